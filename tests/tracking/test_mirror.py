"""The mirror's contract against real MLflow stores: runs, tags, nesting, metrics, artifacts, secrets."""

from __future__ import annotations

import json
import math
import sys
import uuid
from pathlib import Path
from typing import Any

from autoresearch import tracking
from tests.conftest import wait_state
from tests.tracking.conftest import (
    client,
    make_decision,
    make_loop,
    make_trial,
    metric_history,
    submit_trial,
)

REPORTER = "from autoresearch import report\nfor i in range({n}):\n    report(step=i, loss=1.0 / (i + 1), acc=i / {n})\n"


def _run(uri: str, run_id: str) -> Any:
    return client(uri).get_run(run_id)


def _job_run(uri: str, experiment: str, job_id: int) -> Any:
    c = client(uri)
    exp = c.get_experiment_by_name(experiment)
    runs = c.search_runs([exp.experiment_id], filter_string=f"tags.`autoresearch.job_id` = '{job_id}'")
    assert len(runs) == 1, f"expected one run for job {job_id}, found {len(runs)}"
    return runs[0]


def test_standalone_job_becomes_one_finished_run_with_tags_metrics_and_a_redacted_log(
        api: Any, store: str, tmp_path: Path) -> None:
    experiment = f"exp-{uuid.uuid4().hex[:8]}"
    script = "import os\nprint('token is', os.environ['HF_TOKEN'])\n" + REPORTER.format(n=30)
    view = api.submit({"command": [sys.executable, "-c", script], "workdir": str(tmp_path), "experiment": experiment,
                       "env": {"HF_TOKEN": "hf_verysecretvalue", "BATCH": "64"}, "tags": {"team": "vision"}})
    wait_state(api, view.id, "succeeded")
    report = tracking.sync()
    assert report.runs_created == 1 and report.metrics == 60

    run = _job_run(store, experiment, view.id)
    tags = run.data.tags
    assert run.info.status == "FINISHED"
    assert tags["autoresearch.state"] == "succeeded" and tags["autoresearch.attempts"] == "1"
    assert tags["autoresearch.end_reason"] == "exit" and tags["autoresearch.node"]
    assert tags["team"] == "vision"
    assert run.data.params["env.BATCH"] == "64"
    assert not any("HF_TOKEN" in k for k in [*run.data.params, *tags])
    assert metric_history(store, run.info.run_id, "loss") == [(i, 1.0 / (i + 1)) for i in range(30)]
    log = Path(client(store).download_artifacts(run.info.run_id, "logs/attempt-1.log", str(tmp_path))).read_text()
    assert "token is [REDACTED]" in log and "hf_verysecretvalue" not in log

    again = tracking.sync()  # nothing new: nothing sent twice
    assert again.metrics == 0 and again.runs_created == 0
    assert len(metric_history(store, run.info.run_id, "loss")) == 30


def test_failed_job_run_is_failed_and_nan_is_kept(api: Any, quiet: Path, tmp_path: Path) -> None:
    script = "from autoresearch import report\nreport(step=0, loss=float('nan'))\nreport(step=1, loss=2.0)\nraise SystemExit(3)"
    view = api.submit({"command": [sys.executable, "-c", script], "workdir": str(tmp_path)})
    wait_state(api, view.id, "failed")
    tracking.sync()
    uri = tracking.tracking_uri(quiet)
    run = _job_run(uri, "Default", view.id)
    assert run.info.status == "FAILED"
    assert run.data.tags["autoresearch.failure_class"] == "user"  # its own exit, no fault of the machine seen
    history = metric_history(uri, run.info.run_id, "loss")
    assert math.isnan(history[0][1]) and history[1] == (1, 2.0)


def test_loop_is_a_parent_run_with_nested_trials_carrying_their_provenance(
        api: Any, store: str, tmp_path: Path) -> None:
    plan = f"plan-{uuid.uuid4().hex[:8]}"
    loop = make_loop(api, plan, {"name": plan, "objective": "loss", "space": {"lr": [0.1, 0.01]}})
    decision = make_decision(api, loop, "propose", rationale="lr 0.1 diverged; try 0.01 with warmup",
                             outputs={"proposals": [{"lr": 0.01}]}, tokens_in=1200, tokens_out=300, cost_usd=0.004,
                             proposer={"kind": "llm", "model": "claude-x", "prompt_name": "propose",
                                       "prompt_sha256": "ab" * 32, "temperature": 0.7})
    first = make_trial(api, loop, decision, {"lr": 0.1, "optim": {"name": "adam", "betas": [0.9, 0.99]}}, seed=1)
    second = make_trial(api, loop, decision, {"lr": 0.01}, proposer="llm", parent_trial=first,
                        patch="--- a/train.py\n+++ b/train.py\n@@ -1 +1 @@\n-warmup=0\n+warmup=100\n")
    runs = tracking.prepare_runs(api._ledger.home, [first, second])
    assert set(runs) == {first, second}

    show_env = "import os\nprint('RUN', os.environ.get('MLFLOW_RUN_ID'), os.environ.get('MLFLOW_EXPERIMENT_ID'))\n"
    jobs = [submit_trial(api, t, [sys.executable, "-c", show_env + REPORTER.format(n=5)], tmp_path)
            for t in (first, second)]
    for job in jobs:
        wait_state(api, job, "succeeded")
    tracking.sync()

    c = client(store)
    exp = c.get_experiment_by_name(plan)
    parent = c.search_runs([exp.experiment_id], filter_string="tags.`autoresearch.kind` = 'loop'")
    assert len(parent) == 1
    parent_id = parent[0].info.run_id
    children = c.search_runs([exp.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent_id}'")
    assert sorted(int(r.data.tags["autoresearch.trial_id"]) for r in children) == [first, second]
    by_trial = {int(r.data.tags["autoresearch.trial_id"]): r for r in children}
    for trial, job in zip((first, second), jobs, strict=True):
        run = by_trial[trial]
        assert run.info.run_id == runs[trial]  # the run made before launch is the one that got everything
        log = api.logs(job).text
        assert f"RUN {run.info.run_id} {exp.experiment_id}" in log  # the trial was told its run
        assert run.data.tags["autoresearch.job_id"] == str(job)
        assert run.data.tags["autoresearch.decision_id"] == str(decision)
        assert run.data.tags["mlflow.note.content"] == "lr 0.1 diverged; try 0.01 with warmup"
        assert len(metric_history(store, run.info.run_id, "loss")) == 5
    assert by_trial[second].data.tags["autoresearch.parent_trial"] == str(first)
    assert by_trial[second].data.tags["autoresearch.proposer"] == "llm"
    assert by_trial[first].data.params == {"lr": "0.1", "optim.name": "adam", "optim.betas": "[0.9, 0.99]"}
    patch = Path(c.download_artifacts(runs[second], "patch.diff", str(tmp_path))).read_text()
    assert "+warmup=100" in patch
    record = json.loads(Path(c.download_artifacts(
        parent_id, f"decisions/{decision:06d}-propose.json", str(tmp_path))).read_text())
    assert record["proposer"]["model"] == "claude-x" and record["tokens_in"] == 1200
    assert record["trials"] == [first, second] and record["rationale"].startswith("lr 0.1")
    assert parent[0].data.params["objective"] == "loss"


def test_a_trial_that_logs_to_mlflow_itself_lands_in_its_run(api: Any, quiet: Path, tmp_path: Path) -> None:
    loop = make_loop(api, "self-logging")
    trial = make_trial(api, loop, make_decision(api, loop), {"lr": 0.5})
    run_id = tracking.prepare_runs(api._ledger.home, [trial])[trial]
    script = "import mlflow\nmlflow.log_metric('own_metric', 7.0, step=2)\nmlflow.set_tag('from_trial', 'yes')\n"
    job = submit_trial(api, trial, [sys.executable, "-c", script], tmp_path)
    wait_state(api, job, "succeeded", timeout=60)
    tracking.sync()
    uri = tracking.tracking_uri(quiet)
    run = _run(uri, run_id)
    assert run.data.tags["from_trial"] == "yes"
    assert metric_history(uri, run_id, "own_metric") == [(2, 7.0)]
    assert run.info.status == "FINISHED"
