"""Each simulated fault reaches the runtime the way a real one does, and the same health
policy acts on it: a real Runtime, ledger and health checks over the sim backend."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from autoresearch.backends.sim import SimBackend
from autoresearch.engine import jobs
from autoresearch.engine.runtime import Runtime
from autoresearch.health.store import HealthStore


def fleet(home: Path, nodes: int = 1, **faults: Any) -> SimBackend:
    return SimBackend(nodes=[{"name": "n", "count": nodes, "gpus": 8}], faults=faults, seed=3,
                      clock={"mode": "events"}, trial={"steps": 200, "seconds": "100h"}, home_dir=str(home))


def submit(rt: Runtime, gpus: int = 1, **extra: Any) -> int:
    job = jobs.submit(rt, {"command": ["train"], "workdir": ".", "gpus": gpus, **extra})
    rt.tick()
    return job


def run_until_ended(rt: Runtime, sim: SimBackend, job: int, n: int = 1, hours: float = 200) -> Any:
    for _ in range(int(hours * 2)):
        att = rt.jobs.attempt(job, n)
        if att is not None and att["state"] not in ("starting", "running"):
            return att
        sim.clock.wait(1800)
        rt.tick()
    raise AssertionError(f"attempt {job}.{n} did not end in {hours} simulated hours")


def first_fault(sim: SimBackend, node: str, kind: str) -> float:
    found = [f for f in sim.state.schedule.events(node, 0, 30 * 86400) if f.kind == kind]
    assert found, f"no {kind} fault in 30 simulated days"
    return found[0].t


def test_xid_crashes_the_attempt_as_infra_and_cordons_the_node(home: Path) -> None:
    sim = fleet(home, xid=0.05)
    rt = Runtime(home, sim)
    job = submit(rt)
    att = run_until_ended(rt, sim, job, hours=24 * 30)
    assert att["failure_class"] == "infra", att["failure_why"]
    assert "xid_79" in att["failure_why"]
    assert b"Xid" in sim.read_log(att["external_id"])
    node = HealthStore(rt.ledger).node("n-0")
    assert node["state"] == "cordoned" and "xid_79" in node["reason"]
    assert sim.state.cordons() and sim.state.cordons()[0][0] == "n-0"  # the backend was told (an operator fixes it)
    assert rt.jobs.job(job)["state"] == "queued"  # retried elsewhere: nowhere, the only node is cordoned


def test_nccl_hang_ends_a_multi_gpu_attempt_with_the_watchdog_line(home: Path) -> None:
    sim = fleet(home, nccl_hang=0.05)
    rt = Runtime(home, sim)
    job = submit(rt, gpus=4)
    hang = first_fault(sim, "n-0", "nccl_hang")
    att = run_until_ended(rt, sim, job, hours=24 * 30)
    # the job's own output points at the machine: a suspicion (retried elsewhere), not a verdict on the node
    assert att["failure_class"] == "infra-suspect" and "collective_timeout" in att["failure_why"]
    status = sim.poll(att["external_id"])
    assert status.ended_at is not None and status.ended_at - sim.clock.wall(hang) == sim.fleet.faults.hang_timeout
    findings = HealthStore(rt.ledger).attempt_findings(job, 1)
    assert any(f.signature == "collective_timeout" for f in findings)


def test_thermal_throttling_marks_the_node_degraded_through_nvml(home: Path) -> None:
    sim = fleet(home, thermal=0.05)
    rt = Runtime(home, sim)
    (home / "config.yaml").write_text("health:\n  poll_interval: 0s\n")  # poll at every pass, not every 30 wall s
    submit(rt)
    hot = first_fault(sim, "n-0", "thermal")
    sim.clock.advance_to(hot + 60)
    assert sim.gpu_reader("n-0").sample().gpus[0].clock_event_reasons  # NVML reads the throttling
    rt.tick()
    node = HealthStore(rt.ledger).node("n-0")
    assert node["state"] == "degraded" and "throttling" in node["reason"]


def test_node_loss_loses_the_attempt_and_the_node_goes_down(home: Path) -> None:
    sim = fleet(home, nodes=2, node_loss=0.05)
    rt = Runtime(home, sim)
    job = submit(rt)
    node = rt.jobs.attempt(job, 1)["node"]
    att = run_until_ended(rt, sim, job, hours=24 * 30)
    assert att["end_reason"] == "infra" and "lost" in (att["detail"] or "")
    loss = sim.state.schedule.down(node, sim.clock.now())
    assert loss is not None
    assert [n.state for n in sim.nodes() if n.name == node] == ["down"]  # the sim says so, and why
    row = HealthStore(rt.ledger).node(node)
    assert row["state"] == "down" and "node lost (a simulated fault)" in row["reason"], dict(row)
    sim.clock.advance_to(sim.state.schedule.back_at(loss) + 1)
    rt.tick()
    row = HealthStore(rt.ledger).node(node)
    assert (row["state"], row["reason"]) == ("healthy", "")  # back: no reason left over from its loss


def test_a_node_back_from_down_keeps_no_reason_of_its_absence(home: Path) -> None:
    from autoresearch.backends import NodeInfo

    rt = Runtime(home, fleet(home, nodes=2))
    a, b = NodeInfo("a", ("0",), 1.0, 1), NodeInfo("b", ("0",), 1.0, 1)
    rt.jobs.save_nodes("sim", [a, b], 1.0)
    rt.jobs.save_nodes("sim", [a], 2.0)
    assert [(r["state"], r["reason"]) for r in rt.jobs.nodes("sim") if r["name"] == "b"] == [
        ("down", "not reported by backend")]
    rt.jobs.save_nodes("sim", [a, b], 3.0)
    assert [(r["state"], r["reason"]) for r in rt.jobs.nodes("sim") if r["name"] == "b"] == [("healthy", "")]


def test_a_fault_on_one_member_ends_the_gang_attempt(home: Path) -> None:
    sim = fleet(home, nodes=4, xid=0.02)
    first = {n: first_fault(sim, n, "xid") for n in ("n-0", "n-1", "n-2", "n-3")}
    struck = min(first, key=lambda n: first[n])
    other = next(n for n in first if n != struck)
    from autoresearch.backends import LaunchRequest

    request = LaunchRequest(key="9.1", argv=["train"], env={}, workdir=".", log_path=str(home / "9.log"),
                            run_dir=str(home / "9" / "attempt-1"), node=other, gpu_ids=("0",), nodes=2)
    alloc = ((other, ("0",)), (struck, ("0",)))  # contract 1: the whole placement, one (node, GPUs) per member
    if "alloc" in LaunchRequest.__dataclass_fields__:
        request = dataclasses.replace(request, alloc=alloc)  # type: ignore[call-arg]
    else:  # before the gang field is on main: the same request, with it
        request = SimpleNamespace(**dataclasses.asdict(request), alloc=alloc)  # type: ignore[assignment]
    ext = sim.start(request)
    record = json.loads((Path(request.run_dir) / "sim.json").read_text())["record"]
    assert record["nodes"] == [other, struck]
    sim.clock.advance_to(first[struck] + 1)
    status = sim.poll(ext)
    assert status.ended and status.exit_code == 1
    assert f"node {struck}".encode() in sim.read_log(ext)


def test_preemption_by_a_higher_class_loses_work_since_the_checkpoint_and_resumes_there(home: Path) -> None:
    sim = SimBackend(nodes=[{"name": "n", "count": 1, "gpus": 8}], seed=1, clock={"mode": "events"},
                     trial={"steps": 20, "seconds": "20h", "checkpoint_every": 5}, home_dir=str(home))
    rt = Runtime(home, sim)
    soak = submit(rt, gpus=8, priority="best-effort")
    sim.clock.advance_to(7.5 * 3600)  # 7 steps done: the checkpoint at step 5 holds
    rt.tick()
    urgent = submit(rt, gpus=8, priority="critical")
    for _ in range(5):
        rt.tick()
    first = rt.jobs.attempt(soak, 1)
    assert first["end_reason"] == "preempted"
    assert rt.jobs.attempt(urgent, 1) is not None  # it got the GPUs
    run_until_ended(rt, sim, urgent)
    rt.tick()
    second = rt.jobs.attempt(soak, 2)
    assert second is not None
    record = json.loads((Path(second["external_id"][4:]) / "sim.json").read_text())["record"]
    assert record["resume"] == 5  # steps 6 and 7 were lost with the preemption
