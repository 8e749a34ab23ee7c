"""MCP edges (issue 14, item 8): an offset past the end of a log, a prompt for a missing job,
a plan whose trial.workdir leaves the server's root, and a grep pattern that backtracks
forever. Each is a clear result or error with a hint, never "[internal]" or a hung server."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_state
from tests.tools.conftest import connect, text

pytestmark = pytest.mark.anyio


@pytest.fixture
def finished_job(api: Any, workdir: Path) -> int:
    job = api.submit({"command": ["/bin/sh", "-c", "echo hello; echo aaaaaaaaaaaaaaaaaaaaaaaaaaab"],
                      "workdir": str(workdir)})
    wait_state(api, job.id, "succeeded")
    return job.id


@pytest.mark.parametrize("offset", [10**15, 10**30, 2**63])
async def test_logs_offset_past_the_end_is_an_empty_page(server: Any, finished_job: int, offset: int) -> None:
    async with connect(server) as client:
        result = await client.call_tool("logs", {"job_id": finished_job, "offset": offset})
    assert not result.is_error, text(result)
    page = result.structured_content
    assert page["text"] == "" and page["size"] > 0 and page["offset"] == page["size"] == page["next_offset"]
    assert "past the end of the log" in page["hint"]


async def test_diagnose_prompt_for_a_missing_job_says_so(server: Any) -> None:
    from mcp import MCPError

    async with connect(server) as client:
        with pytest.raises(MCPError) as info:
            await client.get_prompt("diagnose_failed_job", {"job_id": "4242"})
    message = str(info.value)
    assert "[not_found] no job 4242" in message and "hint:" in message
    assert "Internal server error" not in message


PLAN = """\
name: escape
objective: {metric: loss}
trial: {command: "python -c 'print(1)' {x}", workdir: WORKDIR}
space: {x: {low: 0.0, high: 1.0}}
budget: {trials: 1, parallel: 1}
"""


@pytest.mark.parametrize("workdir_value", ["../../..", "/tmp", "link-out"])
async def test_start_loop_refuses_a_trial_workdir_outside_the_root(server: Any, api: Any, workdir: Path,
                                                                   tmp_path: Path, workdir_value: str) -> None:
    (workdir / "link-out").symlink_to(tmp_path)  # a link inside the root that points out of it
    (workdir / "plan.yaml").write_text(PLAN.replace("WORKDIR", workdir_value))
    async with connect(server) as client:
        result = await client.call_tool("start_loop", {"plan": "plan.yaml"})
    assert result.is_error
    assert "[spec_invalid] the plan's trial.workdir" in text(result) and "outside the server's root" in text(result)
    assert "hint: " in text(result)
    assert api._ledger.one("SELECT COUNT(*) AS n FROM loops")["n"] == 0
    assert not (api._ledger.home / "loops" / "escape").exists()


async def test_grep_that_backtracks_forever_is_stopped(server: Any, api: Any, finished_job: int) -> None:
    started = time.monotonic()
    async with connect(server) as client:
        slow = await client.call_tool("logs", {"job_id": finished_job, "grep": "(a+)+$"})
        fine = await client.call_tool("logs", {"job_id": finished_job, "grep": "hel+o"})
    assert time.monotonic() - started < 15  # without a limit: 2**27 steps, ~30 s of CPU
    assert slow.is_error and "took more than" in text(slow) and "nested repeats" in text(slow)
    assert not fine.is_error and fine.structured_content["text"] == "1: hello"


async def test_grep_pattern_length_and_nul_are_refused(api: Any, finished_job: int) -> None:
    from autoresearch.errors import SpecError

    with pytest.raises(SpecError, match="at most 1000"):
        api.logs(finished_job, grep="a" * 1001)
    with pytest.raises(SpecError, match="NUL byte"):
        api.logs(finished_job, grep="a\0")
    assert api.logs(finished_job, grep="\ud800|hello").text == "1: hello"  # a lone surrogate is no crash


async def test_a_nul_byte_in_a_path_argument_is_refused(server: Any, api: Any) -> None:
    async with connect(server) as client:
        for args in ({"workdir": "a\0b"}, {"mounts": {"data": "a\0b"}}):
            result = await client.call_tool("submit", {"command": ["true"], **args})
            assert result.is_error and "[spec_invalid]" in text(result) and "NUL byte" in text(result)
        result = await client.call_tool("start_loop", {"plan": "plan\0.yaml"})
        assert result.is_error and "NUL byte" in text(result)
    assert api._ledger.one("SELECT COUNT(*) AS n FROM jobs")["n"] == 0


@pytest.mark.parametrize(("tool", "args", "expected"), [
    ("logs", {"attempt": 2**63}, "[not_found] job 1 has no attempt"),
    ("list_jobs", {"cursor": 2**63}, None),
    ("list_jobs", {"cursor": 10**30}, None),
    ("cancel", {"job_id": 2**63}, "[not_found] no job"),
    ("metrics", {"job_id": 10**30}, "[not_found] no job"),
])
async def test_integers_past_sqlite_are_answered(server: Any, finished_job: int, tool: str, args: dict[str, Any],
                                                 expected: str | None) -> None:
    args = {"job_id": finished_job, **args} if tool == "logs" else args
    async with connect(server) as client:
        result = await client.call_tool(tool, args)
    assert "[internal]" not in text(result)
    if expected is None:
        assert not result.is_error and result.structured_content["jobs"][0]["id"] == finished_job
    else:
        assert result.is_error and expected in text(result)
