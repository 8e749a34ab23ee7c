"""Bad calls: each is an is_error result whose text carries a hint, and nothing changes in the ledger."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.tools.conftest import connect, text

pytestmark = pytest.mark.anyio

BAD_CALLS = [
    ("submit", {}, "command: Field required"),
    ("submit", {"command": "python train.py"}, "valid list"),
    ("submit", {"command": []}, "command"),
    ("submit", {"command": ["true"], "gpus": "lots"}, "gpus"),
    ("submit", {"command": ["true"], "gpus": 100_000}, "less than or equal to 1024"),
    ("submit", {"command": ["true"], "gpus": -1}, "greater than or equal to 0"),
    ("submit", {"command": ["true"], "gpus": 64}, "[capacity]"),
    ("submit", {"command": ["true"], "nodes": 5, "gpus": 1}, "[capacity] a gang of 5 members with 1 GPU(s) each needs 5 GPU slots"),
    ("submit", {"command": ["true"], "priority": "urgent"}, "priority"),
    ("submit", {"command": ["true"], "timeout": "soon"}, "not a duration"),
    ("submit", {"command": ["true"], "memory": "lots"}, "not a size"),
    ("submit", {"command": ["true"], "workdir": "/etc"}, "relative path"),
    ("submit", {"command": ["true"], "workdir": "../outside"}, "relative path"),
    ("submit", {"command": ["true"], "workdir": "a/../../b"}, "relative path"),
    ("submit", {"command": ["true"], "workdir": "~/x"}, "relative path"),
    ("submit", {"command": ["true"], "workdir": "missing-dir"}, "does not exist"),
    ("submit", {"command": ["true"], "mounts": {"data": "/etc"}}, "relative path"),
    ("submit", {"command": ["true"], "mounts": {"../up": "."}}, "relative path"),
    ("submit", {"command": ["true"], "gpu": 1}, "unknown argument(s) gpu"),
    ("status", {"job_id": 424242}, "no job 424242"),
    ("status", {"job_id": "abc"}, "job_id"),
    ("status", {"job_id": 0}, "greater than or equal to 1"),
    ("logs", {"job_id": 424242}, "no job 424242"),
    ("logs", {"job_id": 1, "tail_lines": 10**9}, "less than or equal to 5000"),
    ("logs", {"job_id": 1, "max_bytes": 10**7}, "less than or equal to 16000"),
    ("logs", {"job_id": 1, "offset": -5}, "offset"),
    ("logs", {"job_id": 1, "grep": "(unclosed"}, "not a valid regular expression"),
    ("logs", {"job_id": 1, "attempt": 9}, "no attempt 9"),
    ("metrics", {"job_id": 424242}, "no job 424242"),
    ("metrics", {"job_id": 1, "max_points": 10_000}, "less than or equal to 200"),
    ("cancel", {"job_id": 424242}, "no job 424242"),
    ("cancel", {}, "job_id: Field required"),
    ("list_jobs", {"state": "exploded"}, "state"),
    ("list_jobs", {"limit": 100_000}, "limit"),
    ("no_such_tool", {}, "the tools are"),
]


def _ledger_rows(api: Any) -> tuple[int, int, int]:
    counts = [api._ledger.one(f"SELECT COUNT(*) AS n FROM {t}")["n"] for t in ("jobs", "attempts", "events")]
    return counts[0], counts[1], counts[2]


@pytest.fixture
async def existing_job(api: Any, workdir: Path) -> int:
    from tests.conftest import wait_state

    job = api.submit({"command": ["true"], "workdir": str(workdir)})
    wait_state(api, job.id, "succeeded")
    assert job.id == 1
    return job.id


@pytest.mark.usefixtures("existing_job")
async def test_bad_calls_return_errors_with_hints_and_change_nothing(server: Any, api: Any) -> None:
    before = _ledger_rows(api)
    async with connect(server) as client:
        for name, args, expected in BAD_CALLS:
            result = await client.call_tool(name, args)
            message = text(result)
            assert result.is_error, (name, args, message)
            assert expected in message, (name, args, message)
            assert "\nhint: " in message and message.split("\nhint: ", 1)[1].strip(), (name, args, message)
            assert "Traceback" not in message and "errors.pydantic.dev" not in message, message
    assert _ledger_rows(api) == before


async def test_unknown_job_error_says_how_to_list_jobs(server: Any) -> None:
    async with connect(server) as client:
        result = await client.call_tool("status", {"job_id": 7})
    assert result.is_error and "[not_found] no job 7" in text(result) and "list_jobs" in text(result)


async def test_unknown_job_resource_is_an_error(server: Any) -> None:
    from mcp import MCPError

    async with connect(server) as client:
        with pytest.raises(MCPError, match="no job 9"):
            await client.read_resource("autoresearch://jobs/9/logs")
