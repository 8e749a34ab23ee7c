"""Issue 16: a loop's passes run on its controller's thread. A pass thread beside it shared one GIL
and cost the controller ~1 ms more CPU a trial than it saved (docs/DESIGN-NOTES.md, "The pass
thread is gone"). Counted, not timed: which threads ran passes, and that every ending was recorded
and the next trial started by them."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from autoresearch.engine.runtime import Runtime
from autoresearch.loop.controller import Controller
from autoresearch.loop.plan import parse_plan


def test_a_loop_runs_its_passes_on_its_own_thread(home: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    threads: list[str] = []
    real_tick = Runtime.tick

    def tick(self: Runtime, *args: Any, **kwargs: Any) -> bool:
        threads.append(threading.current_thread().name)
        return bool(real_tick(self, *args, **kwargs))

    monkeypatch.setattr(Runtime, "tick", tick)
    plan = parse_plan({"name": "one-thread", "objective": {"metric": "loss"},
                       "trial": {"command": f"{sys.executable} -c \"print('loss: {{x}}')\""},
                       "space": {"x": {"low": 0.0, "high": 1.0}}, "proposer": {"kind": "random"},
                       "budget": {"trials": 8, "parallel": 4}}, base_dir=tmp_path)
    before = {t.name for t in threading.enumerate()}
    view = Controller(plan, home=home).run()
    assert view.counts == {"succeeded": 8}
    assert threads and set(threads) == {threading.current_thread().name}  # (a pass thread's would differ)
    assert {t.name for t in threading.enumerate()} <= before  # none left behind


def test_a_loop_polls_the_trials_its_pokes_name_and_all_of_them_each_second(
        home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Between whole passes (at least one a second), a wake's pass polls the attempts whose
    supervisors said they ended, and the starting ones: not every running trial."""
    passes: list[Any] = []
    real_tick = Runtime.tick

    def tick(self: Runtime, *args: Any, **kwargs: Any) -> bool:
        passes.append(kwargs.get("only"))
        return bool(real_tick(self, *args, **kwargs))

    monkeypatch.setattr(Runtime, "tick", tick)
    plan = parse_plan({"name": "named", "objective": {"metric": "loss"},
                       "trial": {"command": "sleep 0.3; echo loss: {x}", "shell": True},
                       "space": {"x": {"low": 0.0, "high": 1.0}}, "proposer": {"kind": "random"},
                       "budget": {"trials": 12, "parallel": 4}}, base_dir=tmp_path)
    view = Controller(plan, home=home).run()
    assert view.counts == {"succeeded": 12}
    named = [only for only in passes if only]  # (a submit's pass gets only=(): the starting attempts)
    assert named, passes  # the endings' pokes named their attempts
    assert all(isinstance(only, set) for only in named)
    assert passes[0] is None  # the first is whole, and whole ones keep coming
    assert sum(only is None for only in passes) >= 2
