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
    mine = rows[""]
    assert 0 <= mine.pop("decayed_gpu_h") < 0.1 and mine.pop("share") > 0  # 2 GPUs held now, for seconds
    assert mine == {"project": "", "gpus_used": 2, "quota": None, "weight": 3.0, "queued": 1, "guaranteed": 0,
                    "borrow": None}
    assert rows["other"] == {"project": "other", "gpus_used": 0, "quota": 1, "weight": 2.0, "queued": 0,
                             "guaranteed": 0, "borrow": None, "decayed_gpu_h": 0.0, "share": 0.0}
    api.cancel([job["id"], queued["id"]])


async def test_cluster_status_shows_guarantees_and_caps_its_rows_busiest_first(server: Any, api: Any,
                                                                              home: Path) -> None:
    listed = ", ".join(f"p{i:03d}: {{weight: 1}}" for i in range(120))
    (home / "config.yaml").write_text("scheduler: {half_life: 12h, projects: {zz: {guaranteed: 1, borrow: 3}, "
                                      + listed + "}}\n")
    job = await ok(server, "submit", {"command": ["sleep", "60"], "gpus": 1})
    wait_state(api, job["id"], "running")
    cluster = await ok(server, "cluster_status")
    assert len(cluster["projects"]) == 50  # of 122: few tokens
    assert cluster["projects"][0]["project"] == "" and cluster["projects"][0]["gpus_used"] == 1  # the busy one first
    everything = {p.project: p for p in api.cluster().projects}
    assert len(everything) == 122 and (everything["zz"].guaranteed, everything["zz"].borrow,
                                       everything["zz"].quota) == (1, 3, 4)
    api.cancel([job["id"]])
