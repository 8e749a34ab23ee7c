"""A plan runs on the simulated fleet unchanged: the loop, a proposer and the engine, in wall
mode at a high speed (the events clock's wiring into the loop is the controller's)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from autoresearch.api import Api
from autoresearch.loop.plan import parse_plan


def test_a_plan_runs_on_the_sim_and_its_trials_report(home: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTORESEARCH_TRACKING", "off")  # no MLflow runs to wait for (as tests/loop/ do)
    plan = parse_plan({
        "name": "simloop", "objective": {"metric": "loss", "goal": "min"},
        "trial": {"command": "train --lr {lr}", "gpus": 2, "workdir": str(tmp_path)},
        "space": {"lr": {"low": 0.001, "high": 0.1, "log": True}}, "proposer": "random",
        "budget": {"trials": 4, "parallel": 2},
        "backend": {"kind": "sim", "nodes": [{"name": "h100", "count": 1, "gpus": 8}],
                    "trial": {"steps": 10, "seconds": "1h"}, "seed": 1, "clock": {"mode": "wall", "speed": 36000}},
    }, "plan.yaml", home=home)
    api = Api(home)
    from autoresearch.engine.runtime import runtime_for_plan

    runtime_for_plan(home, plan).backend.clock.now()  # the fleet starts its clock (as `autoresearch nodes` would)
    time.sleep(0.5)  # ... a while before the loop: 5 simulated hours at this speed
    view = api.run_loop(plan)
    trials = api.loop_status("simloop")[0].trials
    assert [t.state for t in trials] == ["succeeded"] * 4, view
    assert all(t.objective is not None and 0 < t.objective < 1 for t in trials)  # each trial's reported loss
    assert Path(home / "sim" / "current.json").exists()  # later processes open this fleet by the name sim
    # one clock: a trial is created, starts and ends in simulated time (36000x the wall here), so the
    # best-vs-time plot's "seconds since the loop started" do not mix the wall's with the sim's
    for t in trials:
        assert t.started_at is not None and t.ended_at is not None
        assert t.created_at <= t.started_at <= t.ended_at
    span = max(t.ended_at or 0 for t in trials) - min(t.created_at for t in trials)
    assert 0 < span <= view.elapsed_s + 1, (span, view.elapsed_s)  # the loop's elapsed time is simulated too
    assert all(c.at >= min(t.created_at for t in trials) for c in view.curve)
