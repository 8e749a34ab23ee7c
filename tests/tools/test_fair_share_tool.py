"""MCP cluster_status shows each project's use against its fair share (issue 11)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_state
from tests.tools.test_tools import ok

pytestmark = pytest.mark.anyio


async def test_cluster_status_lists_projects_with_use_quota_weight_and_queue(server: Any, api: Any,
                                                                             home: Path) -> None:
    (home / "config.yaml").write_text("scheduler: {default_weight: 3, projects: {other: {weight: 2, gpu_quota: 1}}}\n")
    job = await ok(server, "submit", {"command": ["sleep", "60"], "gpus": 2})
    wait_state(api, job["id"], "running")
    queued = await ok(server, "submit", {"command": ["true"], "gpus": 1})  # the fleet is full: waits
    cluster = await ok(server, "cluster_status")
    rows = {p["project"]: p for p in cluster["projects"]}
    assert rows[""] == {"project": "", "gpus_used": 2, "quota": None, "weight": 3.0, "queued": 1}
    assert rows["other"] == {"project": "other", "gpus_used": 0, "quota": 1, "weight": 2.0, "queued": 0}
    api.cancel([job["id"], queued["id"]])
