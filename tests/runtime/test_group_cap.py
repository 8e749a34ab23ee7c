"""Issue 16: a group's running cap (``jobs.submit_many(..., group=, max_running=)``), like Slurm's
``--array=0-99%16``: never more than N jobs of a group start or run at once, the pass that records
an ending starts the group's next queued job, and a job waiting for its group holds nothing back.

Pure scheduler cases, then the engine on the fake backend (no processes, no timing); the count of
a group's running jobs is flat in the ledger's size (SQLite VM steps, as tests/runtime/test_flat_costs.py).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pytest

from autoresearch.api import Api
from autoresearch.backends.fake import FakeBackend
from autoresearch.engine.jobs import submit_many
from autoresearch.engine.scheduler import NodeState, Pending, Running, admit, schedule
from autoresearch.errors import SpecError
from tests.runtime.test_flat_costs import counted

SPEC = {"command": ["train"], "workdir": os.getcwd()}


def test_the_scheduler_places_at_most_a_groups_room_and_the_others_go_on() -> None:
    node = [NodeState("n", ("0", "1"), cpus=64)]
    pending = [Pending(i, "normal", group="loop:1") for i in range(1, 11)] + [Pending(20, "normal"),
                                                                              Pending(21, "normal", group="loop:2")]
    placed = [p.job_id for p in schedule(pending, node, [], room={"loop:1": 3, "loop:2": 0}).placements]
    assert placed == [1, 2, 3, 20]  # the group's first three in submit order; an uncapped job is not held back
    assert [p.job_id for p in schedule(pending, node, []).placements] == [*range(1, 11), 20, 21]  # no room: no cap
    assert [p.job_id for p in admit(pending, node, [], room={"loop:1": 2, "loop:2": 0}).placements] == [1, 2, 20]
    assert [p.job_id for p in admit(pending, node, [], preempts=True, room={"loop:1": 1}).placements] == [1, 20, 21]


def test_a_job_waiting_for_its_group_neither_reserves_nor_preempts() -> None:
    node = [NodeState("n", ("0",))]
    victim = Running(9, 1, "best-effort", (("n", ("0",)),), started_at=1.0)
    capped = Pending(1, "critical", gpus=1, waited_s=1e6, group="g")
    out = schedule([capped], node, [victim], reserve_after_s=0, room={"g": 0})
    assert not out.placements and not out.preemptions and not out.reserved
    out = schedule([capped], node, [victim], reserve_after_s=0, room={"g": 1})
    assert [p.job_id for p in out.preemptions] == [9]  # with room it does


def _engine(home: Path) -> tuple[Api, FakeBackend]:
    fake = FakeBackend(gpus=0)
    return Api(home, backend=fake), fake


def _running(api: Api) -> list[int]:
    return [r["id"] for r in api._ledger.query("SELECT id FROM jobs WHERE state IN ('starting','running') "
                                                "ORDER BY id")]


def test_the_cap_holds_while_one_pass_records_many_endings_and_launches_the_next(tmp_path: Path) -> None:
    api, fake = _engine(tmp_path / "h")
    ids = submit_many(api._runtime, [SPEC] * 20, group="loop:7", max_running=4)
    free = submit_many(api._runtime, [SPEC] * 3)  # another user's jobs: not held back by the group
    assert _running(api) == ids[:4] + free
    seen = set(ids[:4])
    while len(seen) < len(ids) or any(j in _running(api) for j in ids):
        for job in _running(api):
            if job in ids:
                fake.finish(f"{job}.1", 0)  # every running one ends before the next pass
        api._runtime.tick()  # one pass: records the endings and starts the next ones at once
        group_running = [j for j in _running(api) if j in ids]
        assert len(group_running) <= 4, group_running
        assert len(group_running) == min(4, len(ids) - len(seen)), (group_running, len(seen))
        seen.update(group_running)
    states = {r["state"] for r in api._ledger.query("SELECT state FROM jobs WHERE job_group='loop:7'")}
    assert states == {"succeeded"}


def test_a_batch_for_a_full_group_runs_no_pass_and_the_next_ending_starts_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A loop queues its trials ahead of its free slots: while its group is full no pass could start
    them, so the submit runs none and pokes nobody (a pass per batch was ~4 ms of a loop's controller);
    the pass that records an ending starts the next. With room, the submit places them as ever."""
    api, fake = _engine(tmp_path / "h")
    runtime = api._runtime
    first = submit_many(runtime, [SPEC] * 2, group="loop:1", max_running=2)
    assert _running(api) == first
    passes: list[bool] = []
    pokes: list[Path] = []
    real_tick = runtime.tick
    monkeypatch.setattr(runtime, "tick", lambda wait=True, **kw: passes.append(wait) or real_tick(wait, **kw))
    monkeypatch.setattr("autoresearch.engine.jobs.wake", lambda home, backend="local": pokes.append(home) or False)
    ahead = submit_many(runtime, [SPEC] * 3, group="loop:1", max_running=2)
    assert passes == [] and pokes == [] and _running(api) == first  # full: nothing could start
    fake.finish(f"{first[0]}.1", 0)
    runtime.tick()  # the ending's pass starts the first one queued ahead
    assert _running(api) == [first[1], ahead[0]]
    for job in (first[1], ahead[0]):
        fake.finish(f"{job}.1", 0)
    real_tick()
    assert _running(api) == ahead[1:]
    for job in ahead[1:]:
        fake.finish(f"{job}.1", 0)
    real_tick()  # the group's endings recorded: it has room and nothing queued
    passes.clear()
    more = submit_many(runtime, [SPEC], group="loop:1", max_running=2)
    assert passes and _running(api) == more  # with room, a pass of its own starts it


def test_a_new_cap_applies_from_the_next_pass(tmp_path: Path) -> None:
    api, fake = _engine(tmp_path / "h")
    ids = submit_many(api._runtime, [SPEC] * 6, group="g", max_running=2)
    api._runtime.jobs.set_group_cap("g", 4)
    api._runtime.tick()
    assert _running(api) == ids[:4]
    assert api._runtime.jobs.cancel_queued(ids) == ids[4:]  # only the ones never started
    assert [api.status(j, refresh=False).state for j in ids[4:]] == ["cancelled"] * 2


@pytest.mark.parametrize(("group", "cap"), [("", 2), ("x" * 201, 2), (None, 2), ("g", 0), ("g", -1), ("g", True),
                                            ("g", "3"), ("g", 10**9), ("g", math.nan), ("g", 2.5)])
def test_a_bad_group_or_cap_is_refused_before_anything_is_recorded(tmp_path: Path, group: Any, cap: Any) -> None:
    api, _ = _engine(tmp_path / "h")
    with pytest.raises(SpecError) as err:
        submit_many(api._runtime, [SPEC], group=group, max_running=cap)
    assert err.value.hint
    assert api._ledger.one("SELECT COUNT(*) AS n FROM jobs")["n"] == 0


def _ending_cost(home: Path, finished_in_group: int) -> tuple[int, int]:
    api, fake = _engine(home)
    api._runtime.jobs.seed_finished(finished_in_group, "fake", '{"command": ["train"], "workdir": "/"}')
    api._ledger.query("UPDATE jobs SET job_group='g'")  # a long loop's ended trials
    ids = submit_many(api._runtime, [SPEC] * 6, group="g", max_running=2)
    fake.finish(f"{ids[0]}.1", 0)
    with counted(api) as c:
        api._runtime.tick()  # records the ending, counts the group, starts the next
    assert _running(api) == [ids[1], ids[2]]
    return c.steps, len(c.statements)


def test_counting_a_groups_running_jobs_is_flat_in_its_ended_jobs(tmp_path: Path) -> None:
    small, large = _ending_cost(tmp_path / "small", 100), _ending_cost(tmp_path / "large", 2000)
    assert small == large, f"the group's count scans its jobs: {small} vs {large} (VM steps, statements)"


def test_a_resumed_job_keeps_its_paused_jobs_place_in_the_queue() -> None:
    node = [NodeState("n", (), cpus=64)]
    pending = [Pending(i, "normal", group="g") for i in (5, 6, 7)] + [Pending(9, "normal", group="g", order=2)]
    assert [p.job_id for p in schedule(pending, node, [], room={"g": 1}).placements] == [9]
    assert [p.job_id for p in admit(pending, node, [], room={"g": 2}).placements] == [9, 5]
    from autoresearch.engine.scheduler import FairShare

    assert [p.job_id for p in schedule(pending, node, [], fair=FairShare(), room={"g": 1}).placements] == [9]


def test_place_as_through_the_engine_and_its_bad_values(tmp_path: Path) -> None:
    api, fake = _engine(tmp_path / "h")
    first = submit_many(api._runtime, [SPEC] * 3, group="g", max_running=1)
    resumed = submit_many(api._runtime, [SPEC], group="g", max_running=1, place_as=first[0])[0]
    fake.finish(f"{first[0]}.1", 0)
    api._runtime.tick()
    assert _running(api) == [resumed]  # before the two submitted ahead of it
    for bad in (0, -3, True, "1", 2**63, 1.5):
        with pytest.raises(SpecError):
            submit_many(api._runtime, [SPEC], group="g", place_as=bad)
