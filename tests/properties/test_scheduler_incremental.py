"""The Scheduler object (engine/scheduler.py) keeps its node records between passes: after any sequence
of events (attempts started from its own placements, ended, stopped, checkpointed; nodes cordoned,
degraded, lost, back; the same node handed as a new equal object) its records equal a fresh build's,
its buckets are in the nodes' order, and each pass decides exactly what :func:`schedule` decides on
the same inputs (the holds of the nodes freed for a job carried from pass to pass: the Scheduler keeps
them, :func:`schedule` is given the last pass's). Seeded random runs on small clusters, with fair share,
quotas, guarantees and reclaims (gangs too), gangs, group caps and fractional cores."""

from __future__ import annotations

import random
from typing import Any

import pytest

from autoresearch.engine import scheduler as S

PRIORITIES = ("critical", "normal", "best-effort")


def _records(index: Any) -> dict[str, tuple[Any, ...]]:
    return {name: (slot.total, slot.free, slot.cpus, slot.memory, slot.tier, slot.best_effort, slot.stopping,
                   slot.reserved_for, slot.priced)
            for name, slot in index.state.items()}


def _buckets(index: Any) -> list[list[list[str]]]:
    return [[list(bucket) for bucket in tier] for tier in index.buckets]


def _fresh(nodes: list[S.NodeState], running: list[S.Running]) -> tuple[dict[str, tuple[Any, ...]], list[Any]]:
    state, max_gpus, _, _ = S._build(nodes, running)  # noqa: SLF001
    index = S._Index(state.values(), max_gpus, [], 0.0)  # noqa: SLF001
    return _records(index), _buckets(index)


def _node(rng: random.Random, name: str, gpus: int, cpus: float) -> S.NodeState:
    ids = tuple(str(g) for g in range(gpus))
    roll = rng.random()
    return S.NodeState(name, ids, cpus=cpus, memory=64, schedulable=roll > 0.12, degraded=0.12 < roll < 0.22)


def _run(seed: int, passes: int = 40) -> int:
    rng = random.Random(seed)
    fractional = seed % 3 == 0  # fractions of a core: the projects' figures are summed afresh each pass
    count = rng.randint(2, 7)
    sizes = [rng.choice((2, 4, 8)) for _ in range(count)]
    cores = [rng.choice((0.0, 16.0)) for _ in range(count)]
    nodes = [S.NodeState(f"n{i}", tuple(str(g) for g in range(sizes[i])), cpus=cores[i], memory=64)
             for i in range(count)]
    fair = S.FairShare({"a": S.Share(2.0, quota=rng.choice((None, 6))), "b": S.Share(1.0, guaranteed=2, borrow=6),
                        "c": S.Share(1.0, guaranteed=8)},
                       half_life=3600.0) if seed % 2 else None
    past = {"a": 1000.0 * rng.random(), "b": 500.0} if fair is not None else None
    sched = S.Scheduler()
    running: list[S.Running] = []
    queue: list[S.Pending] = []
    next_id = 1
    t = 0.0
    compared = 0
    expected, largest = 0, -1
    held: dict[str, int] = {}  # the nodes held for the jobs victims were stopped for, pass to pass
    for _ in range(passes):
        t += rng.choice((30.0, 300.0))
        for _ in range(rng.randint(0, 4)):  # arrivals
            cpus = rng.choice((0.0, 1.0, 2.0, 0.5 if fractional else 1.0))
            if seed % 4 == 3:  # reclaims: normal work of projects with and without guarantees, gangs
                kind = (rng.choice(("normal", "normal", "critical")), rng.choice((1, 2, 2, 4)), rng.choice((1, 2, 2)),
                        cpus, 0, 0.0)
            else:
                kind = (rng.choice(PRIORITIES), rng.choice((0, 1, 2, 4, 8)), rng.choice((1, 1, 2)), cpus,
                        rng.choice((0, 8)), rng.choice((0.0, 1000.0)))
            queue.append(S.Pending(next_id, *kind[:5], waited_s=kind[5],
                                   avoid=frozenset({"n0"}) if rng.random() < 0.1 else frozenset(),
                                   project=rng.choice(("", "a", "b", "c")), group=rng.choice(("", "", "g"))))
            next_id += 1
        for att in list(running):  # endings, stops, checkpoints
            roll = rng.random()
            if roll < 0.15 or att.stopping and roll < 0.6:
                running.remove(att)
            elif roll < 0.22 and not att.stopping:
                running[running.index(att)] = att._replace(stopping=True)
            elif roll < 0.3:
                running[running.index(att)] = att._replace(saved_at=t)
        for i in range(len(nodes)):  # node changes: a new state, or the same one as a new object
            roll = rng.random()
            if roll < 0.08:
                nodes[i] = _node(rng, nodes[i].name, len(nodes[i].gpu_ids), nodes[i].cpus)
            elif roll < 0.15:
                nodes[i] = nodes[i]._replace()
        kwargs: dict[str, Any] = {"now": t, "fair": fair, "past": past, "room": {"g": rng.randint(0, 3)},
                                  "pack_gangs": seed % 5 == 0, "max_starts": rng.choice((None, 2, 256)),
                                  "reserve_after_s": 300.0}
        top = max((len(n.gpu_ids) for n in nodes if n.schedulable), default=0)
        expected += top != largest  # (the largest schedulable node changed: the buckets are sized anew)
        largest = top
        pending = list(queue)
        want = S.schedule(pending, nodes, running, held=held, **kwargs)
        got = sched.schedule(pending, nodes, running, **kwargs)  # (the holds it kept from its last pass)
        held = want.held
        assert got == want, f"seed {seed}: the kept records decided otherwise than a fresh pass"
        assert sched._index is not None  # noqa: SLF001
        records, buckets = _fresh(nodes, running)
        assert _records(sched._index) == records  # noqa: SLF001
        assert _buckets(sched._index) == buckets  # noqa: SLF001  (each bucket in the nodes' order)
        compared += 1
        placed = {p.job_id: p.alloc for p in got.placements}
        by_id = {p.job_id: p for p in queue}
        for job_id, alloc in placed.items():  # the placements start
            p = by_id[job_id]
            running.append(S.Running(job_id, 1, p.priority, alloc, started_at=t, cpus=p.cpus, memory=p.memory,
                                     project=p.project))
        stopped = {(pre.job_id, pre.attempt) for pre in got.preemptions}
        running = [a._replace(stopping=True) if (a.job_id, a.attempt) in stopped else a for a in running]
        queue = [p for p in queue if p.job_id not in placed]
    assert sched.rebuilds == expected, "a pass rebuilt the records it could have kept"
    return compared


@pytest.mark.parametrize("seed", range(30))
def test_kept_records_equal_a_fresh_build_and_decide_the_same(seed: int) -> None:
    assert _run(seed) == 40


def test_it_rebuilds_when_it_cannot_tell_what_changed() -> None:
    """Nodes added or reordered, or an attempt given twice: a full rebuild, and still the pure pass's decisions."""
    nodes = [S.NodeState("a", ("0", "1")), S.NodeState("b", ("0", "1", "2", "3"))]
    running = [S.Running(1, 1, "best-effort", (("b", ("0",)),), started_at=1.0)]
    pending = [S.Pending(2, "normal", 2), S.Pending(3, "critical", 4)]
    sched = S.Scheduler()
    for case in (nodes, nodes[::-1], [*nodes, S.NodeState("c", tuple(str(g) for g in range(8)))]):
        assert sched.schedule(pending, case, running, now=5.0) == S.schedule(pending, case, running, now=5.0)
    assert sched.rebuilds == 3
    twice = [running[0], running[0]]
    assert sched.schedule(pending, nodes, twice, now=5.0) == S.schedule(pending, nodes, twice, now=5.0)
    assert sched.schedule(pending, nodes, running, now=5.0) == S.schedule(pending, nodes, running, now=5.0)
    assert sched.rebuilds == 5  # (the list with one attempt twice is not kept: the next pass builds again)
