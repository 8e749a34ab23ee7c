"""Issue 16: the turnover between a trial's end and the next trial's launch.

* Queue ahead: at parallel >= 4 the controller keeps ``parallel // 4`` trials proposed ahead of
  the free slots, so an ending is followed by the launch of an already proposed trial, not by a
  propose() call first. Never beyond the trial budget; a sequential loop (parallel < 4) does not
  propose ahead; trials still waiting when the loop stops are ``skipped``, not failed.
* One live update per wake, however many trials ended in it (not one per ending).

Driven step by step on the fake backend (no processes, no timing): counters only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autoresearch.backends.fake import FakeBackend, Script
from autoresearch.loop.controller import Controller
from autoresearch.loop.plan import parse_plan
from autoresearch.runtime import Runtime


def _controller(home: Path, tmp_path: Path, trials: int, parallel: int, **kw: Any) -> tuple[Controller, FakeBackend]:
    fake = FakeBackend(programs={"train": Script()})  # runs until the test ends it
    plan = parse_plan({"name": "ahead", "objective": {"metric": "loss"}, "trial": {"command": "train {x}"},
                       "space": {"x": {"low": 0.0, "high": 1.0}}, "proposer": {"kind": "random"},
                       "budget": {"trials": trials, "parallel": parallel}}, base_dir=tmp_path)
    c = Controller(plan, runtime=Runtime(home, backend=fake), **kw)
    c.open()
    return c, fake


def _end(c: Controller, fake: FakeBackend, trial_ids: list[int]) -> None:
    """The trials' programs exit 0 after reporting, and the controller wakes once."""
    for t in trial_ids:
        key = f"{c.state.rows[t]['job_id']}.1"
        fake.emit(key, "loss: 0.5\n")
        fake.finish(key, 0)
    c._woke = True
    c._poll()


def _proposals(c: Controller) -> list[int]:
    calls: list[int] = []
    real = c.proposer.propose

    def counted(history: Any, n: int) -> Any:
        calls.append(n)
        return real(history, n)

    c.proposer.propose = counted  # type: ignore[method-assign]
    return calls


def test_endings_launch_trials_proposed_ahead_without_a_propose_call_first(home: Path, tmp_path: Path) -> None:
    c, fake = _controller(home, tmp_path, trials=40, parallel=8)
    try:
        s = c.state
        c._fill()
        assert len(s.active) == 8
        waiting = [r["id"] for r in s.pending()]
        assert len(waiting) == c.ahead() == 2, waiting  # before issue 16: none proposed ahead
        calls = _proposals(c)
        first = sorted(s.active)[:2]
        _end(c, fake, first)
        assert calls == [] and len(s.active) == 6  # noticed, nothing proposed yet
        c._fill()
        launched = sorted(set(s.active) - set(first))[-2:]
        assert launched == waiting, (launched, waiting)  # the two ahead ones, proposed before the ending
        assert calls == [2] and len(s.pending()) == 2  # and then the queue ahead refilled, in one call
    finally:
        c.close()


def test_queue_ahead_never_proposes_beyond_the_trial_budget_and_skips_what_a_stop_leaves(home: Path,
                                                                                          tmp_path: Path) -> None:
    c, fake = _controller(home, tmp_path, trials=9, parallel=8)
    try:
        s = c.state
        c._fill()
        assert len(s.active) == 8 and len(s.pending()) == 1  # 9 in all: the budget, not 8 + 2
        _end(c, fake, sorted(s.active)[:1])
        c._fill()
        assert len(s.rows) == 9 and not s.pending()  # the last one launched; nothing more proposed
    finally:
        c.close()
    c, fake = _controller(home / "b", tmp_path, trials=40, parallel=8)
    try:
        s = c.state
        c._fill()
        s.stop_reason = "stopped by request"
        for t in list(s.active):
            c.stop_trial(t, "test", {})
        for _ in range(50):
            c._woke = True
            c._poll()
            if not s.active:
                break
        view = c._finish()
        assert view.counts.get("skipped") == 2 and "failed" not in view.counts, view.counts
        skipped = [r for r in s.rows.values() if r["state"] == "skipped"]
        assert all(r["failure"] == "not launched: stopped by request" for r in skipped)
    finally:
        c.close()


def test_a_sequential_loop_does_not_propose_ahead(home: Path, tmp_path: Path) -> None:
    c, _ = _controller(home, tmp_path, trials=10, parallel=3)
    try:
        c._fill()
        assert len(c.state.active) == 3 and not c.state.pending() and c.ahead() == 0
    finally:
        c.close()


def test_one_live_update_per_wake_however_many_trials_ended(home: Path, tmp_path: Path) -> None:
    views: list[Any] = []
    c, fake = _controller(home, tmp_path, trials=40, parallel=8, on_update=views.append, update_every_s=1e9)
    try:
        c._fill()
        views.clear()
        _end(c, fake, sorted(c.state.active)[:5])
        assert len(views) == 1, len(views)  # before issue 16: 5, one full render per ending
        assert views[0].counts.get("succeeded") == 5
    finally:
        c.close()


def test_more_endings_than_trials_ahead_still_launch_in_one_batch(home: Path, tmp_path: Path,
                                                                  monkeypatch: Any) -> None:
    from autoresearch import jobs

    c, fake = _controller(home, tmp_path, trials=40, parallel=8)
    try:
        s = c.state
        c._fill()
        batches: list[int] = []
        real = jobs.submit_many

        def spy(runtime: Any, specs: list[Any], project: str = "") -> list[int]:
            batches.append(len(specs))
            return real(runtime, specs, project)

        monkeypatch.setattr(jobs, "submit_many", spy)
        calls = _proposals(c)
        _end(c, fake, sorted(s.active)[:5])  # 5 slots free, 2 trials waiting
        c._fill()
        assert batches == [5] and calls == [5], (batches, calls)  # one propose call, one submit
        assert len(s.active) == 8 and len(s.pending()) == 2
    finally:
        c.close()
