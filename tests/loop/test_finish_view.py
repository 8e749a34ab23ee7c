"""The loop's end reads and replays its trials once (issue 16): the view it returns after its
``finish`` decision is the one before, with what the loop's row and decisions say now."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from autoresearch.loop.controller import Controller
from autoresearch.loop.plan import parse_plan
from autoresearch.loop.store import LoopStore
from autoresearch.loop.views import loop_view, reread_loop


def _plan(tmp_path: Path, **extra: Any) -> Any:
    data = {"name": "fin", "objective": {"metric": "loss"},
            "trial": {"command": "echo loss: {x}", "shell": True, "grace": 1},
            "space": {"x": {"low": 0.0, "high": 1.0}}, "proposer": {"kind": "random"},
            "budget": {"trials": 6, "parallel": 3}}
    data.update(extra)
    return parse_plan(data, base_dir=tmp_path)


@pytest.mark.parametrize("extra", [{}, {"warm_start": True}])
def test_the_returned_view_is_the_ledgers_and_the_end_reads_the_trials_once(
        api: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: dict[str, Any]) -> None:
    controller = Controller(_plan(tmp_path, **extra), runtime=api._runtime)
    reads: list[str] = []
    finish = Controller._finish

    def counted_finish(self: Controller) -> Any:
        trials = LoopStore.trials
        monkeypatch.setattr(LoopStore, "trials", lambda store, *a: reads.append("trials") or trials(store, *a))
        try:
            return finish(self)
        finally:
            monkeypatch.setattr(LoopStore, "trials", trials)

    monkeypatch.setattr(Controller, "_finish", counted_finish)
    view = controller.run()
    assert reads == ["trials"]  # the second view (after the finish decision) reused the first one's trials

    fresh = loop_view(api._ledger, "fin")
    assert view.state == "finished" and view.stop_reason and view.next_step.startswith("see `autoresearch report")
    assert view.counts == {"succeeded": 6} and view.eta_s is None
    assert dataclasses.replace(view, elapsed_s=0.0) == dataclasses.replace(fresh, elapsed_s=0.0)
    assert view.decisions == len(LoopStore(api._ledger, view.loop_id).decisions())  # the finish decision counted


def test_reread_loop_leaves_the_view_it_was_given(api: Any, tmp_path: Path) -> None:
    view = Controller(_plan(tmp_path), runtime=api._runtime).run()
    before = dataclasses.replace(view)
    LoopStore(api._ledger, view.loop_id).set_loop(state="running")
    again = reread_loop(api._ledger, view, elapsed_s=5.0)
    assert view == before
    assert again.state == "running" and again.stop_reason == "" and again.elapsed_s == 5.0
    assert again.next_step.startswith("follow with") and again.trials is view.trials
