"""Loop tools over real HTTP with two tokens: a loop and its trial jobs belong to the project
of the token that started it; another project's token sees none of it and can touch none of it."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.tools.conftest import NEEDS_BWRAP, connect, http_server, text

pytestmark = [pytest.mark.anyio, NEEDS_BWRAP]

TOKEN_A = "token-for-team-a-0123456789"
TOKEN_B = "token-for-team-b-9876543210"
PLAN = f"""\
name: scoped
objective: {{metric: loss}}
trial:
  command: {sys.executable} -c "print('loss:', {{x}})"
space:
  x: {{low: 0.0, high: 1.0}}
proposer: {{kind: agent}}
budget: {{trials: 3, parallel: 1}}
"""


async def call(client: Any, tool: str, **args: Any) -> Any:
    result = await client.call_tool(tool, args)
    return ("error", text(result)) if result.is_error else result.structured_content


async def test_a_loop_and_its_trials_are_invisible_to_another_projects_token(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTORESEARCH_TRACKING", "off")  # the controller needs no MLflow here
    root = tmp_path / "root"
    root.mkdir()
    (root / "plan.yaml").write_text(PLAN)
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{TOKEN_A} team-a\n{TOKEN_B} team-b\n")
    with http_server(tmp_path / "home", tokens=tokens, root=root) as url:
        async with connect(url, TOKEN_A) as a, connect(url, TOKEN_B) as b:
            started = await call(a, "start_loop", plan="plan.yaml")
            assert started["name"] == "scoped", started
            sent = await call(a, "propose_trials", loop="scoped", rationale="one point",
                              proposals=[{"params": {"x": 0.5}}])
            assert sent["accepted"] == 1, sent
            deadline = time.monotonic() + 60
            while (await call(a, "loop_status", loop="scoped"))["counts"].get("succeeded") != 1:
                assert time.monotonic() < deadline, await call(a, "loop_status", loop="scoped")
                await anyio.sleep(0.1)
            job_id = (await call(a, "leaderboard", loop="scoped"))["rows"][0]["job_id"]
            assert job_id in [j["id"] for j in (await call(a, "list_jobs"))["jobs"]]  # the trial is team-a's job

            assert (await call(b, "list_jobs"))["jobs"] == []
            assert (await call(b, "status", job_id=job_id))[0] == "error"
            missing = await call(b, "loop_status", loop="no-such-loop")
            for tool, args in (("loop_status", {}), ("leaderboard", {}), ("trial_patch", {"trial_id": 1}),
                               ("propose_trials", {"rationale": "mine now", "proposals": [{"params": {"x": 0.1}}]}),
                               ("stop_loop", {"rationale": "not yours"})):
                kind, message = await call(b, tool, loop="scoped", **args)
                assert kind == "error" and "no loop named 'scoped'" in message, (tool, message)
                # exactly like a loop that does not exist: nothing tells team-b that team-a has one
                assert message.split(": ", 1)[1].replace("scoped", "no-such-loop") == missing[1].split(": ", 1)[1]
            kind, message = await call(b, "start_loop", plan="plan.yaml")  # nor take it over by starting it
            assert kind == "error" and "taken by another project" in message

            status = await call(a, "loop_status", loop="scoped")  # untouched by team-b's attempts
            assert status["controller_running"] and status["counts"] == {"succeeded": 1}
            stopped = await call(a, "stop_loop", loop="scoped", rationale="done")
            assert stopped["loop"] == "scoped"
