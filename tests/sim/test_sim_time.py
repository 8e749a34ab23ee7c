"""The runtime's waits run on the fleet's clock: on the sim backend in events mode, where simulated
time jumps hours at a wait while wall time barely moves, a reservation, a health cordon's cool-down,
a stop sent again and a timeout happen at the simulated moment they are due (not never)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from autoresearch.backends.sim import SimBackend
from autoresearch.engine import jobs
from autoresearch.engine.runtime import Runtime
from autoresearch.health.findings import Finding
from autoresearch.health.monitor import review
from autoresearch.health.store import HealthStore


def fleet(home: Path, nodes: int = 1, hours: str = "100h") -> SimBackend:
    return SimBackend(nodes=[{"name": "n", "count": nodes, "gpus": 8}], seed=3, clock={"mode": "events"},
                      trial={"steps": 100, "seconds": hours}, home_dir=str(home))


def sim_ts(sim: SimBackend) -> float:
    """Simulated now as a timestamp (what the backend stamps ``started_at`` with)."""
    return sim.clock.wall(sim.clock.now())


def submit(rt: Runtime, gpus: int = 1, **extra: Any) -> int:
    return jobs.submit(rt, {"command": ["train"], "workdir": ".", "gpus": gpus, **extra})


def test_the_runtime_and_its_ledger_read_the_fleets_clock(home: Path) -> None:
    sim = fleet(home)
    rt = Runtime(home, sim)
    sim.clock.advance_to(3 * 86400)
    assert rt.ledger.clock() == sim_ts(sim)
    job = submit(rt)
    assert rt.jobs.job(job)["submitted_at"] == sim_ts(sim)  # stamped in simulated time, as the attempts are


def test_a_job_waiting_past_the_reservation_age_holds_a_node_in_simulated_time(home: Path) -> None:
    sim = fleet(home)
    rt = Runtime(home, sim)
    small = [submit(rt) for _ in range(7)]  # 7 of the node's 8 GPUs busy for 100 simulated hours
    rt.tick()
    assert all(rt.jobs.attempt(j, 1) is not None for j in small)
    big = submit(rt, gpus=8)
    rt.tick()
    decisions = rt.schedule()
    assert decisions is not None and big not in decisions.reserved.values()  # it has not waited yet
    sim.clock.advance_to(sim.clock.now() + 60)
    decisions = rt.schedule()
    assert decisions is not None and big not in decisions.reserved.values()  # a minute: not long enough
    sim.clock.advance_to(sim.clock.now() + 600)  # past reserve_after_s (5 min) of simulated waiting
    decisions = rt.schedule()
    assert decisions is not None and decisions.reserved == {"n-0": big}
    late = submit(rt)  # the free GPU is held for the big job: a later 1-GPU job does not take it
    rt.tick()
    assert rt.jobs.attempt(late, 1) is None


def test_in_wall_mode_the_reservation_age_runs_at_the_fleets_speed(home: Path) -> None:
    sim = SimBackend(nodes=[{"name": "n", "count": 1, "gpus": 8}], seed=3, clock={"mode": "wall", "speed": 3600},
                     trial={"steps": 100, "seconds": "1000h"}, home_dir=str(home))
    rt = Runtime(home, sim)
    for _ in range(7):
        submit(rt)
    rt.tick()
    big = submit(rt, gpus=8)
    rt.tick()
    deadline = time.monotonic() + 60  # 5 simulated minutes are 0.08 wall seconds at this speed
    reserved: dict[str, int] = {}
    while not reserved and time.monotonic() < deadline:
        decisions = rt.schedule()
        reserved = decisions.reserved if decisions is not None else {}
        time.sleep(0.05)
    assert reserved == {"n-0": big}


def test_a_soft_health_cordon_lifts_after_its_cool_down_in_simulated_time(home: Path) -> None:
    sim = fleet(home, nodes=2)
    (home / "config.yaml").write_text("health:\n  uncordon: preflight\n  cooldown: 10m\n  poll_interval: 0s\n")
    rt = Runtime(home, sim)
    rt.tick()
    sim.clock.advance_to(3600)
    store = HealthStore(rt.ledger)
    store.record([Finding("n-1", "xid_13", "infra", "hard", "nvml", "0", "Xid 13 (a soft cause)", sim_ts(sim))])
    assert review(rt.ledger, sim, "n-1", sim_ts(sim)) == "cordoned"
    assert store.node("n-1")["since"] == sim_ts(sim)
    sim.clock.advance_to(3600 + 300)  # half the cool-down: a passing check does not lift it yet
    rt.tick()
    assert store.node("n-1")["state"] == "cordoned"
    sim.clock.advance_to(3600 + 660)  # past it: the next pass's check lifts it
    rt.tick()
    assert store.node("n-1")["state"] == "healthy"


def test_a_stop_never_sent_is_sent_again_after_grace_in_simulated_time(home: Path) -> None:
    sim = fleet(home)
    rt = Runtime(home, sim)
    job = submit(rt, grace=20)
    rt.tick()
    att = rt.jobs.attempt(job, 1)
    assert att is not None and att["state"] in ("starting", "running")
    rt.jobs.mark_stop(job, 1, "cancelled")  # recorded, then the process died before it was sent
    run_dir = Path(att["external_id"][4:])
    rt.tick()
    assert not (run_dir / "stop.json").exists()  # not yet: it may still be on its way
    sim.clock.advance_to(sim.clock.now() + 20 + rt.STOP_AGAIN_AFTER_S + 1)
    rt.tick()
    assert json.loads((run_dir / "stop.json").read_text())["grace"] == 20


def test_a_timeout_ends_the_attempt_at_the_simulated_moment(home: Path) -> None:
    sim = fleet(home)
    rt = Runtime(home, sim)
    sim.clock.advance_to(1000)
    job = submit(rt, timeout="1h", grace=30)
    rt.tick()
    for _ in range(10):
        sim.clock.wait(1800)
        rt.tick()
    att = rt.jobs.attempt(job, 1)
    assert att["state"] not in ("starting", "running")
    assert att["started_at"] == sim.clock.wall(1000)
    # SIGTERM at the hour; a sim trial ends on it at once
    assert att["ended_at"] - att["started_at"] == 3600
    assert rt.jobs.job(job)["state"] == "failed" and "timeout" in (att["detail"] or "")


def test_the_gpus_stopped_for_a_job_wait_for_it_through_the_grace_period_in_simulated_time(home: Path) -> None:
    """A best-effort attempt holds the node; a normal job stops it. A job queued after, at an older place
    (a resumed trial's), sorts ahead of it: when the victim has ended, simulated minutes later, the job it
    was stopped for starts, not the one sorted ahead (the hold is events, no wall clock)."""
    sim = fleet(home)
    rt = Runtime(home, sim)
    victim = submit(rt, gpus=8, priority="best-effort")
    rt.tick()
    assert rt.jobs.attempt(victim, 1) is not None
    wanted = submit(rt, gpus=8)  # its pass stops the victim
    ahead = jobs.submit_many(rt, [{"command": ["train"], "workdir": ".", "gpus": 8}], place_as=victim)[0]
    assert rt.jobs.attempt(ahead, 1) is None and rt.jobs.attempt(wanted, 1) is None
    sim.clock.advance_to(sim.clock.now() + 600)  # past the victim's grace period
    for _ in range(3):
        rt.tick()
    assert rt.jobs.attempt(wanted, 1) is not None
    assert rt.jobs.attempt(ahead, 1) is None
