"""A home whose disk fills while a job runs: its ending is recorded as ``infra`` with ``disk full:
PATH`` and what to free, the job is not run again while the disk is still full, and the node is
not blamed. Before, the supervisor died writing exit.json: ``infra: supervisor died``, the job run
again (the disk still full), and each ending counted toward the node's cordon.

Needs root (a 4 MB tmpfs is mounted as the home's disk); skipped elsewhere."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from autoresearch.api import Api
from tests.conftest import wait_state


@pytest.fixture
def small_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)],
                                           capture_output=True).returncode != 0:
        pytest.skip("needs root to mount a small tmpfs")
    home = disk / "home"
    monkeypatch.setenv("AUTORESEARCH_HOME", str(home))
    try:
        yield home
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def test_a_disk_that_fills_under_a_job_is_a_disk_full_ending_not_the_nodes_fault(small_disk: Path,
                                                                                 tmp_path: Path) -> None:
    api = Api(small_disk)
    fill = small_disk / "fill"
    job = api.submit({"command": ["sh", "-c", f"head -c 8M /dev/zero > {fill}; echo done; exit 0"],
                      "workdir": str(tmp_path)})
    view = wait_state(api, job.id, ("succeeded", "failed"), timeout=60)

    assert view.state == "failed" and view.attempts == 1  # not run again while the disk is still full
    attempt = view.attempt_list[0]
    assert attempt.end_reason == "infra" and attempt.detail == f"disk full: {small_disk.parent}"
    assert view.failure_hint is not None and f"free space on {small_disk.parent}" in view.failure_hint
    assert "not the node's fault" in (view.failure_why or "")
    findings = api._ledger.one("SELECT COUNT(*) FROM events WHERE kind='finding' AND data LIKE '%infra_failure%'")
    assert findings[0] == 0
    assert [n.state for n in api.nodes()] == ["healthy"]
    run_dir = small_disk / "jobs" / str(job.id) / "attempt-1"
    assert (run_dir / "exit.json").exists() and not list(run_dir.glob("exit.json.*.tmp"))  # the reserve became it
