"""The pass's shortcuts never change a decision: giving up a priority class once nothing more of it can
start (no unreserved node with room for its smallest job, nothing left to preempt, no reservation left to
give) and dropping a project at its quota from fair share's order. :func:`schedule` with them and without
them (``scheduler._SHORTCUTS``) must place, preempt and reserve the same, on small clusters with free and
held slots, best-effort and stopping attempts, gangs, quotas, group caps and a reservation cap."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from autoresearch.engine import scheduler
from autoresearch.engine.scheduler import Decisions, FairShare, NodeState, Pending, Running, Share, schedule
from tests.properties.strategies import FAST

PRIORITIES = ("critical", "normal", "best-effort")


@st.composite
def clusters(draw: Any) -> tuple[list[NodeState], list[Running]]:
    nodes: list[NodeState] = []
    running: list[Running] = []
    job = 1000
    for i in range(draw(st.integers(1, 4))):
        name = f"n{i}"
        ids = tuple(str(g) for g in range(draw(st.integers(0, 4))))
        nodes.append(NodeState(name, ids, cpus=draw(st.sampled_from([0.0, 4.0])),
                               schedulable=draw(st.booleans()) or draw(st.booleans()), degraded=draw(st.booleans())))
        held = [g for g in ids if draw(st.booleans())]
        while held:
            take = held[:draw(st.integers(1, 2))]
            held = held[len(take):]
            running.append(Running(job, 1, draw(st.sampled_from(PRIORITIES)), ((name, tuple(take)),),
                                   started_at=float(draw(st.integers(0, 100))), cpus=draw(st.sampled_from([0.0, 1.0])),
                                   stopping=draw(st.integers(0, 5)) == 0, project=draw(st.sampled_from(["", "a"]))))
            job += 1
    return nodes, running


PENDING = st.lists(st.builds(
    Pending, job_id=st.integers(1, 999), priority=st.sampled_from(PRIORITIES), gpus=st.integers(0, 4),
    nodes=st.integers(1, 2), cpus=st.sampled_from([0.0, 1.0, 3.0]), waited_s=st.sampled_from([0.0, 1000.0]),
    avoid=st.sampled_from([frozenset(), frozenset({"n0"})]), project=st.sampled_from(["", "a", "b"]),
    group=st.sampled_from(["", "g"])), max_size=12, unique_by=lambda p: p.job_id)


def _both(*args: Any, **kwargs: Any) -> tuple[Decisions, Decisions]:
    fast = schedule(*args, **kwargs)
    scheduler._SHORTCUTS = False
    try:
        slow = schedule(*args, **kwargs)
    finally:
        scheduler._SHORTCUTS = True
    return fast, slow


@FAST
@given(cluster=clusters(), pending=PENDING, fair=st.booleans(), pack=st.booleans(), room=st.integers(0, 3),
       cap=st.integers(0, 3), quota=st.integers(0, 4), starts=st.none() | st.integers(1, 4))
def test_the_shortcuts_change_no_decision(cluster: tuple[list[NodeState], list[Running]], pending: list[Pending],
                                         fair: bool, pack: bool, room: int, cap: int, quota: int,
                                         starts: int | None) -> None:
    nodes, running = cluster
    share = FairShare({"a": Share(2.0, quota=quota), "b": Share(1.0, quota=1)}) if fair else None
    fast, slow = _both(pending, nodes, running, fair=share, pack_gangs=pack, room={"g": room}, max_reservations=cap,
                       now=200.0, max_starts=starts)
    assert fast == slow


def _started(out: Decisions) -> list[int]:
    """The jobs a pass started, in its order: placed, or new victims stopped for them."""
    return list(dict.fromkeys([*(p.job_id for p in out.placements), *(p.for_job for p in out.preemptions)]))


@FAST
@given(cluster=clusters(), pending=PENDING, fair=st.booleans(), pack=st.booleans(), cap=st.integers(0, 3),
       starts=st.integers(1, 4))
def test_a_capped_pass_decides_what_an_uncapped_one_decides_first(
        cluster: tuple[list[NodeState], list[Running]], pending: list[Pending], fair: bool, pack: bool, cap: int,
        starts: int) -> None:
    """``max_starts``: the pass stops after that many starts (placements, or jobs it stopped new victims
    for), and what it decided up to there is exactly the start of what a pass without the cap decides:
    the same placements, preemptions and reservations in the same order. ``capped`` says it stopped."""
    nodes, running = cluster
    share = FairShare({"a": Share(2.0, quota=3), "b": Share(1.0)}) if fair else None
    kw: dict[str, Any] = dict(fair=share, pack_gangs=pack, max_reservations=cap, now=200.0)
    full = schedule(pending, nodes, running, max_starts=None, **kw)
    part = schedule(pending, nodes, running, max_starts=starts, **kw)
    assert not full.capped
    assert part.placements == full.placements[:len(part.placements)]
    assert part.preemptions == full.preemptions[:len(part.preemptions)]
    assert list(part.reserved.items()) == list(full.reserved.items())[:len(part.reserved)]
    assert len(_started(part)) == min(starts, len(_started(full)))
    assert part.capped == (len(_started(part)) == starts)
    if not part.capped:
        assert part == full


def test_a_full_fleet_gives_up_the_queue_but_decides_the_same() -> None:
    """The case the shortcuts are for: every slot held, a few best-effort attempts, a long queue of every
    class; the pass preempts what it can, reserves up to the cap and gives up the rest."""
    nodes = [NodeState(f"n{i:02d}", tuple(str(g) for g in range(4))) for i in range(12)]
    running = [Running(100 + i, 1, "best-effort" if i % 4 == 0 else "normal", ((f"n{i:02d}", ("0", "1", "2", "3")),),
                       started_at=float(i), project="a" if i % 2 else "b") for i in range(12)]
    pending = [Pending(i, PRIORITIES[i % 3], 1 + i % 4, 1 + (i % 7 == 0), waited_s=400.0, project="ab"[i % 2])
               for i in range(1, 300)]
    fair = FairShare({"a": Share(1.0, quota=8)})
    fast, slow = _both(pending, nodes, running, fair=fair, max_reservations=4)
    assert fast == slow
    assert len(fast.preemptions) == 3 and len(fast.reserved) == 4
