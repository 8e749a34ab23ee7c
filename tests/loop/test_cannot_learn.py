"""A loop that cannot learn stops: when its first N trials (``budget.fail_fast``, default
max(3, parallel)) all fail the same way or never report the objective, it stops with the reason,
the first failing trial's decisive log line and the metric names the trials did print, and
``autoresearch run`` exits 1. Before, it ran its whole budget and exited 0 with no reason."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from autoresearch.backends.fake import FakeBackend, Script
from autoresearch.engine.runtime import Runtime
from autoresearch.loop.controller import Controller
from autoresearch.loop.plan import parse_plan
from autoresearch.loop.views import CANNOT_LEARN


def _run(home: Path, tmp_path: Path, script: Script, **budget: int) -> tuple[object, FakeBackend]:
    fake = FakeBackend(gpus=1, programs={"train": script})
    plan = parse_plan({"name": "doomed", "objective": {"metric": "val_loss"},
                       "trial": {"command": "train {x}"}, "space": {"x": {"low": 0.0, "high": 1.0}},
                       "proposer": "random", "budget": {"trials": 12, "parallel": 2, **budget}}, base_dir=tmp_path)
    view = Controller(plan, runtime=Runtime(home, backend=fake), poll_s=0.01).run()
    return view, fake


def test_a_loop_whose_first_trials_all_crash_alike_stops_with_the_decisive_line(home: Path, tmp_path: Path) -> None:
    crash = Script(b"loading data\nTraceback (most recent call last):\nFileNotFoundError: data/train.bin\n",
                   exit_code=1)
    view, fake = _run(home, tmp_path, crash)

    assert view.stop_reason.startswith(CANNOT_LEARN)  # type: ignore[attr-defined]
    assert "all failed alike: exited 1" in view.stop_reason  # type: ignore[attr-defined]
    assert "FileNotFoundError: data/train.bin" in view.stop_reason  # type: ignore[attr-defined]
    assert len(fake.attempts()) < 12  # not the whole budget


def test_a_loop_whose_trials_print_another_metric_asks_did_you_mean(home: Path, tmp_path: Path) -> None:
    view, fake = _run(home, tmp_path, Script(b"step 1\nval-loss: 0.5\nacc: 0.7\n", exit_code=0), fail_fast=4)

    reason = view.stop_reason  # type: ignore[attr-defined]
    assert reason.startswith(CANNOT_LEARN) and "none of the first 4 trial(s) reported the objective 'val_loss'" in reason
    assert "did you mean 'val-loss'?" in reason
    assert len(fake.attempts()) < 12


def test_one_good_trial_among_the_first_keeps_the_loop_going(home: Path, tmp_path: Path) -> None:
    calls = {"n": 0}

    def output(request: object) -> bytes:
        calls["n"] += 1
        return b"val_loss: 0.5\n" if calls["n"] == 2 else b"boom: error\n"

    view, _ = _run(home, tmp_path, Script(output, exit_code=0), trials=5)
    assert not view.stop_reason.startswith(CANNOT_LEARN)  # type: ignore[attr-defined]


def test_fail_fast_zero_never_stops_for_this(home: Path, tmp_path: Path) -> None:
    view, fake = _run(home, tmp_path, Script(b"nothing\n", exit_code=1), fail_fast=0, trials=5)
    assert not view.stop_reason.startswith(CANNOT_LEARN)  # type: ignore[attr-defined]
    assert len(fake.attempts()) == 5


def test_autoresearch_run_exits_1_with_the_reason(home: Path, tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text("name: cli-doomed\nobjective: {metric: loss}\n"
                    "trial: {command: \"sh -c 'echo lr={lr}; echo KeyError: loss >&2; exit 2'\"}\n"
                    "space: {lr: {low: 0.1, high: 1.0}}\nproposer: random\nbudget: {trials: 6, parallel: 1}\n")
    done = subprocess.run([sys.executable, "-m", "autoresearch.cli", "run", str(plan), "--json", "--no-report"],
                          capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert "all failed alike: exited 2" in done.stderr and "KeyError: loss" in done.stderr
