"""A submit to a full cluster skips the placement of the whole queue when
:func:`autoresearch.engine.scheduler.nothing_starts` says no placement and no preemption could come of it.
That must never be wrong: whenever it says so, :func:`schedule` itself places and preempts nothing,
whatever the queue, the fair share, the group caps or the gang packing."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from autoresearch.engine.scheduler import FairShare, NodeState, Pending, Running, Share, nothing_starts, schedule
from tests.properties.strategies import FAST

PRIORITIES = ("critical", "normal", "best-effort")


@st.composite
def clusters(draw: Any) -> tuple[list[NodeState], list[Running]]:
    """Nodes whose slots are mostly all held (each slot by an attempt of one or two slots); now and
    then one left free, a node cordoned, an attempt stopping or an attempt's slots on two nodes."""
    nodes: list[NodeState] = []
    running: list[Running] = []
    job = 1000
    for i in range(draw(st.integers(1, 3))):
        name = f"n{i}"
        ids = tuple(str(g) for g in range(draw(st.integers(0, 4))))
        nodes.append(NodeState(name, ids, cpus=draw(st.sampled_from([0.0, 8.0])), memory=0,
                               schedulable=draw(st.booleans()) or draw(st.booleans()),
                               degraded=draw(st.booleans())))
        held = list(ids)
        if held and draw(st.integers(0, 5)) == 0:
            held.pop()  # one slot free
        while held:
            take = held[:draw(st.integers(1, 2))]
            held = held[len(take):]
            alloc: tuple[tuple[str, tuple[str, ...]], ...] = ((name, tuple(take)),)
            running.append(Running(job, 1, draw(st.sampled_from(PRIORITIES)), alloc, started_at=float(job),
                                   stopping=draw(st.integers(0, 6)) == 0, project=draw(st.sampled_from(["", "a"]))))
            job += 1
    return nodes, running


PENDING = st.lists(st.builds(
    Pending, job_id=st.integers(1, 999), priority=st.sampled_from(PRIORITIES), gpus=st.integers(0, 3),
    nodes=st.integers(1, 2), cpus=st.sampled_from([0.0, 1.0]), waited_s=st.sampled_from([0.0, 1000.0]),
    project=st.sampled_from(["", "a", "b"]), group=st.sampled_from(["", "g"])), max_size=8, unique_by=lambda p: p.job_id)


@FAST
@given(cluster=clusters(), pending=PENDING, fair=st.booleans(), pack=st.booleans(), room=st.integers(0, 2))
def test_when_it_says_nothing_starts_the_scheduler_starts_and_preempts_nothing(
        cluster: tuple[list[NodeState], list[Running]], pending: list[Pending], fair: bool, pack: bool,
        room: int) -> None:
    nodes, running = cluster
    gpuless = any(p.gpus == 0 for p in pending)
    preemptor = any(p.priority != "best-effort" for p in pending)
    if not nothing_starts(nodes, running, gpuless, preemptor):
        return
    share = FairShare({"a": Share(2.0, quota=2), "b": Share(1.0)}) if fair else None
    out = schedule(pending, nodes, running, fair=share, pack_gangs=pack, room={"g": room})
    assert out.placements == [] and out.preemptions == []


def test_a_full_cluster_with_best_effort_jobs_queued_starts_nothing() -> None:
    """The case it is for (a cluster held by a critical job, best-effort work queued behind it),
    and the cases that are not: a free slot, a job that needs no GPU, a critical job that could
    stop a best-effort one."""
    nodes = [NodeState("n0", ("0", "1"))]
    held = [Running(1, 1, "critical", (("n0", ("0", "1")),))]
    assert nothing_starts(nodes, held, gpuless_queued=False, preemptor_queued=True)
    assert not nothing_starts(nodes, [Running(1, 1, "critical", (("n0", ("0",)),))], False, False)  # slot 1 free
    assert not nothing_starts(nodes, held, gpuless_queued=True, preemptor_queued=False)
    best_effort = [Running(1, 1, "best-effort", (("n0", ("0", "1")),))]
    assert nothing_starts(nodes, best_effort, gpuless_queued=False, preemptor_queued=False)
    assert not nothing_starts(nodes, best_effort, gpuless_queued=False, preemptor_queued=True)
    stopping = [Running(1, 1, "normal", (("n0", ("0", "1")),), stopping=True)]
    assert not nothing_starts(nodes, stopping, gpuless_queued=False, preemptor_queued=True)
    cordoned_free = [NodeState("n0", ("0", "1")), NodeState("n1", ("0",), schedulable=False)]
    assert nothing_starts(cordoned_free, held, gpuless_queued=False, preemptor_queued=False)
