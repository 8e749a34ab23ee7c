"""The loop tools over MCP (an in-process server, the real mcp.Client): an agent starts a
loop whose controller runs in its own process, proposes trials, reads the leaderboard
and stops the loop."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

PLAN = """\
name: agent-quad
objective: {metric: loss, goal: minimize}
trial:
  command: python -c "import time; time.sleep({wait}); print('loss:', ({x} - 0.3) ** 2)"
  grace: 1
space:
  x: {low: 0.0, high: 1.0}
  wait: {choices: [0, 60]}
proposer: {kind: agent}
budget: {trials: 6, parallel: 2}
"""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "project"
    path.mkdir()
    (path / "plan.yaml").write_text(PLAN)
    (path / "bad.yaml").write_text(PLAN.replace("goal: minimize", "gaol: minimize"))
    return path


def build(api: Any, root: Path, read_only: bool = False) -> Any:
    from autoresearch.tools.server import build_server

    return build_server(api, root=root, read_only=read_only)


async def call(client: Any, tool: str, **args: Any) -> Any:
    result = await client.call_tool(tool, args)
    text = "\n".join(getattr(b, "text", "") for b in result.content)
    if result.is_error:
        return text
    return result.structured_content or json.loads(text)


async def test_an_agent_drives_a_loop_end_to_end(api: Any, root: Path) -> None:
    from mcp import Client

    async with Client(build(api, root)) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        for name in ("start_loop", "loop_status", "propose_trials", "leaderboard", "trial_patch", "stop_loop"):
            assert len(tools[name].description or "") > 120, name
            assert all(p.get("description") for p in tools[name].input_schema["properties"].values()), name
        assert tools["loop_status"].annotations.read_only_hint and tools["stop_loop"].annotations.destructive_hint

        error = await call(client, "start_loop", plan="bad.yaml")
        assert "[plan_invalid]" in error and "did you mean 'goal'" in error  # before anything launches
        assert "../plan.yaml" in await call(client, "start_loop", plan="../plan.yaml")

        started = await call(client, "start_loop", plan="plan.yaml")
        assert started["name"] == "agent-quad" and "propose_trials" in started["next_step"]

        sent = await call(client, "propose_trials", loop="agent-quad", rationale="bracket the optimum",
                          agent="test-agent", proposals=[
                              {"params": {"x": 0.2, "wait": 0}, "rationale": "left"},
                              {"params": {"x": 0.45, "wait": 0}, "rationale": "right"},
                              {"params": {"x": 0.3}, "rationale": "incomplete"}])
        assert sent["accepted"] == 2 and sent["rejected"] == ["proposal 3: missing parameter 'wait'"]

        async def succeeded() -> int:
            status = await call(client, "loop_status", loop="agent-quad")
            return int(status["counts"].get("succeeded", 0))

        for _ in range(600):  # the controller is another process: poll its results
            if await succeeded() == 2:
                break
            import anyio

            await anyio.sleep(0.05)
        status = await call(client, "loop_status", loop="agent-quad")
        assert status["controller_running"] and status["best_params"] == {"x": 0.2, "wait": 0}
        assert [t["trial_id"] for t in status["recent"]] == [1, 2]

        board = await call(client, "leaderboard", loop="agent-quad", top=5)
        assert [r["params"]["x"] for r in board["rows"]] == [0.2, 0.45]
        assert board["rows"][0]["objective"] == pytest.approx(0.01)

        await call(client, "propose_trials", loop="agent-quad", rationale="a long one",
                   proposals=[{"params": {"x": 0.3, "wait": 60}, "rationale": "slow"}])
        wait_for(lambda: api._ledger.one("SELECT state FROM trials WHERE id=3 AND state='running'"), 30)
        stopped = await call(client, "stop_loop", loop="agent-quad", rationale="good enough")
        assert len(stopped["stopped_jobs"]) == 1

        wait_for(lambda: api._ledger.one("SELECT 1 FROM loops WHERE name='agent-quad' AND state='finished'"), 30)
        final = await call(client, "loop_status", loop="agent-quad")
        assert final["counts"] == {"succeeded": 2, "stopped": 1} and not final["controller_running"]
        decisions = api._ledger.one("SELECT COUNT(*) AS n FROM decisions")["n"]
        again = await call(client, "stop_loop", loop="agent-quad", rationale="once more")
        assert again["already_ended"] and again.get("decision_id") is None and "already ended" in again["next_step"]
        assert api._ledger.one("SELECT COUNT(*) AS n FROM decisions")["n"] == decisions  # nothing recorded
        late = await call(client, "propose_trials", loop="agent-quad", rationale="late",
                          proposals=[{"params": {"x": 0.1, "wait": 0}}])
        assert "[bad_state]" in late and "resume=true" in late


async def test_a_read_only_server_refuses_loop_writes(api: Any, root: Path) -> None:
    from mcp import Client

    async with Client(build(api, root, read_only=True)) as client:
        for tool, args in (("start_loop", {"plan": "plan.yaml"}), ("stop_loop", {"loop": "x"}),
                           ("propose_trials", {"loop": "x", "rationale": "r", "proposals": [{"params": {}}]})):
            text = await call(client, tool, **args)
            assert "[auth]" in text and "--read-only" in text, tool
        assert "[not_found]" in await call(client, "loop_status", loop="nope")
