"""Budgets and the end of a loop, for the controller: when to stop (wall, GPU hours, steps, LLM
spend, all trials crashed, an agent's ``stop_loop``, the trial budget, an exhausted space)
and, for a hard stop, which trials still running to stop. Works on the
:class:`~autoresearch.loop.state.LoopState`.

GPU hours, ``steps`` (the compute budget: reported steps summed over all trials) and LLM
dollars normally stop launching and let running trials finish (``budget.stop_in_flight``
stops them too for ``steps``: the overshoot is then at most what they reported before their
stop decision); with
``hard_budgets`` (``--ci``) every budget stops the running trials too, a ``max_wall``
(``--max-wall``) caps the wall time whatever the plan says, and trials that have not ended
``HARD_STOP_WAIT_S`` after their grace are left behind (named in the stop reason) rather
than waited for: a CI job ends with its report, never hangs."""

from __future__ import annotations

import time
from typing import Any

from autoresearch.loop.state import LoopState

HARD_STOP_WAIT_S = 60.0  # beyond the plan's grace: how long a hard stop waits for trials to end


def check_limits(s: LoopState) -> list[int]:
    """Set ``s.stop_reason`` once a budget is spent; returns the running trials a hard stop
    must stop now (the controller decides and cancels them)."""
    b = s.plan.budget
    reason = s.stop_reason
    walls = [w for w in (b.wall, s.max_wall) if w is not None]
    if not reason and walls and s.elapsed() >= min(walls):
        reason = f"wall budget {min(walls):g}s used" + (" (--max-wall)" if min(walls) != b.wall else "")
    if not reason and b.gpu_hours is not None and gpu_hours(s) >= b.gpu_hours:
        reason = f"gpu_hours budget {b.gpu_hours:g} used"
    if not reason and b.steps is not None and steps_used(s) >= b.steps:
        reason = f"steps budget {b.steps} used ({steps_used(s)} steps reported by all trials)"
    if not reason and b.llm_usd is not None and llm_spent(s) >= b.llm_usd:
        reason = f"llm_usd budget ${b.llm_usd:g} used"
    if not reason and s.state_counts["crashed"] >= b.trials:
        reason = "every trial crashed on infrastructure failures; check `autoresearch nodes`"
    if not reason:  # the MCP tool stop_loop (autoresearch/loop/ops.py) records this decision
        stop, s.decisions_looked = s.store.stop_loop_after(s.decisions_looked, s.wall_started_at())
        reason = f"stopped by stop_loop: {stop['rationale']}" if stop is not None else ""
    if reason and not s.stop_reason:
        s.stop_reason = reason
    soft = ("llm_usd", "gpu_hours") if b.stop_in_flight else ("llm_usd", "gpu_hours", "steps")
    hard = s.stop_reason and (s.hard_budgets or not s.stop_reason.startswith(soft))
    if not hard:
        return []
    if s.hard_budgets and s.stop_deadline is None:
        s.stop_deadline = time.monotonic() + s.plan.trial.grace + HARD_STOP_WAIT_S
    return [trial_id for trial_id in list(s.active)
            if trial_id not in s.stopping and trial_id not in s.finishing and s.active[trial_id]["job_id"] is not None]


def llm_spent(s: LoopState) -> float:
    """The loop's LLM spend in dollars, every decision's ``cost_usd`` (written once, with the
    decision): the decisions made since the last look are added to the running sum."""
    row = s.store.decision_totals_since(s.llm_looked)
    if row is not None:
        s.llm_usd_spent += float(row["usd"])
        s.llm_looked = int(row["last"])
    return s.llm_usd_spent


def steps_used(s: LoopState) -> int:
    """Compute spent so far: the last step each trial reported (its curve of the objective),
    summed over every trial of the loop, stopped, failed and repeats included."""
    return sum(series[-1][0] for series in s.series.values() if series)


def gpu_hours(s: LoopState) -> float:
    if not s.plan.trial.gpus:
        return 0.0
    return s.store.gpu_seconds(now=s.now_ts()) * s.plan.trial.gpus / 3600


def done(s: LoopState, call: Any) -> bool:
    """Whether the loop ends now (nothing running, and nothing more to launch); ``call``: the
    propose() call in flight, if any."""
    if s.stop_deadline is not None and time.monotonic() > s.stop_deadline:
        if s.active:  # the backend did not end them: say so, do not hang
            s.stop_reason += (f"; trial(s) {', '.join(str(t) for t in sorted(s.active))} did not end within "
                              f"{s.plan.trial.grace + HARD_STOP_WAIT_S:g}s of the stop and were left behind")
            s.active.clear()
        return True
    if s.active:
        return False
    if s.stop_reason:  # _fill no longer collects a call that ends after the stop: do not wait for it
        return call is None or not call.is_alive()
    if call is not None:
        return False
    pending = s.pending()
    if s.launched() >= s.plan.budget.trials:
        s.stop_reason = f"trial budget {s.plan.budget.trials} used"
        return True
    if s.exhausted and not pending:
        s.stop_reason = "the proposer has nothing more to propose (space exhausted)"
        return True
    return False
