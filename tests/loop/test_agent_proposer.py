"""The agent proposer: the coding agent proposes through propose_trials; the real
controller launches, evaluates and stops; stop_loop ends the loop."""

from __future__ import annotations

import json
import subprocess
import threading
import traceback
from pathlib import Path
from typing import Any

import pytest

from autoresearch.errors import NotFoundError, StateError
from autoresearch.loop import ops
from autoresearch.loop.controller import Controller
from autoresearch.loop.plan import parse_plan
from tests.conftest import wait_for

QUADRATIC = "python -c \"import time; time.sleep({wait}); print('loss:', ({x} - 0.3) ** 2)\""


def agent_plan(workdir: Path, trials: int = 3, **extra: Any) -> Any:
    return parse_plan({
        "name": "agentic", "objective": {"metric": "loss", "goal": "minimize"},
        "trial": {"command": QUADRATIC, "workdir": str(workdir), "grace": 1},
        "space": {"x": {"low": 0.0, "high": 1.0}, "wait": {"choices": [0, 30]}},
        "proposer": {"kind": "agent"}, "budget": {"trials": trials, "parallel": 2}, **extra,
    }, base_dir=workdir)


def run_in_thread(controller: Controller) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["view"] = controller.run()
        except BaseException:  # noqa: BLE001 - surfaced by the test, with where it was raised
            out["error"] = traceback.format_exc()

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, out


def trial_states(api: Any) -> dict[int, str]:
    return {r["id"]: r["state"] for r in api._ledger.query("SELECT id, state FROM trials")}


def test_agent_trials_are_validated_recorded_launched_and_the_budget_ends_the_loop(api: Any, tmp_path: Path) -> None:
    controller = Controller(agent_plan(tmp_path), runtime=api._runtime, poll_s=0.02)
    thread, out = run_in_thread(controller)
    wait_for(lambda: api.loop_proposer("agentic") is not None, 10)

    sent = api.submit_proposals("agentic", [
        {"params": {"x": 0.25, "wait": 0}, "rationale": "near the guess"},
        {"params": {"x": 7, "wait": 0}, "rationale": "way out"},
        {"params": {"x": 0.5}, "rationale": "forgot wait"},
        {"params": {"x": 0.25, "wait": 0}, "rationale": "a duplicate"},
    ], "start around 0.3", agent="claude-code")

    assert sent.accepted == 2 and sent.controller_running
    assert sent.notes == ["proposal 2: clipped x from 7 to 1 (range [0, 1])"]
    assert sent.rejected == ["proposal 3: missing parameter 'wait'",
                             "proposal 4: already tried or waiting with these params and code"]
    submit = api._ledger.one("SELECT * FROM decisions WHERE id=?", (sent.decision_id,))
    assert submit["kind"] == "agent_submit" and submit["rationale"].startswith("start around 0.3")
    assert json.loads(submit["proposer"])["model"] == "claude-code"

    wait_for(lambda: list(trial_states(api).values()) == ["succeeded", "succeeded"], 30)
    view, rows = api.leaderboard("agentic")
    assert [(r["trial_id"], r["params"]) for r in rows] == [(1, {"x": 0.25, "wait": 0}), (2, {"x": 1.0, "wait": 0})]
    assert rows[0]["objective"] == pytest.approx(0.0025) and rows[0]["rationale"] == "near the guess"
    assert view.best_trial == 1
    propose = api._ledger.one("SELECT * FROM decisions WHERE kind='propose' ORDER BY id LIMIT 1")
    assert propose["id"] > sent.decision_id and f"#{sent.decision_id}" in propose["rationale"]  # provenance

    last = api.submit_proposals("agentic", [{"params": {"x": 0.3, "wait": 0}, "rationale": "the optimum"},
                                                 {"params": {"x": 0.31, "wait": 0}, "rationale": "one too many"}],
                                "refine")
    assert last.accepted == 1 and last.rejected == ["proposal 2: over budget.trials (3)"]
    thread.join(60)
    assert "error" not in out, out.get("error")
    assert out["view"].state == "finished" and out["view"].stop_reason == "trial budget 3 used"
    assert out["view"].best_value == pytest.approx(0.0)
    with pytest.raises(StateError) as err:
        api.submit_proposals("agentic", [{"params": {"x": 0.1, "wait": 0}}], "too late")
    assert "resume=true" in err.value.hint


def test_stop_loop_stops_running_trials_and_finishes_the_controller(api: Any, tmp_path: Path) -> None:
    controller = Controller(agent_plan(tmp_path, trials=10), runtime=api._runtime, poll_s=0.02)
    thread, out = run_in_thread(controller)
    wait_for(lambda: api.loop_proposer("agentic") is not None, 10)
    api.submit_proposals("agentic", [{"params": {"x": 0.5, "wait": 30}, "rationale": "slow one"}], "go")
    wait_for(lambda: trial_states(api).get(1) == "running", 20)

    decision, jobs = api.stop_loop("agentic", rationale="enough for today")

    thread.join(30)
    assert not thread.is_alive() and "error" not in out, out.get("error")
    assert len(jobs) == 1 and out["view"].state == "finished"
    assert trial_states(api) == {1: "stopped"}
    kinds = [r["kind"] for r in api._ledger.query("SELECT kind FROM decisions ORDER BY id")]
    assert kinds.index("stop_loop") < kinds.index("stop") < kinds.index("finish")  # recorded before acted on
    assert decision == api._ledger.one("SELECT id FROM decisions WHERE kind='stop_loop'")["id"]
    stopped_job = api.status(jobs[0])
    assert stopped_job.state == "cancelled" and stopped_job.end_reason == "stopped"  # `list` shows it as stopped

    # Stopping it again is idempotent: it says the loop had already ended and records nothing.
    assert api.stop_loop("agentic", rationale="again") == (None, [])
    assert [r["kind"] for r in api._ledger.query("SELECT kind FROM decisions ORDER BY id")] == kinds
    with pytest.raises(NotFoundError) as err:
        api.stop_loop("agentic-typo")
    assert "agentic" in err.value.hint


def test_agent_code_edits_become_patches_on_the_best_trial(api: Any, tmp_path: Path) -> None:
    repo = tmp_path / "proj"
    repo.mkdir()
    (repo / "train.py").write_text("import sys\nSCALE = 2.0\nprint('loss:', SCALE * float(sys.argv[1]))\n")
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "b"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True)
    plan = parse_plan({
        "name": "agentic", "objective": {"metric": "loss", "goal": "minimize"},
        "trial": {"command": "python train.py {x}", "workdir": str(repo)},
        "space": {"x": {"low": 0.1, "high": 1.0}}, "code": {"files": ["train.py"]},
        "proposer": {"kind": "agent"}, "budget": {"trials": 2, "parallel": 1},
    }, base_dir=repo)
    thread, out = run_in_thread(Controller(plan, runtime=api._runtime, poll_s=0.02))
    wait_for(lambda: api.loop_proposer("agentic") is not None, 10)

    sent = api.submit_proposals("agentic", [
        {"params": {"x": 0.5}, "rationale": "halve the scale",
         "edits": [{"file": "train.py", "search": "SCALE = 2.0", "replace": "SCALE = 1.0"}]},
        {"params": {"x": 0.5}, "rationale": "a file outside code.files",
         "edits": [{"file": "prepare.py", "search": "a", "replace": "b"}]},
    ], "code first")

    assert sent.rejected == ["proposal 2: edit 1 touches 'prepare.py'; only train.py may be edited"]
    wait_for(lambda: trial_states(api).get(1) == "succeeded", 30)
    api.submit_proposals("agentic", [{"params": {"x": 0.1}, "rationale": "smaller x, same code"}], "exploit")
    thread.join(60)
    assert "error" not in out, out.get("error")
    rows = {r["id"]: r for r in api._ledger.query("SELECT * FROM trials")}
    assert rows[2]["parent_trial"] == 1  # built on the incumbent
    assert rows[2]["objective"] == pytest.approx(0.1)  # SCALE = 1.0 carried over
    assert ops.patch_summary(rows[1]["patch"]) == "train.py +1 -1"
    assert (repo / "train.py").read_text().count("SCALE = 2.0") == 1  # the user's file is untouched
