"""The background syncer: one per ``$AUTORESEARCH_HOME``, started by :func:`kick`.

It holds ``tracking.lock`` for its whole life, so there is never more than one. It
passes over the ledger every ``POLL_S`` while anything is queued or running (live
metrics), backs off with tenacity while the tracking store is down (work goes on; the
ledger keeps every point), and exits after ``IDLE_EXIT_S`` with nothing to do. Jobs that
look active keep it only while something changes: after ``BUSY_EXIT_S`` with nothing
mirrored (a silent job, or one whose supervisor died with its host) it counts as idle;
the kick at an attempt's end brings a syncer back. A failed sync (the store down at start,
another MLflow client creating the same SQLite store) is retried with back-off while
anything is unmirrored, and why it is behind is recorded for ``status`` and ``ui``. It
leaves at once when its home (the ledger) is gone, wherever it is (a thread watches: a pass, mlflow
creating its database, an outage's back-off). Before it exits it releases
the lock and looks at ``tracking.kick``: a kick that arrived while it was deciding to
leave makes it take the lock again, so no kick is lost.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_delay, wait_exponential_jitter
from tenacity.stop import stop_base

from autoresearch.errors import AutoresearchError, TrackingError
from autoresearch.tracking import KICK_FILE, LOCK_FILE, LOG_FILE
from autoresearch.util._private import UMASK

POLL_S = 1.0
IDLE_EXIT_S = float(os.environ.get("AUTORESEARCH_SYNC_IDLE_S") or 20.0)
BUSY_EXIT_S = float(os.environ.get("AUTORESEARCH_SYNC_BUSY_S") or 300.0)  # active-looking jobs, nothing changing
OUTAGE_EXIT_S = 600.0  # one round of tenacity's retries; then the longer back-off below, while work waits
RETRY_S = float(os.environ.get("AUTORESEARCH_SYNC_RETRY_S") or 5.0)  # first pause after a failed sync
RETRY_MAX_S = 300.0
LOG_MAX = 1 << 20


@contextlib.contextmanager
def _lock(home: Path) -> Iterator[int | None]:
    fd = os.open(home / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield None
            return
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        yield fd
    finally:
        os.close(fd)


def _kick_mtime(home: Path) -> float:
    try:
        return (home / KICK_FILE).stat().st_mtime
    except OSError:
        return 0.0


def _gone(home: Path) -> bool:
    """The home (its ledger) was removed: nothing is left to mirror, and nobody will kick us."""
    return not (home / "ledger.db").exists()


class _HomeGone(stop_base):
    """Stop retrying a dead store once the home is gone."""

    def __init__(self, home: Path) -> None:
        self.home = home

    def __call__(self, retry_state: RetryCallState) -> bool:
        return _gone(self.home)


def _sleeper(home: Path) -> Any:
    def sleep(seconds: float) -> None:  # a back-off of up to 30 s, cut short when the home goes
        end = time.monotonic() + seconds
        while not _gone(home) and (left := end - time.monotonic()) > 0:
            time.sleep(min(left, POLL_S))
    return sleep


GONE_CHECK_S = 0.25


def _leave_when_gone(home: Path) -> None:
    """Exit the process as soon as the home's ledger is gone (``rm -rf`` of the home), wherever the syncer
    is: a pass mirroring hundreds of jobs, or mlflow creating its database, took seconds, and mlflow
    makes the directories of a SQLite store it opens: the removed home came back with a new database,
    mirrored into. Nothing is lost: there is nothing left to mirror (and the flock goes with us)."""
    while not _gone(home):
        time.sleep(GONE_CHECK_S)
    os._exit(0)


def _busy(ledger: object) -> bool:
    from autoresearch.store.ledger import Ledger

    assert isinstance(ledger, Ledger)
    from autoresearch.tracking._store import MirrorStore

    return MirrorStore(ledger).any_job_live()


def serve(home: Path, idle_exit_s: float = IDLE_EXIT_S, poll_s: float = POLL_S,
          busy_exit_s: float = BUSY_EXIT_S) -> int:
    """Run until idle. Returns 0, or 0 at once when another syncer holds the lock."""
    while not _gone(home):
        with _lock(home) as fd:
            if fd is None:
                return 0
            served = _loop(home, idle_exit_s, poll_s, busy_exit_s)
        # The lock is released. A kick that came in while we were leaving is ours to serve.
        if _kick_mtime(home) <= served:
            return 0
    return 0


def _transient(err: BaseException) -> bool:
    return isinstance(err, TrackingError) and bool(err.details.get("transient"))


def _say(ledger: Any, recorded: list[bool]) -> Any:
    def say(state: RetryCallState) -> None:
        err = state.outcome.exception() if state.outcome is not None else None
        text = err.render() if isinstance(err, AutoresearchError) else str(err)
        pause = state.next_action.sleep if state.next_action is not None else 0.0
        _failed(ledger, text, pause)  # status and ui say why, while tenacity backs off
        recorded[0] = True
        if state.attempt_number == 1 or state.attempt_number % 20 == 0:
            print(f"autoresearch tracking: {text} (try {state.attempt_number})", file=sys.stderr, flush=True)
    return say


def _behind(ledger: Any) -> dict[str, int]:
    """What is still unmirrored ({} when all is, or when the ledger cannot be read)."""
    from autoresearch.tracking._store import MirrorStore

    if _gone(ledger.home):
        return {}
    try:
        return dict(MirrorStore(ledger).unmirrored())
    except Exception:  # noqa: BLE001 - a ledger being removed: nothing to wait for
        return {}


def _failed(ledger: Any, text: str, pause: float) -> None:
    """Record why the mirror is behind, for `autoresearch status` / `sync --status` / `ui`."""
    from autoresearch.tracking._store import MirrorStore

    if _gone(ledger.home):
        return
    with contextlib.suppress(Exception):
        store = MirrorStore(ledger)
        now = time.time()
        store.set_state("error", text[:500])
        store.set_state("error_at", now)
        store.set_state("retry_at", now + pause)


def _healed(ledger: Any) -> None:
    from autoresearch.tracking._store import MirrorStore

    with contextlib.suppress(Exception):
        MirrorStore(ledger).clear_state("error", "error_at", "retry_at")


def _loop(home: Path, idle_exit_s: float, poll_s: float, busy_exit_s: float = BUSY_EXIT_S) -> float:
    """Sync until idle; returns the kick time it has served.

    A failed sync (the store down at start, another client creating the same SQLite store,
    an outage longer than ``OUTAGE_EXIT_S``) is retried with back-off, from ``RETRY_S`` up to
    ``RETRY_MAX_S``, for as long as anything is unmirrored; why it failed and when it retries
    is in the ledger (``tracking_state``) for ``status`` and ``ui`` to say. Only a tracking URI
    that cannot be a store at all makes it leave: that does not heal by waiting.
    """
    from autoresearch.store.ledger import Ledger
    from autoresearch.tracking._sync import Syncer, freeze_imports

    try:  # opened once, now: opening it again later would make a removed home anew
        ledger = Ledger(home)
    except AutoresearchError as err:
        print(f"autoresearch tracking: {err.render()}", file=sys.stderr, flush=True)
        return time.time()
    recorded = [False]  # a failure is in the ledger: clear it once a pass works
    retrying = Retrying(wait=wait_exponential_jitter(initial=0.5, max=30.0), retry=retry_if_exception(_transient),
                        stop=stop_after_delay(OUTAGE_EXIT_S) | _HomeGone(home), sleep=_sleeper(home),
                        before_sleep=_say(ledger, recorded), reraise=True)
    idle_since = changed_at = time.monotonic()
    served = _kick_mtime(home)
    syncer: Any = None
    failures = 0
    while not _gone(home):  # a removed home (a test's tmp dir) has nothing left to mirror
        kick = _kick_mtime(home)
        try:
            if syncer is None:
                syncer = retrying(Syncer, ledger)
                freeze_imports()  # this process is the mirror's: mlflow's heap out of the collector
            report = retrying(syncer.run_once, max_batches=50)
        except Exception as err:  # noqa: BLE001 - whatever broke the pass, the ledger keeps the work
            text = err.render() if isinstance(err, AutoresearchError) else \
                f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0][:300]}"
            config = syncer is None and isinstance(err, TrackingError) and not err.details.get("transient")
            left = _behind(ledger)
            if config or not left:
                _failed(ledger, text, 0.0) if config else _healed(ledger)
                print(f"autoresearch tracking: giving up for now: {text}", file=sys.stderr, flush=True)
                return time.time()  # the next kick retries
            failures += 1
            pause = min(RETRY_MAX_S, RETRY_S * 2 ** (failures - 1))
            what = ", ".join(f"{n} {k}" for k, n in left.items())
            print(f"autoresearch tracking: sync failed ({text}); {what} unmirrored: retrying in {pause:.0f}s",
                  file=sys.stderr, flush=True)
            _failed(ledger, text, pause)
            recorded[0] = True
            syncer = None  # built again: the store may have been half-made when it failed
            _sleeper(home)(pause)
            continue
        if recorded[0]:
            print("autoresearch tracking: the sync works again", file=sys.stderr, flush=True)
            failures, recorded[0] = 0, False
            _healed(ledger)
        now = time.monotonic()
        if report.did_work or report.pending or kick != served:
            idle_since = changed_at = now
            served = kick
        elif now - changed_at < busy_exit_s and _busy(syncer.ledger):
            idle_since = now  # live metrics may come: stay, but not forever for jobs that never change
        elif now - idle_since > idle_exit_s:
            return served
        if not report.pending:
            time.sleep(poll_s)
    return time.time()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autoresearch.tracking")
    parser.add_argument("--home", required=True)
    parser.add_argument("--idle", type=float, default=IDLE_EXIT_S)
    args = parser.parse_args(argv)
    home = Path(args.home)
    os.umask(UMASK)  # what MLflow writes for us (artifacts, their folders) is private; this process runs no job

    with contextlib.suppress(OSError):
        if (home / LOG_FILE).stat().st_size > LOG_MAX:
            os.truncate(home / LOG_FILE, 0)
    with contextlib.suppress(OSError):
        os.nice(5)  # mirroring must not slow the trials down
    threading.Thread(target=_leave_when_gone, args=(home,), name="home-watch", daemon=True).start()
    from autoresearch.tracking._sync import fail_fast_http

    with fail_fast_http():
        return serve(home, args.idle)
