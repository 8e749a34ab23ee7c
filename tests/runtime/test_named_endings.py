"""A pass told which attempts ended (their supervisors' pokes name them) polls those and the
starting ones, not every running attempt; a whole pass still finds the others (issue 16)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from autoresearch.api import Api
from autoresearch.backends._local import LocalBackend
from autoresearch.backends.fake import FakeBackend
from autoresearch.engine import passd
from autoresearch.engine.runtime import Runtime
from autoresearch.engine.watcher import Watcher
from tests.conftest import wait_for


def _polled(monkeypatch: pytest.MonkeyPatch, fake: FakeBackend) -> list[str]:
    seen: list[str] = []
    real = fake.poll

    def poll(external_id: str) -> object:
        seen.append(external_id)
        return real(external_id)

    monkeypatch.setattr(fake, "poll", poll)
    return seen


def test_a_named_pass_polls_the_named_attempts_and_the_starting_ones(home: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeBackend(gpus=8)
    api = Api(home, backend=fake)
    spec = {"command": ["train"], "workdir": os.getcwd()}
    a, b, c = (int(api.submit(spec).id) for _ in range(3))
    api._runtime.tick()  # all three running now
    assert [api.status(j).state for j in (a, b, c)] == ["running"] * 3
    d = int(api.submit(spec).id)  # its pass launched it after reconciling: starting, never polled
    assert api._ledger.one("SELECT state FROM attempts WHERE job_id=?", (d,))["state"] == "starting"
    fake.finish(f"{a}.1", 0)
    fake.finish(f"{b}.1", 0)
    seen = _polled(monkeypatch, fake)
    assert api._runtime.tick(only={(a, 1)})
    assert sorted(seen) == sorted([f"fake:{a}.1", f"fake:{d}.1"])  # not b (it ended, but nobody said so yet), not c
    rows = {r["id"]: r["state"] for r in api._ledger.query("SELECT id, state FROM jobs")}
    assert (rows[a], rows[b], rows[c]) == ("succeeded", "running", "running")
    seen.clear()
    assert api._runtime.tick()  # a whole pass: every active attempt
    assert sorted(seen) == sorted([f"fake:{b}.1", f"fake:{c}.1", f"fake:{d}.1"])
    rows = {r["id"]: r["state"] for r in api._ledger.query("SELECT id, state FROM jobs")}
    assert (rows[b], rows[c], rows[d]) == ("succeeded", "running", "running")


def test_a_local_supervisor_names_its_attempt_in_its_poke(home: Path, tmp_path: Path) -> None:
    """Through the zygote or not, the supervisor of attempt 1 of job J pokes ``eJ.1``."""
    api = Api(home)
    with Watcher(api._ledger.home) as watcher:  # a listener: supervisors poke it instead of running the pass
        job = int(api.submit({"command": ["true"], "workdir": str(tmp_path)}).id)
        heard: set[tuple[int, int]] = set()

        def named() -> bool:
            if watcher.wait(0.2):
                heard.update(watcher.take() or ())
            return (job, 1) in heard

        wait_for(named, timeout=30)
        api._runtime.tick(only=heard)
        assert api.status(job).state == "succeeded"


@pytest.fixture
def _partial(monkeypatch: pytest.MonkeyPatch) -> None:
    """Passes told what ended stay partial however slow the machine (a whole pass is due after an hour)."""
    monkeypatch.setattr(Runtime, "FULL_RECONCILE_S", 3600.0, raising=False)


def test_a_submits_pass_polls_the_starting_attempts_not_the_running_ones(home: Path, monkeypatch: pytest.MonkeyPatch,
                                                                         _partial: None) -> None:
    """64 running attempts made a local submit ~5 ms slower: its pass polled each. The endings it would
    find are heard by a listener or recorded by their supervisors; the first pass of a process, and one
    at least every FULL_RECONCILE_S, still polls them all."""
    fake = FakeBackend(gpus=8)
    api = Api(home, backend=fake)
    spec = {"command": ["train"], "workdir": os.getcwd()}
    running = [int(api.submit(spec).id) for _ in range(3)]
    api._runtime.tick()  # a whole pass: all three running
    fake.finish(f"{running[0]}.1", 0)  # ended, not yet heard
    seen = _polled(monkeypatch, fake)
    fresh = int(api.submit(spec).id)
    assert seen == []  # nothing was starting; its own attempt began after the reconcile
    assert api._ledger.one("SELECT state FROM jobs WHERE id=?", (running[0],))["state"] == "running"
    later = int(api.submit(spec).id)
    assert seen == [f"fake:{fresh}.1"]  # the starting one, alone
    api._runtime._full_at = float("-inf")  # a whole pass is due: the next submit's polls them all
    seen.clear()
    api.submit(spec)
    assert sorted(seen) == sorted([*(f"fake:{j}.1" for j in running), f"fake:{fresh}.1", f"fake:{later}.1"])
    assert api._ledger.one("SELECT state FROM jobs WHERE id=?", (running[0],))["state"] == "succeeded"


def test_the_pass_daemon_polls_the_attempts_its_pokes_name(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          _partial: None) -> None:
    """The daemon ran a whole pass on every poke: with 64 running, ~5 ms of polls per ending."""
    monkeypatch.setenv("AUTORESEARCH_PASSD", "off")  # (our own daemon below, in a thread: no other)
    api = Api(home)
    sleepers = [int(api.submit({"command": ["sleep", "30"], "workdir": str(tmp_path)}).id) for _ in range(2)]
    wait_for(lambda: api._runtime.tick() and all(api.status(j).state == "running" for j in sleepers), timeout=30)
    polls: list[tuple[str, str]] = []
    real = LocalBackend.poll

    def poll(self: LocalBackend, external_id: str) -> object:
        polls.append((threading.current_thread().name, external_id))
        return real(self, external_id)

    monkeypatch.setattr(LocalBackend, "poll", poll)
    passes: list[str] = []
    real_tick = Runtime.tick

    def tick(self: Runtime, *args: object, **kwargs: object) -> bool:
        done = real_tick(self, *args, **kwargs)  # type: ignore[arg-type]
        passes.append(threading.current_thread().name)
        return done

    monkeypatch.setattr(Runtime, "tick", tick)
    daemon = threading.Thread(target=passd.serve, args=(str(home), "local", 0.2), name="passd")
    daemon.start()
    try:
        # Its first pass (whole) is over: our submit's own pass gets the lock, so it pokes nobody with an
        # unnamed wake (which would owe a whole pass); the short job's supervisor names its attempt.
        wait_for(lambda: "passd" in passes, timeout=30)
        polls.clear()
        short = int(api.submit({"command": ["true"], "workdir": str(tmp_path)}).id)
        wait_for(lambda: api._ledger.one("SELECT state FROM jobs WHERE id=?", (short,))["state"] == "succeeded",
                 timeout=30)
        by_daemon = {external for who, external in polls if who == "passd"}
        assert by_daemon == {str(home / "jobs" / str(short) / "attempt-1")}  # its ending, not the sleepers
    finally:
        api.cancel(sleepers)
        daemon.join(timeout=60)
    assert not daemon.is_alive()


def test_a_partial_pass_reads_only_what_it_polls_and_still_runs_the_health_round(
        home: Path, monkeypatch: pytest.MonkeyPatch, _partial: None) -> None:
    """Every active attempt with its job's spec was read by every pass (~0.6 ms at 64 running), and again
    by the health round after an ending. A partial pass reads the starting and named ones; the round
    asks only whether an attempt runs on a node that is due."""
    fake = FakeBackend(gpus=8)
    api = Api(home, backend=fake)
    spec = {"command": ["train"], "workdir": os.getcwd()}
    a, b = (int(api.submit(spec).id) for _ in range(2))
    api._runtime.tick()  # both running
    reads: list[str] = []
    real = api._runtime.jobs.active_attempts
    monkeypatch.setattr(api._runtime.jobs, "active_attempts", lambda backend: reads.append(backend) or real(backend))
    rounds: list[int] = []
    monkeypatch.setattr(type(api._runtime.health), "monitor", lambda self, active: rounds.append(len(active)))
    with api._ledger.tx() as c:
        c.execute("UPDATE nodes SET poll_due_at=NULL")  # the node is due for its round
    fake.finish(f"{a}.1", 0)
    assert api._runtime.tick(only={(a, 1)})
    assert rounds == [1]  # b runs there: the round ran, on the attempts as they are now (b)
    assert reads == [fake.name]  # the round's own read, not the reconcile's
    assert api._ledger.one("SELECT state FROM jobs WHERE id=?", (a,))["state"] == "succeeded"
    reads.clear()
    rounds.clear()
    with api._ledger.tx() as c:
        c.execute("UPDATE nodes SET poll_due_at=?", (time.time() + 3600,))  # nothing due
    assert api._runtime.tick(only={(b, 1)})
    assert reads == [] and rounds == []


def test_a_daemon_pass_that_failed_owes_a_whole_one(home: Path, monkeypatch: pytest.MonkeyPatch, _partial: None) -> None:
    """A pass that failed (the ledger stayed locked) after it took its pokes' names: the next one polls
    every attempt, or those endings would wait for their supervisors' own passes (up to ACK_MAX_S)."""
    from autoresearch.backends._supervisor import _poke
    from autoresearch.engine.watcher import Watcher, fifo_name
    from autoresearch.errors import LedgerError

    Api(home)  # the home and its ledger
    calls: list[object] = []

    def tick(self: Runtime, *args: object, **kwargs: object) -> bool:
        calls.append(kwargs.get("only", "whole"))
        if len(calls) == 2:
            raise LedgerError("the ledger is locked", hint="retry")
        return True

    monkeypatch.setattr(Runtime, "tick", tick)
    daemon = threading.Thread(target=passd.serve, args=(str(home), "local", 60.0), name="passd")
    daemon.start()
    try:
        wait_for(lambda: calls == ["whole"], timeout=30)  # its first pass
        fifo = str(home / fifo_name("local"))
        assert _poke(fifo, "5.1")
        wait_for(lambda: len(calls) == 2, timeout=30)
        assert calls[1] == {(5, 1)}  # told what ended; it failed
        assert _poke(fifo, "6.1")
        wait_for(lambda: len(calls) == 3, timeout=30)
        assert calls[2] is None  # whole: 5.1's ending was not recorded
        assert _poke(fifo, "7.1")
        wait_for(lambda: len(calls) == 4, timeout=30)
        assert calls[3] == {(7, 1)}  # and then told again
    finally:
        with Watcher(home):  # a loop or a server listens: the daemon makes way and leaves
            daemon.join(timeout=30)
    assert not daemon.is_alive()


def test_names_that_are_not_attempts_are_ignored(home: Path, _partial: None) -> None:
    """``only`` comes from pokes and from Api.tick's callers: what is not a job id SQLite can hold is
    not an attempt (no OverflowError inside the pass)."""
    fake = FakeBackend(gpus=8)
    api = Api(home, backend=fake)
    job = int(api.submit({"command": ["train"], "workdir": os.getcwd()}).id)
    api._runtime.tick()
    fake.finish(f"{job}.1", 0)
    garbage = {("x", 1), (float("nan"), 1), (10**30, 1), (-job, 1), (job, "../"), (job, 10**30)}
    assert api.tick(only=garbage)
    assert api._ledger.one("SELECT state FROM jobs WHERE id=?", (job,))["state"] == "running"  # not named
    assert api.tick(only=garbage | {(job, 1)})
    assert api._ledger.one("SELECT state FROM jobs WHERE id=?", (job,))["state"] == "succeeded"
