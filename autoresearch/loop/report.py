"""The loop's report: plots, a Markdown summary and an HTML report, saved and logged to MLflow.

``autoresearch report NAME`` (and the end of ``autoresearch run``) writes, under
``$AUTORESEARCH_HOME/loops/NAME/report/`` (figures: :mod:`autoresearch.loop._plots`):

* ``best_vs_trials.png``   every ended trial (early-stopped at their last value, seed repeats,
                           gains within noise) and the incumbent the loop kept, ± the noise floor;
* ``best_vs_time.png``     the same against wall time, with every trial's (partial) curve;
* ``learning_curves.png``  the objective by step per trial, with the ASHA rungs, end labels apart;
* ``parallel.png``         parallel coordinates (optuna's: real axes, log where the space is log,
                           a colour bar; darker is better, the worst still visible, the incumbent red);
* ``importances.png``      parameter importances (optuna's fANOVA over the finished trials);
* ``lineage.png``          the tree of code-edit trials (parent -> child), when there is one;
* ``summary.md``           the incumbent, the noise floor, a leaderboard, budgets, failures;
* ``report.html``          all of it in one self-contained page (:mod:`autoresearch.loop._html`).

"Best" everywhere is :func:`autoresearch.loop.views.incumbent_sequence`. The facade then has
the mirror attach the files to the loop's MLflow run (when tracking is on:
:func:`autoresearch.tracking.log_to_mlflow`, through the outbox). matplotlib and optuna are
imported by the figures only, never on a fast path.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from autoresearch.loop import _html, _plots
from autoresearch.loop.store import LoopStore
from autoresearch.loop.views import LoopView, confirmed_text, loop_view, mark, ranked
from autoresearch.store.ledger import Ledger

LEADERBOARD_ROWS = 10


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


def summary_markdown(view: LoopView, plan: dict[str, Any], files: list[str]) -> str:
    """The summary (Markdown): the incumbent the loop kept, the noise floor, a leaderboard, failures, plots."""
    lines = [f"# Loop `{view.name}`", ""]
    lines.append(f"Objective: **{view.goal} `{view.metric}`** · state: {view.state}"
                 + (f" ({view.stop_reason})" if view.stop_reason else ""))
    lines.append("")
    if view.best_trial is not None:
        seeds = f" (mean of {view.best_seeds} seeds)" if view.best_seeds > 1 else ""
        status = confirmed_text(view, plan)
        best_job = next((t.job_id for t in view.trials if t.trial_id == view.best_trial), None)
        job = f" (job {best_job}: `autoresearch logs T{view.best_trial}`)" if best_job is not None else ""
        lines.append(f"**Best:** trial {view.best_trial}{job}: `{view.metric}` = {_fmt(view.best_value)}{seeds}, "
                     "the incumbent the loop kept" + (f" · **{status}**" if status else "") + "  ")
        lines.append(f"params: `{json.dumps(view.best_params, sort_keys=True)}`")
        within = [t for t in view.trials if t.within_noise]
        if within:
            lines.append("")
            lines.append("Gains within the noise floor, not kept (better than the incumbent of their time by less "
                         "than the floor): " + ", ".join(
                f"trial {t.trial_id} ({_fmt(t.objective)})" for t in within[:10]) + ".")
    else:
        lines.append("**Best:** no trial finished with the objective yet.")
    lines.append("")
    if plan.get("repeats"):
        if view.noise_floor is not None:
            lines.append(f"**Noise floor:** ±{view.noise_floor:.4g} of `{view.metric}` ({view.noise_basis}): a "
                         "challenger must beat the incumbent's mean by more than this to replace it; "
                         f"{view.rejected_as_noise} apparent gain(s) within the floor of their time were not kept.")
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
    if view.budget_spent:
        lines.append(f"**Budgets spent / given:** {view.budget_spent}.")
    if view.warm_start:
        lines.append(f"**Warm start:** {view.warm_start.removeprefix('warm start: ')}.")
    lines.append("")
    board = ranked(view)
    if board:
        lines += ["## Leaderboard", "",
                  "The incumbent is the trial the loop kept (noise-aware); a run *within noise* beat the incumbent "
                  "of its time by less than the noise floor and was not kept.", "",
                  f"| trial | job | role | seed | {view.metric} | loop's verdict | params |",
                  "|---|---|---|---|---|---|---|"]
        for t in board[:LEADERBOARD_ROWS]:
            lines.append(f"| {t.trial_id} | {'-' if t.job_id is None else t.job_id} | {t.role} | {t.seed} | {_fmt(t.objective)} | {mark(t, view) or '-'} | "
                         f"`{json.dumps(t.params, sort_keys=True)}` |")
        if len(board) > LEADERBOARD_ROWS:
            lines.append(f"\n{len(board) - LEADERBOARD_ROWS} more succeeded trial(s) not shown "
                         "(the loop's MLflow experiment lists every trial).")
        lines.append("")
    failed = [t for t in view.trials if t.state in ("failed", "crashed")]
    if failed:
        lines += ["## Failures", ""]
        for t in failed[:5]:
            first = (t.failure or "").strip().splitlines()[:1]
            job = f", job {t.job_id}" if t.job_id is not None else ""
            lines.append(f"- trial {t.trial_id} ({t.state}{job}): {first[0] if first else 'no detail'}")
        lines.append("")
    if files:
        lines += ["## Plots", ""] + [f"![{f}]({f})" for f in files] + [""]
    return "\n".join(lines)


def _save(data: _plots.ReportData, out: Path, only: tuple[str, ...] | None = None) -> list[str]:
    """Write the figures as PNG (and keep them for the HTML report as SVG): the PNG file names."""
    files = []
    svgs: dict[str, str] = {}
    figures = _plots.figures(data, only)
    while True:
        try:
            item = next(figures, None)
            if item is None:
                break
            name, fig = item
            fig.savefig(out / f"{name}.png", dpi=110)
            files.append(f"{name}.png")
            if only is None:
                svgs[name] = _html.svg_of(fig)
            _plots.close(fig)
        except Exception as err:  # noqa: BLE001 - one figure a plan's odd text breaks must not lose the rest
            print(f"autoresearch: a report figure was left out ({type(err).__name__}: {str(err)[:200]})",
                  file=sys.stderr)
    if only is None:
        (out / "report.html").write_text(_html.render(data, summary_markdown(data.view, data.plan, files), svgs))
    return files


def _data(ledger: Ledger, name: str) -> _plots.ReportData:
    view = loop_view(ledger, name)
    loop = LoopStore.find(ledger, name)
    plan = json.loads(loop["plan"]) if loop else {}
    return _plots.load(ledger, view, plan)


def write_report(ledger: Ledger, name: str, out_dir: str | Path | None = None, plots: bool = True) -> LoopView:
    """Write the report of loop ``name`` (plots, ``summary.md``, ``report.html``) to ``out_dir``
    (default: ``$AUTORESEARCH_HOME/loops/NAME/report``)."""
    data = _data(ledger, name)
    out = Path(out_dir) if out_dir else ledger.home / "loops" / name / "report"
    out.mkdir(parents=True, exist_ok=True)
    files = _save(data, out) if plots and data.view.trials else []
    (out / "summary.md").write_text(summary_markdown(data.view, data.plan, files))
    if out_dir is None:  # under the home: private like the rest of it (a folder you named keeps your umask)
        from autoresearch.util._private import tighten

        tighten(out)
    data.view.report_dir = str(out)
    return data.view


def summary_with_plot(ledger: Ledger, name: str, plot_path: str | Path) -> tuple[str, Path | None]:
    """The summary Markdown of loop ``name`` and its best-so-far plot, written to ``plot_path``
    (a PNG; None when no trial has ended). For callers that publish a short summary (a CI
    job summary): the same incumbent and plot as the full report."""
    data = _data(ledger, name)
    path = Path(plot_path)
    fig = _plots.plot_best_vs_trials(data) if data.view.trials else None
    if fig is None:
        return summary_markdown(data.view, data.plan, []), None
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    _plots.close(fig)
    return summary_markdown(data.view, data.plan, []), path
