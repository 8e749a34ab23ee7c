"""The simulated driver's monitor reads only what can have changed (sim/driver.py ``_monitor``): a healthy
node that read clean is left alone until its next Xid or thermal fault (``Schedule.next_of``), a degraded
node throttling steadily under load has its poll noted by time only, and a degraded node that reads clean
is not reviewed while only its throttling can weigh (findings held as ``_inert``). The same seed gives the
same run as reading every node in reach at every round (``Driver.shortcuts = False``): every figure,
cordon, status change, start and finding; a fault inside the skipped stretch is seen at the first round
after it."""

from __future__ import annotations

import dataclasses
import random
import sys
from pathlib import Path
from typing import Any

import pytest

from autoresearch.engine.scheduler import FairShare, Share
from autoresearch.health import policy as P
from autoresearch.health.config import HealthConfig
from autoresearch.health.findings import Finding
from autoresearch.sim import driver as D
from autoresearch.sim.faults import Schedule
from autoresearch.sim.fleet import parse

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import bench_sim_week as B  # noqa: E402

HOT = {**B.FAULTS, "node_loss": 0.005, "xid": 0.02, "nccl_hang": 0.02, "thermal": 0.08}


class _Logged(D.Driver):
    """The driver, its starts and status changes logged."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.log: list[tuple[Any, ...]] = []

    def _launch(self, job: D.Job, alloc: Any, t: float) -> None:
        self.log.append(("start", t, job.id, alloc))
        super()._launch(job, alloc, t)

    def _set_status(self, node: str, status: Any) -> None:
        self.log.append(("status", node, status))
        super()._set_status(node, status)


def _run(seed: int, shortcuts: bool, fair: bool) -> tuple[Any, ...]:
    rng = random.Random(seed)
    nodes = rng.choice((6, 12, 16))
    horizon = rng.choice((1.0, 2.0)) * 86400
    fleet = parse([{"name": "h100", "count": nodes, "gpus": 8}], HOT, seed)
    jobs = (B.shared_mix(seed, horizon, nodes) if fair
            else B.misbehave(B.job_mix(seed, horizon, nodes), seed, 0.1, 0.05))
    share = FairShare({p: Share(w) for p, w in B.PROJECTS.items()}) if fair else None
    driver = _Logged(fleet, jobs, horizon, fair=share)
    driver.shortcuts = shortcuts
    stats = driver.run()
    findings = {node: list(found) for node, found in driver.findings.items()}
    return dataclasses.asdict(stats), driver.log, driver.cordon_log, driver.status, findings


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("fair", [False, True])
def test_the_shortcuts_give_the_same_run_as_reading_every_node(seed: int, fair: bool) -> None:
    fast = _run(seed, True, fair)
    slow = _run(seed, False, fair)
    assert fast[0] == slow[0]  # every figure
    assert fast[1] == slow[1]  # every start and status change, in order
    assert fast[2:] == slow[2:]  # cordons, the final states, every node's findings


def test_a_fault_inside_the_skipped_stretch_is_seen_at_the_next_round(monkeypatch: pytest.MonkeyPatch) -> None:
    """Idle nodes (no jobs: only the monitor sees them): between the round that found a node clean and its
    next Xid, nothing reads the node; the first round at or after the Xid cordons it."""
    fleet = parse([{"name": "h100", "count": 6, "gpus": 8}], {**HOT, "xid": 0.05, "thermal": 0.02}, 5)
    driver = D.Driver(fleet, [], 3 * 86400.0)
    horizons: list[tuple[str, float, float | None]] = []  # (node, the round's time, the fault it waits for)
    reads: list[tuple[str, float]] = []
    rounds: list[float] = []
    next_of, sick, monitor = Schedule.next_of, Schedule.sick, D.Driver._monitor

    def spy_next_of(self: Schedule, node: str, t0: float, t1: float, kinds: tuple[str, ...] = ()) -> float | None:
        due = next_of(self, node, t0, t1, kinds)
        horizons.append((node, t0, due))
        return due

    def spy_sick(self: Schedule, node: str, t: float, cordons: Any = ()) -> Any:
        reads.append((node, t))
        return sick(self, node, t, cordons)

    def spy_monitor(self: D.Driver, t: float) -> bool:
        rounds.append(t)
        return monitor(self, t)

    monkeypatch.setattr(Schedule, "next_of", spy_next_of)
    monkeypatch.setattr(Schedule, "sick", spy_sick)
    monkeypatch.setattr(D.Driver, "_monitor", spy_monitor)
    driver.run()
    checked = 0
    for node, since, due in horizons:
        if due is None or not any(x.kind == "xid" and x.t == due for x in driver.schedule_.events(node, since, due)):
            continue
        seen = min(t for t in rounds if t >= due)
        assert not [t for n, t in reads if n == node and since < t < due]  # left alone in between
        assert (node, seen) in driver.cordon_log  # and cordoned at the first round after its Xid
        checked += 1
    assert checked >= 3


def test_a_steady_throttling_read_is_noted_by_its_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A busy node throttling for hours: its polls make findings once, and what is read afterwards is what
    reading it at every round gives (the findings of the latest poll, stamped with its time)."""
    faults = {"node_loss": 0, "xid": 0, "nccl_hang": 0, "thermal": 0.02, "thermal_for": "3h"}
    made: list[int] = []
    nvml = D.Driver._nvml

    def spy_nvml(self: D.Driver, node: str, t: float, *args: Any, **kwargs: Any) -> list[Finding]:
        found = nvml(self, node, t, *args, **kwargs)
        made.append(len(found))
        return found

    monkeypatch.setattr(D.Driver, "_nvml", spy_nvml)
    out = []
    for shortcuts in (True, False):
        fleet = parse([{"name": "h100", "count": 2, "gpus": 8}], faults, 11)
        jobs = [D.Job(i, "normal", 8, 1, (600.0,) * 60, 0.0, 6, "soak", project="p") for i in (1, 2)]
        driver = D.Driver(fleet, jobs, 86400.0)
        driver.shortcuts = shortcuts
        made.clear()
        stats = driver.run()
        out.append((dataclasses.asdict(stats), driver.status, driver.findings, sum(made)))
    (fast_stats, fast_status, fast_found, fast_made), (slow_stats, slow_status, slow_found, slow_made) = out
    assert slow_made > 200  # every round read the throttling node: 16 findings each
    assert fast_made * 10 < slow_made
    assert fast_stats == slow_stats and fast_status == slow_status and fast_found == slow_found


def test_next_of_is_the_first_fault_of_those_kinds() -> None:
    fleet = parse([{"name": "n", "count": 3, "gpus": 8}], {**HOT, "thermal_for": "1h"}, 2)
    schedule = Schedule(fleet)
    rng = random.Random(2)
    for _ in range(200):
        node = rng.choice(fleet.node_names)
        t0 = rng.uniform(0, 3 * 86400)
        t1 = t0 + rng.choice((0.0, rng.uniform(0, 3600), rng.uniform(0, 2 * 86400)))
        kinds = rng.choice((("xid", "thermal"), ("node_loss",), ("xid",)))
        want = [x.t for x in schedule.events(node, t0, t1) if x.kind in kinds]
        assert schedule.next_of(node, t0, t1, kinds) == (want[0] if want else None)


# (signature, class, severity, source) of what a node's findings hold besides its throttling
OTHERS = (("infra_failure", "infra", "soft", "verdict"), ("infra_failure", P.SUSPECT, "soft", "ending"),
          ("xid_79", "infra", "hard", "nvml"), ("nccl_error", P.SUSPECT, "soft", "log"),
          ("xid_79", "infra", "hard", "log"), ("nvml_error", "infra", "soft", "nvml"),
          ("hot", "throttle", "soft", "nvml"), ("collective_timeout", P.SUSPECT, "soft", "ending"))


@pytest.mark.parametrize("seed", range(300))
def test_findings_held_as_inert_weigh_in_no_later_answer(seed: int) -> None:
    """What ``_hold`` leaves beside a steady throttling read: when every other finding is ``_inert``, the
    policy's answer at any later poll (with a differential that vouches for every ending) is the state the
    node is in, and the differential has nothing to say."""
    rng = random.Random(seed)
    config = HealthConfig()
    t = 100_000.0
    cleared = rng.choice((0.0, t - 5000.0, t - 100.0))
    rest = []
    for i in range(rng.randint(1, 8)):
        sig, cls, sev, source = rng.choice(OTHERS)
        ts = t - rng.choice((0.0, 30.0, 600.0, 3599.0, 3600.0, 3601.0, 7200.0, 9000.0))
        rest.append(Finding("n1", sig, cls, sev, source, None, f"{sig} {i}", ts, i if source == "ending" else None))
    since = t - config.cordon_window_s
    if not all(D._inert(f, cleared, since) for f in rest):
        return
    poll = [Finding("n1", "throttling", "throttle", "soft", "nvml", str(g), "clocks slowed: hw_thermal", t)
            for g in range(2)]
    status = P.NodeStatus("degraded", P.PREFIX + poll[0].line()[:240], t - 900.0, cleared)
    jobs = frozenset(f.job_id for f in rest if f.job_id is not None)
    diff = P.Differential(8, jobs, frozenset(f"p{j}" for j in jobs), tuple((j, f"p{j}") for j in sorted(jobs)))
    for later in (t, t + 30.0, t + 4000.0):
        stamped = [dataclasses.replace(f, ts=later) for f in poll]
        assert P.node_state(status, [*rest, *stamped], config, later, diff=diff) == status
        assert not [f for f in rest if f.source == "ending" and f.ts >= later - config.cordon_window_s]


@pytest.mark.parametrize("shortcuts", [True, False])
def test_a_fading_node_with_endings_in_the_window_is_reviewed_at_every_round(shortcuts: bool) -> None:
    """A degraded node that reads clean is left unreviewed only while nothing but its throttling can weigh:
    with infra-suspect endings in the window, the fleet's differential can turn (their jobs succeed
    elsewhere) and the next round cordons it."""
    fleet = parse([{"name": "h100", "count": 4, "gpus": 8}], {"node_loss": 0, "xid": 0, "nccl_hang": 0,
                                                              "thermal": 0}, 1)
    driver = D.Driver(fleet, [D.Job(j, "normal", 8, 1, (600.0,), 0.0, project=f"p{j % 2}") for j in (1, 2, 3)],
                      86400.0)
    driver.shortcuts = shortcuts
    node, other = fleet.node_names[0], fleet.node_names[1]
    hot = [Finding(node, "throttling", "throttle", "soft", "nvml", str(g), "clocks slowed: hw_thermal", 10.0)
           for g in range(2)]
    endings = [Finding(node, "infra_failure", P.SUSPECT, "soft", "ending", None, f"job {j}: nccl_hang", 10.0, j, 1)
               for j in (1, 2, 3)]
    driver.findings[node] = [*endings, *hot]
    driver._set_status(node, P.NodeStatus("degraded", P.PREFIX + hot[0].line()[:240], 0.0, 0.0))
    driver._monitor(30.0)
    assert driver.status[node].state == "degraded"  # nobody vouched for those jobs yet
    driver.successes += [(60.0, (other,), j, f"p{j % 2}") for j in (1, 2, 3)]  # now they ran elsewhere
    driver._monitor(90.0)
    assert driver.status[node].state == "cordoned"
