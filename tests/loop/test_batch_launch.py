"""Issue 16: a proposal's trials go to the engine as one batch (``jobs.submit_many``), and a
batch the engine refuses part-way launches each trial once (none twice, none lost)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from autoresearch.engine import jobs
from autoresearch.errors import SpecError
from autoresearch.loop.controller import Controller
from autoresearch.loop.plan import parse_plan
from tests.loop.conftest import submit_batches


def _plan(tmp_path: Path, trials: int, parallel: int) -> Any:
    return parse_plan({"name": "batch", "objective": {"metric": "loss"},
                       "trial": {"command": f"{sys.executable} -c \"print('loss: {{x}}')\"", "grace": 1},
                       "space": {"x": {"low": 0.0, "high": 1.0}}, "proposer": {"kind": "random"},
                       "budget": {"trials": trials, "parallel": parallel}}, base_dir=tmp_path)


def test_a_proposals_trials_are_submitted_in_one_batch(api: Any, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    batches = submit_batches(monkeypatch)
    view = Controller(_plan(tmp_path, 6, 4), runtime=api._runtime).run()
    assert view.counts == {"succeeded": 6}, view.counts
    assert batches == [6], batches  # the first proposal fills every slot and the queue ahead at once (random: 4 ahead)
    jobs_of = api._ledger.query("SELECT job_id FROM trials ORDER BY id")
    assert len({r["job_id"] for r in jobs_of}) == 6


def test_a_batch_refused_part_way_launches_each_trial_once(api: Any, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    real = jobs.submit_many

    refused: list[int] = []

    def half_then_refuse(runtime: Any, specs: list[Any], project: str = "", **kw: Any) -> list[int]:
        if refused or len(specs) < 2:  # (jobs.submit may be a batch of one)
            return real(runtime, specs, project, **kw)
        refused.append(len(specs))
        real(runtime, specs[:1], project, **kw)  # the first job is recorded, then the batch is refused
        raise SpecError("refused part-way", hint="test")

    monkeypatch.setattr(jobs, "submit_many", half_then_refuse)
    view = Controller(_plan(tmp_path, 3, 3), runtime=api._runtime).run()
    assert view.counts == {"succeeded": 3}, view.counts
    assert refused == [3]
    assert api._ledger.one("SELECT COUNT(*) AS n FROM jobs")["n"] == 3  # the first one adopted, not submitted again
