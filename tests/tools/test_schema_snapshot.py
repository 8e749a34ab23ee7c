"""The tool list and schemas are a contract with agents: a rename must be deliberate.

After an intended change, regenerate with ``AUTORESEARCH_UPDATE_SNAPSHOTS=1 pytest tests/tools``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.tools.conftest import connect

pytestmark = pytest.mark.anyio

SNAPSHOT = Path(__file__).parent / "snapshots" / "tools.json"
CORE = ("submit", "status", "logs", "metrics", "cancel", "list_jobs", "cluster_status")
READ_ONLY = ("status", "logs", "metrics", "list_jobs", "cluster_status")


async def test_tool_list_and_schemas_match_the_snapshot(server: Any) -> None:
    async with connect(server) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    assert set(CORE) <= set(tools), sorted(tools)
    current = {
        name: {
            "description": tools[name].description,
            "input_schema": tools[name].input_schema,
            "output_schema": tools[name].output_schema,
            "annotations": tools[name].annotations.model_dump(exclude_none=True) if tools[name].annotations else None,
        }
        for name in CORE
    }
    if os.environ.get("AUTORESEARCH_UPDATE_SNAPSHOTS"):
        SNAPSHOT.parent.mkdir(exist_ok=True)
        SNAPSHOT.write_text(json.dumps(current, indent=2, sort_keys=True) + "\n")
    assert current == json.loads(SNAPSHOT.read_text()), "tool schemas changed: update the snapshot deliberately"


async def test_annotations_and_descriptions_guide_a_model(server: Any) -> None:
    async with connect(server) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    for name in READ_ONLY:
        assert tools[name].annotations.read_only_hint is True, name
    assert tools["cancel"].annotations.destructive_hint is True
    assert tools["submit"].annotations.read_only_hint is False
    for name in CORE:
        tool = tools[name]
        assert tool.output_schema and tool.output_schema["type"] == "object", name
        assert len(tool.description or "") > 120, name  # what it does, when to use it, what comes back
        for param, schema in tool.input_schema.get("properties", {}).items():
            assert schema.get("description"), f"{name}.{param} has no description"
    assert tools["submit"].input_schema["properties"]["command"]["type"] == "array"
    for name in ("status", "logs", "metrics", "cancel"):
        assert "job_id" in tools[name].input_schema["properties"], name
