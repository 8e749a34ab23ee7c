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


@pytest.mark.parametrize("extra", [{}, {"warm_start": True}, {"repeats": {"seeds": 2}}])
def test_the_returned_view_is_the_ledgers_and_the_end_reads_no_trial_back(
        api: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: dict[str, Any]) -> None:
    """The final view is built from the rows and verdicts the controller holds (it is their only writer):
    it reads no trial and no verdict back from the ledger, and equals the view read from the ledger."""
    controller = Controller(_plan(tmp_path, **extra), runtime=api._runtime)
    reads: list[str] = []
    finish = Controller._finish

    def counted_finish(self: Controller) -> Any:
        trials, promotions = LoopStore.trials, LoopStore.promotions

        def counted(store: LoopStore, *a: Any) -> Any:
            rows = promotions(store, *a)
            reads.extend("verdict" for _ in rows)
            return rows

        monkeypatch.setattr(LoopStore, "trials", lambda store, *a: reads.append("trials") or trials(store, *a))
        monkeypatch.setattr(LoopStore, "promotions", counted)
        try:
            return finish(self)
        finally:
            monkeypatch.setattr(LoopStore, "trials", trials)
            monkeypatch.setattr(LoopStore, "promotions", promotions)

    monkeypatch.setattr(Controller, "_finish", counted_finish)
    view = controller.run()
    assert reads == []

    fresh = loop_view(api._ledger, "fin")
    assert view.state == "finished" and view.stop_reason and view.next_step.startswith("see `autoresearch report")
    assert sum(view.counts.values()) == 6 and view.counts.get("succeeded") == 6 and view.eta_s is None
    assert view.best_trial is not None and any(t.kept for t in view.trials)
    assert dataclasses.replace(view, elapsed_s=0.0) == dataclasses.replace(fresh, elapsed_s=0.0)
    assert view.decisions == len(LoopStore(api._ledger, view.loop_id).decisions())  # the finish decision counted


def test_a_resumed_loops_final_view_has_the_verdicts_of_its_first_run(api: Any, tmp_path: Path) -> None:
    """A resumed controller reads the promote decisions written before it once, at its start, and keeps
    its own as it writes them: its final view equals the ledger's, the first run's verdicts included."""
    first = Controller(_plan(tmp_path, budget={"trials": 3, "parallel": 3}), runtime=api._runtime).run()
    assert first.counts == {"succeeded": 3} and any(t.kept for t in first.trials)
    view = Controller(_plan(tmp_path), runtime=api._runtime, resume=True).run()
    fresh = loop_view(api._ledger, "fin")
    assert len(view.trials) == 6 and view.trials[0].kept == fresh.trials[0].kept
    assert dataclasses.replace(view, elapsed_s=0.0) == dataclasses.replace(fresh, elapsed_s=0.0)


def test_a_verdict_the_controller_did_not_write_is_read_at_the_end(api: Any, tmp_path: Path) -> None:
    """Should a promote decision be written past the kept ones by someone else, the end reads it."""
    from autoresearch.loop.state import LoopState
    from autoresearch.loop.views import verdict_of, verdicts

    controller = Controller(_plan(tmp_path), runtime=api._runtime)
    view = controller.run()
    s: LoopState = controller.state
    kept = dict(s.verdicts)
    assert kept == verdicts(api._ledger, view.loop_id) and kept
    trial = view.trials[-1].trial_id
    decision = s.store.decide("promote", trial_id=trial, outputs={"promoted": True, "trial_id": trial, "margin": 1.0},
                              at=123.0)
    assert s.judged()[trial] == verdict_of({"promoted": True, "margin": 1.0}, trial, 123.0, decision)
    assert s.judged() == verdicts(api._ledger, view.loop_id)
    s.note_verdict(verdict_of({"promoted": False}, trial, 1.0, decision))  # not newer than what is kept: ignored
    assert s.verdicts[trial].promoted


def test_reread_loop_leaves_the_view_it_was_given(api: Any, tmp_path: Path) -> None:
    view = Controller(_plan(tmp_path), runtime=api._runtime).run()
    before = dataclasses.replace(view)
    LoopStore(api._ledger, view.loop_id).set_loop(state="running")
    again = reread_loop(api._ledger, view, elapsed_s=5.0)
    assert view == before
    assert again.state == "running" and again.stop_reason == "" and again.elapsed_s == 5.0
    assert again.next_step.startswith("follow with") and again.trials is view.trials
