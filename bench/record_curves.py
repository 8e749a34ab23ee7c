"""Record tabular learning curves from real training runs (not a test): the data the search
benchmark (bench/bench_search.py, autoresearch/sim/replay.py) replays.

Eight small workloads, each trained for real, epoch by epoch, on a Sobol sample of its space;
after every epoch the validation metric and the CPU seconds of the epoch are recorded
(process time, one BLAS thread: the machine this runs on is shared, wall time would be noise).

* ``digits-mlp``: scikit-learn's MLPClassifier (adam, ``partial_fit`` = one epoch) on the
  digits images; validation error. lr, hidden units, L2 alpha, batch size, activation.
* ``synth-sgd``: SGDClassifier (logistic loss, elastic net) on a noisy synthetic 8-class
  problem; validation log loss. alpha, eta0, learning-rate schedule, l1 ratio.
* ``friedman-numpy``: a two-layer numpy net (SGD with momentum, hand-written backprop) on
  Friedman #1 regression; validation MSE. lr, units, momentum, weight decay, batch size.
* ``cancer-gbm``: gradient boosting on sklearn's breast-cancer data, one "epoch" = 4 more trees
  (``warm_start``); validation log loss. lr, max depth, subsample, min samples per leaf.
* ``diabetes-gbr``: gradient boosting regression on sklearn's diabetes data (standardized target),
  4 more trees an epoch; validation MSE. lr, max depth, subsample, min samples per leaf, loss.
* ``digits-linear``: SGDClassifier (L2) on the digits images; validation error. alpha, eta0,
  schedule, loss (hinge, log, modified huber, perceptron), averaging.
* ``cancer-mlp``: MLPClassifier (SGD, Nesterov momentum) on the standardized breast-cancer data;
  validation log loss. lr, units, momentum, L2 alpha, batch size.
* ``digits-cnn``: a small numpy conv net (3x3 conv, ReLU, 2x2 max pool, softmax; hand-written
  backprop, SGD with momentum) on the 8x8 digits; validation log loss. lr, filters, momentum,
  weight decay, batch size.

Which workloads are for development and which for test: autoresearch/sim/data/split.json.

A diverged value (NaN, inf, or past the workload's ``cap``) is recorded as the cap for the rest
of the curve, so a table never holds a non-finite number.

    nice python bench/record_curves.py [--configs 256] [--only digits-mlp] [--out autoresearch/sim/data]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
EPOCHS = 27


def _split(x: Any, y: Any, seed: int = 0, val: float = 0.3) -> tuple[Any, Any, Any, Any]:
    from sklearn.model_selection import train_test_split

    return train_test_split(x, y, test_size=val, random_state=seed)


# -- workloads: params -> per-epoch (value, cpu seconds) -----------------------------------


def digits_mlp(params: dict[str, Any], seed: int, data: Any) -> list[tuple[float, float]]:
    from sklearn.neural_network import MLPClassifier

    xt, xv, yt, yv = data
    model = MLPClassifier(hidden_layer_sizes=(int(params["units"]),), activation=params["activation"],
                          solver="adam", alpha=params["alpha"], batch_size=int(params["batch_size"]),
                          learning_rate_init=params["lr"], random_state=seed)
    classes = np.unique(yt)
    out = []
    for _ in range(EPOCHS):
        t0 = time.process_time()
        model.partial_fit(xt, yt, classes=classes)
        err = float(1.0 - model.score(xv, yv))
        out.append((err, time.process_time() - t0))
    return out


def digits_data() -> Any:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return _split(x / 16.0, y, val=0.5)


def synth_sgd(params: dict[str, Any], seed: int, data: Any) -> list[tuple[float, float]]:
    from sklearn.linear_model import SGDClassifier
    from sklearn.metrics import log_loss

    xt, xv, yt, yv = data
    model = SGDClassifier(loss="log_loss", penalty="elasticnet", alpha=params["alpha"], eta0=params["eta0"],
                          learning_rate=params["schedule"], l1_ratio=params["l1_ratio"], random_state=seed)
    classes = np.unique(yt)
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(EPOCHS):
        t0 = time.process_time()
        order = rng.permutation(len(yt))
        model.partial_fit(xt[order], yt[order], classes=classes)
        proba = np.clip(model.predict_proba(xv), 1e-7, 1.0)
        out.append((float(log_loss(yv, proba / proba.sum(axis=1, keepdims=True), labels=classes)),
                    time.process_time() - t0))
    return out


def synth_data() -> Any:
    from sklearn.datasets import make_classification
    from sklearn.preprocessing import StandardScaler

    x, y = make_classification(n_samples=1500, n_features=40, n_informative=24, n_redundant=6, n_classes=8,
                               n_clusters_per_class=2, flip_y=0.05, class_sep=1.2, random_state=7)
    xt, xv, yt, yv = _split(x, y)
    scaler = StandardScaler().fit(xt)
    return scaler.transform(xt), scaler.transform(xv), yt, yv


def friedman_numpy(params: dict[str, Any], seed: int, data: Any) -> list[tuple[float, float]]:
    return list(friedman_epochs(params, seed, data))


def friedman_epochs(params: dict[str, Any], seed: int, data: Any) -> Any:
    """friedman-numpy's training, one (val MSE, cpu seconds) per epoch as it goes (bench_search_real.py)."""
    xt, xv, yt, yv = data
    rng = np.random.default_rng(seed)
    units, lr, mom, wd = int(params["units"]), params["lr"], params["momentum"], params["weight_decay"]
    batch = int(params["batch_size"])
    w1 = rng.normal(0, math.sqrt(2 / xt.shape[1]), (xt.shape[1], units))
    b1 = np.zeros(units)
    w2 = rng.normal(0, math.sqrt(1 / units), (units, 1))
    b2 = np.zeros(1)
    weights = [w1, b1, w2, b2]
    velocity = [np.zeros_like(w) for w in weights]
    for _ in range(EPOCHS):
        t0 = time.process_time()
        order = rng.permutation(len(yt))
        with np.errstate(all="ignore"):
            for start in range(0, len(order), batch):
                idx = order[start:start + batch]
                xb, yb = xt[idx], yt[idx, None]
                h = np.maximum(xb @ w1 + b1, 0.0)
                pred = h @ w2 + b2
                g = 2 * (pred - yb) / len(idx)
                gh = (g @ w2.T) * (h > 0)
                grads = [xb.T @ gh + wd * w1, gh.sum(0), h.T @ g + wd * w2, g.sum(0)]
                for w, v, gr in zip(weights, velocity, grads, strict=True):
                    v *= mom
                    v -= lr * gr
                    w += v
            pred = np.maximum(xv @ w1 + b1, 0.0) @ w2 + b2
            mse = float(np.mean((pred[:, 0] - yv) ** 2))
        yield mse, time.process_time() - t0


def friedman_data() -> Any:
    from sklearn.datasets import make_friedman1

    x, y = make_friedman1(n_samples=2000, n_features=10, noise=1.0, random_state=3)
    y = (y - y.mean()) / y.std()
    return _split(x, y)


def cancer_gbm(params: dict[str, Any], seed: int, data: Any) -> list[tuple[float, float]]:
    from sklearn.ensemble import GradientBoostingClassifier
    from sklearn.metrics import log_loss

    xt, xv, yt, yv = data
    model = GradientBoostingClassifier(learning_rate=params["lr"], max_depth=int(params["max_depth"]),
                                       subsample=params["subsample"],
                                       min_samples_leaf=int(params["min_samples_leaf"]), n_estimators=0,
                                       warm_start=True, random_state=seed)
    out = []
    for epoch in range(1, EPOCHS + 1):
        t0 = time.process_time()
        model.set_params(n_estimators=4 * epoch)
        model.fit(xt, yt)
        proba = np.clip(model.predict_proba(xv), 1e-7, 1 - 1e-7)
        out.append((float(log_loss(yv, proba)), time.process_time() - t0))
    return out


def cancer_data() -> Any:
    from sklearn.datasets import load_breast_cancer

    x, y = load_breast_cancer(return_X_y=True)
    return _split(x, y, seed=1, val=0.4)


def diabetes_gbr(params: dict[str, Any], seed: int, data: Any) -> list[tuple[float, float]]:
    from sklearn.ensemble import GradientBoostingRegressor

    xt, xv, yt, yv = data
    model = GradientBoostingRegressor(learning_rate=params["lr"], max_depth=int(params["max_depth"]),
                                      subsample=params["subsample"], loss=params["loss"],
                                      min_samples_leaf=int(params["min_samples_leaf"]), n_estimators=0,
                                      warm_start=True, random_state=seed)
    out = []
    for epoch in range(1, EPOCHS + 1):
        t0 = time.process_time()
        model.set_params(n_estimators=4 * epoch)
        model.fit(xt, yt)
        out.append((float(np.mean((model.predict(xv) - yv) ** 2)), time.process_time() - t0))
    return out


def diabetes_data() -> Any:
    from sklearn.datasets import load_diabetes

    x, y = load_diabetes(return_X_y=True)
    return _split(x, (y - y.mean()) / y.std(), seed=2, val=0.4)


def digits_linear(params: dict[str, Any], seed: int, data: Any) -> list[tuple[float, float]]:
    from sklearn.linear_model import SGDClassifier

    xt, xv, yt, yv = data
    model = SGDClassifier(loss=params["loss"], penalty="l2", alpha=params["alpha"], eta0=params["eta0"],
                          learning_rate=params["schedule"], average=bool(params["average"] == "yes"),
                          random_state=seed)
    classes = np.unique(yt)
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(EPOCHS):
        t0 = time.process_time()
        order = rng.permutation(len(yt))
        model.partial_fit(xt[order], yt[order], classes=classes)
        out.append((float(1.0 - model.score(xv, yv)), time.process_time() - t0))
    return out


def cancer_mlp(params: dict[str, Any], seed: int, data: Any) -> list[tuple[float, float]]:
    from sklearn.metrics import log_loss
    from sklearn.neural_network import MLPClassifier

    xt, xv, yt, yv = data
    model = MLPClassifier(hidden_layer_sizes=(int(params["units"]),), solver="sgd", momentum=params["momentum"],
                          nesterovs_momentum=True, alpha=params["alpha"], batch_size=int(params["batch_size"]),
                          learning_rate_init=params["lr"], random_state=seed)
    classes = np.unique(yt)
    out = []
    for _ in range(EPOCHS):
        t0 = time.process_time()
        model.partial_fit(xt, yt, classes=classes)
        proba = np.clip(model.predict_proba(xv), 1e-7, 1 - 1e-7)
        out.append((float(log_loss(yv, proba, labels=classes)), time.process_time() - t0))
    return out


def cancer_scaled_data() -> Any:
    from sklearn.preprocessing import StandardScaler

    xt, xv, yt, yv = cancer_data()
    scaler = StandardScaler().fit(xt)
    return scaler.transform(xt), scaler.transform(xv), yt, yv


def _im2col(x: Any) -> Any:
    """8x8 images -> (n, 36, 9): the 3x3 patch of each of the 6x6 valid positions (row-major)."""
    cols = np.empty((x.shape[0], 6, 6, 9))
    for k in range(9):
        di, dj = divmod(k, 3)
        cols[:, :, :, k] = x[:, di:di + 6, dj:dj + 6]
    return cols.reshape(x.shape[0], 36, 9)


def digits_cnn(params: dict[str, Any], seed: int, data: Any) -> list[tuple[float, float]]:
    """A small numpy conv net: 3x3 conv (``filters``) + ReLU + 2x2 max pool + softmax; SGD with momentum."""
    xt, xv, yt, yv = data
    rng = np.random.default_rng(seed)
    f, lr, mom, wd = int(params["filters"]), params["lr"], params["momentum"], params["weight_decay"]
    batch = int(params["batch_size"])
    wc = rng.normal(0, math.sqrt(2 / 9), (9, f))
    bc = np.zeros(f)
    wo = rng.normal(0, math.sqrt(1 / (9 * f)), (9 * f, 10))
    bo = np.zeros(10)
    weights = [wc, bc, wo, bo]
    velocity = [np.zeros_like(w) for w in weights]

    def forward(cols: Any) -> tuple[Any, Any, Any, Any, Any]:
        z = cols @ wc + bc  # (n, 36, f)
        h = np.maximum(z, 0.0).reshape(len(cols), 3, 2, 3, 2, f)
        pooled = h.max(axis=(2, 4))  # (n, 3, 3, f)
        flat = pooled.reshape(len(cols), 9 * f)
        logits = flat @ wo + bo
        logits -= logits.max(axis=1, keepdims=True)
        probs = np.exp(logits)
        probs /= probs.sum(axis=1, keepdims=True)
        return z, h, pooled, flat, probs

    out = []
    for _ in range(EPOCHS):
        t0 = time.process_time()
        order = rng.permutation(len(yt))
        with np.errstate(all="ignore"):
            for start in range(0, len(order), batch):
                idx = order[start:start + batch]
                cols, n = xt[idx], len(idx)
                z, h, pooled, flat, probs = forward(cols)
                g = probs
                g[np.arange(n), yt[idx]] -= 1.0
                g /= n
                gflat = g @ wo.T
                mask = h == pooled[:, :, None, :, None, :]
                gz = (mask * gflat.reshape(n, 3, 1, 3, 1, f)).reshape(n, 36, f) * (z > 0)
                grads = [cols.reshape(-1, 9).T @ gz.reshape(-1, f) + wd * wc, gz.sum(axis=(0, 1)),
                         flat.T @ g + wd * wo, g.sum(0)]
                for w, v, gr in zip(weights, velocity, grads, strict=True):
                    v *= mom
                    v -= lr * gr
                    w += v
            probs = np.clip(forward(xv)[-1], 1e-7, 1.0)
            loss = float(-np.mean(np.log(probs[np.arange(len(yv)), yv])))
        out.append((loss, time.process_time() - t0))
    return out


def digits_cnn_data() -> Any:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    xt, xv, yt, yv = _split(x.reshape(-1, 8, 8) / 16.0, y, seed=3, val=0.5)
    return _im2col(xt), _im2col(xv), yt, yv


WORKLOADS: dict[str, dict[str, Any]] = {
    "digits-mlp": {"run": digits_mlp, "data": digits_data, "metric": "val_error", "cap": 1.0, "space": {
        "lr": {"low": 1e-4, "high": 0.3, "log": True},
        "units": {"low": 8, "high": 128, "log": True},
        "alpha": {"low": 1e-6, "high": 1.0, "log": True},
        "batch_size": [16, 32, 64, 128, 256],
        "activation": ["relu", "tanh", "logistic"]}},
    "synth-sgd": {"run": synth_sgd, "data": synth_data, "metric": "val_logloss", "cap": 10.0, "space": {
        "alpha": {"low": 1e-6, "high": 0.1, "log": True},
        "eta0": {"low": 1e-4, "high": 1.0, "log": True},
        "schedule": ["constant", "invscaling", "adaptive"],
        "l1_ratio": {"low": 0.0, "high": 1.0}}},
    "friedman-numpy": {"run": friedman_numpy, "data": friedman_data, "metric": "val_mse", "cap": 10.0, "space": {
        "lr": {"low": 1e-4, "high": 0.5, "log": True},
        "units": {"low": 4, "high": 128, "log": True},
        "momentum": {"low": 0.0, "high": 0.95},
        "weight_decay": {"low": 1e-6, "high": 0.1, "log": True},
        "batch_size": [8, 16, 32, 64, 128]}},
    "cancer-gbm": {"run": cancer_gbm, "data": cancer_data, "metric": "val_logloss", "cap": 10.0, "space": {
        "lr": {"low": 0.005, "high": 1.0, "log": True},
        "max_depth": {"low": 1, "high": 6},
        "subsample": {"low": 0.3, "high": 1.0},
        "min_samples_leaf": {"low": 1, "high": 60, "log": True}}},
    "diabetes-gbr": {"run": diabetes_gbr, "data": diabetes_data, "metric": "val_mse", "cap": 10.0, "space": {
        "lr": {"low": 0.005, "high": 1.0, "log": True},
        "max_depth": {"low": 1, "high": 6},
        "subsample": {"low": 0.3, "high": 1.0},
        "min_samples_leaf": {"low": 1, "high": 60, "log": True},
        "loss": ["squared_error", "huber", "absolute_error"]}},
    "digits-linear": {"run": digits_linear, "data": digits_data, "metric": "val_error", "cap": 1.0, "space": {
        "alpha": {"low": 1e-7, "high": 0.1, "log": True},
        "eta0": {"low": 1e-5, "high": 1.0, "log": True},
        "schedule": ["constant", "invscaling", "adaptive", "optimal"],
        "loss": ["hinge", "log_loss", "modified_huber", "perceptron"],
        "average": ["no", "yes"]}},
    "cancer-mlp": {"run": cancer_mlp, "data": cancer_scaled_data, "metric": "val_logloss", "cap": 10.0, "space": {
        "lr": {"low": 1e-4, "high": 1.0, "log": True},
        "units": {"low": 2, "high": 128, "log": True},
        "momentum": {"low": 0.0, "high": 0.99},
        "alpha": {"low": 1e-6, "high": 1.0, "log": True},
        "batch_size": [8, 16, 32, 64, 128]}},
    "digits-cnn": {"run": digits_cnn, "data": digits_cnn_data, "metric": "val_logloss", "cap": 10.0, "space": {
        "lr": {"low": 1e-4, "high": 1.0, "log": True},
        "filters": {"low": 2, "high": 32, "log": True},
        "momentum": {"low": 0.0, "high": 0.95},
        "weight_decay": {"low": 1e-6, "high": 0.1, "log": True},
        "batch_size": [16, 32, 64, 128, 256]}},
}


def sobol_configs(space: dict[str, Any], n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` configs of a plan ``space:`` from a scrambled Sobol sequence (values as a proposer writes them)."""
    from scipy.stats import qmc

    points = qmc.Sobol(d=len(space), scramble=True, seed=seed).random(n)
    out = []
    for row in points:
        params: dict[str, Any] = {}
        for u, (name, p) in zip(row, space.items(), strict=True):
            if isinstance(p, list):
                params[name] = p[min(int(u * len(p)), len(p) - 1)]
                continue
            low, high = float(p["low"]), float(p["high"])
            value = math.exp(math.log(low) + u * (math.log(high) - math.log(low))) if p.get("log") else \
                low + u * (high - low)
            is_int = isinstance(p["low"], int) and isinstance(p["high"], int)
            params[name] = int(round(value)) if is_int else float(f"{value:.6g}")
        out.append(params)
    return out


def clean(points: list[tuple[float, float]], cap: float) -> tuple[list[float], list[float]]:
    """Values rounded to 5 digits; from the first non-finite or capped value on, the cap."""
    values, seconds, dead = [], [], False
    for value, secs in points:
        dead = dead or not math.isfinite(value) or value > cap
        values.append(cap if dead else float(f"{value:.5g}"))
        seconds.append(float(f"{max(secs, 0.0):.3g}"))
    return values, seconds


def record(name: str, n: int, out_dir: Path, seed: int = 0,
           progress: Callable[[str], None] = print) -> Path:
    w = WORKLOADS[name]
    data = w["data"]()
    configs = []
    t0 = time.process_time()
    for i, params in enumerate(sobol_configs(w["space"], n, seed)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            values, seconds = clean(w["run"](params, i, data), w["cap"])
        configs.append({"params": params, "values": values, "seconds": seconds})
        if (i + 1) % 32 == 0:
            progress(f"{name}: {i + 1}/{n} configs, {time.process_time() - t0:.0f} cpu s")
    table = {"format": "autoresearch-curves/1", "workload": name, "metric": w["metric"], "mode": "min",
             "space": w["space"], "step_unit": "epoch", "max_step": EPOCHS, "configs": configs,
             "recorded": {"configs": n, "sampler": f"sobol scrambled seed={seed}", "seconds": "cpu (process time)",
                          "cpu_seconds_total": round(time.process_time() - t0, 1)}}
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json.gz"
    path.write_bytes(gzip.compress(json.dumps(table, separators=(",", ":")).encode(), mtime=0))
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", type=int, default=256)
    ap.add_argument("--only", action="append", choices=sorted(WORKLOADS))
    ap.add_argument("--out", type=Path, default=ROOT / "autoresearch" / "sim" / "data")
    ap.add_argument("--time-one", action="store_true", help="time 4 configs of each workload and exit")
    args = ap.parse_args()
    for name in args.only or list(WORKLOADS):
        if args.time_one:
            w = WORKLOADS[name]
            data = w["data"]()
            for params in sobol_configs(w["space"], 4, 1):
                t0 = time.process_time()
                values, _ = clean(w["run"](params, 0, data), w["cap"])
                print(f"{name}: {time.process_time() - t0:.2f} cpu s  final {values[-1]:.4g}  {params}")
            continue
        path = record(name, args.configs, args.out)
        print(f"{name}: {path} ({path.stat().st_size} bytes)", flush=True)


if __name__ == "__main__":
    main()
