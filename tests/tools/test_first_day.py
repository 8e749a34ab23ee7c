"""What a new agent reads first from the MCP tools: each answer says what it means in its text as
well as its structured data (clients that show the text only), and never something untrue."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from autoresearch.loop.controller import plan_json
from autoresearch.loop.plan import parse_plan
from autoresearch.loop.store import LoopStore
from tests.conftest import wait_state
from tests.tools.conftest import connect, text

pytestmark = pytest.mark.anyio


@pytest.fixture
def finished_job(api: Any, workdir: Path) -> int:
    job = api.submit({"command": ["/bin/sh", "-c", "echo loss: 0.5"], "workdir": str(workdir)})
    wait_state(api, job.id, "succeeded")
    return job.id


async def test_an_empty_list_says_it_is_empty(server: Any) -> None:
    async with connect(server) as client:
        result = await client.call_tool("list_jobs", {"state": "running"})
    assert not result.is_error and text(result) == '{"jobs":[]}'


async def test_a_log_offset_past_the_end_says_so_in_the_text(server: Any, finished_job: int) -> None:
    async with connect(server) as client:
        result = await client.call_tool("logs", {"job_id": finished_job, "offset": 10**6})
    assert "past the end of the log" in result.structured_content["hint"]
    assert "offset 1000000 is past the end of the log" in text(result)


async def test_metrics_of_an_unknown_name_name_the_job_s_metrics(server: Any, finished_job: int) -> None:
    async with connect(server) as client:
        result = await client.call_tool("metrics", {"job_id": finished_job, "names": ["nope"]})
        known = await client.call_tool("metrics", {"job_id": finished_job, "names": ["loss"]})
    step = result.structured_content["next_step"]
    assert "no metrics yet" not in step and "no metric named 'nope'" in step and "loss" in step
    assert known.structured_content["metrics"][0]["last"] == 0.5


async def test_cluster_status_times_are_iso_8601_for_a_reader(server: Any) -> None:
    async with connect(server) as client:
        result = await client.call_tool("cluster_status", {})
    node = json.loads(text(result))["nodes"][0]
    assert "since" not in node and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", node["since_iso"])
    assert isinstance(result.structured_content["nodes"][0]["since"], float)  # programs keep the seconds


async def test_tool_descriptions_are_sent_without_their_docstring_indentation(server: Any) -> None:
    async with connect(server) as client:
        tools = (await client.list_tools()).tools
    assert len(tools) >= 10
    for tool in tools:
        assert tool.description and "\n    " not in tool.description and tool.description == tool.description.strip()


PLAN = {"name": "agentic", "objective": {"metric": "loss"}, "trial": {"command": "train {x}"},
        "space": {"x": {"low": 0.0, "high": 1.0}}, "proposer": {"kind": "agent"}, "budget": {"trials": 4}}


async def test_a_second_stop_of_a_stopping_loop_says_it_is_stopping(server: Any, api: Any, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    plan = parse_plan(PLAN, base_dir=tmp_path)
    LoopStore.create(api._ledger, plan.name, plan_json(plan), "d", plan.name)
    monkeypatch.setattr("autoresearch.loop.ops.controller_running", lambda home, name: True)  # it finishes
    async with connect(server) as client:
        sent = await client.call_tool("propose_trials", {"loop": "agentic", "rationale": "r", "proposals": [
            {"params": {"x": 7.0}, "rationale": "out of range"}]})
        first = await client.call_tool("stop_loop", {"loop": "agentic"})
        second = await client.call_tool("stop_loop", {"loop": "agentic"})
    assert not sent.is_error and "clipped" in text(sent), text(sent)  # clipped, and said
    assert not first.is_error and not first.structured_content["already_ended"]
    step = second.structured_content["next_step"]
    assert second.structured_content["already_ended"] and "already stopping" in step and "(running)" not in step
