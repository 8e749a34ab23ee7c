"""Issue 16: the turnover between a trial's end and the next trial's launch.

* Queue ahead: at parallel >= 4 the controller submits ``parallel // 4`` trials ahead of the free
  slots into the loop's job group, whose running cap is ``parallel``: the pass that records an
  ending starts the next trial at once, with no round trip through the loop (no propose() call,
  no submit first). Never beyond the trial budget; a sequential loop (parallel < 4) submits nothing
  ahead; trials still queued when the loop stops are cancelled and ``skipped``, not failed; a
  resumed controller adopts them (no duplicates, none lost).
* One live update per wake, however many trials ended in it (not one per ending).

Driven step by step on the fake backend (no processes, no timing): counters only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from autoresearch.backends.fake import FakeBackend, Script
from autoresearch.engine.runtime import Runtime
from autoresearch.loop.controller import Controller
from autoresearch.loop.plan import parse_plan
from tests.loop.conftest import submit_batches


def _plan(tmp_path: Path, trials: int, parallel: int) -> Any:
    return parse_plan({"name": "ahead", "objective": {"metric": "loss"}, "trial": {"command": "train {x}"},
                       "space": {"x": {"low": 0.0, "high": 1.0}}, "proposer": {"kind": "random"},
                       "budget": {"trials": trials, "parallel": parallel}}, base_dir=tmp_path)


def _controller(home: Path, tmp_path: Path, trials: int, parallel: int, fake: FakeBackend | None = None,
                resume: bool = False, learns: bool = True, **kw: Any) -> tuple[Controller, FakeBackend]:
    """``learns``: as a model-based proposer (tpe, bohb, an LLM), which queues ``parallel // 4``
    ahead; random search (learns nothing from results) queues a whole ``parallel``."""
    fake = fake or FakeBackend(programs={"train": Script()})  # runs until the test ends it
    c = Controller(_plan(tmp_path, trials, parallel), runtime=Runtime(home, backend=fake), resume=resume, **kw)
    c.open()
    if learns:
        c.proposer.learns = True
        c.state.ahead = c.ahead()
    return c, fake


def _finish_jobs(c: Controller, fake: FakeBackend, trial_ids: list[int]) -> None:
    """The trials' programs exit 0 after reporting (nobody has noticed yet)."""
    for t in trial_ids:
        key = f"{c.state.rows[t]['job_id']}.1"
        fake.emit(key, "loss: 0.5\n")
        fake.finish(key, 0)


def _end(c: Controller, fake: FakeBackend, trial_ids: list[int]) -> None:
    """The trials' programs exit 0 after reporting, and the controller wakes once."""
    _finish_jobs(c, fake, trial_ids)
    c._woke = True
    c._poll()


def _jobs(c: Controller, state: str) -> list[int]:
    return [r["id"] for r in c.ledger.query("SELECT id FROM jobs WHERE state=? ORDER BY id", (state,))]


def _running(c: Controller) -> list[int]:
    return [r["id"] for r in c.ledger.query("SELECT id FROM jobs WHERE state IN ('starting','running') ORDER BY id")]


def _proposals(c: Controller) -> list[int]:
    calls: list[int] = []
    real = c.proposer.propose

    def counted(history: Any, n: int) -> Any:
        calls.append(n)
        return real(history, n)

    c.proposer.propose = counted  # type: ignore[method-assign]
    return calls


@pytest.mark.parametrize("learns", [True, False])
def test_the_pass_that_records_an_ending_starts_a_trial_queued_ahead_with_no_loop_round_trip(
        home: Path, tmp_path: Path, learns: bool) -> None:
    c, fake = _controller(home, tmp_path, trials=40, parallel=8, learns=learns)
    try:
        s = c.state
        c._fill()
        n = 2 if learns else 8
        assert c.ahead() == n
        assert len(s.active) == 8 + n and not s.pending()  # 8 running + the ahead ones, all submitted at once
        assert len(_running(c)) == 8 and len(ahead := _jobs(c, "queued")) == n  # the cap: parallel
        calls = _proposals(c)
        first = sorted(s.active)[:2]
        _finish_jobs(c, fake, first)
        c.runtime.tick()  # one pass, as the pass daemon or any process runs it: no controller involved
        # Before issue 16 the ahead trials were only proposed: they waited for the controller to
        # notice the endings, then submit, then another pass. Now the same pass started them.
        assert set(ahead[:2]) <= set(_running(c)) and len(_running(c)) == 8 and _jobs(c, "queued") == ahead[2:]
        assert calls == []  # and the loop did nothing for it
        _end(c, fake, [])  # the controller wakes: it notices, then proposes and submits the next two ahead
        c._fill()
        if not learns:  # random search refills its queue ahead half at a time: 6 of 8 still wait, none proposed
            assert calls == [] and len(_jobs(c, "queued")) == 6 and len(_running(c)) == 8
            _end(c, fake, [t for t, r in s.active.items() if c.runtime.jobs.job(r["job_id"])["state"] == "running"][:2])
            c._fill()
            assert calls == [4]
        else:
            assert calls == [2]
        assert len(s.active) == 8 + n and len(_jobs(c, "queued")) == n and len(_running(c)) == 8
    finally:
        c.close()


def test_queue_ahead_never_goes_beyond_the_trial_budget(home: Path, tmp_path: Path) -> None:
    c, fake = _controller(home, tmp_path, trials=9, parallel=8)
    try:
        s = c.state
        c._fill()
        assert len(s.active) == 9 and not s.pending() and len(_running(c)) == 8  # 9 in all: the budget, not 8 + 2
        for _ in range(20):
            _end(c, fake, [t for t, r in s.active.items() if c.runtime.jobs.job(r["job_id"])["state"] == "running"])
            c._fill()
            assert len(s.rows) == 9 and s.launched() <= 9
            if not s.active:
                break
        assert not s.active and len(c.ledger.query("SELECT id FROM jobs")) == 9
        assert s.state_counts["succeeded"] == 9
    finally:
        c.close()


def test_a_stop_cancels_the_trials_queued_ahead_and_skips_them(home: Path, tmp_path: Path) -> None:
    c, fake = _controller(home, tmp_path, trials=40, parallel=8)
    try:
        s = c.state
        c._fill()
        ahead = _jobs(c, "queued")
        assert len(ahead) == 2
        _finish_jobs(c, fake, sorted(s.active)[:1])
        c.runtime.tick()  # one ending: the first ahead trial starts, the second still waits
        assert _jobs(c, "queued") == ahead[1:]
        s.stop_reason = "stopped by request"
        for _ in range(50):
            c._woke = True
            c._poll()
            if not s.active:
                break
        view = c._finish()
        assert view.counts.get("skipped") == 1 and "failed" not in view.counts, view.counts
        skipped = [r for r in s.rows.values() if r["state"] == "skipped"]
        assert [r["job_id"] for r in skipped] == ahead[1:]  # the one that started runs as any other
        assert all(r["failure"] == "not launched: stopped by request" for r in skipped)
        assert c.runtime.jobs.job(ahead[1])["state"] == "cancelled" and not c.runtime.jobs.attempts(ahead[1])
        assert s.launched() == 9  # skipped ones do not count against the trial budget
    finally:
        c.close()


def test_a_resumed_controller_adopts_the_trials_queued_ahead(home: Path, tmp_path: Path) -> None:
    c, fake = _controller(home, tmp_path, trials=12, parallel=8)
    c._fill()
    before = [r["id"] for r in c.ledger.query("SELECT id FROM jobs ORDER BY id")]
    assert len(before) == 10 and len(_jobs(c, "queued")) == 2
    c.close()  # killed: nothing more written (the loop row stays running, its trials queued or running)
    c, fake = _controller(home, tmp_path, trials=12, parallel=8, fake=fake, resume=True)
    try:
        s = c.state
        assert sorted(r["job_id"] for r in s.active.values()) == before  # adopted, the queued ones too
        c._fill()
        assert len(c.ledger.query("SELECT id FROM jobs")) == 10  # the window is full: nothing submitted twice
        for _ in range(20):
            _end(c, fake, [t for t, r in s.active.items() if c.runtime.jobs.job(r["job_id"])["state"] == "running"])
            c._fill()
            if not s.active:
                break
        jobs = c.ledger.query("SELECT id, state FROM jobs ORDER BY id")
        assert len(jobs) == 12 and all(j["state"] == "succeeded" for j in jobs)  # none lost, none twice
        assert s.state_counts["succeeded"] == 12
    finally:
        c.close()


def test_a_sequential_loop_does_not_queue_ahead(home: Path, tmp_path: Path) -> None:
    c, _ = _controller(home, tmp_path, trials=10, parallel=3)
    try:
        c._fill()
        assert len(c.state.active) == 3 and not c.state.pending() and c.ahead() == 0 and not _jobs(c, "queued")
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
    c, fake = _controller(home, tmp_path, trials=40, parallel=8)
    try:
        s = c.state
        c._fill()
        batches = submit_batches(monkeypatch)
        calls = _proposals(c)
        _end(c, fake, sorted(s.active)[:5])  # 5 slots free, 2 trials queued ahead: they took 2 of them
        assert len(_running(c)) == 5
        c._fill()
        assert batches == [5] and calls == [5], (batches, calls)  # one propose call, one submit
        assert len(s.active) == 10 and not s.pending() and len(_running(c)) == 8 and len(_jobs(c, "queued")) == 2
    finally:
        c.close()


def test_stopping_an_interrupted_loops_trials_skips_the_ones_queued_ahead(home: Path, tmp_path: Path) -> None:
    from autoresearch.loop import ops

    c, fake = _controller(home, tmp_path, trials=40, parallel=8)
    c._fill()
    ahead, running = _jobs(c, "queued"), _running(c)
    c.close()  # interrupted (Ctrl-C): then the user asks to stop its trials too
    stopped = ops.stop_running(c.runtime, "ahead", "stopped by the user after Ctrl-C")
    assert sorted(stopped) == sorted(ahead + running)
    rows = {r["job_id"]: r for r in c.ledger.query("SELECT * FROM trials")}
    assert all(rows[j]["state"] == "skipped" and rows[j]["failure"].startswith("not launched") for j in ahead)
    assert all(c.runtime.jobs.job(j)["state"] == "cancelled" and not c.runtime.jobs.attempts(j) for j in ahead)
    stops = c.ledger.query("SELECT trial_id FROM decisions WHERE kind='stop'")
    assert sorted(rows[j]["id"] for j in running) == sorted(r["trial_id"] for r in stops)  # only those that ran


def test_a_promoted_trial_resumes_in_the_loops_group_before_the_trials_queued_ahead(home: Path, tmp_path: Path,
                                                                                     monkeypatch: Any) -> None:
    fake = FakeBackend(programs={"train": Script()})
    plan = parse_plan({"name": "ahead", "objective": {"metric": "loss"}, "trial": {"command": "train {x}"},
                       "space": {"x": {"low": 0.0, "high": 1.0}}, "proposer": {"kind": "random"},
                       "budget": {"trials": 40, "parallel": 4},
                       "early_stop": {"kind": "asha", "min_steps": 1, "reduction_factor": 2, "pause": True}},
                      base_dir=tmp_path)
    c = Controller(plan, runtime=Runtime(home, backend=fake))
    c.open()
    try:
        s = c.state
        c._fill()
        assert c.ahead() == 4 and len(_running(c)) == 4 and len(_jobs(c, "queued")) == 4
        paused = sorted(s.active)[0]
        job = s.rows[paused]["job_id"]
        checkpoint = home / "jobs" / str(job) / "checkpoint"
        checkpoint.mkdir(parents=True, exist_ok=True)
        (checkpoint / "epoch-1").write_text("saved")  # it checkpointed: it can be paused
        s.pause_at.add(paused)
        c.stop_trial(paused, "lost at its rung", {"pause": True})
        for _ in range(50):
            _end(c, fake, [])
            if s.rows[paused]["state"] == "paused":
                break
        assert s.rows[paused]["state"] == "paused" and len(_running(c)) == 4  # an ahead one took its slot
        c._fill()
        s.series[paused] = [(1, 0.1)]
        monkeypatch.setattr(c.stopper, "promotable", lambda *a: True)  # later trials did worse at its rung
        ahead = _jobs(c, "queued")
        _end(c, fake, [t for t in sorted(s.active) if s.rows[t]["state"] == "running"][:1])  # a slot frees: promote
        resumed = s.rows[paused]["job_id"]
        assert resumed != job and c.runtime.jobs.job(resumed)["state"] == "queued"  # the cap holds: it waits ...
        assert len(_running(c)) == 4
        row = c.ledger.one("SELECT job_group, queue_order FROM jobs WHERE id=?", (resumed,))
        assert (row["job_group"], row["queue_order"]) == (s.job_group(), job)  # ... in its paused job's place
        _finish_jobs(c, fake, [t for t in sorted(s.active) if s.rows[t]["state"] == "running"][:1])
        c.runtime.tick()
        assert resumed in _running(c) and set(ahead[1:]) <= set(_jobs(c, "queued"))  # first, not behind them
        assert len(_running(c)) == 4
    finally:
        c.close()


def test_a_soft_stop_skips_only_the_trials_beyond_parallel(home: Path, tmp_path: Path, monkeypatch: Any) -> None:
    """A trial within ``parallel`` whose job has not started yet (no pass placed it so far) was launched:
    a budget that lets running trials finish lets it run too; only the ones queued ahead are skipped."""
    c, fake = _controller(home, tmp_path, trials=40, parallel=8)
    try:
        s = c.state
        monkeypatch.setattr(c.runtime, "tick", lambda wait=True, **kw: True)  # no pass places anything yet
        c._fill()
        assert len(_jobs(c, "queued")) == 10
        s.stop_reason = "llm_usd budget $0.02 used"  # soft: running trials finish
        c._poll()
        skipped = sorted(r["job_id"] for r in s.rows.values() if r["state"] == "skipped")
        assert skipped == _jobs(c, "cancelled") and len(skipped) == 2  # the newest two: the ones ahead
        assert len(s.active) == 8 and len(_jobs(c, "queued")) == 8
    finally:
        c.close()


def test_random_search_proposes_and_submits_half_its_queue_ahead_at_once(home: Path, tmp_path: Path,
                                                                        monkeypatch: Any) -> None:
    """Trials that end one at a time: a proposer that learns nothing from them is asked, and its trials
    submitted, eight at a time at parallel 16 (before: one call, one submit batch and their four
    transactions per ending), and no slot ever waits for a trial while the budget lasts."""
    c, fake = _controller(home, tmp_path, trials=64, parallel=16, learns=False)
    try:
        s = c.state
        c._fill()
        assert c.ahead() == 16 and len(_running(c)) == 16 and len(_jobs(c, "queued")) == 16
        batches = submit_batches(monkeypatch)
        calls = _proposals(c)
        ended = 0
        while s.active:
            running = [t for t, r in s.active.items() if c.runtime.jobs.job(r["job_id"])["state"] == "running"]
            _end(c, fake, running[:1])  # one ending per wake (none at the first: its trials were starting)
            c._fill()
            ended += len(running[:1])
            assert len(_jobs(c, "succeeded")) == ended and len(_running(c)) == min(16, 64 - ended), ended
        assert s.state_counts["succeeded"] == 64 and len(c.ledger.query("SELECT id FROM jobs")) == 64
        assert sum(batches) == 32 and sum(calls) == 32  # the 32 trials beyond the first window
        assert batches == [8, 8, 8, 8] and calls == [8, 8, 8, 8], (batches, calls)  # before: 32 of one each
    finally:
        c.close()
