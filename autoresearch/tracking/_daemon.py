"""The background syncer: one per ``$AUTORESEARCH_HOME``, started by :func:`kick`.

It holds ``tracking.lock`` for its whole life, so there is never more than one. It
passes over the ledger every ``POLL_S`` while anything is queued or running (live
metrics), backs off with tenacity while the tracking store is down (work goes on; the
ledger keeps every point), and exits after ``IDLE_EXIT_S`` with nothing to do. Jobs that
look active keep it only while something changes: after ``BUSY_EXIT_S`` with nothing
mirrored (a silent job, or one whose supervisor died with its host) it counts as idle;
the kick at an attempt's end brings a syncer back. It leaves at once when its home (the
ledger) is gone, even in the middle of an outage's back-off. Before it exits it releases
the lock and looks at ``tracking.kick``: a kick that arrived while it was deciding to
leave makes it take the lock again, so no kick is lost.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_delay, wait_exponential_jitter
from tenacity.stop import stop_base

from autoresearch.errors import AutoresearchError, TrackingError
from autoresearch.tracking import KICK_FILE, LOCK_FILE, LOG_FILE

POLL_S = 1.0
IDLE_EXIT_S = float(os.environ.get("AUTORESEARCH_SYNC_IDLE_S") or 20.0)
BUSY_EXIT_S = float(os.environ.get("AUTORESEARCH_SYNC_BUSY_S") or 300.0)  # active-looking jobs, nothing changing
OUTAGE_EXIT_S = 600.0  # stop retrying a dead store after this long with no job running; the next kick resumes
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


def _busy(ledger: object) -> bool:
    from autoresearch.ledger import Ledger

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


def _say(state: RetryCallState) -> None:
    err = state.outcome.exception() if state.outcome is not None else None
    if state.attempt_number == 1 or state.attempt_number % 20 == 0:
        text = err.render() if isinstance(err, AutoresearchError) else str(err)
        print(f"autoresearch tracking: {text} (try {state.attempt_number})", file=sys.stderr, flush=True)


def _loop(home: Path, idle_exit_s: float, poll_s: float, busy_exit_s: float = BUSY_EXIT_S) -> float:
    """Sync until idle; returns the kick time it has served."""
    from autoresearch.tracking._sync import Syncer

    retrying = Retrying(wait=wait_exponential_jitter(initial=0.5, max=30.0), retry=retry_if_exception(_transient),
                        stop=stop_after_delay(OUTAGE_EXIT_S) | _HomeGone(home), sleep=_sleeper(home),
                        before_sleep=_say, reraise=True)
    idle_since = changed_at = time.monotonic()
    served = _kick_mtime(home)
    try:
        syncer = Syncer(home)
    except AutoresearchError as err:
        print(f"autoresearch tracking: {err.render()}", file=sys.stderr, flush=True)
        return time.time()  # a malformed URI does not heal by itself; the next kick retries
    while not _gone(home):  # a removed home (a test's tmp dir) has nothing left to mirror
        kick = _kick_mtime(home)
        try:
            report = retrying(syncer.run_once, max_batches=50)
        except AutoresearchError as err:
            print(f"autoresearch tracking: giving up for now: {err.render()}", file=sys.stderr, flush=True)
            return time.time()
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

    with contextlib.suppress(OSError):
        if (home / LOG_FILE).stat().st_size > LOG_MAX:
            os.truncate(home / LOG_FILE, 0)
    with contextlib.suppress(OSError):
        os.nice(5)  # mirroring must not slow the trials down
    from autoresearch.tracking._sync import fail_fast_http

    with fail_fast_http():
        return serve(home, args.idle)
