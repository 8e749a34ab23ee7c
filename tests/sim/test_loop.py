"""A plan runs on the simulated fleet unchanged: the loop, a proposer and the engine, in wall
mode at a high speed (the events clock's wiring into the loop is the controller's)."""

from __future__ import annotations

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
    view = api.run_loop(plan)
    trials = api.loop_status("simloop")[0].trials
    assert [t.state for t in trials] == ["succeeded"] * 4, view
    assert all(t.objective is not None and 0 < t.objective < 1 for t in trials)  # each trial's reported loss
    assert Path(home / "sim" / "current.json").exists()  # later processes open this fleet by the name sim
