"""Preemption that costs least: on small clusters the victims :func:`schedule` picks for one arriving
job lose no more work (GPU-seconds since each victim's last checkpoint, or its start) than the cheapest
choice a brute force over every set of victims finds, number of victims second, and none of them is
superfluous: without any one of them the job would not fit on its nodes."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from autoresearch.engine.scheduler import NodeState, Pending, Running, schedule
from tests.properties.strategies import FAST

NOW = 10_000.0


@st.composite
def cases(draw: Any) -> tuple[list[NodeState], list[Running], Pending]:
    nodes: list[NodeState] = []
    running: list[Running] = []
    job = 100
    for i in range(draw(st.integers(1, 4))):
        size = draw(st.integers(1, 4))
        ids = [str(g) for g in range(size)]
        nodes.append(NodeState(f"n{i}", tuple(ids)))
        while ids:
            take = draw(st.integers(0, len(ids)))
            if take == 0:
                break  # the rest stays free
            held, ids = ids[:take], ids[take:]
            started = float(draw(st.integers(0, 9_000)))
            saved = draw(st.one_of(st.none(), st.integers(0, 10_000).map(float)))
            running.append(Running(job, 1, draw(st.sampled_from(["best-effort", "best-effort", "normal"])),
                                   ((f"n{i}", tuple(held)),), started_at=started, saved_at=saved))
            job += 1
    arriving = Pending(1, draw(st.sampled_from(["critical", "normal"])), draw(st.integers(1, 4)),
                       nodes=draw(st.integers(1, 2)))
    return nodes, running, arriving


def lost(att: Running) -> float:
    since = att.started_at if att.saved_at is None else max(att.started_at, att.saved_at)
    return max(0.0, NOW - since) * sum(len(ids) for _, ids in att.alloc)


def fits(node: NodeState, running: list[Running], stopped: set[int], gpus: int) -> bool:
    held = sum(len(ids) for r in running if r.job_id not in stopped for n, ids in r.alloc if n == node.name)
    return len(node.gpu_ids) - held >= gpus


def oracle(nodes: list[NodeState], running: list[Running], job: Pending) -> tuple[float, int] | None:
    """The cheapest (work lost, victims) over every choice of nodes and of best-effort victims on them."""
    per_node: dict[str, tuple[float, int] | None] = {}
    for node in nodes:
        mine = [r for r in running if r.priority == "best-effort" and r.alloc[0][0] == node.name]
        best: tuple[float, int] | None = None
        for k in range(len(mine) + 1):
            for pick in itertools.combinations(mine, k):
                if fits(node, running, {r.job_id for r in pick}, job.gpus):
                    cost = (sum(lost(r) for r in pick), len(pick))
                    best = cost if best is None or cost < best else best
        per_node[node.name] = best
    options = sorted(c for c in per_node.values() if c is not None)
    if len(options) < job.nodes:
        return None
    chosen = options[: job.nodes]
    return sum(c[0] for c in chosen), sum(c[1] for c in chosen)


@FAST
@given(cases())
def test_victims_cost_no_more_than_the_cheapest_choice(case: tuple[list[NodeState], list[Running], Pending]) -> None:
    nodes, running, job = case
    out = schedule([job], nodes, running, now=NOW)
    if out.placements:
        return  # it fit without stopping anything
    best = oracle(nodes, running, job)
    victims = {p.job_id for p in out.preemptions}
    if best is None:
        assert not victims
        return
    if best == (0.0, 0):
        assert not victims
        return
    by_id = {r.job_id: r for r in running}
    assert all(by_id[v].priority == "best-effort" for v in victims)
    cost = (sum(lost(by_id[v]) for v in victims), len(victims))
    assert cost[0] <= best[0] + 1e-6 and cost <= (best[0] + 1e-6, best[1])
    # none superfluous: on its node, the job no longer fits without any one of them
    for v in victims:
        name = by_id[v].alloc[0][0]
        node = next(n for n in nodes if n.name == name)
        here = {w for w in victims if by_id[w].alloc[0][0] == name}
        assert not fits(node, running, here - {v}, job.gpus)
