"""One number for one trial: a loop's trial ids and the ids of the jobs that ran them drift apart
(a job submitted by hand takes a job id, never a trial id), so every surface shows a trial with its
job, and the job reads (status, logs, metrics) take a trial's id as ``T48`` or ``--trial 48``."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoresearch.api import Api
from autoresearch.backends import LaunchRequest
from autoresearch.backends.fake import FakeBackend, Script
from autoresearch.cli import main
from autoresearch.engine.runtime import Runtime
from autoresearch.engine.spec import make_spec
from autoresearch.errors import NotFoundError
from autoresearch.loop.controller import Controller
from autoresearch.loop.plan import parse_plan
from autoresearch.loop.report import summary_markdown


def _loss(request: LaunchRequest) -> bytes:
    return f"x={request.argv[1]}\nloss: {(float(request.argv[1]) - 0.5) ** 2}\n".encode()


def _drifted_loop(home: Path, tmp_path: Path) -> tuple[Api, FakeBackend, object]:
    fake = FakeBackend(gpus=1, programs={"train": Script(_loss, exit_code=0), "other": Script(b"hand\n")})
    api = Api(home, backend=fake)
    api.submit(make_spec({"command": ["other"], "name": "by-hand"}))  # job 1: no trial has it
    plan = parse_plan({"name": "ids", "objective": {"metric": "loss"}, "trial": {"command": "train {x}"},
                       "space": {"x": [0.1, 0.5, 0.9]}, "proposer": "grid", "budget": {"trials": 3, "parallel": 1}},
                      base_dir=tmp_path)
    view = Controller(plan, runtime=Runtime(home, backend=fake), poll_s=0.01).run()
    return api, fake, view


def test_a_trial_id_reads_the_job_that_ran_it(home: Path, tmp_path: Path) -> None:
    api, _, view = _drifted_loop(home, tmp_path)
    assert all(t.job_id is not None and t.job_id != t.trial_id for t in view.trials)  # they drifted
    for t in view.trials:
        assert api.status(f"T{t.trial_id}").id == t.job_id
        assert f"x={t.params['x']}" in api.logs(f"t{t.trial_id}").text
        assert api.metrics(f"T{t.trial_id}", names=["loss"])[0].last == pytest.approx((t.params["x"] - 0.5) ** 2)
    with pytest.raises(NotFoundError, match="no job for trial 99"):
        api.status("T99")
    for bad in ("T", "T-1", "Tx", "T" + "9" * 30, "T1/../2"):
        with pytest.raises(NotFoundError):
            api.logs(bad)


def test_the_faces_show_a_trial_with_its_job(home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    api, fake, view = _drifted_loop(home, tmp_path)
    best = next(t for t in view.trials if t.trial_id == view.best_trial)
    assert f"trial {best.trial_id} (job {best.job_id}" in summary_markdown(view, {}, [])
    from autoresearch.cli import _live

    live = _live.LiveTable(parse_plan({"name": "ids", "objective": {"metric": "loss"}, "trial": {"command": "t"},
                                       "space": {"x": [1]}}, base_dir=tmp_path), interactive=False)
    live.summary(view)  # type: ignore[arg-type]
    assert f"best: trial {best.trial_id} (job {best.job_id})" in capsys.readouterr().out
    monkeypatch.setattr("autoresearch.cli._facade.open_api", lambda args: api)
    for argv in (["logs", f"T{best.trial_id}"], ["logs", "--trial", str(best.trial_id)]):
        assert main(argv) == 0
        assert f"x={best.params['x']}" in capsys.readouterr().out
    assert main(["metrics", "--trial", str(best.trial_id)]) == 0
    assert "loss" in capsys.readouterr().out
    assert main(["logs", "1", "--trial", "2"]) == 2
    assert main(["logs"]) == 2 and "--trial 48" in capsys.readouterr().err
