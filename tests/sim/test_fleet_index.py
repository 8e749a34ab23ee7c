"""The fleet-wide fault index the driver's monitor and passes read: the nodes with a fault in a window
are exactly those a look at every node one by one finds."""

from __future__ import annotations

import random

from autoresearch.sim.faults import Schedule
from autoresearch.sim.fleet import FAULT_KINDS, parse

FAULTS = {"node_loss": 0.01, "xid": 0.02, "nccl_hang": 0.02, "thermal": 0.05}


def test_touched_is_every_node_with_a_fault_in_the_window() -> None:
    fleet = parse([{"name": "h100", "count": 40, "gpus": 8}, {"name": "a100", "count": 9, "gpus": 4}], FAULTS, 11)
    sched = Schedule(fleet)
    names = [name for name, _ in fleet.nodes()]
    rng = random.Random(5)
    for _ in range(60):
        t0 = rng.uniform(-3600, 4 * 86400)
        t1 = t0 + rng.choice([0.0, 30.0, 3600.0, 86400.0, 2.5 * 86400])
        for kind in ("", *FAULT_KINDS):
            slow = {n for n in names if any(not kind or x.kind == kind for x in sched.events(n, t0, t1))}
            assert sched.touched(t0, t1, kind) == slow


def test_no_faults_touch_nothing() -> None:
    fleet = parse([{"name": "h100", "count": 4, "gpus": 8}], {k: 0 for k in FAULT_KINDS}, 3)
    assert Schedule(fleet).touched(0.0, 7 * 86400) == set()
