"""The pure scheduler: priorities, backfill, preemption choice, slot exclusivity."""

from __future__ import annotations

import random

import pytest

from autoresearch.engine.scheduler import MAX_STARTS, Decisions, NodeState, Pending, Placement, Running, schedule


def node(name: str = "n1", gpus: int = 2, **kw: object) -> NodeState:
    return NodeState(name, tuple(str(i) for i in range(gpus)), **kw)  # type: ignore[arg-type]


def running(job_id: int, priority: str, node_name: str, ids: tuple[str, ...], started: float = 0.0,
            stopping: bool = False) -> Running:
    return Running(job_id, 1, priority, ((node_name, ids),), started, stopping=stopping)


def test_priority_class_then_submit_order() -> None:
    pending = [Pending(1, "best-effort", 1), Pending(2, "normal", 1), Pending(3, "critical", 1), Pending(4, "normal", 1)]
    out = schedule(pending, [node(gpus=2)], [])
    assert [p.job_id for p in out.placements] == [3, 2]


def test_best_fit_keeps_big_holes_open() -> None:
    nodes = [node("big", 8), node("small", 2)]
    out = schedule([Pending(1, "normal", 1), Pending(2, "normal", 8)], nodes, [])
    placed = {p.job_id: p.alloc[0][0] for p in out.placements}
    assert placed == {1: "small", 2: "big"}


def test_backfill_small_job_when_big_one_cannot_fit() -> None:
    out = schedule([Pending(1, "normal", 2), Pending(2, "normal", 1)], [node(gpus=2)],
                   [running(9, "normal", "n1", ("0",))])
    assert [p.job_id for p in out.placements] == [2]
    assert out.placements[0].alloc == (("n1", ("1",)),)


def test_long_waiting_job_reserves_a_node_against_backfill() -> None:
    nodes = [node("n1", 2)]
    busy = [running(9, "normal", "n1", ("0",))]
    out = schedule([Pending(1, "normal", 2, waited_s=400), Pending(2, "normal", 1)], nodes, busy)
    assert out.placements == []
    assert out.reserved == {"n1": 1}


def test_reservations_are_capped_per_pass_first_waiters_first() -> None:
    """At most MAX_RESERVATIONS long-waiting jobs hold a node in one pass (as Slurm's bf_max_job_test bounds
    the jobs its backfill plans for): every waiting job holding a node blocked backfill on most of a fleet."""
    from autoresearch.engine.scheduler import MAX_RESERVATIONS

    nodes = [node(f"n{i:02d}", 2) for i in range(MAX_RESERVATIONS + 8)]
    busy = [running(100 + i, "normal", f"n{i:02d}", ("0",)) for i in range(len(nodes))]
    waiting = [Pending(i, "normal", 2, waited_s=400) for i in range(1, len(nodes) + 5)]
    out = schedule(waiting, nodes, busy)
    assert sorted(out.reserved.values()) == list(range(1, MAX_RESERVATIONS + 1))
    out = schedule([*waiting, Pending(99, "normal", 1)], nodes, busy, max_reservations=2)
    assert sorted(out.reserved.values()) == [1, 2]
    # the nodes nobody holds still backfill
    assert [p.job_id for p in out.placements] == [99] and out.placements[0].alloc[0][0] not in out.reserved


def test_cordoned_node_gets_nothing() -> None:
    out = schedule([Pending(1, "normal", 1)], [node("bad", 2, schedulable=False)], [])
    assert out.placements == []


def test_preempts_youngest_best_effort_first() -> None:
    busy = [running(10, "best-effort", "n1", ("0",), started=100.0),
            running(11, "best-effort", "n1", ("1",), started=200.0)]
    out = schedule([Pending(1, "critical", 1)], [node(gpus=2)], busy)
    assert [(p.job_id, p.for_job) for p in out.preemptions] == [(11, 1)]
    assert out.placements == []  # it starts once the victim has exited


def test_preemption_picks_node_needing_fewest_victims() -> None:
    nodes = [node("a", 2), node("b", 2)]
    busy = [running(10, "best-effort", "a", ("0",), 1.0), running(11, "best-effort", "a", ("1",), 2.0),
            running(12, "best-effort", "b", ("0", "1"), 3.0)]
    out = schedule([Pending(1, "normal", 2)], nodes, busy)
    assert [p.job_id for p in out.preemptions] == [12]


def test_never_preempts_normal_or_for_best_effort() -> None:
    busy = [running(10, "normal", "n1", ("0", "1"))]
    assert schedule([Pending(1, "critical", 2)], [node(gpus=2)], busy).preemptions == []
    busy = [running(10, "best-effort", "n1", ("0", "1"))]
    assert schedule([Pending(1, "best-effort", 2)], [node(gpus=2)], busy).preemptions == []


def test_stopping_victims_are_claimed_not_preempted_again() -> None:
    busy = [running(10, "best-effort", "n1", ("0",), 1.0, stopping=True),
            running(11, "best-effort", "n1", ("1",), 2.0)]
    out = schedule([Pending(1, "critical", 1)], [node(gpus=2)], busy)
    assert out.preemptions == []  # the attempt already shutting down is enough
    # and a second critical job does not steal that claim: it takes the other victim
    out = schedule([Pending(1, "critical", 1), Pending(2, "critical", 1)], [node(gpus=2)], busy)
    assert [(p.job_id, p.for_job) for p in out.preemptions] == [(11, 2)]


def test_cpu_and_memory_reservations() -> None:
    nodes = [NodeState("n1", ("0",), cpus=4, memory=1000)]
    out = schedule([Pending(1, "normal", 0, cpus=3), Pending(2, "normal", 0, cpus=2), Pending(3, "normal", 0, memory=900)],
                   nodes, [])
    assert [p.job_id for p in out.placements] == [1, 3]


def test_multi_node_job_gets_distinct_nodes() -> None:
    nodes = [node("a", 2), node("b", 2), node("c", 1)]
    out = schedule([Pending(1, "normal", 2, nodes=2)], nodes, [])
    assert sorted(n for n, _ in out.placements[0].alloc) == ["a", "b"]


def test_never_two_attempts_on_one_slot_randomized() -> None:
    rng = random.Random(7)
    for _ in range(200):
        nodes = [node(f"n{i}", rng.choice([1, 2, 4, 8])) for i in range(rng.randint(1, 6))]
        busy: list[Running] = []
        for i, n in enumerate(nodes):
            ids = n.gpu_ids[: rng.randint(0, len(n.gpu_ids))]
            if ids:
                busy.append(running(1000 + i, rng.choice(["best-effort", "normal"]), n.name, ids, rng.random()))
        pending = [Pending(j, rng.choice(["critical", "normal", "best-effort"]), rng.randint(0, 8),
                           waited_s=rng.choice([0, 1000])) for j in range(rng.randint(1, 30))]
        out = schedule(pending, nodes, busy)
        taken = {(n, g) for r in busy for n, ids in r.alloc for g in ids}
        for placement in out.placements:
            for name, ids in placement.alloc:
                for gpu in ids:
                    assert (name, gpu) not in taken, "a slot was given twice"
                    taken.add((name, gpu))
        victims = {(p.job_id, p.attempt) for p in out.preemptions}
        assert all(r.priority == "best-effort" for r in busy if (r.job_id, r.attempt) in victims)


def test_ten_thousand_jobs_scale() -> None:
    import time

    nodes = [node(f"n{i}", 8) for i in range(128)]
    pending = [Pending(i, ["critical", "normal", "best-effort"][i % 3], [1, 2, 4, 8][i % 4]) for i in range(10_000)]
    t0 = time.process_time()  # this process's CPU time: other processes on a loaded machine do not count
    out = schedule(pending, nodes, [], max_starts=None)
    elapsed = time.process_time() - t0
    assert sum(len(ids) for p in out.placements for _, ids in p.alloc) == 1024  # the cluster is full
    assert elapsed < 2.0  # bench/ reports the real figure
    capped = schedule(pending, nodes, [])  # the default: MAX_STARTS jobs, the rest in the next pass
    assert capped.capped and capped.placements == out.placements[:MAX_STARTS]


def test_degraded_nodes_and_nodes_a_job_failed_on_come_last() -> None:
    # best fit would pick the smaller hole (n1); degraded (throttling), it is used only when nothing else fits
    nodes = [node("n1", 2, degraded=True), node("n2", 4)]
    out = schedule([Pending(1, "normal", gpus=2)], nodes, [])
    assert out.placements[0].alloc[0][0] == "n2"
    out = schedule([Pending(1, "normal", gpus=2), Pending(2, "normal", gpus=4)], nodes, [])
    assert {p.job_id: p.alloc[0][0] for p in out.placements} == {1: "n2"}  # job 2 does not fit anywhere now
    out = schedule([Pending(1, "normal", gpus=4), Pending(2, "normal", gpus=2)], nodes, [])
    assert {p.job_id: p.alloc[0][0] for p in out.placements} == {1: "n2", 2: "n1"}  # degraded, but the only room
    avoid = schedule([Pending(1, "normal", gpus=2, avoid=frozenset({"n2"}))], [node("n2", 2), node("n3", 4)], [])
    assert avoid.placements[0].alloc[0][0] == "n3"
    only = schedule([Pending(1, "normal", gpus=2, avoid=frozenset({"n2"}))], [node("n2", 2)], [])
    assert only.placements[0].alloc[0][0] == "n2"


def test_the_records_compare_hash_and_replace_like_the_frozen_dataclasses_they_were() -> None:
    """Plain slotted classes since issue 16 (a submit imports this module): equal by value and type,
    hashable, no attribute beyond their fields, and _replace refuses a field they do not have."""
    a, same = Pending(1, "normal", gpus=2, avoid=frozenset({"n1"})), Pending(1, "normal", 2, avoid=frozenset({"n1"}))
    assert a == same and hash(a) == hash(same)
    assert a != Pending(1, "normal", gpus=3, avoid=frozenset({"n1"})) and a != Placement(1, ())
    assert a._replace(gpus=4).gpus == 4 and a.gpus == 2
    with pytest.raises(TypeError, match="no field gpu"):
        a._replace(gpu=4)
    with pytest.raises(AttributeError):
        a.extra = 1  # type: ignore[attr-defined]
    assert repr(Placement(3, (("n1", ("0",)),))) == "Placement(job_id=3, alloc=(('n1', ('0',)),))"
    assert Decisions() == Decisions() and Decisions().placements is not Decisions().placements


def test_gang_preempts_the_two_youngest_not_the_first_nodes_by_name() -> None:
    """Best-effort whole-node jobs started at 0, 0.5, 1 and 1.5 h (on n0..n3) and a critical
    2-node gang: the two youngest lose the least work, whatever the nodes are called."""
    nodes = [node(f"n{i}", 8) for i in range(4)]
    all8 = tuple(str(g) for g in range(8))
    busy = [running(10 + i, "best-effort", f"n{i}", all8, started=i * 1800.0) for i in range(4)]
    out = schedule([Pending(1, "critical", 8, nodes=2)], nodes, busy, now=2 * 3600.0)
    assert sorted(p.job_id for p in out.preemptions) == [12, 13]
    assert schedule([Pending(1, "critical", 8, nodes=2)], nodes, busy).preemptions == out.preemptions  # now: latest


def test_preemption_spares_work_a_recent_checkpoint_does_not_hold() -> None:
    """The older job saved a checkpoint a minute ago: stopping it loses a minute, the younger one an hour."""
    nodes = [node("a", 1), node("b", 1)]
    busy = [Running(10, 1, "best-effort", (("a", ("0",)),), started_at=0.0, saved_at=7140.0),
            Running(11, 1, "best-effort", (("b", ("0",)),), started_at=3600.0)]
    out = schedule([Pending(1, "normal", 1)], nodes, busy, now=7200.0)
    assert [p.job_id for p in out.preemptions] == [10]


def test_never_more_victims_than_the_job_needs() -> None:
    """Two small young victims and one big old one on a node: a 4-GPU job stops the big one alone
    (the young ones would not free enough with it anyway), a 2-GPU job the two young ones."""
    nodes = [node("a", 6)]
    busy = [running(10, "best-effort", "a", ("0", "1", "2", "3"), started=0.0),
            running(11, "best-effort", "a", ("4",), started=100.0),
            running(12, "best-effort", "a", ("5",), started=200.0)]
    assert [p.job_id for p in schedule([Pending(1, "critical", 4)], nodes, busy, now=300.0).preemptions] == [10]
    two = schedule([Pending(1, "critical", 2)], nodes, busy, now=300.0).preemptions
    assert sorted(p.job_id for p in two) == [11, 12]
