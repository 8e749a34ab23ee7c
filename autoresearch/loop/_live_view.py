"""The running controller's view of its loop for a live display, kept up to date as trials
change instead of rebuilt from the ledger: per update it reads only the decisions written
since the last one (an index range) and builds rows only for the trials a live table shows
(the active ones, the newest ended ones, the incumbent); the rest is a count
(``LoopView.not_shown``). So the display's cost per trial event stays flat however many
trials have run (issue 16). The final view, the report and ``--json`` read the whole loop
from the ledger (:func:`autoresearch.loop.views.loop_view`).

The incumbent sequence is :class:`~autoresearch.loop.views.IncumbentTracker`, the same code
as :func:`~autoresearch.loop.views.incumbent_sequence`, fed in the order the controller ended
and judged its trials."""

from __future__ import annotations

from collections import deque
from typing import Any

from autoresearch.loop.noise import incumbent_floor
from autoresearch.loop.state import LoopState
from autoresearch.loop.views import (
    CurveStep,
    IncumbentTracker,
    LoopView,
    TrialRow,
    Verdict,
    incumbent_sequence,
    to_verdict,
)

RECENT = 32  # ended trials a live view carries (a live table shows at most 18 rows)
PENDING_SHOWN = 8  # proposed trials not launched yet that it carries


class LiveView:
    def __init__(self, state: LoopState) -> None:
        self.s = state
        self.tracker: IncumbentTracker | None = None  # None until the first view (then it replays the past once)
        self.verdicts: dict[int, Verdict] = {}
        self.steps: dict[int, CurveStep] = {}  # trial id -> the incumbent sequence's step at its end
        self.recent: deque[int] = deque(maxlen=RECENT)
        self.after_promote = 0  # the newest promote decision read
        self.after_decision = 0  # the newest decision counted in the totals
        self.decisions, self.usd, self.tokens = 0, 0.0, 0
        self.rejected = 0
        self.durations, self.succeeded_timed = 0.0, 0

    def _start(self) -> None:
        """Once: the trials that ended before this view (a resumed loop), replayed in full."""
        s = self.s
        self.tracker = IncumbentTracker(s.sign)
        for row in s.store.promotions():
            self._verdict(row)
        ended = [r for r in s.rows.values() if r["ended_at"]]
        for step in incumbent_sequence(ended, self.verdicts, self.tracker):
            self._ended(s.rows[step.trial_id], step)
        s.ended_log.clear()

    def _verdict(self, row: Any) -> None:
        self.after_promote = max(self.after_promote, int(row["id"]))
        verdict = to_verdict(row)
        if verdict is None:
            return
        self.verdicts[verdict.trial_id] = verdict
        self.rejected += verdict.within_noise

    def _ended(self, row: Any, step: CurveStep) -> None:
        self.steps[row["id"]] = step
        self.recent.append(row["id"])
        if row["state"] == "succeeded" and row["started_at"] and row["ended_at"]:
            self.durations += float(row["ended_at"]) - float(row["started_at"])
            self.succeeded_timed += 1

    def _catch_up(self) -> None:
        """What changed since the last view: new decisions (an index range), trials that ended."""
        s = self.s
        if self.tracker is None:
            self._start()
        assert self.tracker is not None
        for row in s.store.promotions(self.after_promote):
            self._verdict(row)
        for trial_id in s.ended_log:
            row = s.rows[trial_id]
            if row["ended_at"]:
                self._ended(row, self.tracker.step(row, self.verdicts.get(trial_id)))
        s.ended_log.clear()
        totals = s.store.decision_totals_since(self.after_decision)
        if totals is not None:
            self.decisions += int(totals["n"])
            self.usd += float(totals["usd"])
            self.tokens += int(totals["tok"])
            self.after_decision = int(totals["last"])

    def view(self, name: str, live: dict[int, tuple[int, float]], elapsed_s: float) -> LoopView:
        self._catch_up()
        s, plan = self.s, self.s.plan
        incumbent = self.tracker.incumbent if self.tracker is not None else None
        shown = set(s.active) | set(sorted(s.proposed)[:PENDING_SHOWN]) | set(self.recent)
        if incumbent is not None:
            shown.add(incumbent)
        trials = [self._row(s.rows[t], live) for t in sorted(shown) if t in s.rows]
        inc_row = s.rows.get(incumbent) if incumbent is not None else None
        best_value = None
        if inc_row is not None and inc_row["objective"] is not None:
            values = s.groups.get(inc_row["id"], [inc_row["objective"]])
            best_value = sum(values) / len(values)
        floor = incumbent_floor(incumbent, s.groups, s.sign)
        eta = None
        if self.succeeded_timed:
            remaining = max(0, plan.budget.trials - s.launched())
            mean = self.durations / self.succeeded_timed
            eta = mean * (remaining / max(1, plan.budget.parallel) + (1 if s.active else 0))
        return LoopView(
            name=name, loop_id=s.store.loop_id, state="running", metric=plan.objective.metric,
            goal=plan.objective.goal, trials=trials, counts={k: n for k, n in s.state_counts.items() if n > 0},
            best_trial=incumbent, best_value=best_value,
            best_params=dict(s.records[incumbent].params) if inc_row is not None and incumbent is not None else {},
            best_seeds=len(s.groups.get(incumbent, [1])) if incumbent is not None else 0,
            noise_floor=floor.value, noise_basis=floor.basis(incumbent), rejected_as_noise=self.rejected,
            decisions=self.decisions, llm_usd=self.usd, tokens=self.tokens, elapsed_s=elapsed_s, eta_s=eta,
            budget_trials=plan.budget.trials, parallel=plan.budget.parallel, stop_reason="",
            next_step="follow with `autoresearch run <plan> --resume`; stop trials with `autoresearch cancel JOB`",
            not_shown=len(s.rows) - len(trials), blocked=s.blocked)

    def _row(self, r: Any, live: dict[int, tuple[int, float]]) -> TrialRow:
        step, value = live.get(r["id"], (None, None))
        verdict = self.verdicts.get(r["id"])
        point = self.steps.get(r["id"])
        return TrialRow(r["id"], r["job_id"], r["role"], r["state"], self.s.records[r["id"]].params, r["seed"],
                        r["parent_trial"], r["objective"], point.value if point else None, step, value,
                        r["created_at"], r["started_at"], r["ended_at"], r["rationale"], r["failure"],
                        bool(r["patch"]), kept=bool(verdict and verdict.promoted),
                        within_noise=bool(verdict and verdict.within_noise),
                        incumbent_after=point.incumbent if point else None)
