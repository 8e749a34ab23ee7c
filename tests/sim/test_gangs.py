"""Gangs on the simulated fleet: the driver watches every member's node with the runtime's own checks and
blames the node the machine's evidence names (health.policy.blamed), as the runtime does."""

from __future__ import annotations

from typing import Any

import pytest

from autoresearch.sim.driver import Driver, Job
from autoresearch.sim.faults import Fault
from autoresearch.sim.fleet import parse
from autoresearch.sim.timeline import Ending

NO_FAULTS = {"node_loss": 0, "xid": 0, "nccl_hang": 0, "thermal": 0}


def gang(monkeypatch: pytest.MonkeyPatch) -> tuple[Driver, tuple[str, ...], dict[str, Any]]:
    fleet = parse([{"name": "h100", "count": 4, "gpus": 8}], NO_FAULTS, 3)
    driver = Driver(fleet, [Job(1, "normal", 8, 2, (600.0,) * 6, 0.0, 2, "gang", project="p")], 86400.0)
    driver.enqueue(driver.jobs[1], 0.0)
    driver._pass(0.0)
    members = driver.running[1].rec.nodes
    assert len(members) == 2
    bad: dict[str, Any] = {}  # node -> the Xid that hit it

    def sick(node: str, t: float, cordons: Any = ()) -> Fault | None:
        return bad.get(node)

    monkeypatch.setattr(driver.schedule_, "sick", sick)
    # the monitor looks only at the nodes the schedule says a fault is in reach of: these
    monkeypatch.setattr(driver.schedule_, "touched", lambda t0, t1, kind="": set(bad))
    return driver, members, bad


def test_an_xid_on_member_1s_node_cordons_that_node_at_the_next_monitor_round(monkeypatch: pytest.MonkeyPatch) -> None:
    driver, (first, second), bad = gang(monkeypatch)
    bad[second] = Fault(10.0, "xid", second, 3)
    driver._monitor(30.0)
    assert driver.status[second].state == "cordoned" and "xid_79" in driver.status[second].reason
    assert driver.status[first].state == "healthy"


def test_a_gang_ended_by_member_1s_xid_blames_that_node_and_restarts_elsewhere(
        monkeypatch: pytest.MonkeyPatch) -> None:
    driver, (first, second), bad = gang(monkeypatch)
    bad[second] = Fault(10.0, "xid", second, 3)
    att = driver.running[1]
    att.life.ending = Ending(20.0, state="lost", detail="xid", cause="xid")
    driver._end(att)
    assert driver.status[second].state == "cordoned" and driver.status[first].state == "healthy"
    assert [f.signature for f in driver.findings[first]] == []  # no infra failure weighed on the healthy member
    driver._pass(40.0)
    assert second not in driver.running[1].rec.nodes


def test_an_idle_node_that_goes_bad_is_cordoned_by_the_monitor(monkeypatch: pytest.MonkeyPatch) -> None:
    driver, members, bad = gang(monkeypatch)
    idle = next(n for n in driver.types if n not in members)
    bad[idle] = Fault(10.0, "xid", idle, 0)
    driver._monitor(30.0)
    assert driver.status[idle].state == "cordoned"
