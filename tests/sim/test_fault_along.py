"""An attempt's life reads its nodes' faults through :meth:`Schedule.along` (merged in time order, a day at
a time): at any moments, going forward as a life does, it answers as the per-node look-ups do (any member
throttling; the first fault of the kinds in a window, ties to the earlier node), across day boundaries,
with faults so frequent that several share a step."""

from __future__ import annotations

import random

import pytest

from autoresearch.sim.faults import DAY, Schedule
from autoresearch.sim.fleet import parse


@pytest.mark.parametrize("seed", range(8))
def test_along_answers_as_the_per_node_lookups(seed: int) -> None:
    rng = random.Random(seed)
    fleet = parse([{"name": "n", "count": 6, "gpus": 8}],
                  {"node_loss": 0.05, "xid": 0.1, "nccl_hang": 0.1, "thermal": rng.choice((0.0, 0.2)),
                   "thermal_for": rng.choice(("0", "30m", "2h", "2d"))}, seed)
    schedule = Schedule(fleet)
    names = fleet.node_names
    checked = 0
    for _ in range(20):
        nodes = tuple(rng.sample(names, rng.randint(1, 4)))
        kinds = rng.choice((("node_loss", "xid", "nccl_hang"), ("node_loss", "xid")))
        t = rng.uniform(0, 3 * DAY)
        along = schedule.along(nodes, t, kinds)
        for _ in range(40):
            end = t + rng.choice((0.0, rng.uniform(0, 600), rng.uniform(0, 6 * 3600)))
            assert along.throttling(t) == any(schedule.throttling(n, t) for n in nodes)
            assert along.first(t, end) == schedule.first(nodes, t, end, kinds)
            checked += along.first(t, end) is not None
            t = end
    assert checked > 20
