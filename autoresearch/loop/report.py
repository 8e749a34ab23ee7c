"""The loop's report: PNG plots and a Markdown summary, saved and logged to MLflow.

``autoresearch report NAME`` (and the end of ``autoresearch run``) writes, under
``$AUTORESEARCH_HOME/loops/NAME/report/``:

* ``best_vs_trials.png``  best-so-far (line) and every finished trial (dots) in end order;
* ``best_vs_time.png``    best-so-far against wall-clock time since the loop started;
* ``parallel.png``        parallel coordinates of the parameters, coloured by objective;
* ``lineage.png``         the tree of code-edit trials (parent -> child), when there is one;
* ``summary.md``          the incumbent, the noise floor, a leaderboard, budgets, decisions.

The facade then has the mirror attach the files to the loop's MLflow run (when tracking is
on: :func:`autoresearch.tracking.log_to_mlflow`, through the outbox). matplotlib
is imported here only, never on a fast path.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from autoresearch.ledger import Ledger
from autoresearch.loop.store import LoopStore
from autoresearch.loop.views import LoopView, TrialRow, loop_view


def _finished(view: LoopView) -> list[TrialRow]:
    return sorted((t for t in view.trials if t.ended_at and t.state == "succeeded" and t.objective is not None),
                  key=lambda t: (t.ended_at or 0, t.trial_id))


def _best_curve(view: LoopView, trials: list[TrialRow]) -> list[float]:
    sign = 1.0 if view.goal == "minimize" else -1.0
    best, out = math.inf, []
    for t in trials:
        assert t.objective is not None
        if t.role == "explore":
            best = min(best, sign * t.objective)
        out.append(best * sign if best != math.inf else math.nan)
    return out


def _plots(view: LoopView, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files: list[str] = []
    done = _finished(view)
    curve = _best_curve(view, done)
    start = min((t.created_at for t in view.trials), default=0.0)

    values = [float(t.objective or 0.0) for t in done]
    trials = list(range(1, len(done) + 1))
    times = [(t.ended_at or start) - start for t in done]
    for xs, xlabel, what, name in ((trials, "finished trials", "trials", "best_vs_trials.png"),
                                   (times, "seconds since the loop started", "wall time", "best_vs_time.png")):
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.scatter(xs, values, s=12, alpha=0.5, label="trial")
        ax.step(xs, curve, where="post", color="C3", label="best so far")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(view.metric)
        ax.set_title(f"{view.name}: best {view.metric} vs {what}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / name, dpi=100)
        plt.close(fig)
        files.append(name)

    explore = [t for t in done if t.role == "explore" and t.params]
    names = sorted({k for t in explore for k in t.params})
    if explore and names:
        fig, ax = plt.subplots(figsize=(max(4, 1.6 * len(names) + 2), 4))
        columns: list[list[float]] = []
        labels: list[str] = []
        for name in names:
            raw = [t.params.get(name) for t in explore]
            numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in raw)
            if numeric:
                vals = [float(v) for v in raw]  # type: ignore[arg-type]
                if min(vals) > 0 and max(vals) / min(vals) > 50:
                    vals = [math.log10(v) for v in vals]
                    labels.append(f"log10 {name}")
                else:
                    labels.append(name)
            else:
                cats = sorted({str(v) for v in raw})
                vals = [float(cats.index(str(v))) for v in raw]
                labels.append(f"{name} ({'/'.join(cats)[:30]})")
            lo, hi = min(vals), max(vals)
            columns.append([(v - lo) / (hi - lo) if hi > lo else 0.5 for v in vals])
        objectives = [t.objective or 0.0 for t in explore]
        lo, hi = min(objectives), max(objectives)
        cmap = matplotlib.colormaps["viridis" if view.goal == "minimize" else "viridis_r"]  # better is darker
        for i, value in enumerate(objectives):
            shade = (value - lo) / (hi - lo) if hi > lo else 0.5
            ax.plot(range(len(names)), [col[i] for col in columns], color=cmap(shade), alpha=0.7, lw=1)
        ax.set_xticks(range(len(names)), labels, rotation=15)
        ax.set_yticks([])
        ax.set_title(f"parameters of finished trials (colour: {view.metric}, darker is better)")
        fig.tight_layout()
        fig.savefig(out / "parallel.png", dpi=100)
        plt.close(fig)
        files.append("parallel.png")

    code = [t for t in view.trials if t.has_patch or (t.parent_trial and t.role == "explore")]
    if code:
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
            ax.scatter([x], [y], color=color, s=30, zorder=3)
            label = f"#{t.trial_id} {t.objective:.4g}" if t.objective is not None else f"#{t.trial_id} {t.state}"
            ax.annotate(label, (x, y), xytext=(4, 0), textcoords="offset points", fontsize=7, va="center")
        ax.set_xlabel("edits from the base")
        ax.set_yticks([])
        ax.set_title("lineage of code-edit trials (green kept, red failed)")
        fig.tight_layout()
        fig.savefig(out / "lineage.png", dpi=100)
        plt.close(fig)
        files.append("lineage.png")
    return files


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


def summary_markdown(view: LoopView, plan: dict[str, Any], files: list[str]) -> str:
    sign = 1.0 if view.goal == "minimize" else -1.0
    lines = [f"# Loop `{view.name}`", ""]
    lines.append(f"Objective: **{view.goal} `{view.metric}`** · state: {view.state}"
                 + (f" ({view.stop_reason})" if view.stop_reason else ""))
    lines.append("")
    if view.best_trial is not None:
        seeds = f" (mean of {view.best_seeds} seeds)" if view.best_seeds > 1 else ""
        lines.append(f"**Best:** trial {view.best_trial}: `{view.metric}` = {_fmt(view.best_value)}{seeds}  ")
        lines.append(f"params: `{json.dumps(view.best_params, sort_keys=True)}`")
    else:
        lines.append("**Best:** no trial finished with the objective yet.")
    lines.append("")
    if plan.get("repeats"):
        if view.noise_floor is not None:
            lines.append(f"**Noise floor:** ±{view.noise_floor:.4g} (pooled std of `{view.metric}` over seeds); "
                         f"{view.rejected_as_noise} apparent gain(s) within it were not kept.")
        else:
            lines.append("**Noise floor:** not measured yet (no configuration has two finished seeds).")
    else:
        lines.append("**Noise floor:** not measured (add `repeats: {seeds: 3}` to the plan); a gain smaller than "
                     "seed-to-seed noise may be luck.")
    lines.append("")
    counts = ", ".join(f"{k} {v}" for k, v in sorted(view.counts.items()))
    lines.append(f"Trials: {counts} · budget {view.budget_trials} at parallel {view.parallel} · "
                 f"wall {view.elapsed_s:.1f} s · decisions {view.decisions}"
                 + (f" · LLM ${view.llm_usd:.4f} ({view.tokens} tokens)" if view.tokens else ""))
    lines.append("")
    ranked = sorted((t for t in view.trials if t.state == "succeeded" and t.objective is not None),
                    key=lambda t: sign * (t.objective or 0.0))[:10]
    if ranked:
        lines += ["## Leaderboard", "", f"| trial | role | seed | {view.metric} | params |", "|---|---|---|---|---|"]
        for t in ranked:
            lines.append(f"| {t.trial_id} | {t.role} | {t.seed} | {_fmt(t.objective)} | "
                         f"`{json.dumps(t.params, sort_keys=True)}` |")
        lines.append("")
    failed = [t for t in view.trials if t.state in ("failed", "crashed")]
    if failed:
        lines += ["## Failures", ""]
        for t in failed[:5]:
            first = (t.failure or "").strip().splitlines()[:1]
            lines.append(f"- trial {t.trial_id} ({t.state}): {first[0] if first else 'no detail'}")
        lines.append("")
    if files:
        lines += ["## Plots", ""] + [f"![{f}]({f})" for f in files] + [""]
    return "\n".join(lines)


def write_report(ledger: Ledger, name: str, out_dir: str | Path | None = None, plots: bool = True) -> LoopView:
    view = loop_view(ledger, name)
    loop = LoopStore.find(ledger, name)
    plan = json.loads(loop["plan"]) if loop else {}
    out = Path(out_dir) if out_dir else ledger.home / "loops" / name / "report"
    out.mkdir(parents=True, exist_ok=True)
    files = _plots(view, out) if plots and view.trials else []
    (out / "summary.md").write_text(summary_markdown(view, plan, files))
    view.report_dir = str(out)
    return view

