"""The live table of ``autoresearch run`` (rich) and its final summary.

On a terminal: a table refreshed in place (trial, params, state, metric, best so far,
ETA). Without one (CI logs): one line per finished trial, then the summary.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from rich.markup import escape

if TYPE_CHECKING:  # the loop's views (models); a face reads them, never the loop itself
    from autoresearch.loop.views import LoopView, TrialRow

STYLE = {"proposed": "dim", "queued": "yellow", "running": "cyan", "succeeded": "green", "failed": "red",
         "stopped": "magenta", "crashed": "red", "cancelled": "magenta", "skipped": "dim"}
ROWS = 18


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.5g}"


def _dur(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    return f"{seconds:.0f}s" if seconds < 90 else f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def _params(params: dict[str, Any], width: int = 48) -> str:
    text = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())
    return text if len(text) <= width else text[: width - 1] + "…"


class LiveTable:
    def __init__(self, plan: Any, interactive: bool) -> None:
        from rich.console import Console

        self.plan = plan
        self.interactive = interactive
        self.console = Console()
        self.live: Any = None
        self.printed: set[int] = set()
        self.warned: set[int] = set()  # trials whose unseen objective was said (once each)
        self.blocked = ""  # the reason no node runs the queued trials, as last printed

    def __enter__(self) -> LiveTable:
        if self.interactive:
            from rich.live import Live

            self.live = Live(console=self.console, refresh_per_second=4, transient=False)
            self.live.__enter__()
        else:
            self.console.print(f"loop {self.plan.name}: {self.plan.proposer.kind}, {self.plan.budget.trials} trials "
                               f"at parallel {self.plan.budget.parallel}, {self.plan.objective.goal} "
                               f"{self.plan.objective.metric}", highlight=False, markup=False)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)
            self.live = None

    def update(self, view: LoopView) -> None:
        if self.live is not None:
            self.live.update(self._table(view))
            return
        if view.blocked != self.blocked:  # once, and again when it changes or clears
            self.console.print(f"waiting: {view.blocked}; the loop waits for a node (Ctrl-C stops it)" if view.blocked
                               else "no longer waiting for a node", highlight=False, markup=False,
                               soft_wrap=True)
            self.blocked = view.blocked
        for trial_id, text in self._unseen(view):
            self.console.print(f"warning: trial {trial_id}: {text}", highlight=False, markup=False, soft_wrap=True)
        for t in view.trials:
            if t.ended_at and t.trial_id not in self.printed:
                self.printed.add(t.trial_id)
                note = " (within noise: not kept)" if t.within_noise else " (kept: new incumbent)" if t.kept else ""
                if t.role == "repeat" and t.parent_trial is not None and t.incumbent_after is not None:
                    # best moves with the seeds (a mean), and may go back to an earlier incumbent: say so
                    note = (f" (seed of #{t.parent_trial}; best: incumbent #{t.incumbent_after}'s mean over its "
                            "ended seeds)")
                self.console.print(f"trial {t.trial_id}{_job(t.job_id)} {t.state} {view.metric}={_num(t.objective)}{note} "
                                   f"best={_num(t.best_so_far)} {_params(t.params, 80)}", highlight=False,
                                   markup=False, soft_wrap=True)

    def _table(self, view: LoopView) -> Any:
        from rich.table import Table

        done = sum(n for s, n in view.counts.items() if s not in ("proposed", "queued", "running", "skipped"))
        title = (f"[bold]{escape(view.name)}[/]  {view.goal} {escape(view.metric)}  trials {done}/{view.budget_trials}  "
                 f"best {_num(view.best_value)}" + (f" (#{view.best_trial})" if view.best_trial else "")
                 + (f" ±{view.noise_floor:.3g}" if view.noise_floor is not None else "")
                 + f"  elapsed {_dur(view.elapsed_s)}  ETA {_dur(view.eta_s)}")
        table = Table(title=title, title_justify="left")
        for col in ("TRIAL", "JOB", "PARAMS", "STATE", "STEP", view.metric.upper(), "BEST SO FAR", "TIME"):
            table.add_column(escape(col), no_wrap=True)
        active = [t for t in view.trials if t.state in ("queued", "running", "proposed")]
        ended = sorted((t for t in view.trials if t.ended_at), key=lambda t: t.ended_at or 0)[-max(0, ROWS - len(active)):]
        shown = sorted(active + ended, key=lambda t: t.trial_id)[-ROWS:]
        if view.best_trial is not None and all(t.trial_id != view.best_trial for t in shown):
            shown = [t for t in view.trials if t.trial_id == view.best_trial] + shown[-(ROWS - 1):]
        for t in shown:
            table.add_row(*self._row(t, view))
        hidden = len(view.trials) - len(shown) + view.not_shown
        if hidden > 0:  # one summary row for the rest (a live view carries only what is shown)
            table.add_row("…", "", f"{hidden} more trial(s) not shown", "", "", "", "", "")
        notes = [f"warning: trial {trial_id}: {text}" for trial_id, text in self._unseen(view, again=True)][:3]
        if view.blocked:
            notes.insert(0, f"waiting: {view.blocked}; the loop waits for a node (Ctrl-C stops it)")
        if hidden > 0:
            counts = ", ".join(f"{n} {state}" for state, n in sorted(view.counts.items()))
            notes.append(f"all trials: {counts} (every one: the report and MLflow)")
        if view.rejected_as_noise or any(t.within_noise for t in view.trials):
            notes.append("~ within noise: better than the incumbent of its time by less than the noise floor, not kept")
        if notes:
            table.caption = escape("\n".join(notes))
            table.caption_justify = "left"
        return table

    def _unseen(self, view: LoopView, again: bool = False) -> list[tuple[int, str]]:
        """Running trials that have not shown the objective after UNSEEN_AFTER_S: once each in a log
        (``again``: every refresh, for the live table, while it lasts)."""
        from autoresearch.api import UNSEEN_AFTER_S, unseen_warning

        now, out = time.time(), []
        for t in view.trials:
            if t.state != "running" or t.step is not None or t.value is not None or not t.started_at:
                continue
            if now - t.started_at < UNSEEN_AFTER_S or (t.trial_id in self.warned and not again):
                continue
            self.warned.add(t.trial_id)
            out.append((t.trial_id, unseen_warning(view.metric, now - t.started_at)))
        return out

    @staticmethod
    def _row(t: TrialRow, view: LoopView) -> list[str]:
        value = t.objective if t.ended_at else t.value
        now = t.ended_at or time.time()
        runtime = now - t.started_at if t.started_at else None
        tag = " (seed)" if t.role == "repeat" else ""
        tag += " *" if t.trial_id == view.best_trial else " ~" if t.within_noise else ""
        return [f"{t.trial_id}{tag}", "-" if t.job_id is None else str(t.job_id), escape(_params(t.params)), f"[{STYLE.get(t.state, 'white')}]{t.state}[/]",
                "-" if t.step is None else str(t.step), _num(value), _num(t.best_so_far), _dur(runtime)]

    def summary(self, view: LoopView) -> None:
        c = self.console
        c.print(f"[bold]loop {escape(view.name)} {view.state}[/]: {escape(view.stop_reason or '')}")
        counts = ", ".join(f"{k} {v}" for k, v in sorted(view.counts.items()))
        clock = "simulated time" if _simulated(self.plan) else "wall"  # elapsed_s is simulated on the sim
        c.print(f"trials: {counts}; {clock} {_dur(view.elapsed_s)}; decisions {view.decisions}", highlight=False)
        if view.warm_start:  # which earlier loops' trials warmed the proposer (warm_start:)
            c.print(view.warm_start, highlight=False, markup=False, soft_wrap=True)
        if view.best_trial is not None:
            seeds = f" (mean of {view.best_seeds} seeds)" if view.best_seeds > 1 else ""
            status = ("" if view.best_confirmed is None else " confirmed" if view.best_confirmed
                      else " NOT CONFIRMED (its seeds have not all ended)")
            best_job = next((t.job_id for t in view.trials if t.trial_id == view.best_trial), None)
            c.print(f"best: trial {view.best_trial}{_job(best_job)} {view.metric}={_num(view.best_value)}{seeds}{status} "
                    f"{json.dumps(view.best_params, sort_keys=True)}", highlight=False, markup=False,
                    soft_wrap=True)
        if view.noise_floor is not None:
            c.print(f"noise floor: ±{view.noise_floor:.4g} ({view.noise_basis}; {view.rejected_as_noise} gain(s) "
                    "within the floor of their time not kept)", highlight=False, markup=False, soft_wrap=True)
        if view.report_dir and view.report_state == "writing":
            c.print(f"report: {view.report_dir}/ (plots and summary.md being written in the background; "
                    f"`autoresearch report {view.name}` waits for them)", highlight=False, markup=False,
                    soft_wrap=True)
        elif view.report_dir:
            c.print(f"report: {view.report_dir}/summary.md", highlight=False, markup=False)


def _job(job_id: int | None) -> str:
    """A trial's job beside its id: the number `autoresearch logs` takes (or T<trial>)."""
    return "" if job_id is None else f" (job {job_id})"


def _simulated(plan: Any) -> bool:
    """The plan runs on the sim backend: the loop's elapsed time and ETA are simulated seconds."""
    choice = getattr(plan, "backend_choice", None)
    return callable(choice) and choice()[0] == "sim"
