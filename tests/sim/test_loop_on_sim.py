"""A plan runs unchanged on the simulated fleet: the loop's elapsed time and its budgets are
simulated seconds, and an events clock lets hours of a sweep pass in seconds of wall time."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from autoresearch.loop.controller import Controller
from autoresearch.loop.plan import parse_plan


def _plan(**over: Any) -> Any:
    plan: dict[str, Any] = {
        "name": "sim-sweep", "objective": {"metric": "loss", "goal": "minimize"},
        "trial": {"command": "train --lr {lr}", "gpus": 1, "timeout": "10h"},
        "space": {"lr": {"low": 1e-4, "high": 0.3, "log": True}},
        "proposer": {"kind": "random", "seed": 1},
        "budget": {"trials": 8, "parallel": 4},
        "backend": {"kind": "sim", "nodes": [{"name": "h100", "count": 1, "gpus": 4}],
                    "trial": {"model": "duration", "steps": 6, "seconds": "1h", "metric": "loss"},
                    "seed": 3, "clock": {"mode": "events"}},
    }
    for key, value in over.items():
        plan[key] = {**plan[key], **value} if isinstance(value, dict) else value
    return parse_plan(plan, base_dir=".")


def test_hours_of_simulated_trials_pass_in_seconds_and_elapsed_is_simulated(tmp_path: Path) -> None:
    t0 = time.monotonic()
    view = Controller(_plan(), home=tmp_path / "home").run()
    wall = time.monotonic() - t0
    assert view.counts.get("succeeded") == 8
    # 8 one-hour trials, 4 at a time on 4 GPUs: two simulated hours at least, whatever the wall clock did.
    assert view.elapsed_s >= 2 * 3600
    assert wall < view.elapsed_s / 20


def test_a_wall_budget_is_simulated_time(tmp_path: Path) -> None:
    """On the wall clock a 90-minute budget would never end within this test; in simulated time it
    ends half-way through the second round of one-hour trials, which it stops."""
    view = Controller(_plan(budget={"wall": 5400, "trials": 8}), home=tmp_path / "home").run()
    assert "wall budget 5400s used" in view.stop_reason
    assert 5400 <= view.elapsed_s < 4 * 3600
    assert view.counts == {"succeeded": 4, "stopped": 4}


def test_gpu_hours_are_counted_in_simulated_time(tmp_path: Path) -> None:
    view = Controller(_plan(budget={"gpu_hours": 6, "trials": 40}), home=tmp_path / "home").run()
    assert "gpu_hours budget 6 used" in view.stop_reason
    # GPU hours stop launching and let running trials finish: at most one more round of 4 one-hour trials.
    assert sum(n for state, n in view.counts.items() if state != "skipped") <= 6 + 4  # (skipped: never launched)


def test_a_job_ends_at_its_simulated_end_not_at_the_wall_clock(tmp_path: Path) -> None:
    """The job row's ended_at is the attempt's end (a simulated timestamp), so a one-hour simulated
    trial shows a one-hour runtime (it showed 0 s: started in simulated time, ended in wall time)."""
    view = Controller(_plan(budget={"trials": 2}), home=tmp_path / "home").run()
    from autoresearch.api import Api

    api = Api(tmp_path / "home")
    for trial in view.trials:
        job = api.status(trial.job_id)
        assert job.started_at is not None and job.ended_at is not None
        assert abs((job.ended_at - job.started_at) - 3600) < 1
