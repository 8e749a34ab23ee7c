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
    nccl = ("import sys; print('RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:"
            "1970, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5', flush=True); "
            "sys.exit(1)")
    infra = api.submit({"command": [sys.executable, "-c", nccl], "workdir": str(workdir), "max_retries": 1})
    bug = api.submit({"command": [sys.executable, "-c", "raise ValueError('lr must be > 0')"],
                      "workdir": str(workdir), "max_retries": 3})
    v = wait_state(api, infra.id, "failed", timeout=60)
    assert v.attempts == 2 and v.failure_class == "infra-suspect" and "nccl_error" in (v.failure_why or "")
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


# -- a job cannot forge the machine's evidence (real processes on the local backend, 2 declared GPUs) -------------

SPOOFS = [
    "checking dmesg for Xid 79 ... none found",
    "step 1 no ECC error detected",
    "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.",  # real-looking, still the job's
    "<b>NCCL error</b> &amp; Xid 48 ECC",
]


@pytest.fixture
def kmsg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This machine's kernel log, as a file in /dev/kmsg's format (empty: nothing happened)."""
    path = tmp_path / "kmsg"
    path.write_text("6,1,100,-;Linux version 6.1\n")
    monkeypatch.setenv("AUTORESEARCH_KMSG", str(path))
    return path


def _run(api: Any, workdir: Path, script: str, retries: int = 0) -> Any:
    job = api.submit({"command": ["sh", "-c", script], "workdir": str(workdir), "gpus": 1, "max_retries": retries})
    return wait_for(lambda: (lambda v: v if v.state in ("succeeded", "failed") else None)(api.status(job.id)),
                    timeout=60)


def test_a_job_printing_fault_like_lines_never_cordons_the_only_node(api: Any, workdir: Path, kmsg: Path) -> None:
    lines = "; ".join(f"printf '%s\\n' {json.dumps(s)}" for s in SPOOFS)
    done = _run(api, workdir, lines + "; head -c 1048576 /dev/zero | tr '\\0' x; echo; head -c 4096 /dev/urandom")
    assert done.state == "succeeded"
    failed = _run(api, workdir, lines + "; exit 1", retries=1)
    assert failed.state == "failed" and failed.attempts == 2 and failed.failure_class == "infra-suspect"
    assert [(n.state, n.reason) for n in api.nodes()] == [("healthy", "")]
    assert _run(api, workdir, "true").state == "succeeded"  # the next job runs: nothing waits for an uncordon


def test_jobs_that_kill_themselves_are_unknown_retried_and_never_cordon(api: Any, workdir: Path, kmsg: Path) -> None:
    for _ in range(3):
        v = _run(api, workdir, "kill -9 $$", retries=1)
        assert (v.state, v.attempts, v.failure_class) == ("failed", 2, "unknown")
        assert "nobody owns up" in (v.failure_hint or "")
    assert [n.state for n in api.nodes()] == ["healthy"]


def test_a_sigkill_with_the_oom_killers_record_in_the_kernel_log_is_out_of_memory(
        api: Any, workdir: Path, kmsg: Path) -> None:
    with kmsg.open("a") as fh:
        fh.write("3,2,200,-;Out of memory: Killed process 4242 (python) total-vm:900000kB, anon-rss:800000kB\n")
    v = _run(api, workdir, "kill -9 $$", retries=3)
    assert (v.state, v.attempts, v.failure_class) == ("failed", 1, "user")
    assert "oom_kill" in (v.failure_why or "") and "host memory" in (v.failure_hint or "")
    assert [n.state for n in api.nodes()] == ["healthy"]


def test_an_unreadable_kernel_log_is_a_finding_not_a_fault(
        api: Any, workdir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # (set before the home's first job: the pass daemon it starts reads the kernel log the same way)
    monkeypatch.setenv("AUTORESEARCH_KMSG", str(tmp_path / "missing"))
    assert _run(api, workdir, "true").state == "succeeded"  # the log cannot be read: said, not fatal
    from autoresearch.health.store import HealthStore

    found = {f.signature for f in HealthStore(api._runtime.ledger).recent_findings()}
    assert "kernel_log_unreadable" in found
    assert [n.state for n in api.nodes()] == ["healthy"]


def test_an_xid_in_the_kernel_log_cordons_the_node(api: Any, workdir: Path, kmsg: Path) -> None:
    assert _run(api, workdir, "true").state == "succeeded"  # the log read up to here: nothing happened
    with kmsg.open("a") as fh:
        fh.write("3,3,300,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.\n")
    v = _run(api, workdir, "exit 1", retries=0)
    assert v.failure_class == "infra" and "xid_79" in (v.failure_why or "")
    (node,) = api.nodes()
    assert node.state == "cordoned" and "xid_79" in node.reason
