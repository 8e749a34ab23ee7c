"""The loop controller and the mirror: trials launch with their MLflow run (MLFLOW_RUN_ID) and
the LLM calls behind each propose decision reach MLflow as traces linked to the loop's run."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from autoresearch import tracking
from autoresearch.loop.controller import Controller
from autoresearch.loop.plan import parse_plan
from tests.fakes.llm_server import FakeLLMServer, anthropic_tool_answer
from tests.tracking.conftest import client, metric_history

# A trial that logs to MLflow itself: plain mlflow calls, no run handling.
OWN_MLFLOW = """\
import os, sys
print("run:", os.environ["MLFLOW_RUN_ID"])  # (mlflow takes it out of the environment when it starts the run)
import mlflow
x = float(sys.argv[1])
mlflow.log_metric("own_metric", x * 10, step=1)
print(f"loss: {x}")
"""
PRINT_RUN = """\
import os, sys
print("run:", os.environ.get("MLFLOW_RUN_ID", "none"))
print(f"loss: {(float(sys.argv[1]) - 0.3) ** 2:.6f}")
"""


def _runs_of_trials(api: Any) -> dict[int, str]:
    rows = api._ledger.query("SELECT entity, run_id FROM tracking_runs WHERE entity LIKE 'trial:%'")
    return {int(r["entity"].split(":")[1]): r["run_id"] for r in rows}


def _printed_run(api: Any, job_id: int) -> str:
    found = re.search(r"run: (\S+)", api.logs(job_id).text)
    assert found, api.logs(job_id).text
    return found.group(1)


def test_a_trial_that_logs_to_mlflow_itself_lands_in_its_child_run(api: Any, quiet: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTORESEARCH_RUN_WAIT_S", "30")  # it needs MLFLOW_RUN_ID: it waits for its run
    (tmp_path / "train.py").write_text(OWN_MLFLOW)
    plan = parse_plan({
        "name": "own-mlflow", "objective": {"metric": "loss"},
        "trial": {"command": f"{sys.executable} train.py {{x}}", "workdir": str(tmp_path)},
        "space": {"x": {"choices": [0.5]}}, "proposer": {"kind": "grid"}, "budget": {"trials": 1, "parallel": 1},
    }, base_dir=tmp_path)

    view = Controller(plan, runtime=api._runtime).run()

    assert view.counts == {"succeeded": 1}, view
    trial = api._ledger.one("SELECT * FROM trials")
    run_id = _runs_of_trials(api)[trial["id"]]  # created before the launch ...
    assert _printed_run(api, trial["job_id"]) == run_id  # ... and handed to the trial
    tracking.sync()
    uri = tracking.tracking_uri(quiet)
    run = client(uri).get_run(run_id)
    loop_run = api._ledger.one("SELECT run_id FROM tracking_runs WHERE entity=?", (f"loop:{trial['loop_id']}",))
    assert run.data.tags["mlflow.parentRunId"] == loop_run["run_id"]
    assert run.data.tags["autoresearch.trial_id"] == str(trial["id"])
    assert metric_history(uri, run_id, "own_metric") == [(1, 5.0)]  # the trial's own point, in its child run
    assert metric_history(uri, run_id, "loss") == [(0, 0.5)]  # beside the mirror's
    experiment = client(uri).get_experiment_by_name("own-mlflow")
    assert len(client(uri).search_runs([experiment.experiment_id])) == 2  # the loop and its one trial: no stray run


def test_the_first_trial_does_not_wait_for_mlflow_and_its_run_is_attached_afterwards(
        api: Any, quiet: Path, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(PRINT_RUN)
    plan = parse_plan({
        "name": "at-once", "objective": {"metric": "loss"},
        "trial": {"command": f"{sys.executable} train.py {{x}}", "workdir": str(tmp_path)},
        "space": {"x": {"choices": [0.5]}}, "proposer": {"kind": "grid"}, "budget": {"trials": 1, "parallel": 1},
    }, base_dir=tmp_path)

    view = Controller(plan, runtime=api._runtime).run()

    assert view.counts == {"succeeded": 1}, view
    trial = api._ledger.one("SELECT * FROM trials")
    # It launched at once, before the run maker (importing mlflow, seconds) had made its run ...
    assert _printed_run(api, trial["job_id"]) == "none"
    tracking.sync()
    run_id = _runs_of_trials(api)[trial["id"]]  # ... which the mirror made, and attached its metrics to
    assert metric_history(tracking.tracking_uri(quiet), run_id, "loss") == [(0, 0.04)]
    experiment = client(tracking.tracking_uri(quiet)).get_experiment_by_name("at-once")
    assert len(client(tracking.tracking_uri(quiet)).search_runs([experiment.experiment_id])) == 2  # no stray run


@pytest.fixture
def llm(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeLLMServer]:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    with FakeLLMServer() as fake:
        yield fake


def _answer(x: float) -> dict[str, Any]:
    return {"rationale": f"try {x}", "proposals": [{"params": {"x": x}, "rationale": f"x={x}"}]}


def test_llm_calls_are_stored_per_propose_decision_and_become_traces(
        api: Any, quiet: Path, tmp_path: Path, llm: FakeLLMServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTORESEARCH_RUN_WAIT_S", "30")  # the mirror's helper is done before the sync below
    (tmp_path / "train.py").write_text(PRINT_RUN)
    llm.script(*(anthropic_tool_answer(_answer(x), model="claude-sonnet-4-6") for x in (0.5, 0.25)))
    plan = parse_plan({
        "name": "llm-traced", "objective": {"metric": "loss"},
        "trial": {"command": f"{sys.executable} train.py {{x}}", "workdir": str(tmp_path)},
        "space": {"x": {"low": 0.0, "high": 1.0}},
        "proposer": {"kind": "llm", "provider": "anthropic", "model": "claude-sonnet-4-6", "base_url": llm.url,
                     "temperature": 0.5, "options": {"backoff_s": 0.01}},
        "budget": {"trials": 2, "parallel": 1},
    }, base_dir=tmp_path)

    view = Controller(plan, runtime=api._runtime, poll_s=0.02).run()

    assert view.counts == {"succeeded": 2}, view
    assert len(llm.requests) == 2
    outbox = api._ledger.query("SELECT * FROM tracking_outbox WHERE kind='llm_call' ORDER BY id")
    proposes = api._ledger.query("SELECT * FROM decisions WHERE kind='propose' ORDER BY id")
    assert [o["decision_id"] for o in outbox] == [d["id"] for d in proposes]  # one call per propose decision
    for row, decision in zip(outbox, proposes, strict=True):
        call, info = json.loads(row["payload"]), json.loads(decision["proposer"])
        assert row["loop_id"] == decision["loop_id"] == view.loop_id
        assert (call["model"], call["provider"], call["tokens_in"]) == ("claude-sonnet-4-6", "anthropic", 1523)
        assert (call["prompt_sha256"], call["temperature"]) == (info["prompt_sha256"], 0.5) and call["prompt_sha256"]
        assert call["inputs"]["user"] and call["outputs"]["proposals"]
    report = tracking.sync()
    runs = _runs_of_trials(api)  # every trial has its run: made before its launch (then handed to it) or after
    for trial in api._ledger.query("SELECT * FROM trials"):
        assert _printed_run(api, trial["job_id"]) in (runs[trial["id"]], "none")
    assert report.traces == 2
    assert all(r["done_at"] for r in api._ledger.query("SELECT done_at FROM tracking_outbox"))
    uri = tracking.tracking_uri(quiet)
    loop_run = api._ledger.one("SELECT run_id FROM tracking_runs WHERE entity=?", (f"loop:{view.loop_id}",))
    traces = client(uri).search_traces(locations=[client(uri).get_experiment_by_name("llm-traced").experiment_id])
    assert sorted(t.info.tags["autoresearch.decision_id"] for t in traces) == sorted(str(d["id"]) for d in proposes)
    assert {t.info.trace_metadata.get("mlflow.sourceRun") for t in traces} == {loop_run["run_id"]}
