"""The watcher on its own: a FIFO that a supervisor pokes when an attempt ends."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from autoresearch.backends._supervisor import _poke
from autoresearch.engine.watcher import WAKE_FIFO, Watcher


def test_nobody_listening_means_the_poke_fails_at_once(tmp_path: Path) -> None:
    assert not _poke(str(tmp_path / WAKE_FIFO))  # no FIFO yet
    Watcher(tmp_path).close()
    assert stat.S_ISFIFO((tmp_path / WAKE_FIFO).stat().st_mode)
    started = time.monotonic()
    assert not _poke(str(tmp_path / WAKE_FIFO))  # a FIFO nobody reads: ENXIO, the supervisor runs the pass
    assert time.monotonic() - started < 10  # (a blocking open would never return; slack for a loaded machine)


def test_pokes_wake_the_listener_once_and_are_coalesced(tmp_path: Path) -> None:
    with Watcher(tmp_path) as watcher:
        assert oct(os.stat(tmp_path / WAKE_FIFO).st_mode & 0o777) == oct(0o600)
        assert not watcher.wait(0.05)  # nothing ended: times out
        for _ in range(5):
            assert _poke(str(tmp_path / WAKE_FIFO))
        assert watcher.wait(1.0)
        assert not watcher.wait(0.05)  # the five pokes were one wake-up


def test_a_second_watcher_reuses_the_fifo_and_close_is_idempotent(tmp_path: Path) -> None:
    first = Watcher(tmp_path)
    first.close()
    first.close()
    with Watcher(tmp_path) as second:
        assert _poke(str(tmp_path / WAKE_FIFO))
        assert second.wait(1.0)
    assert second.fd == -1


def test_a_full_pipe_still_counts_as_a_wake_up(tmp_path: Path) -> None:
    with Watcher(tmp_path) as watcher:
        fd = os.open(tmp_path / WAKE_FIFO, os.O_WRONLY | os.O_NONBLOCK)
        try:
            while True:
                os.write(fd, b"x" * 4096)
        except BlockingIOError:
            pass
        finally:
            os.close(fd)
        assert _poke(str(tmp_path / WAKE_FIFO))  # the listener is behind, not gone
        assert watcher.wait(1.0)
        assert not watcher.wait(0.05)  # drained in one go


def test_a_poke_names_its_attempt_and_anything_else_asks_for_a_whole_pass(tmp_path: Path) -> None:
    """A supervisor's poke says which attempt ended, so a listener may poll that one alone; a poke
    that names none (a stop request, a report() at a rung, a stranger's bytes) asks for a whole pass."""
    fifo = str(tmp_path / WAKE_FIFO)
    with Watcher(tmp_path) as watcher:
        assert watcher.take() == set()  # nothing heard
        assert _poke(fifo, "12.1") and _poke(fifo, "7.3") and _poke(fifo, "12.1")
        assert watcher.wait(1.0)
        assert watcher.take() == {(12, 1), (7, 3)}
        assert watcher.take() == set()  # taken once
        for said in (None, "../x", "1.2\nx", "9" * 80):  # no key, or one that is not a key: "x"
            assert _poke(fifo, said)
            assert watcher.wait(1.0)
            assert watcher.take() is None, said
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        for garbage in (b"\ne1.2.3\n", b"\ne-1.2\n", b"\ne\xd9\xa3.1\n", b"\nE1.2\n", b"r", b"\ne1.\n"):
            os.write(fd, b"\ne5.1\n" + garbage)
            assert watcher.wait(1.0)
            assert watcher.take() is None, garbage  # (the good key is kept no better than the rest)
        os.close(fd)


def test_a_listener_that_never_takes_the_names_keeps_a_bounded_set(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A server or the pass daemon runs whole passes and never calls take(): the names it hears do
    not pile up for its lifetime; past the bound a whole pass is owed instead."""
    import autoresearch.engine.watcher as W

    monkeypatch.setattr(W, "NAMED_MAX", 8)
    fifo = str(tmp_path / WAKE_FIFO)
    with Watcher(tmp_path) as watcher:
        for job in range(1, 30):
            assert _poke(fifo, f"{job}.1")
            assert watcher.wait(1.0)
            assert len(watcher._ended) <= 8
        assert watcher.take() is None


def test_a_poke_lost_to_a_full_pipe_asks_for_a_whole_pass(tmp_path: Path) -> None:
    """When the pipe is full a poke is dropped and its key with it: the drain that follows is large,
    and that alone asks for a whole pass, though every byte read was a key."""
    fifo = str(tmp_path / WAKE_FIFO)
    with Watcher(tmp_path) as watcher:
        n = 0
        while True:
            n += 1
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
                try:
                    os.write(fd, b"\ne%d.1\n" % n)
                finally:
                    os.close(fd)
            except BlockingIOError:
                break
        assert _poke(fifo, f"{n}.1")  # the listener is behind: it will wake
        assert watcher.wait(1.0)
        assert watcher.take() is None


def _switches(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches"))


def test_a_supervisor_sleeps_until_the_pass_releases_it_and_then_ends(tmp_path: Path) -> None:
    """It does not poll its ``reaped`` file 50 times a second while a busy listener's pass gets to it:
    the release nudges it."""
    from autoresearch.backends import _supervisor as sup
    from autoresearch.backends._base import LaunchRequest
    from autoresearch.backends._local import LocalBackend
    from tests.conftest import wait_for

    backend = LocalBackend()
    run_dir = tmp_path / "attempt-1"
    with Watcher(tmp_path, claim=False) as listener:
        backend.start(LaunchRequest(key="1.1", argv=["true"], env=dict(os.environ), workdir=str(tmp_path),
                                    log_path=str(tmp_path / "attempt-1.log"), run_dir=str(run_dir),
                                    wake_fifo=str(tmp_path / WAKE_FIFO), on_exit=["touch", str(tmp_path / "hook")]))
        assert listener.wait(30)  # it ended and poked us
        pid = int(sup.read_json(str(run_dir / sup.STATE))["supervisor_pid"])  # type: ignore[index]
        before = _switches(pid)
        time.sleep(0.4)
        assert _switches(pid) - before <= 2, "the supervisor polls instead of sleeping"
        assert backend.poll(str(run_dir)).state == "exited"
        backend.release(str(run_dir))
        wait_for(lambda: not sup.is_alive(pid, None), timeout=60)
    time.sleep(0.2)
    assert not (tmp_path / "hook").exists()  # released: it did not run the pass itself


def test_asking_whether_a_loop_listens_makes_no_file(tmp_path: Path) -> None:
    """The pass daemon asks at every turn, in a home that may have been removed under it (its asking
    made ``wake.fifo.listen`` there again, and the home with it when mlflow had just made the directory)."""
    from autoresearch.engine.watcher import listener_lock, others_listen

    assert not others_listen(tmp_path)
    assert not listener_lock(tmp_path).exists()
    with Watcher(tmp_path, claim=True):
        assert others_listen(tmp_path)
    assert not others_listen(tmp_path)
