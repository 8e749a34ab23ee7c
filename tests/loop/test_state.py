"""The loop's state on its own (no controller): the trial mirror over a real ledger, and
the budget rules of :mod:`autoresearch.loop._limits` working on it."""

from __future__ import annotations

from pathlib import Path

from autoresearch.loop import _limits
from autoresearch.loop.plan import parse_plan
from autoresearch.loop.proposers import Proposal, ProposeResult, ProposerInfo
from autoresearch.loop.state import LoopState
from autoresearch.loop.store import LoopStore
from autoresearch.store.ledger import Ledger


def make_state(home: Path, trials: int = 2) -> LoopState:
    plan = parse_plan({"name": "s", "objective": {"metric": "loss", "goal": "maximize"},
                       "trial": {"command": "echo {x}"}, "space": {"x": [1, 2, 3]},
                       "budget": {"trials": trials, "parallel": 1}})
    state = LoopState(plan, plan.objective.sign())
    state.store = LoopStore.create(Ledger(home), "s", "{}", "d", "s")
    return state


def propose(state: LoopState, *xs: int) -> list[int]:
    proposals = [Proposal({"x": x}, rationale="r") for x in xs]
    return state.store.record_proposals(ProposeResult(proposals, ProposerInfo(kind="test")), proposals, inputs={})


def test_the_mirror_follows_the_ledger(home: Path) -> None:
    state = make_state(home)
    assert state.sign == -1.0
    first = propose(state, 1, 2)
    state.reload()
    assert [r["id"] for r in state.pending()] == first and state.launched() == 0
    row = state.update_trial(first[0], state="running")
    assert row["state"] == "running" and state.store.trial(first[0])["state"] == "running"
    assert state.records[first[0]].state == "running" and state.launched() == 1
    state.update_trial(first[1], state="crashed")  # crashed trials do not count against the budget
    assert state.launched() == 1 and state.state_counts["crashed"] == 1 and state.pending() == []
    later = propose(state, 3)
    state.reload(later)
    assert [r["id"] for r in state.pending()] == later and set(state.rows) == {*first, *later}


def test_limits_end_the_loop_on_the_state_alone(home: Path) -> None:
    state = make_state(home, trials=1)
    ids = propose(state, 1)
    state.reload()
    assert not _limits.done(state, None)  # one proposed trial still to launch
    state.update_trial(ids[0], state="succeeded")
    assert _limits.done(state, None) and state.stop_reason == "trial budget 1 used"
    state.active[ids[0]] = {**state.rows[ids[0]], "job_id": 7}
    assert _limits.check_limits(state) == [ids[0]]  # a hard stop: stop what runs
