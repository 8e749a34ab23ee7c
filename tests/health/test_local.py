"""Health on the local backend with real processes: a trial whose log shows an NCCL failure is
retried as the machine's fault (its retries are the infra ones), one that raises is the user's
and fails fast; a node whose recorded GPUs are faulty never starts a GPU job."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_for, wait_state
from tests.health.conftest import FIXTURES


def test_an_nccl_failure_is_retried_and_an_exception_fails_fast(api: Any, workdir: Path) -> None:
    nccl = "import sys; print('NCCL error: unhandled system error, NCCL version 2.21.5', flush=True); sys.exit(1)"
    infra = api.submit({"command": [sys.executable, "-c", nccl], "workdir": str(workdir), "max_retries": 1})
    bug = api.submit({"command": [sys.executable, "-c", "raise ValueError('lr must be > 0')"],
                      "workdir": str(workdir), "max_retries": 3})
    v = wait_state(api, infra.id, "failed", timeout=60)
    assert v.attempts == 2 and v.failure_class == "infra" and "nccl_error" in (v.failure_why or "")
    u = wait_state(api, bug.id, "failed", timeout=60)
    assert u.attempts == 1 and u.failure_class == "user" and "python_exception" in (u.failure_why or "")
    assert "ValueError" in (u.log_excerpt or "")


def test_a_faulty_local_gpu_keeps_gpu_jobs_from_starting(api: Any, workdir: Path,
                                                         monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    state = json.loads((FIXTURES / "ecc.json").read_text())
    state["gpus"] = state["gpus"][:2]  # the 2 slots the test home declares
    state["gpus"][1]["ecc_volatile_uncorrected"] = 4
    path = tmp_path / "local.json"
    path.write_text(json.dumps(state))
    monkeypatch.setenv("AUTORESEARCH_NVML_FAKE", str(path))  # one node's state: this machine's
    job = api.submit({"command": [sys.executable, "-c", "print(1)"], "workdir": str(workdir), "gpus": 1})
    assert api.status(job.id).state == "queued"
    node = wait_for(lambda: next((n for n in api.nodes() if n.state == "cordoned"), None))
    assert "ecc_uncorrectable" in node.reason and node.findings
    cpu = api.submit({"command": [sys.executable, "-c", "print(1)"], "workdir": str(workdir)})
    assert cpu.state == "queued"  # a cordoned node takes no new work, GPU or not


def test_a_cpu_machine_without_a_driver_is_never_cordoned_for_it(home: Path, workdir: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # README's first command on a laptop: no driver, no AUTORESEARCH_GPUS, nvidia-ml-py installed.
    # The monitor's NVML read fails there by nature; it cordoned the only node, so every later
    # trial queued for ever behind "nvml_unavailable".
    from autoresearch.api import Api
    from autoresearch.health.nvml import FAKE_ENV

    monkeypatch.delenv("AUTORESEARCH_GPUS", raising=False)
    monkeypatch.delenv(FAKE_ENV, raising=False)
    api = Api(home)
    if any(n.gpus for n in api.nodes()):
        pytest.skip("this machine has a GPU driver")
    job = api.submit({"command": [sys.executable, "-c", "import time; time.sleep(30)"], "workdir": str(workdir)})
    wait_state(api, job.id, "running")
    runtime = api._runtime
    runtime.health.monitor(runtime.jobs.active_attempts(runtime.backend.name))
    assert [(n.state, n.reason) for n in api.nodes()] == [("healthy", "")]
    assert api.submit({"command": ["true"], "workdir": str(workdir)}).state in ("starting", "running", "succeeded")
    api.cancel([job.id])
