"""The report's figures (matplotlib, and optuna's plots where they serve), from the ledger.

Every "best" drawn here is the loop's incumbent sequence
(:func:`autoresearch.loop.views.incumbent_sequence`), so the plots agree with the table,
``summary.md`` and MLflow. Every ended trial is drawn: early-stopped ones as their
partial curves (and their last value, marked ``x``), seed repeats as triangles, gains
within the noise floor ringed. Imported only by :mod:`autoresearch.loop.report`
(matplotlib, optuna: never on a fast path).

Each ``plot_*`` returns a matplotlib Figure or None (nothing to draw); points that stand
for a trial carry the URL ``#trial-N`` so the HTML report can link them to the trial's row.
Each title names the best as ``summary.md`` does (trial, job, value, confirmed over seeds);
the layout rules (a colour ramp visible at both ends, end labels apart, legends under the
axes) are :mod:`autoresearch.loop._layout`'s.
"""

from __future__ import annotations

import json
import math
import sys
import textwrap
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from autoresearch.engine import metrics as M
from autoresearch.loop import _layout as L
from autoresearch.loop.views import LoopView, TrialRow, confirmed_text
from autoresearch.store.jobstore import JobStore
from autoresearch.store.ledger import Ledger

Series = list[tuple[int, float, float]]  # (step, value, ts) in the objective's own direction


@dataclass
class ReportData:
    view: LoopView
    plan: dict[str, Any]
    series: dict[int, Series] = field(default_factory=dict)  # trial id -> its objective's curve (last attempt)

    @property
    def sign(self) -> float:
        return 1.0 if self.view.goal == "minimize" else -1.0

    @property
    def confirmed(self) -> str:
        """``, confirmed (3 seeds)`` / ``, not confirmed: 1 of 3 seed(s) ended`` / '' (the plan has no repeats):
        every label that names the incumbent carries it, as summary.md, the CI reports and MLflow do."""
        text = confirmed_text(self.view, self.plan)
        return f", {text}" if text else ""

    @property
    def simulated(self) -> bool:
        """The loop ran on the sim backend: its trials' times (created, ended, metric points) are simulated."""
        backend = self.plan.get("backend")
        return isinstance(backend, dict) and backend.get("kind") == "sim"

    @property
    def start(self) -> float:
        return min((t.created_at for t in self.view.trials), default=0.0)


def load(ledger: Ledger, view: LoopView, plan: dict[str, Any]) -> ReportData:
    """The view plus every trial's objective curve (the last attempt; reported beats parsed)."""
    by_job = {t.job_id: t.trial_id for t in view.trials if t.job_id is not None}
    data = ReportData(view, plan)
    if not by_job:
        return data
    points = JobStore(ledger).metric_series(view.metric, by_job)
    last: dict[int, int] = {}
    for p in points:
        last[p["job_id"]] = max(last.get(p["job_id"], 0), p["attempt"])
    for p in M.best_source(points, key=lambda p: (p["job_id"], p["attempt"])):
        value = p["value"]
        if p["attempt"] != last[p["job_id"]] or value is None or not math.isfinite(value):
            continue
        data.series.setdefault(by_job[p["job_id"]], []).append((int(p["step"]), float(value), float(p["ts"])))
    for s in data.series.values():
        s.sort()
    return data


def _t(text: object) -> str:
    """Text from a plan (a metric's name) as matplotlib draws it: '$' is not math."""
    return str(text).replace("$", r"\$")


def _value(data: ReportData, t: TrialRow) -> float | None:
    """A trial's final value: its objective, or (early-stopped) the last point of its curve."""
    if t.objective is not None and math.isfinite(t.objective):
        return t.objective
    curve = data.series.get(t.trial_id)
    return curve[-1][1] if curve else None


def _logy(ax: Any, values: list[float]) -> None:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if finite and min(finite) > 0 and max(finite) / min(finite) > 20:
        ax.set_yscale("log")


def _best_line(data: ReportData) -> str:
    """The best trial as summary.md says it: its number, job, value (a mean over seeds) and
    whether its seeds confirmed it."""
    view = data.view
    if view.best_trial is None or view.best_value is None:
        return "no trial finished with the objective yet"
    job = next((t.job_id for t in view.trials if t.trial_id == view.best_trial), None)
    seeds = f" (mean of {view.best_seeds} seeds)" if view.best_seeds > 1 else ""
    status = confirmed_text(view, data.plan)
    return (f"best: trial {view.best_trial}" + (f" (job {job})" if job is not None else "")
            + f": {view.metric} = {view.best_value:.6g}{seeds}" + (f", {status}" if status else ""))


def _mpl() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _trial_points(ax: Any, data: ReportData, xs: dict[int, float]) -> list[float]:
    """Every ended trial at its x: kind by marker, each a link to its row. Returns the values drawn."""
    view = data.view
    groups: dict[str, tuple[list[float], list[float], list[int]]] = {}
    for t in view.trials:
        value = _value(data, t)
        if t.trial_id not in xs or value is None:
            continue
        if t.state == "succeeded":
            kind = "seed repeat" if t.role == "repeat" else "finished trial"
        elif t.state in ("stopped", "cancelled"):
            kind = "early-stopped (last value)"
        else:
            kind = f"{t.state} (last value)"
        xs_, ys, ids = groups.setdefault(kind, ([], [], []))
        xs_.append(xs[t.trial_id])
        ys.append(value)
        ids.append(t.trial_id)
    style = {"finished trial": dict(marker="o", color="C0"), "seed repeat": dict(marker="^", color="C2"),
             "early-stopped (last value)": dict(marker="x", color="C7")}
    drawn: list[float] = []
    for kind, (x, y, ids) in groups.items():
        points = ax.scatter(x, y, s=22, alpha=0.8, label=kind, zorder=3, **style.get(kind, dict(marker="s", color="C3")))
        points.set_urls([f"#trial-{i}" for i in ids])
        drawn += y
    noise = [t for t in view.trials if t.within_noise and t.trial_id in xs and t.objective is not None]
    if noise:
        ax.scatter([xs[t.trial_id] for t in noise], [t.objective for t in noise], s=90, facecolors="none",
                   edgecolors="C1", linewidths=1.5, zorder=4, label="gain within noise: not kept")
    inc = next((t for t in view.trials if t.trial_id == view.best_trial), None)
    if inc is not None and inc.trial_id in xs and inc.objective is not None:
        ax.scatter([xs[inc.trial_id]], [inc.objective], s=160, marker="*", color="C3", zorder=5,
                   label=f"incumbent: trial {inc.trial_id} (one run){data.confirmed}")
    return drawn


def _incumbent_line(ax: Any, data: ReportData, xs: dict[int, float]) -> list[float]:
    view = data.view
    steps = [(xs[c.trial_id], c.value, c.noise) for c in view.curve
             if c.trial_id in xs and c.value is not None and math.isfinite(c.value)]
    if not steps:
        return []
    x = [s[0] for s in steps]
    y = [float(s[1]) for s in steps]  # type: ignore[arg-type]
    noise = [s[2] if s[2] is not None and math.isfinite(s[2]) else 0.0 for s in steps]
    ax.step(x, y, where="post", color="C3", lw=2, label=f"best so far (the incumbent the loop kept{data.confirmed})", zorder=2)
    if any(noise):  # the floor each incumbent was defended with: the std of one run of it (noise.py)
        lo = [v - n for v, n in zip(y, noise, strict=True)]
        hi = [v + n for v, n in zip(y, noise, strict=True)]
        now = f", now ±{view.noise_floor:.3g}" if view.noise_floor is not None else ""
        ax.fill_between(x, lo, hi, step="post", color="C3", alpha=0.12, lw=0,
                        label=f"± noise floor (one run's std{now})")
    return y


def plot_best_vs_trials(data: ReportData) -> Any:
    view = data.view
    if not view.curve:
        return None
    plt = _mpl()
    xs = {c.trial_id: float(i) for i, c in enumerate(view.curve, 1)}  # the order the loop judged them
    fig, ax = plt.subplots(figsize=(10.5, 5))
    values = _trial_points(ax, data, xs) + _incumbent_line(ax, data, xs)
    _logy(ax, values)
    ax.set_xlabel("ended trials, in the order the loop judged them")
    ax.set_ylabel(f"{_t(view.metric)} ({'lower' if data.sign > 0 else 'higher'} is better)")
    ax.set_title(f"{view.name}: best {_t(view.metric)} vs trials ({len(xs)} ended)\n{_t(_best_line(data))}",
                 fontsize=11)
    ax.grid(alpha=0.3)
    L.legend_under(fig, ax)
    return fig


def plot_best_vs_time(data: ReportData) -> Any:
    view = data.view
    if not view.curve:
        return None
    plt = _mpl()
    start = data.start
    fig, ax = plt.subplots(figsize=(10.5, 5))
    values: list[float] = []
    for t in view.trials:  # every trial's curve over wall time; early-stopped ones end early
        curve = data.series.get(t.trial_id)
        if not curve:
            continue
        stopped = t.state in ("stopped", "cancelled")
        line, = ax.plot([c[2] - start for c in curve], [c[1] for c in curve], lw=0.8, alpha=0.45,
                        color="C7" if stopped else "C0", ls="--" if stopped else "-")
        line.set_url(f"#trial-{t.trial_id}")
        values += [c[1] for c in curve]
    xs = {c.trial_id: c.at - start for c in view.curve}
    values += _trial_points(ax, data, xs) + _incumbent_line(ax, data, judged_at(view, start))
    ax.plot([], [], lw=0.8, color="C0", label="a trial's curve")
    ax.plot([], [], lw=0.8, color="C7", ls="--", label="an early-stopped trial's partial curve")
    _logy(ax, values)
    clock = "simulated time" if data.simulated else "wall time"
    ax.set_xlabel(f"seconds since the loop started ({clock})")
    ax.set_ylabel(_t(view.metric))
    ax.set_title(f"{view.name}: best {_t(view.metric)} vs {clock}\n{_t(_best_line(data))}", fontsize=11)
    ax.grid(alpha=0.3)
    L.legend_under(fig, ax)
    return fig


def judged_at(view: LoopView, start: float) -> dict[int, float]:
    """When each ended trial's verdict could first be drawn, in seconds since ``start``: never
    before it ended, nor before the trials judged ahead of it (the curve is in the order the
    loop judged them, a stopped trial's end may be earlier than a judged one's; on the sim
    backend decisions are wall time, ends simulated). The best-so-far line, drawn at its own
    end, went back in time and showed a best before it existed."""
    out: dict[int, float] = {}
    latest = -math.inf
    for c in view.curve:
        latest = max(latest, c.at - start)
        out[c.trial_id] = latest
    return out


def asha_rungs(plan: dict[str, Any], max_step: int) -> list[int]:
    """The steps where ASHA compares trials: min_steps * reduction_factor^k (up to max_step)."""
    early = plan.get("early_stop") or {}
    if str(early.get("kind", "")).lower() != "asha":
        return []
    try:
        step, factor = int(early.get("min_steps") or 1), int(early.get("reduction_factor") or 3)
    except (TypeError, ValueError):
        return []
    step, factor = max(step, 1), max(factor, 2)
    limit = min(max_step, int(early.get("max_steps") or max_step))
    rungs: list[int] = []
    while step <= limit and len(rungs) < 20:
        rungs.append(step)
        step *= factor
    return rungs


def plot_learning_curves(data: ReportData) -> Any:
    view = data.view
    if not data.series:
        return None
    plt = _mpl()
    fig, ax = plt.subplots(figsize=(10.5, 5))
    values: list[float] = []
    seen: set[str] = set()
    ends: list[L.End] = []
    for t in view.trials:
        curve = data.series.get(t.trial_id)
        if not curve:
            continue
        if t.trial_id == view.best_trial:
            kind, style = f"incumbent: trial {t.trial_id}{data.confirmed}", dict(color="C3", lw=2.2, zorder=4)
        elif t.state in ("stopped", "cancelled"):
            kind, style = "early-stopped", dict(color="C7", lw=0.9, ls="--", alpha=0.7)
        elif t.role == "repeat":
            kind, style = "seed repeat", dict(color="C2", lw=0.9, alpha=0.7)
        else:
            kind, style = t.state, dict(color="C0" if t.state == "succeeded" else "C1", lw=0.9, alpha=0.7)
        line, = ax.plot([c[0] for c in curve], [c[1] for c in curve], label=None if kind in seen else kind,
                        **style)  # type: ignore[arg-type]
        line.set_url(f"#trial-{t.trial_id}")
        seen.add(kind)
        rank = -math.inf if t.trial_id == view.best_trial else data.sign * curve[-1][1]
        ends.append(L.End(f"#{t.trial_id}", curve[-1][0], curve[-1][1], str(style["color"]), rank))
        values += [c[1] for c in curve]
    max_step = max(c[-1][0] for c in data.series.values())
    for i, rung in enumerate(asha_rungs(data.plan, max_step)):
        ax.axvline(rung, color="C4", lw=0.8, ls=":", label="ASHA rung" if i == 0 else None)
    _logy(ax, values)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel(_t(view.metric))
    ax.set_title(f"{view.name}: learning curves by trial\n{_t(_best_line(data))}", fontsize=11)
    ax.grid(alpha=0.3)
    low, high = ax.get_xlim()
    ax.set_xlim(low, high + 0.04 * (high - low))  # room for the end labels inside the axes
    L.legend_under(fig, ax)
    L.end_labels(fig, ax, ends)
    return fig


def _study(data: ReportData) -> Any:
    """The loop's explore trials as an in-memory optuna study (its plots know log axes)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    dists: dict[str, Any] = {}
    for name, spec in (data.plan.get("space") or {}).items():
        if not isinstance(spec, dict):
            continue
        if spec.get("choices") is not None:
            dists[name] = optuna.distributions.CategoricalDistribution(
                [c if isinstance(c, (int, float, str, bool)) or c is None else json.dumps(c) for c in spec["choices"]])
        elif spec.get("low") is not None and spec.get("high") is not None:
            if spec.get("type") == "int":
                dists[name] = optuna.distributions.IntDistribution(int(spec["low"]), int(spec["high"]),
                                                                   log=bool(spec.get("log")))
            else:
                dists[name] = optuna.distributions.FloatDistribution(float(spec["low"]), float(spec["high"]),
                                                                     log=bool(spec.get("log")))
    study = optuna.create_study(direction="minimize" if data.sign > 0 else "maximize")
    for t in data.view.trials:
        if t.role != "explore" or t.state != "succeeded" or t.objective is None or not math.isfinite(t.objective):
            continue
        params = {k: v for k, v in t.params.items() if k in dists and "$" not in k}
        try:
            for k, v in params.items():
                if not _inside(dists[k], v):
                    raise ValueError(k)
            study.add_trial(optuna.trial.create_trial(params=params, distributions={k: dists[k] for k in params},
                                                      value=t.objective, user_attrs={"trial_id": t.trial_id}))
        except (ValueError, TypeError):
            continue  # a value outside the plan's space (an agent's edit, a resumed plan): left out
    return study


def _inside(dist: Any, value: Any) -> bool:
    """Whether ``value`` lies in an optuna distribution (its choices, or low..high)."""
    if hasattr(dist, "choices"):
        return value in dist.choices
    return isinstance(value, (int, float)) and not isinstance(value, bool) and dist.low <= value <= dist.high


def plot_parallel(data: ReportData) -> Any:
    """Parallel coordinates with real axes (log where the space is log) and a colour bar: optuna's."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from optuna.visualization.matplotlib import plot_parallel_coordinate

        study = _study(data)
        if len(study.trials) < 2:
            return None
        ax = plot_parallel_coordinate(study, target_name=_t(data.view.metric))
    fig: Any = ax.figure
    fig.set_size_inches(max(7, 1.8 * len(study.trials[0].params) + 3), 5)
    lines = L.recolour(ax, data.sign)
    view = data.view
    inc = next((t for t in study.trials if t.user_attrs.get("trial_id") == view.best_trial), None)
    shown = ""
    if lines is not None and inc is not None:  # the incumbent on top, in the red of every other plot
        segment = lines.get_segments()[L.segment_of(lines, inc.value)]
        ax.plot(segment[:, 0], segment[:, 1], color="C3", lw=2.4, zorder=5)
        shown = f"red: the incumbent, {_best_line(data).removeprefix('best: ')}"
    title = (f"{view.name}: parameters of the {len(study.trials)} finished explore trials, coloured by "
             f"{view.metric} (darker is better)" + (f"\n{shown}" if shown else ""))
    width = int(fig.get_figwidth() * 72 / (10 * 0.55))  # characters of 10 points the figure holds
    ax.set_title("")  # optuna's; the figure's title is centred on the figure, not on the axes beside the colour bar
    fig.suptitle(_t("\n".join(textwrap.fill(line, width) for line in title.splitlines())), fontsize=10)
    fig.tight_layout()
    return fig


def plot_importances(data: ReportData) -> Any:
    """Parameter importances: optuna's fANOVA over the loop's finished trials (needs scikit-learn)."""
    usable = [t for t in data.view.trials if t.role == "explore" and t.state == "succeeded"
              and t.objective is not None and math.isfinite(t.objective)]
    if len(usable) < 3:
        return None  # before importing optuna.importance and scikit-learn (~2 s) for a plot not drawn
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            from optuna.importance import FanovaImportanceEvaluator
            from optuna.visualization.matplotlib import plot_param_importances

            study = _study(data)
            names = {k for t in study.trials for k in t.params}
            if len(study.trials) < 3 or len(names) < 1:
                return None
            ax = plot_param_importances(study, evaluator=FanovaImportanceEvaluator(seed=0),
                                        target_name=_t(data.view.metric))
        except (ImportError, RuntimeError, ValueError):
            return None  # no scikit-learn, or too little variation to fit
    fig: Any = ax.figure
    fig.set_size_inches(7, max(2.5, 0.6 * len(names) + 1.5))
    ax.set_title("", loc="left")  # optuna's own title
    legend = ax.get_legend()
    if legend is not None:  # one bar series, named after the metric the title names already
        legend.remove()
    ax.set_title(f"{data.view.name}: importance of each parameter for {_t(data.view.metric)}\n"
                 f"(optuna's fANOVA over {len(study.trials)} finished trials; few trials: a rough guide)", fontsize=10)
    fig.tight_layout()
    return fig


def plot_lineage(data: ReportData) -> Any:
    view = data.view
    code = [t for t in view.trials if t.has_patch or (t.parent_trial and t.role == "explore")]
    if not code:
        return None
    plt = _mpl()
    by_id = {t.trial_id: t for t in view.trials}

    def depth(t: TrialRow) -> int:
        d, seen = 0, set()
        while t.parent_trial and t.parent_trial in by_id and t.trial_id not in seen:
            seen.add(t.trial_id)
            t, d = by_id[t.parent_trial], d + 1
        return d

    fig, ax = plt.subplots(figsize=(7, max(3, 0.25 * len(code) + 1)))
    ys = {t.trial_id: i for i, t in enumerate(sorted(code, key=lambda t: t.trial_id))}
    for t in code:
        x, y = depth(t), ys[t.trial_id]
        parent = by_id.get(t.parent_trial or -1)
        if parent is not None and parent.trial_id in ys:
            ax.plot([depth(parent), x], [ys[parent.trial_id], y], color="grey", lw=0.8)
        color = {"succeeded": "C2", "failed": "C3", "stopped": "C1"}.get(t.state, "C7")
        dot = ax.scatter([x], [y], color=color, s=30, zorder=3, marker="*" if t.trial_id == view.best_trial else "o")
        dot.set_urls([f"#trial-{t.trial_id}"])
        label = f"#{t.trial_id} {t.objective:.4g}" if t.objective is not None else f"#{t.trial_id} {t.state}"
        if t.trial_id == view.best_trial:
            label += f" (incumbent{data.confirmed})"
        ax.annotate(label, (x, y), xytext=(4, 0), textcoords="offset points", fontsize=7, va="center")
    ax.set_xlabel("edits from the base")
    ax.set_yticks([])
    ax.set_title("lineage of code-edit trials (green succeeded, red failed, orange stopped)")
    fig.tight_layout()
    return fig


PLOTS = (("best_vs_trials", plot_best_vs_trials), ("best_vs_time", plot_best_vs_time),
         ("learning_curves", plot_learning_curves), ("parallel", plot_parallel),
         ("importances", plot_importances), ("lineage", plot_lineage))


def figures(data: ReportData, only: tuple[str, ...] | None = None) -> Iterator[tuple[str, Any]]:
    """(name, Figure) of every plot with something to draw (``only``: these names), one at a
    time: save and :func:`close` each before the next (optuna's plots restyle matplotlib
    globally, so each is made inside its own ``rc_context``)."""
    import matplotlib

    for name, make in PLOTS:
        if only is not None and name not in only:
            continue
        with matplotlib.rc_context():
            try:
                fig = make(data)
            except Exception as err:  # noqa: BLE001 - one figure a plan's odd text breaks must not lose the rest
                print(f"autoresearch: the report's {name} figure was left out ({type(err).__name__}: "
                      f"{str(err)[:200]})", file=sys.stderr)
                continue
            if fig is not None:
                yield name, fig


def close(fig: Any) -> None:
    _mpl().close(fig)
