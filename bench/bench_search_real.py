"""Search on real training, not replayed (not a test): our loop against Optuna on one workload.

The workload is ``friedman-numpy`` (bench/record_curves.py: a two-layer numpy net on Friedman
#1, 27 epochs, val MSE), trained for real by the same function in both tools, with training
seed 0 for every config:

* **ours**: a real loop (``Controller`` on the local backend, real trial processes, parallel 4)
  with a plan that names no proposer and no stopper kind (the defaults:
  ``early_stop: {min_steps: 1, reduction_factor: 3, max_steps: 27}``), ``budget.steps`` = the
  compute budget. Each trial is ``python bench/bench_search_real.py --trial ...``: it trains
  and calls ``autoresearch.report`` every epoch.
* **optuna**: ``TPESampler(seed)`` + ``SuccessiveHalvingPruner()`` (both defaults), ``n_jobs=4``,
  ``trial.report`` / ``should_prune`` every epoch, stopped when the budget is spent.

Each epoch of either tool appends ``time trial epoch value`` to a log (``--epoch-s`` of sleep per
epoch stands for a longer epoch, so that four trials are in flight as in real training).
From it: **compute-to-target** (epochs consumed by all trials, stopped ones included, when a
fully trained trial first reaches the target: the value the best 5% of the recorded configs
reach) and **best at fixed compute** (the best fully trained value within the budget).

    python bench/bench_search_real.py [--seeds 3] [--budget 40] [--epoch-s 0.05]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
EPOCHS = 27
PARALLEL = 4


def train(params: dict[str, Any], data_file: Path) -> Any:
    """(epoch, val MSE) as friedman-numpy trains (record_curves.friedman_epochs), training seed 0."""
    import numpy as np

    from bench.record_curves import friedman_epochs

    with np.load(data_file) as z:
        data = (z["xt"], z["xv"], z["yt"], z["yv"])
    for epoch, (mse, _) in enumerate(friedman_epochs(params, 0, data), 1):
        yield epoch, mse if math.isfinite(mse) and mse <= 10.0 else 10.0  # the recorder's cap


def log_line(log: Path, trial: str, epoch: int, value: float) -> None:
    with open(log, "a") as f:  # one short write per line: O_APPEND keeps lines whole across processes
        f.write(f"{time.time():.6f} {trial} {epoch} {value:.6g}\n")


def trial_main(argv: list[str]) -> None:
    """One trial of our loop (a real process): train, report every epoch."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--log", type=Path)
    ap.add_argument("--data", type=Path)
    ap.add_argument("--id")
    ap.add_argument("--epoch-s", type=float)
    ap.add_argument("--params", nargs="+", help="name=value ...")
    args = ap.parse_args(argv)
    from autoresearch import report

    params = {}
    for item in args.params:
        name, _, raw = item.partition("=")
        params[name] = json.loads(raw) if raw[:1].isdigit() or raw[:1] in "-." else raw
    for epoch, value in train(params, args.data):
        time.sleep(args.epoch_s)
        log_line(args.log, f"ours-{args.id}", epoch, value)
        report(step=epoch, val_mse=value)


def summarize(log: Path, target: float, budget: int) -> dict[str, Any]:
    rows = sorted((float(t), trial, int(e), float(v)) for t, trial, e, v in
                  (line.split() for line in log.read_text().splitlines() if line.strip()))
    c2t, best = math.inf, math.inf
    for k, (_, _, epoch, value) in enumerate(rows, 1):
        if k <= budget and epoch == EPOCHS:
            best = min(best, value)
            if value <= target and math.isinf(c2t):
                c2t = k
    return {"c2t": c2t, "best": best, "epochs": len(rows), "trials": len({r[1] for r in rows}),
            "full": sum(1 for r in rows if r[2] == EPOCHS)}


def run_ours(work: Path, space: dict[str, Any], seed: int, budget: int, epoch_s: float, data: Path) -> Path:
    from autoresearch.api import Api
    from autoresearch.loop.controller import Controller
    from autoresearch.loop.plan import parse_plan

    log = work / f"ours-{seed}.log"
    log.touch()
    params = " ".join(f"{n}={{{n}}}" for n in space)
    command = (f"{sys.executable} {ROOT / 'bench' / 'bench_search_real.py'} --trial --log {log} --data {data} "
               f"--id {{trial_id}} --epoch-s {epoch_s} --params {params}")
    plan = parse_plan({
        "name": f"real-{seed}", "objective": {"metric": "val_mse"},
        "trial": {"command": command, "grace": 5},
        "space": space, "proposer": {"seed": seed},
        "budget": {"trials": 100_000, "parallel": PARALLEL, "steps": budget, "stop_in_flight": True},
        "early_stop": {"min_steps": 1, "reduction_factor": 3, "max_steps": EPOCHS}}, base_dir=work)
    Controller(plan, runtime=Api(work / "home")._runtime).run()
    return log


def run_optuna(work: Path, space: dict[str, Any], seed: int, budget: int, epoch_s: float, data: Path) -> Path:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    log = work / f"optuna-{seed}.log"
    log.touch()
    lock = threading.Lock()
    used = [0]

    def objective(trial: Any) -> float:
        params: dict[str, Any] = {}
        for name, p in space.items():
            if isinstance(p, list):
                params[name] = trial.suggest_categorical(name, p)
            elif isinstance(p["low"], int) and isinstance(p["high"], int):
                params[name] = trial.suggest_int(name, p["low"], p["high"], log=p.get("log", False))
            else:
                params[name] = trial.suggest_float(name, p["low"], p["high"], log=p.get("log", False))
        value = math.inf
        for epoch, value in train(params, data):
            time.sleep(epoch_s)
            with lock:
                used[0] += 1
                log_line(log, f"optuna-{trial.number}", epoch, value)
            trial.report(value, epoch)
            if trial.should_prune():
                raise optuna.TrialPruned()
        return value

    def enough(study: Any, _trial: Any) -> None:
        if used[0] >= budget:
            study.stop()

    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=seed),
                                pruner=optuna.pruners.SuccessiveHalvingPruner())
    study.optimize(objective, n_jobs=PARALLEL, callbacks=[enough])
    return log


def main() -> None:
    if sys.argv[1:2] == ["--trial"]:
        trial_main(sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--seed-start", type=int, default=100)
    ap.add_argument("--budget", type=int, default=40, help="compute budget, in full trainings (x 27 epochs)")
    ap.add_argument("--epoch-s", type=float, default=0.05, help="sleep per epoch (a longer epoch)")
    args = ap.parse_args()
    import numpy as np

    from autoresearch.sim.curves import CurveTable
    from autoresearch.sim.replay import target_of
    from bench.record_curves import WORKLOADS, friedman_data

    work = Path(tempfile.mkdtemp(prefix="bench-search-real-"))
    os.environ.update(AUTORESEARCH_HOME=str(work / "home"), AUTORESEARCH_TRACKING="off")
    data = work / "friedman.npz"
    np.savez(data, **dict(zip(("xt", "xv", "yt", "yv"), friedman_data(), strict=True)))
    table = CurveTable.load(ROOT / "autoresearch" / "sim" / "data" / "friedman-numpy.json.gz")
    target, budget = target_of(table), args.budget * EPOCHS
    space = WORKLOADS["friedman-numpy"]["space"]
    load0 = os.getloadavg()[0]
    results: dict[str, list[dict[str, Any]]] = {"ours (bohb+hyperband, defaults)": [], "optuna tpe+sh": []}
    for seed in range(args.seed_start, args.seed_start + args.seeds):
        for name, fn in (("ours (bohb+hyperband, defaults)", run_ours), ("optuna tpe+sh", run_optuna)):
            t0 = time.perf_counter()
            row = summarize(fn(work, space, seed, budget, args.epoch_s, data), target, budget)
            row["wall_s"] = time.perf_counter() - t0
            results[name].append(row)
            print(f"  seed {seed} {name:32s} c2t {row['c2t']:>5} best {row['best']:.4g} trials {row['trials']} "
                  f"epochs {row['epochs']} wall {row['wall_s']:.0f}s", file=sys.stderr, flush=True)
    print(f"real runs: friedman-numpy, parallel {PARALLEL}, budget {budget} epochs, target {target:.4g} (top 5%), "
          f"{args.seeds} seeds from {args.seed_start}, {args.epoch_s:g} s sleep/epoch, load {load0:.1f} -> "
          f"{os.getloadavg()[0]:.1f}")
    print(f"{'tool':32s} {'c2t median':>10s} {'per seed':>18s} {'hit':>5s} {'best@budget':>12s} {'trials':>7s} "
          f"{'wall s':>7s}")
    ref = statistics.median(r["c2t"] for r in results["optuna tpe+sh"])
    for name, rows in results.items():
        c2t = [r["c2t"] for r in rows]
        med = statistics.median(c2t)
        print(f"{name:32s} {med:>10} {' '.join(str(c) for c in c2t):>18s} "
              f"{sum(map(math.isfinite, c2t)):>2d}/{len(c2t)} {statistics.median(r['best'] for r in rows):>12.4g} "
              f"{statistics.median(r['trials'] for r in rows):>7.0f} {statistics.median(r['wall_s'] for r in rows):>7.0f}")
    ours = statistics.median(r["c2t"] for r in results["ours (bohb+hyperband, defaults)"])
    print(f"ratio of medians, ours / optuna: {ours / ref if math.isfinite(ref) and ref else math.nan:.2f}")


if __name__ == "__main__":
    main()
