"""MLflow opens on the sweep (issue 13, item 3): experiments are model-training experiments with a
saved view that lists the trials with their params, objective and provenance; trial runs are
named with their id, state and params and carry the loop's verdict; ``autoresearch ui`` refuses
a busy port with exit 1 and a hint, and prints the URL only once the server answers."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from autoresearch import tracking
from tests.tracking.conftest import client, free_port, make_decision, make_loop, make_trial, submit_trial

PLAN = {"name": "sweep", "objective": {"metric": "loss", "goal": "minimize"},
        "space": {"lr": {"low": 0.001, "high": 0.1, "log": True}, "width": {"choices": [8, 16]}}}


def _sweep(api: Any, tmp_path: Path) -> tuple[int, list[int]]:
    """A loop with two finished trials: #1 kept, #2 lower by less than the noise floor."""
    loop = make_loop(api, "sweep", PLAN)
    decision = make_decision(api, loop)
    trials = []
    for lr, loss in ((0.01, 0.5), (0.02, 0.49)):
        trial = make_trial(api, loop, decision, {"lr": lr, "width": 8})
        submit_trial(api, trial, [sys.executable, "-c", f"print('loss: {loss}')"], tmp_path)
        trials.append(trial)
    from tests.conftest import wait_for

    for trial in trials:
        job = api._ledger.one("SELECT job_id FROM trials WHERE id=?", (trial,))["job_id"]
        wait_for(lambda j=job: api.status(j).state == "succeeded", timeout=60)
        with api._ledger.tx() as c:
            c.execute("UPDATE trials SET state='succeeded', objective=?, ended_at=?, updated_at=? WHERE id=?",
                      (0.5 if trial == trials[0] else 0.49, time.time(), time.time(), trial))
    make_decision(api, loop, "promote", outputs={"promoted": True, "trial_id": trials[0]})
    make_decision(api, loop, "promote", outputs={"promoted": False, "trial_id": trials[1], "margin": 0.01},
                  inputs={"incumbent_trial": trials[0]})
    with api._ledger.tx() as c:  # the decisions name their trial, as the loop's do
        c.execute("UPDATE decisions SET trial_id=json_extract(outputs, '$.trial_id') WHERE kind='promote'")
    return loop, trials


def test_the_experiment_opens_on_the_trials_with_params_objective_and_provenance(api: Any, quiet: Path,
                                                                                 tmp_path: Path) -> None:
    _, trials = _sweep(api, tmp_path)
    tracking.sync(quiet)
    uri = f"sqlite:///{quiet.resolve() / 'mlflow.db'}"
    mlflow = client(uri)
    exp = mlflow.get_experiment_by_name("sweep")
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"  # not the GenAI view
    view = json.loads(exp.tags["mlflow.sharedViewState.autoresearch"])
    assert view["searchFilter"] == "tags.`autoresearch.kind` = 'trial'"
    assert {"params.`lr`", "params.`width`", "metrics.`loss`", "tags.`autoresearch.verdict`",
            "tags.`autoresearch.proposer`", "tags.`autoresearch.decision_id`"} <= set(view["selectedColumns"])
    assert view["orderByKey"] == "metrics.`loss`" and view["orderByAsc"] is True
    runs = {r.data.tags["autoresearch.trial_id"]: r for r in mlflow.search_runs(
        [exp.experiment_id], filter_string=view["searchFilter"])}
    first, second = runs[str(trials[0])], runs[str(trials[1])]
    assert first.info.run_name == f"trial-{trials[0]} succeeded lr=0.01 width=8"
    assert first.data.tags["autoresearch.verdict"] == "incumbent"
    assert second.data.tags["autoresearch.verdict"] == "within noise"
    loop_run = mlflow.search_runs([exp.experiment_id], filter_string="tags.`autoresearch.kind` = 'loop'")[0]
    assert loop_run.data.tags["autoresearch.incumbent_trial"] == str(trials[0])
    from autoresearch.api import Api

    page = Api(quiet).mlflow_ui("127.0.0.1", 1, sync=False)[2]
    assert page == (f"/#/experiments/{exp.experiment_id}/runs?viewStateShareKey=autoresearch"
                    "&workflowType=machine_learning")


def _procs() -> dict[int, tuple[int, int]]:
    """Every process's (parent pid, session id), from /proc."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            out[int(entry)] = (int(fields[1]), int(fields[3]))
    return out


def _ui(home: Path, port: int) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "autoresearch.cli", "ui", "--port", str(port), "--no-sync"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "AUTORESEARCH_HOME": str(home)})


def test_ui_on_a_busy_port_exits_1_with_a_hint(quiet: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = _ui(quiet, port)
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    assert f"port {port} on 127.0.0.1 is already in use" in err and "hint: pass --port" in err
    assert "http://" not in out  # no URL for a server that is not ours
    assert "Traceback" not in err


@pytest.mark.timeout(400)  # mlflow ui takes 30-120 s to start on a loaded machine
def test_ui_prints_the_url_once_the_server_answers_and_stops_it(api: Any, quiet: Path, tmp_path: Path) -> None:
    _sweep(api, tmp_path)
    tracking.sync(quiet)
    port = free_port()
    proc = _ui(quiet, port)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until ui prints: it must answer by then
        assert line.startswith(f"MLflow UI: http://127.0.0.1:{port}/#/experiments/"), line
        assert "viewStateShareKey=autoresearch&workflowType=machine_learning" in line
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as resp:
            assert resp.status == 200
        # One worker for one person's browser (mlflow's default, four, took ~25 s to answer on 2 cores):
        # in the session the ui started, `mlflow ui` and the uvicorn it runs, no worker process beside.
        procs = _procs()
        server = [pid for pid, (ppid, _) in procs.items() if ppid == proc.pid]
        assert len(server) == 1, server
        assert 1 <= sum(1 for _, sid in procs.values() if sid == server[0]) <= 2, procs
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the server it started is gone with it: the port is free again
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
        except OSError:
            break
        time.sleep(0.5)
    else:
        raise AssertionError("mlflow ui still answers after autoresearch ui stopped")


def test_the_loop_run_says_which_best_and_whether_its_seeds_confirmed_it(api: Any, quiet: Path) -> None:
    """The summary and the CI reports said "confirmed" or not; the loop's MLflow run named the last
    promoted trial only, and nothing said whether its repeats had ended."""
    loop = make_loop(api, "sure", PLAN)
    make_decision(api, loop, "finish", outputs={"reason": "budget", "best_trial": 7, "best_value": 0.25,
                                                "best_seeds": 1, "best_confirmed": False, "noise_floor": None})
    tracking.sync(quiet)
    mlflow = client(f"sqlite:///{quiet.resolve() / 'mlflow.db'}")
    exp = mlflow.get_experiment_by_name("sure")
    run = mlflow.search_runs([exp.experiment_id], filter_string="tags.`autoresearch.kind` = 'loop'")[0]
    tags = run.data.tags
    assert tags["autoresearch.best_trial"] == "7" and tags["autoresearch.incumbent_trial"] == "7"
    assert tags["autoresearch.best_confirmed"] == "false" and tags["autoresearch.best_seeds"] == "1"
    assert float(tags["autoresearch.best_value"]) == 0.25


def test_best_tags_take_nothing_malformed_from_a_decision() -> None:
    from autoresearch.tracking._traces import best_tags

    assert best_tags({"best_trial": 3, "best_value": 0.5, "best_seeds": 3, "best_confirmed": True}) == {
        "autoresearch.best_trial": "3", "autoresearch.incumbent_trial": "3", "autoresearch.best_value": "0.5",
        "autoresearch.best_seeds": "3", "autoresearch.best_confirmed": "true"}
    assert best_tags({"best_trial": 3, "best_confirmed": None})["autoresearch.best_confirmed"] == "no repeats"
    for garbage in (None, [], "x" * 10**6, {"best_trial": "<b>1</b>", "best_value": "nan", "best_seeds": -1,
                                            "best_confirmed": "yes"}, {"best_trial": True}):
        assert best_tags(garbage) == {}
