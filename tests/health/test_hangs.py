"""Hangs acted on by policy (health.on_hang): kill stops the hung attempt (SIGKILL after the grace when it
ignores SIGTERM), dumps its Python stack first when py-spy is installed, and its ending is infra-suspect
(the machine's re-check decides); report leaves it running and a later timeout stays the user's."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from autoresearch.api import Api
from autoresearch.backends.fake import Script
from autoresearch.health.monitor import _dump_stack
from tests.health.conftest import CordoningFake, Fleet, configure, node_states, submit, view


def hung(home: Path, policy: str) -> tuple[Api, CordoningFake, int, str]:
    configure(home, f"on_hang: {policy}\nhang_after: 10m")
    fake = CordoningFake(nodes=2, gpus=8, programs={"train": Script(on_term="ignore")})
    api = Api(home, backend=fake)
    job = submit(api, gpus=1, max_retries=1, grace=5, timeout=3600)
    fake.emit(f"{job}.1", "step 1\n")
    api._runtime.tick()
    health, runtime = api._runtime.health, api._runtime
    active = runtime.jobs.active_attempts(fake.name)
    health.monitor(active, now=active[0]["created_at"] + 60)  # output seen: progress noted
    active = runtime.jobs.active_attempts(fake.name)
    health.monitor(active, now=active[0]["created_at"] + 60 + 700)  # silent past hang_after
    return api, fake, job, fake.attempt(f"{job}.1").request.node


def test_on_hang_kill_stops_a_hang_that_ignores_sigterm_and_its_ending_is_infra_suspect(
        home: Path, fleet: Fleet) -> None:
    api, fake, job, node = hung(home, "kill")
    signatures = {f.signature for f in api._runtime.health.store.attempt_findings(job, 1)}
    assert {"hang", "hang_killed"} <= signatures
    att = fake.attempt(f"{job}.1")
    assert att.term_at is not None and att.status is None  # SIGTERM sent, ignored
    fake.advance(10)  # past the grace: SIGKILL
    api._runtime.tick()
    v = view(api, job)
    first = v.attempt_list[0]
    assert first.failure_class == "infra-suspect" and v.attempts == 2
    assert node_states(api)[node][0] == "healthy"  # the machine's re-check passed: the job's silence decides nothing
    assert fake.attempt(f"{job}.2").request.node != node


def test_on_hang_report_leaves_it_running_and_a_later_timeout_stays_the_users(home: Path, fleet: Fleet) -> None:
    api, fake, job, _ = hung(home, "report")
    att = fake.attempt(f"{job}.1")
    assert att.term_at is None and att.status is None  # reported, not stopped
    fake.advance(3600 + 10)  # its timeout: SIGTERM ignored, SIGKILL after the grace
    api._runtime.tick()
    v = view(api, job)
    assert (v.state, v.failure_class) == ("failed", "user")


def _script(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


class Pids:
    name = "stub"

    def __init__(self, pids: Any) -> None:
        self.pids = pids

    def attempt_pids(self, external_id: str) -> Any:
        return self.pids


def test_the_stack_of_a_hung_python_program_is_dumped_with_py_spy_when_installed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    att = {"external_id": "x", "log_path": str(tmp_path / "attempt-1.log")}
    monkeypatch.setenv("PATH", str(bin_dir))
    assert _dump_stack(Pids([os.getpid()]), att) == ""  # not installed: skipped quietly
    _script(bin_dir / "py-spy", "#!/bin/sh\necho \"Process $3: python train.py\"\necho 'Thread 1 (idle)'\n"
                                "echo '    wait (train.py:12)'\n")
    line = _dump_stack(Pids([os.getpid()]), att)
    assert "stack dumped to" in line and "wait (train.py:12)" in line
    dumped = (tmp_path / "attempt-1.stack.txt").read_text()
    assert f"py-spy dump --pid {os.getpid()}" in dumped and "wait (train.py:12)" in dumped
    assert _dump_stack(Pids(["../../etc"]), att) == ""  # a pid that is no pid: no stack, no error
    _script(bin_dir / "py-spy", "#!/bin/sh\necho 'Error: Failed to find python version' >&2\nexit 1\n")
    assert "stack dumped" in _dump_stack(Pids([os.getpid()]), att)  # not a Python program: py-spy's word kept
    assert "Failed to find python version" in (tmp_path / "attempt-1.stack.txt").read_text()
