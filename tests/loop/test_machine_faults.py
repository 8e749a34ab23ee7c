"""The loop is told when a trial crashed for the machine's fault, not its config's
(autoresearch/health/): the trial is ``crashed`` (not counted against the budget) and the
failure the proposer observes says so, with the log line that decided it."""

from __future__ import annotations

from pathlib import Path

from autoresearch.backends import LaunchRequest
from autoresearch.backends.fake import FakeBackend, Script
from autoresearch.engine.runtime import Runtime
from autoresearch.loop.controller import Controller
from autoresearch.loop.plan import parse_plan
from autoresearch.loop.store import LoopStore


def nccl_or_loss(request: LaunchRequest) -> bytes:
    if request.argv[1] == "0.1":
        return b"[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=3)\n"
    return b"Traceback (most recent call last):\nValueError: bad lr\n"


def test_a_trial_that_crashed_on_the_machine_is_reported_to_the_proposer_as_the_machines_fault(
        home: Path, tmp_path: Path) -> None:
    fake = FakeBackend(gpus=1, programs={"train": Script(nccl_or_loss, exit_code=1)})
    plan = parse_plan({"name": "faults", "objective": {"metric": "loss"},
                       "trial": {"command": "train {x}", "max_retries": 0}, "space": {"x": [0.1, 0.5]},
                       "proposer": "grid", "budget": {"trials": 2, "parallel": 1}}, base_dir=tmp_path)
    runtime = Runtime(home, backend=fake)
    Controller(plan, runtime=runtime, poll_s=0.01).run()
    loop_id = runtime.ledger.one("SELECT id FROM loops WHERE name='faults'")["id"]
    trials = {t["params"]: t for t in LoopStore(runtime.ledger, loop_id).trials()}
    machine, program = trials['{"x": 0.1}'], trials['{"x": 0.5}']
    assert machine["state"] == "crashed"
    assert "the machine's fault, not this config's" in machine["failure"]
    assert "collective_timeout" in machine["failure"]
    assert program["state"] == "failed" and "machine" not in program["failure"]
