"""Reproducible sweeps: a seeded ``--ci`` run gives the same trials, decisions and best whatever
order its trials end in.

An asynchronous loop acts on trials as they end and reach rungs, so two runs of the same plan and
code differ as soon as two trials finish in another order: the proposer learns from another
history, an ASHA rung compares a trial with another set of trials (a stop by 0.0785693 against a
cutoff of 0.0784751 in one run of five), the incumbent changes in another order. In ordered mode
(:attr:`LoopState.ordered`, on for a ``--ci`` run whose proposer has a seed and does not block):

* **Endings take effect in trial order.** A trial that ends is recorded in the ledger's jobs at
  once, but its outcome (its state, keep or discard, the proposer's observation, its repeats) waits
  until every trial with a lower id has taken effect (:func:`drain`).
* **Proposals are made only as endings take effect**, one call per ending, with the history of
  the trials that took effect (no curve of a running trial): trial ``k`` is proposed once
  ``k - window`` trials took effect, ``window`` being ``parallel`` plus the queue ahead.
* **A rung is decided once its cohort is in**: trial ``t`` is judged at rung ``r`` against the
  trials below ``t`` only (its Hyperband bracket's), once each of them took effect, was stopped, or
  was judged and kept at ``r`` (:func:`judge_view`); a stopped trial's curve ends at its rung. A
  report() at the rung waits for that verdict (at most ``AUTORESEARCH_STOP_WAIT_S``). A trial that
  ended before its rung could be decided is judged when its ending takes effect: if it would have
  been stopped there, it is recorded ``stopped`` with its value at the rung (a ``stop`` decision
  with ``retroactive: true``), as in a run where the stop came in time.

The price is throughput: a slot may wait for a slow lower trial before the next proposal. The
median and curve rules decide at any step and are not made reproducible (their live stops stay).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from autoresearch.loop.state import LoopHost, LoopState
from autoresearch.loop.stopping import Series, StopVerdict


def eligible(plan: Any, hard_budgets: bool, proposer: Any) -> bool:
    """Ordered mode for a ``--ci`` run (hard budgets) with a seeded, non-blocking proposer."""
    seed = getattr(plan.proposer, "seed", None)
    return bool(hard_budgets and seed is not None and not getattr(proposer, "blocking", False))


def effective(s: LoopState, trial_id: int) -> Series:
    """A trial's curve as decisions read it: a stopped trial's ends at the rung it was stopped at."""
    series = s.series.get(trial_id) or []
    at = s.stopped_at.get(trial_id)
    return series if at is None else [p for p in series if p[0] <= at]


def _lower(s: LoopState, trial_id: int) -> list[int]:
    return [j for j, r in s.rows.items() if j < trial_id and r["role"] != "repeat" and r["state"] != "skipped"]


def judge_view(c: LoopHost, trial_id: int, series: Series) -> tuple[Series, dict[int, Series], int | None]:
    """What the stopper may judge of a running trial now: its curve cut below its first rung whose
    cohort (the lower trials it is compared with) is not in yet, the lower trials' curves, and that rung."""
    s, stopper = c.state, c.stopper
    assert stopper is not None
    lower = _lower(s, trial_id)
    others = {j: effective(s, j) for j in lower}
    peers = [j for j in lower if stopper.peers(trial_id, j)]
    if not series:
        return series, others, None
    for rung in stopper.decision_steps(trial_id):
        if rung > series[-1][0]:
            break
        if any(j not in s.processed and j not in s.stopped_at and rung not in stopper.judged_rungs(j) for j in peers):
            return [p for p in series if p[0] < rung], others, rung
    return series, others, None


def retro_verdict(c: LoopHost, trial_id: int) -> StopVerdict | None:
    """A trial that ended before a rung of it was decided: the verdict it would have had there (its
    cohort has taken effect: every lower trial has)."""
    s, stopper = c.state, c.stopper
    if stopper is None or trial_id in s.stopped_at or s.rows[trial_id]["role"] == "repeat":
        return None
    series = s.series.get(trial_id) or []
    if not series or not stopper.decision_steps(trial_id):
        return None
    return stopper.check(trial_id, series, {j: effective(s, j) for j in _lower(s, trial_id)})


def drain(c: LoopHost, take_effect: Callable[[LoopHost, int, Any, Any], None], final: bool = False) -> None:
    """Let ended trials take effect in trial order: each one whose lower trials all did (``take_effect``:
    loop/outcomes.py's, handed in: that module calls this one), then the proposals that ending makes
    room for. ``final`` (the loop ends): all of them, in order."""
    s = c.state
    while s.deferred:
        waiting = (t for t, r in s.rows.items() if t not in s.processed and r["state"] != "skipped"
                   and not (final and r["state"] == "proposed"))
        nxt = min(waiting, default=None)
        if nxt is None or nxt not in s.deferred:
            if not final:
                return
            nxt = min(s.deferred)
        row, job = s.deferred.pop(nxt)
        s.processed.add(nxt)
        take_effect(c, nxt, row, job)
        if not final:
            c.propose_now()
