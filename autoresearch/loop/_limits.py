"""Budgets and the end of a loop, for the controller: when to stop (wall, GPU hours, LLM
spend, all trials crashed, an agent's ``stop_loop``, the trial budget, an exhausted space)
and, for a hard stop, stopping the trials still running."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from autoresearch.loop.controller import Controller


def check_limits(c: Controller) -> None:
    b = c.plan.budget
    reason = c.stop_reason
    if not reason and b.wall is not None and c.elapsed() >= b.wall:
        reason = f"wall budget {b.wall:g}s used"
    if not reason and b.gpu_hours is not None and gpu_hours(c) >= b.gpu_hours:
        reason = f"gpu_hours budget {b.gpu_hours:g} used"
    if not reason and b.llm_usd is not None and c.store.llm_cost() >= b.llm_usd:
        reason = f"llm_usd budget ${b.llm_usd:g} used"
    if not reason and c.state_counts["crashed"] >= b.trials:
        reason = "every trial crashed on infrastructure failures; check `autoresearch nodes`"
    if not reason:  # the MCP tool stop_loop (autoresearch/loop/ops.py) records this decision
        stop = c.ledger.one("SELECT rationale FROM decisions WHERE loop_id=? AND kind='stop_loop' AND "
                            "created_at>=? LIMIT 1", (c.store.loop_id, time.time() - c.elapsed()
                                                      + c.prior_elapsed))
        reason = f"stopped by stop_loop: {stop['rationale']}" if stop is not None else ""
    if reason and not c.stop_reason:
        c.stop_reason = reason
    hard = c.stop_reason and not c.stop_reason.startswith(("llm_usd", "gpu_hours"))
    if hard:
        for trial_id in list(c.active):
            if trial_id not in c.stopping and c.active[trial_id]["job_id"] is not None:
                c._stop(trial_id, f"stopping the loop: {c.stop_reason}", {"reason": c.stop_reason})


def gpu_hours(c: Controller) -> float:
    if not c.plan.trial.gpus:
        return 0.0
    row = c.ledger.one(
        "SELECT COALESCE(SUM(COALESCE(j.ended_at, ?) - j.started_at), 0) AS s FROM trials t JOIN jobs j "
        "ON j.id=t.job_id WHERE t.loop_id=? AND j.started_at IS NOT NULL", (time.time(), c.store.loop_id))
    return float(row["s"] if row else 0.0) * c.plan.trial.gpus / 3600


def done(c: Controller) -> bool:
    if c.active:
        return False
    if c.stop_reason:  # _fill no longer collects a call that ends after the stop: do not wait for it
        return c.call is None or not c.call.is_alive()
    if c.call is not None:
        return False
    pending = c._pending()
    if c._launched() >= c.plan.budget.trials:
        c.stop_reason = f"trial budget {c.plan.budget.trials} used"
        return True
    if c.exhausted and not pending:
        c.stop_reason = "the proposer has nothing more to propose (space exhausted)"
        return True
    return False
