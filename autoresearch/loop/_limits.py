"""Budgets and the end of a loop, for the controller: when to stop (wall, GPU hours, steps, LLM
spend, all trials crashed, an agent's ``stop_loop``, the trial budget, an exhausted space)
and, for a hard stop, which trials still running to stop. Works on the
:class:`~autoresearch.loop.state.LoopState`.

GPU hours and ``steps`` (the compute budget: reported steps summed over all trials) hold: once
one is spent nothing more launches and the running trials are stopped (stop decisions), so the
overshoot is at most what they reported since the last look, before their stop
(``budget.stop_in_flight: false`` lets them finish instead); LLM dollars stop proposing; with
``hard_budgets`` (``--ci``) every budget stops the running trials too, a ``max_wall``
(``--max-wall``) caps the wall time whatever the plan says, and trials that have not ended
``HARD_STOP_WAIT_S`` after their grace are left behind (named in the stop reason) rather
than waited for: a CI job ends with its report, never hangs."""

from __future__ import annotations

import difflib
import json
import re
import time
from typing import Any

from autoresearch.loop.state import LoopState
from autoresearch.loop.store import ENDED_TRIAL as ENDED
from autoresearch.loop.views import CANNOT_LEARN

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
    if not reason and not s.learning_seen:
        reason = cannot_learn(s)
    if not reason and s.state_counts["crashed"] >= b.trials:
        reason = "every trial crashed on infrastructure failures; check `autoresearch nodes`"
    if not reason:  # the MCP tool stop_loop (autoresearch/loop/ops.py) records this decision
        stop, s.decisions_looked = s.store.stop_loop_after(s.decisions_looked, s.wall_started_at())
        reason = f"stopped by stop_loop: {stop['rationale']}" if stop is not None else ""
    if reason and not s.stop_reason:
        s.stop_reason = reason
    # steps and gpu_hours hold: the running trials are stopped once one is spent (unless stop_in_flight: false)
    soft = ("llm_usd", "gpu_hours", "steps") if b.stop_in_flight is False else ("llm_usd",)
    hard = s.stop_reason and (s.hard_budgets or not s.stop_reason.startswith(soft))
    if not hard:
        return []
    if s.hard_budgets and s.stop_deadline is None:
        s.stop_deadline = time.monotonic() + s.plan.trial.grace + HARD_STOP_WAIT_S
    return [trial_id for trial_id in list(s.active)
            if trial_id not in s.stopping and trial_id not in s.finishing and s.active[trial_id]["job_id"] is not None]


FAILED = ("failed", "crashed")
_DECISIVE = re.compile(r"error|exception|traceback|fatal|killed|not found|no such|denied|disk full|out of memory|"
                       r"cannot|can't|unable|invalid|abort", re.IGNORECASE)


def fail_fast_count(s: LoopState) -> int:
    """N of the fail-fast rule: the plan's ``budget.fail_fast``, else max(3, parallel); at most the budget."""
    b = s.plan.budget
    n = b.fail_fast if b.fail_fast is not None else max(3, b.parallel)
    return min(n, b.trials)


def cannot_learn(s: LoopState) -> str:
    """The stop reason (``CANNOT_LEARN`` ...) when the loop's first N trials (:func:`fail_fast_count`,
    repeats aside) have all ended failed or crashed and either none reported the objective or all failed
    the same way: the first one's decisive log line, and the metric names they did print. '' otherwise;
    once one of them ends any other way, ``learning_seen`` ends the check for good."""
    n = fail_fast_count(s)
    if n <= 0:
        s.learning_seen = True
        return ""
    first = [row for _, row in sorted(s.rows.items()) if row.get("role") != "repeat"][:n]
    if any(row["state"] not in FAILED and row["state"] in ENDED or row.get("objective") is not None for row in first):
        s.learning_seen = True  # one of them did something to learn from
        return ""
    if len(first) < n or any(row["state"] not in FAILED for row in first):
        return ""  # not all ended yet
    failures = [str(row.get("failure") or "") for row in first]
    ways = {text.partition("\n")[0] for text in failures}
    metric = s.plan.objective.metric
    printed = sorted({name for row in first for name in _metric_names(row)} - {metric})
    unseen = all(metric not in _metric_names(row) for row in first)
    if not unseen and len(ways) > 1:
        return ""
    way = failures[0].partition("\n")[0] or "no reason recorded"
    alike = len(ways) == 1 and not way.startswith("exited 0 but never reported")
    if unseen:
        why = f"none of the first {n} trial(s) reported the objective {metric!r}" + (
            f"; all failed alike: {way}" if alike else "")
    else:
        why = f"the first {n} trial(s) all failed alike: {way}"
    out = CANNOT_LEARN + why + f"; trial {first[0]['id']}'s log: {decisive_line(failures[0]) or '(empty)'}"
    if unseen:
        close = difflib.get_close_matches(metric, printed, n=3, cutoff=0.5)
        if close:
            out += f"; did you mean {' or '.join(repr(c) for c in close)}? (objective.metric is {metric!r})"
        elif printed:
            out += f"; they printed {', '.join(repr(p) for p in printed[:8])}, not {metric!r}"
        else:
            out += f"; they printed no metric (report({metric}=...) or a '{metric}: VALUE' line)"
    return out[:1500]


def decisive_line(failure: str) -> str:
    """The line of a failed trial's failure text (its reason, then its log's tail) that most likely says why:
    the last that looks like an error, else the log's last line."""
    lines = [line.strip() for line in failure.splitlines()[1:] if line.strip()]
    for line in reversed(lines):
        if _DECISIVE.search(line):
            return line[:300]
    return lines[-1][:300] if lines else ""


def _metric_names(row: dict[str, Any]) -> set[str]:
    try:
        data = json.loads(row.get("metrics") or "{}")
    except (TypeError, ValueError):
        return set()
    return {str(k) for k in data} if isinstance(data, dict) else set()


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


def spent(s: LoopState) -> dict[str, list[float]]:
    """The compute budgets the plan gives, each as [spent, given] (the finish decision's ``spent``)."""
    b, out = s.plan.budget, {}
    if b.steps is not None:
        out["steps"] = [float(steps_used(s)), float(b.steps)]
    if b.gpu_hours is not None:
        out["gpu_hours"] = [round(gpu_hours(s), 4), float(b.gpu_hours)]
    walls = [w for w in (b.wall, s.max_wall) if w is not None]
    if walls:
        out["wall_s"] = [round(s.elapsed(), 1), float(min(walls))]
    return out


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
