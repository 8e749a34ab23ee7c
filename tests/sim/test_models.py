"""The fleet's models: faults by seed, checkpoint semantics, the clock, trials that report."""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path
from typing import Any

import pytest

from autoresearch.backends import LaunchRequest
from autoresearch.backends.sim import SimBackend
from autoresearch.engine import jobs
from autoresearch.engine.runtime import Runtime
from autoresearch.sim.driver import Driver, Job
from autoresearch.sim.faults import Schedule
from autoresearch.sim.fleet import parse
from autoresearch.sim.timeline import Record, live

FAULTS = {"node_loss": 0.01, "xid": 0.01, "nccl_hang": 0.01, "thermal": 0.02}


def request(home: Path, key: str, env: dict[str, str] | None = None, node: str = "n-0") -> LaunchRequest:
    job, n = key.split(".")
    return LaunchRequest(key=key, argv=["train"], env=env or {}, workdir=".", log_path=str(home / f"{key}.log"),
                         run_dir=str(home / "jobs" / job / f"attempt-{n}"), node=node, gpu_ids=("0",))


def events_fleet(home: Path, trial: dict[str, Any], **kw: Any) -> SimBackend:
    return SimBackend(nodes=[{"name": "n", "count": 2, "gpus": 8}], trial=trial, clock={"mode": "events"},
                      home_dir=str(home), **kw)


def test_the_same_seed_gives_the_same_faults_and_another_seed_others() -> None:
    def faults(seed: int) -> list[Any]:
        fleet = parse([{"name": "h", "count": 8, "gpus": 8}], FAULTS, seed)
        s = Schedule(fleet)
        return [(f.t, f.kind, f.gpu) for node in fleet.node_names for f in s.events(node, 0, 7 * 86400)]

    first = faults(7)
    assert first == faults(7)
    assert {k for _, k, _ in first} == {"node_loss", "xid", "nccl_hang", "thermal"}
    assert first != faults(8)
    # any window of the schedule reads the same as the whole: no history to replay
    fleet = parse([{"name": "h", "count": 8, "gpus": 8}], FAULTS, 7)
    late = Schedule(fleet).events("h-3", 3 * 86400, 4 * 86400)
    assert late == [f for f in Schedule(fleet).events("h-3", 0, 7 * 86400) if 3 * 86400 < f.t <= 4 * 86400]


def test_the_driver_is_deterministic_by_seed() -> None:
    def run(seed: int) -> tuple[Any, ...]:
        fleet = parse([{"name": "h", "count": 4, "gpus": 8}], FAULTS, seed)
        mix = [Job(i, "normal" if i % 3 else "best-effort", 8 if i % 2 else 1, 1 + i % 2, (600.0,) * 12, i * 900.0, 3)
               for i in range(1, 60)]
        s = Driver(fleet, mix, 2 * 86400.0).run()
        return (s.useful_gpu_s, s.lost_fault_gpu_s, s.lost_preempt_gpu_s, s.jobs_failed, s.attempts,
                sorted(s.faults_hit.items()))

    assert run(3) == run(3)
    assert run(3) != run(4)


def test_work_since_the_last_checkpoint_is_lost_and_the_next_attempt_resumes_there(home: Path) -> None:
    sim = events_fleet(home, {"steps": 100, "seconds": 6000, "checkpoint_every": 10})
    metrics = home / "1.metrics.jsonl"
    first = sim.start(request(home, "1.1", {"AUTORESEARCH_METRICS_FILE": str(metrics)}))
    sim.clock.advance_to(25.5 * 60)  # 25 steps done, the 26th half way
    assert sim.poll(first).state == "running"
    sim.stop(first)
    status = sim.poll(first)
    assert status.ended and status.stopped
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == list(range(1, 26))
    metrics2 = home / "2.metrics.jsonl"
    second = sim.start(request(home, "1.2", {"AUTORESEARCH_METRICS_FILE": str(metrics2)}))
    record = json.loads((home / "jobs" / "1" / "attempt-2" / "sim.json").read_text())["record"]
    assert record["resume"] == 20  # steps 21..25 were lost with the stop
    sim.clock.advance_to(25.5 * 60 + 3 * 60)
    sim.poll(second)
    assert [json.loads(line)["step"] for line in metrics2.read_text().splitlines()] == [21, 22, 23]
    assert b"resumed from the checkpoint at step 20" in sim.read_log(second)


def test_checkpoints_by_simulated_time_and_loss_on_a_fault() -> None:
    fleet = parse([{"name": "h", "count": 1, "gpus": 8}], {"node_loss": 0.5}, 1)
    schedule = Schedule(fleet)
    loss = next(f for f in schedule.events("h-0", 0, 86400) if f.kind == "node_loss")
    rec = Record("1.1", 0.0, ("h-0",), 8, 1.0, seconds=(60.0,) * 100000, values=(1.0,) * 100000,
                 checkpoint_s=1800.0)
    life = live(rec, schedule, output=False)
    assert life.ending is not None and life.ending.cause == "node_loss" and life.ending.state == "lost"
    assert life.ending.t == loss.t
    kept = life.checkpoint_at(loss.t)
    assert kept == int(loss.t // 1800) * 30  # every 30 steps of 60 s
    assert 0 <= loss.t - kept * 60 < 1800  # what was lost: less than one checkpoint interval


def test_thermal_throttling_slows_steps_by_its_factor() -> None:
    fleet = parse([{"name": "h", "count": 1, "gpus": 8}], {"thermal": 0.2, "thermal_for": "10h"}, 2)
    schedule = Schedule(fleet)
    hot = next(f for f in schedule.events("h-0", 0, 86400) if f.kind == "thermal").t
    rec = Record("1.1", hot, ("h-0",), 1, 1.0, seconds=(100.0,) * 10, values=(1.0,) * 10)
    life = live(rec, schedule)
    assert life.ending is not None and life.ending.t == pytest.approx(hot + 10 * 100 * 1.5)
    assert live(rec, None).ending.t == pytest.approx(hot + 1000)  # type: ignore[union-attr]


def test_events_clock_jumps_to_the_next_point_and_wall_clock_runs_at_speed(home: Path) -> None:
    sim = events_fleet(home, {"steps": 10, "seconds": 1000})
    assert sim.clock.wait(50) is False and sim.clock.now() == 50  # nothing runs: time moves by the timeout
    sim.start(request(home, "3.1", {}))
    assert sim.clock.wait(3600) is True and sim.clock.now() == pytest.approx(150)  # the first step's point
    wall = SimBackend(nodes=2, clock={"mode": "wall", "speed": 3600}, home_dir=str(home / "w"))
    again = SimBackend(nodes=2, clock={"mode": "wall", "speed": 3600}, home_dir=str(home / "w"))
    assert wall.clock.epoch == again.clock.epoch  # persisted once: every process agrees on simulated now
    t0 = wall.clock.now()
    time.sleep(0.05)
    assert wall.clock.now() - t0 >= 0.05 * 3600 * 0.9


def test_a_job_on_the_sim_reports_its_curve_and_succeeds(home: Path) -> None:
    sim = events_fleet(home, {"steps": 20, "seconds": "2h", "metric": "val_loss"})
    rt = Runtime(home, sim)
    job = jobs.submit(rt, {"command": ["train"], "workdir": ".", "gpus": 1, "cpus": 4, "memory": "8G"})
    rt.tick()
    assert rt.jobs.attempt(job, 1) is not None  # a node type's cores and memory hold what a job names
    for _ in range(100):
        if rt.jobs.job(job)["state"] == "succeeded":
            break
        sim.clock.wait(600)
        rt.tick()
    assert rt.jobs.job(job)["state"] == "succeeded"
    rows = rt.ledger.query("SELECT step, value, source FROM metrics WHERE job_id=? AND name='val_loss' ORDER BY step",
                           (job,))
    assert [r["step"] for r in rows] == list(range(1, 21)) and {r["source"] for r in rows} == {"report"}
    assert rows[0]["value"] > rows[-1]["value"]  # the loss falls
    att = rt.jobs.attempt(job, 1)
    assert att["ended_at"] - att["started_at"] == pytest.approx(7200)  # two simulated hours


def test_a_curve_table_is_replayed_step_by_step(home: Path) -> None:
    table = {"format": "autoresearch-curves/1", "workload": "w", "metric": "err", "mode": "min",
             "space": {"lr": {"low": 0.001, "high": 0.1, "log": True}}, "step_unit": "epoch", "max_step": 3,
             "configs": [{"params": {"lr": 0.01}, "values": [0.5, 0.3, 0.2], "seconds": [10, 20, 30]},
                         {"params": {"lr": 0.1}, "values": [0.9, 0.8, 0.7], "seconds": 5}]}
    path = home / "curves.json.gz"
    home.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(json.dumps(table).encode()))
    sim = events_fleet(home, {"model": "curve", "file": str(path), "metric": "err"})
    metrics = home / "m.jsonl"
    ext = sim.start(request(home, "4.1", {"AUTORESEARCH_METRICS_FILE": str(metrics),
                                          "AUTORESEARCH_PARAMS": json.dumps({"lr": 0.011})}))
    sim.clock.advance_to(100)
    status = sim.poll(ext)
    assert status.ended and status.exit_code == 0 and status.ended_at == sim.clock.wall(60)
    points = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [(p["step"], p["metrics"]["err"]) for p in points] == [(1, 0.5), (2, 0.3), (3, 0.2)]
    assert [p["ts"] - sim.clock.epoch for p in points] == [10, 30, 60]


def test_cordoning_sick_nodes_saves_work_on_the_same_seed() -> None:
    """A node whose GPU failed takes every job placed on it down with it until someone notices;
    the health policy cordons it at the first sign, so fewer jobs fail and more work is kept."""
    def run(cordon: bool) -> Any:
        fleet = parse([{"name": "h", "count": 8, "gpus": 8}], {"xid": 0.01, "unattended_repair": "24h"}, 5)
        mix = [Job(i, "normal", 8, 1, (300.0,) * 12, i * 300.0, 4) for i in range(1, 600)]  # more than fits
        return Driver(fleet, mix, 2 * 86400.0, cordon=cordon).run()

    on, off = run(True), run(False)
    assert on.cordons > 0 and off.cordons == 0
    assert on.faults_hit.get("xid", 0) < off.faults_hit.get("xid", 0)
    assert on.jobs_failed < off.jobs_failed
    assert on.goodput > off.goodput
