"""Budgets and the end of a loop, for the controller: when to stop (wall, GPU hours, LLM
spend, all trials crashed, an agent's ``stop_loop``, the trial budget, an exhausted space)
and, for a hard stop, which trials still running to stop. Works on the
:class:`~autoresearch.loop.state.LoopState`."""

from __future__ import annotations

import time
from typing import Any

from autoresearch.loop.state import LoopState


def check_limits(s: LoopState) -> list[int]:
    """Set ``s.stop_reason`` once a budget is spent; returns the running trials a hard stop
    must stop now (the controller decides and cancels them)."""
    b = s.plan.budget
    reason = s.stop_reason
    if not reason and b.wall is not None and s.elapsed() >= b.wall:
        reason = f"wall budget {b.wall:g}s used"
    if not reason and b.gpu_hours is not None and gpu_hours(s) >= b.gpu_hours:
        reason = f"gpu_hours budget {b.gpu_hours:g} used"
    if not reason and b.llm_usd is not None and s.store.llm_cost() >= b.llm_usd:
        reason = f"llm_usd budget ${b.llm_usd:g} used"
    if not reason and s.state_counts["crashed"] >= b.trials:
        reason = "every trial crashed on infrastructure failures; check `autoresearch nodes`"
    if not reason:  # the MCP tool stop_loop (autoresearch/loop/ops.py) records this decision
        stop = s.store.stop_loop_since(time.time() - s.elapsed() + s.prior_elapsed)
        reason = f"stopped by stop_loop: {stop['rationale']}" if stop is not None else ""
    if reason and not s.stop_reason:
        s.stop_reason = reason
    hard = s.stop_reason and not s.stop_reason.startswith(("llm_usd", "gpu_hours"))
    if not hard:
        return []
    return [trial_id for trial_id in list(s.active)
            if trial_id not in s.stopping and s.active[trial_id]["job_id"] is not None]


def gpu_hours(s: LoopState) -> float:
    if not s.plan.trial.gpus:
        return 0.0
    return s.store.gpu_seconds() * s.plan.trial.gpus / 3600


def done(s: LoopState, call: Any) -> bool:
    """Whether the loop ends now (nothing running, and nothing more to launch); ``call``: the
    propose() call in flight, if any."""
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
