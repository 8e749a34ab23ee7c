"""Code-edit search: patches on top of the best trial, one git worktree per trial,
real trials run by the runtime, a crash's log tail fed back to the (fake) LLM."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from autoresearch.errors import PlanError
from autoresearch.loop.plan import parse_plan
from autoresearch.loop.proposers import ProposerContext, make_proposer
from autoresearch.loop.proposers._base import Proposal, TrialRecord
from autoresearch.loop.proposers.code import CodeProposer, cleanup_worktrees, prepare_trial_workdir
from tests.conftest import wait_state
from tests.fakes.llm_server import FakeLLMServer, anthropic_tool_answer

TRAIN = """\
import sys

WIDTH = 8
DEPTH = 2
lr = float(sys.argv[1])
val_loss = abs(lr - 0.01) * 10 + 1.0 / WIDTH + 0.1 / DEPTH
print(f"val_loss: {val_loss:.6f}")
"""


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "proj"
    path.mkdir()
    (path / "train.py").write_text(TRAIN)
    (path / "program.md").write_text("Make val_loss as small as you can. Do not touch the lr argument.\n")
    git(path, "init", "-q")
    git(path, "-c", "user.email=t@t", "-c", "user.name=t", "add", "-A")
    git(path, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "base")
    return path


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeLLMServer]:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    with FakeLLMServer() as fake:
        yield fake


def code_plan(repo: Path, server: FakeLLMServer) -> Any:
    return parse_plan({
        "name": "edit", "objective": {"metric": "val_loss", "goal": "minimize"},
        "trial": {"command": "python train.py {lr}", "workdir": str(repo)},
        "space": {"lr": {"low": 0.001, "high": 0.1, "log": True}},
        "code": {"files": ["train.py"], "instructions": "program.md"},
        "proposer": {"kind": "llm", "provider": "anthropic", "model": "claude-sonnet-4-6", "base_url": server.url,
                     "options": {"backoff_s": 0.01}},
    })


def edit(search: str, replace: str, why: str, lr: float = 0.01) -> dict[str, Any]:
    return {"params": {"lr": lr}, "rationale": why,
            "edits": [{"file": "train.py", "search": search, "replace": replace}]}


def run_trial(api: Any, workdir: str, lr: float) -> Any:
    job = api.submit({"command": ["python", "train.py", str(lr)], "workdir": workdir})
    return wait_state(api, job.id, ("succeeded", "failed"), timeout=30)


def objective(api: Any, job_id: int) -> float | None:
    return next((m.last for m in api.metrics(job_id) if m.name == "val_loss"), None)


def test_patches_build_on_the_best_trial_and_run_in_their_own_worktrees(
        api: Any, home: Path, repo: Path, server: FakeLLMServer) -> None:
    proposer = make_proposer(ProposerContext(code_plan(repo, server), loop_name="edit", home=home))
    assert isinstance(proposer, CodeProposer) and proposer.info().prompt_name == "propose_patch"

    # Round 1: two edits of the original file.
    server.script(anthropic_tool_answer({"rationale": "capacity first", "proposals": [
        edit("WIDTH = 8", "WIDTH = 32", "wider"),
        edit("DEPTH = 2", "DEPTH = 1", "shallower (worse)"),
    ]}))
    first = proposer.propose([], 2)
    assert [p.parent_trial for p in first.proposals] == [None, None]
    assert "program.md" not in server.requests[0].body["messages"][0]["content"]  # its text, not its name
    assert "Do not touch the lr argument" in server.requests[0].body["messages"][0]["content"]

    history = []
    for trial_id, proposal in enumerate(first.proposals, 1):
        workdir = proposer.workdir_for(trial_id, proposal)
        assert workdir is not None and Path(workdir).parent == home / "loops" / "edit" / "worktrees"
        assert prepare_trial_workdir(repo, proposal.patch, Path(workdir)) == Path(workdir)  # idempotent
        view = run_trial(api, workdir, proposal.params["lr"])
        history.append(TrialRecord(trial_id, proposal.params, view.state, objective=objective(api, view.id),
                                   patch=proposal.patch, rationale=proposal.rationale))
    assert history[0].objective == pytest.approx(1 / 32 + 0.05)  # the wider net really ran
    assert history[1].objective == pytest.approx(1 / 8 + 0.1)
    assert (repo / "train.py").read_text() == TRAIN  # the user's checkout is untouched

    for record in history:  # keep/discard: the loser's worktree goes, the best stays
        proposer.observe(record)
    assert (home / "loops/edit/worktrees/trial-1").is_dir()
    assert not (home / "loops/edit/worktrees/trial-2").exists()

    # Round 2: the prompt shows trial 1's code; the new patch is cumulative on top of it.
    server.script(anthropic_tool_answer({"rationale": "depth now", "proposals": [
        edit("DEPTH = 2", "DEPTH = 4", "deeper on top of the wider net")]}))
    second = proposer.propose(history, 1)
    prompt = server.requests[-1].body["messages"][0]["content"]
    assert "WIDTH = 32" in prompt and "trial #1" in prompt
    proposal = second.proposals[0]
    assert proposal.parent_trial == 1
    assert "+WIDTH = 32" in (proposal.patch or "") and "+DEPTH = 4" in (proposal.patch or "")
    view = run_trial(api, proposer.workdir_for(3, proposal) or "", 0.01)
    assert objective(api, view.id) == pytest.approx(1 / 32 + 0.025)

    assert cleanup_worktrees(repo, home / "loops/edit/worktrees") == 2
    assert "worktrees/trial" not in git(repo, "worktree", "list")


def test_a_crash_log_is_fed_back_and_the_fix_builds_on_the_best_not_the_crash(
        api: Any, home: Path, repo: Path, server: FakeLLMServer) -> None:
    proposer = make_proposer(ProposerContext(code_plan(repo, server), loop_name="edit", home=home))
    server.script(anthropic_tool_answer({"rationale": "r", "proposals": [
        edit("WIDTH = 8", "WIDTH = 8 / undefined_scale", "scale the width")]}))
    broken = proposer.propose([], 1).proposals[0]
    view = run_trial(api, proposer.workdir_for(1, broken) or "", 0.01)
    assert view.state == "failed" and view.failure_class == "user"
    history = [TrialRecord(1, broken.params, "failed", patch=broken.patch, rationale=broken.rationale,
                           failure=f"exit code {view.exit_code}\n{view.log_excerpt}")]

    server.script(anthropic_tool_answer({"rationale": "fix the NameError", "proposals": [
        edit("WIDTH = 8", "WIDTH = 16", "define the scale properly")]}))
    fixed = proposer.propose(history, 1).proposals[0]

    prompt = server.requests[-1].body["messages"][0]["content"]
    assert "NameError: name 'undefined_scale' is not defined" in prompt
    assert fixed.parent_trial is None and "undefined_scale" not in (fixed.patch or "")
    assert run_trial(api, proposer.workdir_for(2, fixed) or "", 0.01).state == "succeeded"


def test_an_edit_that_does_not_match_is_rejected_and_repaired(home: Path, repo: Path, server: FakeLLMServer) -> None:
    proposer = make_proposer(ProposerContext(code_plan(repo, server), loop_name="edit", home=home))
    server.script(
        anthropic_tool_answer({"rationale": "r", "proposals": [edit("WIDTH=8", "WIDTH=9", "no spaces: no match")]}),
        anthropic_tool_answer({"rationale": "r", "proposals": [edit("WIDTH = 8", "WIDTH = 9", "exact")]}),
    )

    result = proposer.propose([], 1)

    assert "+WIDTH = 9" in (result.proposals[0].patch or "")
    assert "the search text does not occur in train.py" in server.requests[1].body["messages"][0]["content"]


def test_code_search_needs_committed_files_in_a_git_repo(tmp_path: Path, repo: Path, server: FakeLLMServer) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "train.py").write_text(TRAIN)
    with pytest.raises(PlanError) as err:
        make_proposer(ProposerContext(code_plan(plain, server)))
    assert "git init" in err.value.hint

    (repo / "model.py").write_text("x = 1\n")
    plan = code_plan(repo, server)
    plan.code.files = ["train.py", "model.py"]
    with pytest.raises(PlanError) as err:
        make_proposer(ProposerContext(plan))
    assert "not committed" in err.value.message and "git add model.py" in err.value.hint


def test_uncommitted_edits_to_tracked_files_are_part_of_the_base(
        home: Path, repo: Path, server: FakeLLMServer) -> None:
    (repo / "train.py").write_text(TRAIN.replace("DEPTH = 2", "DEPTH = 3"))
    proposer = make_proposer(ProposerContext(code_plan(repo, server), loop_name="edit", home=home))
    server.script(anthropic_tool_answer({"rationale": "r", "proposals": [edit("WIDTH = 8", "WIDTH = 9", "w")]}))

    proposal = proposer.propose([], 1).proposals[0]
    workdir = Path(proposer.workdir_for(1, proposal) or "")

    text = (workdir / "train.py").read_text()
    assert "DEPTH = 3" in text and "WIDTH = 9" in text
    assert git(repo, "status", "--porcelain").strip() == "M train.py"  # the checkout is as the user left it
    assert isinstance(proposal, Proposal)
