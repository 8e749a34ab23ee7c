"""The LLM proposer inside the real controller: trials run, a user error's log tail
reaches the next prompt, provenance lands in the decisions, budget.llm_usd stops it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from autoresearch.loop.controller import Controller
from autoresearch.loop.plan import parse_plan
from autoresearch.loop.proposers.llm import prompts_dir
from tests.fakes.llm_server import FakeLLMServer, anthropic_tool_answer, openai_json_answer

TRAIN = """\
import sys
x = float(sys.argv[1])
if x > 0.9:
    raise ValueError(f"x={x} too large: the loss diverged")
print(f"loss: {(x - 0.3) ** 2:.6f}")
"""


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeLLMServer]:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    with FakeLLMServer() as fake:
        yield fake


def llm_plan(workdir: Path, proposer: dict[str, Any], **budget: Any) -> Any:
    (workdir / "train.py").write_text(TRAIN)
    return parse_plan({
        "name": "llm-quad", "objective": {"metric": "loss", "goal": "minimize"},
        "trial": {"command": "python train.py {x}", "workdir": str(workdir)},
        "space": {"x": {"low": 0.0, "high": 1.0}},
        "proposer": {"kind": "llm", "options": {"backoff_s": 0.01}, **proposer},
        "budget": {"trials": 4, "parallel": 2, **budget},
    }, base_dir=workdir)


def answer(*xs: float) -> dict[str, Any]:
    return {"rationale": f"try {xs}", "proposals": [{"params": {"x": x}, "rationale": f"x={x}"} for x in xs]}


def test_an_llm_loop_runs_learns_from_a_crash_and_records_provenance(
        api: Any, tmp_path: Path, server: FakeLLMServer) -> None:
    server.script(anthropic_tool_answer(answer(0.95, 0.5)), anthropic_tool_answer(answer(0.35, 0.36)),
                  anthropic_tool_answer(answer(0.3, 0.31)), anthropic_tool_answer(answer(0.2, 0.21)))
    plan = llm_plan(tmp_path, {"provider": "anthropic", "model": "claude-sonnet-4-6", "base_url": server.url})

    view = Controller(plan, runtime=api._runtime, poll_s=0.02).run()

    assert view.state == "finished" and view.counts.get("failed") == 1
    assert view.best_value is not None and view.best_value <= 0.0025
    later = [r.body["messages"][0]["content"] for r in server.requests[1:]]
    assert any("ValueError: x=0.95 too large: the loss diverged" in p for p in later)  # fed back
    proposes = api._ledger.query("SELECT * FROM decisions WHERE kind='propose' ORDER BY id")
    info = json.loads(proposes[0]["proposer"])
    sha = __import__("hashlib").sha256((prompts_dir() / "propose_params.md").read_bytes()).hexdigest()
    assert (info["kind"], info["provider"], info["model"], info["prompt_sha256"]) == (
        "llm", "anthropic", "claude-sonnet-4-6", sha)
    assert proposes[0]["tokens_in"] == 1523 and proposes[0]["cost_usd"] == pytest.approx(0.007734)
    assert view.llm_usd == pytest.approx(sum(r["cost_usd"] for r in proposes))


def test_budget_llm_usd_stops_proposing_once_spent(api: Any, tmp_path: Path, server: FakeLLMServer) -> None:
    server.script(openai_json_answer(answer(0.1, 0.2), prompt_tokens=10_000, completion_tokens=1_000),
                  openai_json_answer(answer(0.4, 0.5)))
    plan = llm_plan(tmp_path, {"provider": "openai", "model": "gpt-4.1", "base_url": server.openai_url},
                    llm_usd=0.02)

    view = Controller(plan, runtime=api._runtime, poll_s=0.02).run()

    assert len(server.requests) == 1  # $0.028 spent on the first call: no second one
    assert view.stop_reason == "llm_usd budget $0.02 used"
    assert view.counts == {"succeeded": 2}  # the trials already proposed still ran


def test_a_code_edit_loop_keeps_the_better_patch_and_builds_on_it(
        api: Any, tmp_path: Path, server: FakeLLMServer) -> None:
    import subprocess

    repo = tmp_path / "proj"
    repo.mkdir()
    (repo / "train.py").write_text("import sys\nSCALE = 4.0\nprint('loss:', SCALE * float(sys.argv[1]))\n")
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "b"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True)
    plan = parse_plan({
        "name": "edit-loop", "objective": {"metric": "loss", "goal": "minimize"},
        "trial": {"command": "python train.py {x}", "workdir": str(repo)},
        "space": {"x": {"low": 0.5, "high": 1.0}}, "code": {"files": ["train.py"]},
        "proposer": {"kind": "llm", "provider": "anthropic", "model": "claude-haiku-4-5", "base_url": server.url,
                     "options": {"backoff_s": 0.01}},
        "budget": {"trials": 2, "parallel": 1},
    }, base_dir=repo)
    edit = {"file": "train.py", "search": "SCALE = 4.0", "replace": "SCALE = 2.0"}
    server.script(
        anthropic_tool_answer({"rationale": "halve", "proposals": [{"params": {"x": 1.0}, "edits": [edit],
                                                                    "rationale": "halve the scale"}]}),
        anthropic_tool_answer({"rationale": "smaller x", "proposals": [
            {"params": {"x": 0.5}, "rationale": "smaller x on the halved scale",
             "edits": [{"file": "train.py", "search": "print(", "replace": "# kept\nprint("}]}]}),
    )

    view = Controller(plan, runtime=api._runtime, poll_s=0.02).run()

    rows = {r["id"]: r for r in api._ledger.query("SELECT * FROM trials ORDER BY id")}
    assert [rows[1]["objective"], rows[2]["objective"]] == [2.0, 1.0]
    assert rows[2]["parent_trial"] == 1 and "+SCALE = 2.0" in rows[2]["patch"] and "+# kept" in rows[2]["patch"]
    assert rows[1]["workdir"] != rows[2]["workdir"] and "worktrees/trial-" in rows[2]["workdir"]
    assert view.best_trial == 2
    assert "SCALE = 4.0" in (repo / "train.py").read_text()
    assert "trial #1" in server.requests[1].body["messages"][0]["content"]
