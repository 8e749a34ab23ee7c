"""MCP results in fewer tokens (issue 13): compact text, ISO times, 4 KB log pages on line
boundaries; and an HTTP server that neither advertises OAuth it does not serve nor stays
silent about rejected tokens."""

from __future__ import annotations

import json
import logging
import re
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from autoresearch.tools.auth import FileTokenVerifier
from tests.conftest import wait_state
from tests.tools.conftest import connect, http_server, text

pytestmark = pytest.mark.anyio

PY = sys.executable
ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")


async def call(server: Any, name: str, args: dict[str, Any] | None = None) -> Any:
    async with connect(server) as client:
        result = await client.call_tool(name, args or {})
    assert not result.is_error, text(result)
    return result


async def test_results_are_compact_json_with_iso_times(server: Any, api: Any) -> None:
    sub = (await call(server, "submit", {"command": [PY, "-c", "print('hi')"]})).structured_content
    wait_state(api, sub["id"], "succeeded")
    result = await call(server, "status", {"job_id": sub["id"]})
    body = text(result)
    assert "\n" not in body and ": " not in body and ", " not in body  # no indentation, no padding
    shown = json.loads(body)
    job = shown["job"]
    assert ISO.fullmatch(job["submitted_at"]) and ISO.fullmatch(job["attempt_list"][0]["ended_at"])
    assert "null" not in body and "exit_code" in job and job["exit_code"] == 0  # nulls left out, zeros kept
    full = result.structured_content["job"]  # programs get every field: Unix seconds and their ISO twins
    assert isinstance(full["submitted_at"], float) and full["submitted_at_iso"] == job["submitted_at"]
    assert full["failure_class"] is None and full["attempt_list"][0]["started_at_iso"]
    none = (await call(server, "metrics", {"job_id": sub["id"]})).structured_content
    assert none["metrics"] == [] and "epoch 3 val_acc: 0.95" in none["next_step"] and "JSON" in none["next_step"]
    listed = text(await call(server, "list_jobs", {}))
    assert len(listed) < len(json.dumps((await call(server, "list_jobs", {})).structured_content, indent=2)) / 1.5


async def test_log_pages_are_4kb_by_default_and_start_at_a_line(server: Any, api: Any) -> None:
    program = "for i in range(2000): print(f'line {i:05d} ' + 'y' * (i % 70))"
    sub = (await call(server, "submit", {"command": [PY, "-c", program]})).structured_content
    wait_state(api, sub["id"], "succeeded")
    page = (await call(server, "logs", {"job_id": sub["id"]})).structured_content
    log = page["text"].split("\n[truncated")[0]
    assert page["truncated"] and 3000 < len(log.encode()) <= 4096
    assert log.startswith("line ") and log.splitlines()[-1].startswith("line 01999")
    back = int(re.search(r"offset=(\d+) for the page before", page["hint"]).group(1))  # type: ignore[union-attr]
    before = (await call(server, "logs", {"job_id": sub["id"], "offset": back})).structured_content
    assert before["text"].startswith("line ") and before["text"].split("\n[truncated")[0].endswith("\n")
    assert before["next_offset"] <= page["offset"]


async def test_rejected_tokens_are_logged_without_the_token(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    good, bad = "good-token-0123456789abcdef", "wrong-token-SECRETSECRET-0000"
    (tmp_path / "tokens").write_text(f"{good} team-a\n")
    verifier = FileTokenVerifier(tmp_path / "tokens")
    with caplog.at_level(logging.WARNING, logger="autoresearch.tools"):
        assert await verifier.verify_token(bad) is None
        for _ in range(50):  # a flood is throttled, not fifty lines
            assert await verifier.verify_token(bad) is None
        assert (await verifier.verify_token(good)).client_id == "team-a"  # type: ignore[union-attr]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "rejected a request" in lines[0] and f"{len(bad)} characters" in lines[0]
    assert bad not in caplog.text and "SECRET" not in caplog.text


def test_401_does_not_point_at_oauth_metadata_that_is_not_served(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("a-valid-token-0123456789 team-a\n")
    with http_server(tmp_path / "home", tokens=tokens) as url:
        response = httpx.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "initialize"},
                              headers={"Authorization": "Bearer nope-nope-nope-nope-nope",
                                       "Accept": "application/json, text/event-stream"}, timeout=10)
        assert response.status_code == 401
        challenge = response.headers["www-authenticate"]
        assert challenge.lower().startswith("bearer") and "resource_metadata" not in challenge
        base = url.rsplit("/mcp", 1)[0]
        for path in ("/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-authorization-server"):
            assert httpx.get(base + path, timeout=10).status_code == 404  # nothing advertised, nothing half-served
