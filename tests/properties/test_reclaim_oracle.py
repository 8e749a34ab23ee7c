"""A reclaim that costs least, for single jobs and gangs: on small clusters (at most 4 nodes and 6
running attempts) the victims :func:`schedule` stops so that a guaranteed project's job fits within its
guarantee lose no more work than the cheapest choice a brute force over every set of victims finds
(GPU-seconds since each victim's last checkpoint, or its start; then the fewest victims). Every victim
is a normal attempt of another project that still borrowed when it was stopped (in some order), none is
critical, none is superfluous, and nothing at all is stopped when no set would let the job fit. A borrower's
gang (one member on each of two nodes) is stopped whole, by a job of one member; a gang job takes back from
attempts on one node each."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autoresearch.engine import scheduler as S
from autoresearch.engine.scheduler import FairShare, NodeState, Pending, Running, Share, schedule
from tests.properties.strategies import FAST

NOW = 10_000.0
PROJECTS = ("v", "a", "b")


@st.composite
def cases(draw: Any) -> tuple[list[NodeState], list[Running], Pending, FairShare]:
    nodes: list[NodeState] = []
    running: list[Running] = []
    rest: dict[str, list[str]] = {}
    job = 100
    for i in range(draw(st.integers(1, 4))):
        size = draw(st.integers(1, 4))
        ids = [str(g) for g in range(size)]
        nodes.append(NodeState(f"n{i}", tuple(ids)))
        while ids and len(running) < 6:
            take = draw(st.integers(0, len(ids)))
            if take == 0:
                break  # the rest stays free
            held, ids = ids[:take], ids[take:]
            started = float(draw(st.integers(0, 9_000)))
            saved = draw(st.one_of(st.none(), st.integers(0, 10_000).map(float)))
            running.append(Running(job, 1, draw(st.sampled_from(["normal", "normal", "normal", "critical"])),
                                   ((f"n{i}", tuple(held)),), started_at=started,
                                   project=draw(st.sampled_from(PROJECTS)), saved_at=saved))
            job += 1
        rest[f"n{i}"] = ids
    room = [name for name, ids in rest.items() if ids]
    if len(room) >= 2 and len(running) < 6 and draw(st.booleans()):  # a borrower's gang: one member on each of two nodes
        members = draw(st.sampled_from(list(itertools.combinations(room, 2))))
        alloc = tuple((name, tuple(rest[name][:draw(st.integers(1, len(rest[name])))])) for name in members)
        running.append(Running(job, 1, "normal", alloc, started_at=float(draw(st.integers(0, 9_000))),
                               project=draw(st.sampled_from(PROJECTS))))
    fair = FairShare({p: Share(guaranteed=draw(st.integers(0, 6))) for p in PROJECTS})
    arriving = Pending(1, draw(st.sampled_from(["critical", "normal"])), draw(st.integers(1, 4)),
                       nodes=draw(st.integers(1, 3)), project="v")
    return nodes, running, arriving, fair


def lost(att: Running) -> float:
    since = att.started_at if att.saved_at is None else max(att.started_at, att.saved_at)
    return max(0.0, NOW - since) * sum(len(ids) for _, ids in att.alloc)


def gpus(att: Running) -> int:
    return sum(len(ids) for _, ids in att.alloc)


def fits(nodes: list[NodeState], running: list[Running], stopped: set[int], job: Pending) -> bool:
    """Whether ``job.nodes`` distinct nodes each have ``job.gpus`` free once ``stopped`` have ended."""
    room = 0
    for node in nodes:
        held = sum(len(ids) for r in running if r.job_id not in stopped for n, ids in r.alloc if n == node.name)
        room += len(node.gpu_ids) - held >= job.gpus
    return room >= job.nodes


def admissible(pick: tuple[Running, ...], running: list[Running], fair: FairShare) -> bool:
    """Some order of stopping them stops each while its project holds more than its guarantee."""
    held = {p: sum(gpus(r) for r in running if r.project == p) for p in PROJECTS}
    for order in itertools.permutations(pick):
        left = dict(held)
        for r in order:
            if left[r.project] <= fair.share(r.project).guaranteed:
                break
            left[r.project] -= gpus(r)
        else:
            return True
    return False


def oracle(nodes: list[NodeState], running: list[Running], job: Pending, fair: FairShare) -> tuple[float, int] | None:
    """The cheapest (work lost, victims) over every admissible set of victims that lets the job fit."""
    held = sum(gpus(r) for r in running if r.project == job.project)
    if held + job.gpus * job.nodes > fair.share(job.project).guaranteed:
        return None  # past its guarantee: no reclaim
    eligible = [r for r in running if r.priority == "normal" and r.project != job.project
                and (job.nodes == 1 or len(r.alloc) == 1)]  # (a gang job takes back from one-node attempts only)
    best: tuple[float, int] | None = None
    for k in range(len(eligible) + 1):
        for pick in itertools.combinations(eligible, k):
            if fits(nodes, running, {r.job_id for r in pick}, job) and admissible(pick, running, fair):
                cost = (sum(lost(r) for r in pick), len(pick))
                best = cost if best is None or cost < best else best
    return best


@FAST
@given(cases())
def test_reclaim_costs_no_more_than_the_cheapest_choice(
        case: tuple[list[NodeState], list[Running], Pending, FairShare]) -> None:
    nodes, running, job, fair = case
    out = schedule([job], nodes, running, fair=fair, now=NOW)
    if out.placements:
        assert fits(nodes, running, set(), job) and not out.preemptions
        return
    best = oracle(nodes, running, job, fair)
    victims = {p.job_id for p in out.preemptions}
    if best is None:
        assert not victims
        return
    assert best != (0.0, 0)  # (it would have been placed)
    by_id = {r.job_id: r for r in running}
    pick = tuple(by_id[v] for v in sorted(victims))
    assert all(r.priority == "normal" and r.project != job.project for r in pick)
    assert fits(nodes, running, victims, job)
    assert admissible(pick, running, fair)
    cost = (sum(lost(r) for r in pick), len(pick))
    assert cost[0] <= best[0] + 1e-6 and (cost[0] < best[0] - 1e-6 or cost[1] <= best[1])
    for v in victims:  # none superfluous
        assert not fits(nodes, running, victims - {v}, job)


def test_a_gang_reclaims_across_nodes_the_youngest_first() -> None:
    """vision (guaranteed 8) asks for a 2-node gang of 4 GPUs; nlp borrows all three nodes (one 4-GPU job
    each, started at 100, 200 and 300; the one started at 200 saved a checkpoint at 900). The gang stops
    the two that lose least (the checkpointed one and the youngest), one per node, no third."""
    fair = FairShare({"vision": Share(guaranteed=8)})
    nodes = [NodeState(f"n{i}", tuple(str(g) for g in range(4))) for i in range(3)]
    running = [Running(10 + i, 1, "normal", ((f"n{i}", ("0", "1", "2", "3")),), started_at=100.0 * (i + 1),
                       project="nlp", saved_at=900.0 if i == 1 else None) for i in range(3)]
    out = schedule([Pending(1, "normal", 4, nodes=2, project="vision")], nodes, running, fair=fair, now=1_000.0)
    assert sorted((p.job_id, p.for_job) for p in out.preemptions) == [(11, 1), (12, 1)]
    assert out.placements == []
    # a gang past the guarantee (3 x 4 > 8) takes nothing back
    out = schedule([Pending(1, "normal", 4, nodes=3, project="vision")], nodes, running, fair=fair, now=1_000.0)
    assert out.preemptions == []


def test_a_gang_uses_a_free_node_and_reclaims_only_what_the_rest_needs() -> None:
    """One node is free: the 2-node gang stops one victim, on the node where that loses least."""
    fair = FairShare({"vision": Share(guaranteed=4)})
    nodes = [NodeState(f"n{i}", ("0", "1")) for i in range(3)]
    running = [Running(10, 1, "normal", (("n0", ("0", "1")),), started_at=500.0, project="nlp"),
               Running(11, 1, "normal", (("n1", ("0", "1")),), started_at=100.0, project="nlp")]
    out = schedule([Pending(1, "normal", 2, nodes=2, project="vision")], nodes, running, fair=fair, now=1_000.0)
    assert [p.job_id for p in out.preemptions] == [10]


def test_a_gang_that_cannot_fit_stops_nothing() -> None:
    """nlp is guaranteed 6 of the 8 it holds: one victim may go (its second would cut it below 6), which
    frees one node where the gang needs two: nothing is stopped, although one node could be had."""
    fair = FairShare({"vision": Share(guaranteed=4), "nlp": Share(guaranteed=6)})
    nodes = [NodeState(f"n{i}", ("0", "1")) for i in range(4)]
    running = [Running(10 + i, 1, "normal", ((f"n{i}", ("0", "1")),), started_at=float(i), project="nlp")
               for i in range(4)]
    out = schedule([Pending(1, "normal", 2, nodes=2, project="vision")], nodes, running, fair=fair, now=1_000.0)
    assert out.preemptions == []
    one = schedule([Pending(1, "normal", 2, nodes=1, project="vision")], nodes, running, fair=fair, now=1_000.0)
    assert [p.job_id for p in one.preemptions] == [13]  # a single node: the youngest


def test_a_borrower_loses_no_more_than_it_borrows_across_the_gang() -> None:
    """nlp holds 6 of its guarantee 4 (2 borrowed, in 1-GPU jobs), other holds 4 with no guarantee:
    the gang of two 2-GPU members cannot take both from nlp's jobs (the second would go after nlp stopped
    borrowing), so it takes the cheapest admissible mix, even where nlp's jobs are younger."""
    fair = FairShare({"vision": Share(guaranteed=4), "nlp": Share(guaranteed=4)})
    nodes = [NodeState(f"n{i}", ("0", "1")) for i in range(5)]
    running = [Running(10 + i, 1, "normal", ((f"n{i}", (str(g),)),), started_at=900.0, project="nlp")
               for i in range(3) for g in range(2)]
    running = [r._replace(job_id=10 + k) for k, r in enumerate(running)]
    running += [Running(30 + i, 1, "normal", ((f"n{i}", ("0", "1")),), started_at=100.0, project="other")
                for i in (3, 4)]
    out = schedule([Pending(1, "normal", 2, nodes=2, project="vision")], nodes, running, fair=fair, now=1_000.0)
    stopped = sorted(p.job_id for p in out.preemptions)
    assert stopped == [10, 11, 33]  # n0's two (200 GPU-s) and one of other's (1,800 GPU-s: the first node of the two)


@pytest.mark.parametrize("seed", range(200))
def test_a_node_s_prepared_bound_is_the_bound_to_the_last_bit(seed: int) -> None:
    """A reclaim's heaps read each node's bound from its victims prepared once (sums kept, any GPU count),
    not worked out again per GPU count: the same figure as ``_reclaim_bound`` (or None), to the last bit."""
    rng = random.Random(seed)
    total = rng.choice((2, 4, 8))
    slot = S._Node("n", total, tuple(str(g) for g in range(rng.randint(0, total - 1))), 64.0, 0)  # noqa: SLF001
    victims = sorted((S._Victim(S.Running(i, 1, "normal", (("n", tuple(str(g) for g in range(rng.choice((1, 2, 3))))),),  # noqa: SLF001
                                          started_at=rng.uniform(0, 100), cpus=1.0, project="x"), "n",
                                rng.choice((100.0, 137.3)))
                      for i in range(rng.randint(1, 6))), key=lambda v: v.rank)
    prepared = S._Bounds(victims)  # noqa: SLF001
    for gpus in range(1, total + 1):
        assert prepared.low(gpus - len(slot.free)) == S._reclaim_bound(slot, victims, gpus)  # noqa: SLF001


def test_a_borrower_s_gang_is_stopped_whole_for_a_single_job() -> None:
    """nlp borrows both nodes with one 2-node gang (4 GPUs on each). vision, guaranteed 4, asks for 4 GPUs
    on one node: the gang is stopped (all of it: its 8 GPUs count against what nlp borrows), and the node
    held for vision is the first of the two. A 2-node gang job of vision does not stop it (a gang job takes
    back from attempts on one node each)."""
    fair = FairShare({"vision": Share(guaranteed=8)})
    four = ("0", "1", "2", "3")
    nodes = [NodeState("n0", four), NodeState("n1", four)]
    running = [Running(10, 1, "normal", (("n0", four), ("n1", four)), started_at=100.0, project="nlp")]
    out = schedule([Pending(1, "normal", 4, project="vision")], nodes, running, fair=fair, now=1_000.0)
    assert [(p.job_id, p.for_job) for p in out.preemptions] == [(10, 1)] and out.held == {"n0": 1}
    gang = schedule([Pending(1, "normal", 4, nodes=2, project="vision")], nodes, running, fair=fair, now=1_000.0)
    assert gang.preemptions == []
    # with one more attempt of nlp (4 GPUs on n2) and a guarantee of 4, nlp borrows 8: a second job of vision
    # takes nothing more once the gang (8 GPUs, all its members') is stopped, which cut nlp to its guarantee
    nodes.append(NodeState("n2", four))
    running.append(Running(11, 1, "normal", (("n2", four),), started_at=-1_000.0, project="nlp"))
    guarded = FairShare({"vision": Share(guaranteed=8), "nlp": Share(guaranteed=4)})
    jobs = [Pending(1, "normal", 4, project="vision"), Pending(2, "normal", 4, project="vision")]
    out = schedule(jobs, nodes, running, fair=guarded, now=1_000.0)
    assert [(p.job_id, p.for_job) for p in out.preemptions] == [(10, 1)], out  # (7,200 GPU-s lost, against 8,000)
