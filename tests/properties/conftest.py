"""Property tests share one ledger per test; its only node is cordoned, so an accepted job
waits in the queue instead of starting a process for every example."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def api(api: Any) -> Any:
    api._runtime.refresh_nodes()
    for row in api._ledger.query("SELECT name FROM nodes"):
        api.cordon(row["name"], "property tests: accepted jobs stay queued")
    return api



@pytest.fixture
def finished_job(api: Any, workdir: Path) -> int:
    """Job 1 ran (its node uncordoned for it) so reads have a log to page through."""
    from tests.conftest import wait_state

    nodes = [row["name"] for row in api._ledger.query("SELECT name FROM nodes")]
    for name in nodes:
        api.cordon(name, undo=True)
    job = api.submit({"command": ["/bin/sh", "-c", "echo hello; echo loss: 0.5"], "workdir": str(workdir)})
    wait_state(api, job.id, "succeeded")
    for name in nodes:
        api.cordon(name, "property tests: accepted jobs stay queued")
    return int(job.id)
