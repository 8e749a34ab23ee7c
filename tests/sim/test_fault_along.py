"""An attempt's life reads its nodes' faults through :meth:`Schedule.along` (merged in time order, a day at
a time): at any moments, going forward as a life does, it answers as the per-node look-ups do (any member
throttling; the first fault of the kinds in a window, ties to the earlier node), across day boundaries,
with faults so frequent that several share a step. What it says of the time ahead (``hot_at``,
``clear_after``) holds until the time it gives, so a life that asks only then is the same life as one
that asks at every step."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from autoresearch.sim.faults import DAY, Along, Schedule
from autoresearch.sim.fleet import parse
from autoresearch.sim.timeline import Record, live


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


@pytest.mark.parametrize("seed", range(8))
def test_what_along_says_ahead_holds_until_then(seed: int) -> None:
    """``hot_at`` (the last thermal fault and a time before which no other comes) and ``clear_after`` (a time
    before which no fault of the kinds comes) answer, for every moment before the time they give, as
    ``throttling`` and ``first`` do there."""
    rng = random.Random(seed)
    fleet = parse([{"name": "n", "count": 6, "gpus": 8}],
                  {"node_loss": 0.05, "xid": 0.1, "nccl_hang": 0.1, "thermal": rng.choice((0.05, 0.3)),
                   "thermal_for": rng.choice(("30m", "2h", "2d"))}, seed)
    schedule = Schedule(fleet)
    checked = 0
    for _ in range(20):
        nodes = tuple(rng.sample(fleet.node_names, rng.randint(1, 4)))
        kinds = rng.choice((("node_loss", "xid", "nccl_hang"), ("node_loss", "xid")))
        t = rng.uniform(0, 3 * DAY)
        along, ref = schedule.along(nodes, t, kinds), schedule.along(nodes, t, kinds)
        for _ in range(10):
            last, until = along.hot_at(t)
            clear = along.clear_after(t)
            for u in sorted(rng.uniform(t, min(until, clear, t + DAY)) for _ in range(10)):
                assert ref.throttling(u) == (last is not None and last > u - along.thermal_for)
                assert ref.first(t, u) is None
                checked += 1
            t = min(until, clear) + rng.choice((0.0, 1.0, 600.0))
    assert checked > 1000


def _defeated(monkeypatch: pytest.MonkeyPatch) -> None:
    """A life that asks the schedule at every step, as before ``hot_at`` and ``clear_after``."""
    hot_at = Along.hot_at
    monkeypatch.setattr(Along, "hot_at", lambda self, t: (hot_at(self, t)[0], t))
    monkeypatch.setattr(Along, "clear_after", lambda self, t: -math.inf)


@pytest.mark.parametrize("seed", range(6))
def test_a_life_is_the_same_as_asking_at_every_step(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    fleet = parse([{"name": "n", "count": 4, "gpus": 8}],
                  {"node_loss": 0.01, "xid": 0.02, "nccl_hang": 0.03, "thermal": 0.1, "thermal_for": "2h"}, seed)
    schedule = Schedule(fleet)
    records = []
    for i in range(60):
        steps = rng.randint(1, 400)
        nodes = tuple(rng.sample(fleet.node_names, rng.randint(1, 3)))
        records.append((Record(f"{i}.1", rng.uniform(0, 2 * DAY), nodes, 8 * len(nodes), rng.choice((1.0, 0.7)),
                               seconds=tuple(rng.choice((0.0, 30.0, 300.0, 1200.0)) for _ in range(steps)),
                               values=(1.0,) * steps, checkpoint_steps=rng.choice((0, 5))),
                        rng.choice((None, (rng.uniform(0, 3 * DAY), 30.0)))))
    fast = [live(rec, schedule, stop=stop) for rec, stop in records]
    _defeated(monkeypatch)
    slow = [live(rec, schedule, stop=stop) for rec, stop in records]
    assert fast == slow
    assert {life.ending.cause for life in fast if life.ending is not None} >= {"done", "xid", "nccl_hang"}


def test_a_long_life_asks_the_schedule_when_something_can_change(monkeypatch: pytest.MonkeyPatch) -> None:
    fleet = parse([{"name": "n", "count": 2, "gpus": 8}], {"node_loss": 0, "xid": 0.001, "nccl_hang": 0,
                                                           "thermal": 0.01, "thermal_for": "2h"}, 4)
    schedule = Schedule(fleet)
    asked = [0]
    first = Along.first

    def counted(self: Along, t0: float, t1: float) -> Any:
        asked[0] += 1
        return first(self, t0, t1)

    monkeypatch.setattr(Along, "first", counted)
    rec = Record("1.1", 0.0, ("n-0", "n-1"), 16, 1.0, seconds=(60.0,) * 20_000, checkpoint_steps=30)
    life = live(rec, schedule, output=False)
    assert life.ending is not None
    steps = round((life.ending.t - rec.t0) / 60)
    assert steps > 2000 and asked[0] < steps / 50  # about once a simulated day, not once a step
