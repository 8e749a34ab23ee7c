"""A paused trial that is promoted and resumed (``early_stop.pause``) goes on in its own MLflow
run: the same run id, its points continuing at the next step, its status ending as the trial
ends, even when the mirror ran while it was paused (its first job had ended)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from autoresearch import tracking
from autoresearch.loop.controller import Controller
from autoresearch.loop.plan import parse_plan
from tests.loop.test_pause_resume import TRIAL
from tests.tracking.conftest import client, metric_history


def test_a_resumed_trial_continues_its_own_mlflow_run(api: Any, quiet: Path, tmp_path: Path) -> None:
    (tmp_path / "trial.py").write_text(TRIAL)
    plan = parse_plan({  # one rung, at 4: x=2 is paused there, promoted once x=3 does worse, and finishes
        "name": "pause-runs", "objective": {"metric": "loss"},
        "trial": {"command": f"{sys.executable} trial.py {{x}} 8 0.05 1", "grace": 5, "workdir": str(tmp_path)},
        "space": {"x": {"choices": [1.0, 2.0, 3.0, 4.0]}}, "proposer": {"kind": "grid"},
        "budget": {"trials": 4, "parallel": 1},
        "early_stop": {"kind": "asha", "min_steps": 4, "reduction_factor": 2, "pause": True}}, base_dir=tmp_path)
    runs_while_paused: list[str] = []

    def sync_while_paused(view: Any) -> None:  # the mirror runs while x=2 is paused, as the syncer may
        paused = api._ledger.one("SELECT id FROM trials WHERE state='paused' LIMIT 1", ())
        if paused is not None and not runs_while_paused:
            tracking.sync()
            runs_while_paused.append(_runs(api)[paused["id"]])

    view = Controller(plan, runtime=api._runtime, monitor_every_s=0.1, on_update=sync_while_paused).run()
    tracking.sync()

    by_x = {t.params["x"]: t for t in view.trials}
    resumed = by_x[2.0].trial_id
    assert [r["trial_id"] for r in api._ledger.query("SELECT trial_id FROM decisions WHERE kind='resume'", ())] \
        == [resumed]
    assert by_x[2.0].state == "succeeded"
    uri = tracking.tracking_uri(quiet)
    run_id = _runs(api)[resumed]
    assert runs_while_paused == [run_id]  # the run it had before its pause is the one it goes on in
    experiment = client(uri).get_experiment_by_name("pause-runs")
    runs = client(uri).search_runs([experiment.experiment_id])
    assert len(runs) == 5  # the loop's and one per trial: no second run for the resumed trial
    steps = [step for step, _ in metric_history(uri, run_id, "loss")]
    assert steps == list(range(1, 9))  # before the pause, then on from the next step, each once
    status = {r.data.tags.get("autoresearch.trial_id"): r.info.status for r in runs}
    assert status[str(resumed)] == "FINISHED"  # as the trial ended, not as its first job did
    assert status[str(by_x[3.0].trial_id)] == status[str(by_x[4.0].trial_id)] == "KILLED"
    logs = sorted(a.path for a in client(uri).list_artifacts(run_id, "logs"))
    assert logs == ["logs/attempt-1.log", f"logs/job-{by_x[2.0].job_id}-attempt-1.log"]  # both jobs' logs


def _runs(api: Any) -> dict[int, str]:
    rows = api._ledger.query("SELECT entity, run_id FROM tracking_runs WHERE entity LIKE 'trial:%'", ())
    return {int(r["entity"].split(":")[1]): r["run_id"] for r in rows}
