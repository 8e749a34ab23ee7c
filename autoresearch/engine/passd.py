"""The pass daemon: one long-lived process per home and backend that runs the pass on endings.

Without it, every attempt that ends execs a fresh ``python -m autoresearch.engine.runtime`` (its
supervisor's ``on_exit``: ~120 ms of CPU and ~190 ms of wall each, and a queue of them on
the pass lock). :func:`ensure` (autoresearch/engine/watcher.py: ``ensure_daemon``, so that the runtime starts a daemon
without importing this module, which imports the runtime), called by every submit, starts one daemon per home and
backend when nobody listens on the backend's wake FIFO (a loop controller or an MCP server
that listens runs the pass itself); the daemon holds a :class:`Watcher`, runs a pass when
a supervisor pokes it and exits once nothing of its backend has been queued or running for
``IDLE_S`` seconds, or when a loop or a server starts listening (they hear their own
trials' endings on that FIFO: two readers would split the pokes).

Crash safety (invariant 1) is the supervisor's, unchanged: a supervisor whose poke finds
no reader (the daemon is gone: ENXIO) runs the pass itself, and one whose poke is not
acknowledged (``reaped``) runs it once nobody listens any more (checked every half second; at
most ``ACK_MAX_S`` while somebody does). The daemon holds no state
that matters: it is the same pass, in a process that stays.

``AUTORESEARCH_PASSD=off`` turns it off (supervisors then run the pass on every ending, as
before). Stdlib only; see docs/DESIGN-NOTES.md ("The pass daemon").
"""

from __future__ import annotations

import fcntl
import os
import sys
import time
from pathlib import Path

from autoresearch.engine.watcher import SPAWN_GRACE_S, Watcher, fifo_name, others_listen
from autoresearch.engine.watcher import daemon_enabled as enabled
from autoresearch.engine.watcher import daemon_lock as lock_path
from autoresearch.engine.watcher import daemon_pid as running_pid
from autoresearch.engine.watcher import ensure_daemon as ensure

# The daemon's start lives in autoresearch/engine/watcher.py (the runtime starts one and this imports the
# runtime); its names stay here too.
__all__ = ["IDLE_S", "SPAWN_GRACE_S", "WAKE_S", "enabled", "ensure", "lock_path", "main", "running_pid", "serve"]

IDLE_S = 10.0  # exit after this long with nothing queued or running on our backend
WAKE_S = 1.0  # re-check the idle clock and other listeners at least this often
def serve(home: str, backend: str, idle_s: float = IDLE_S) -> int:
    """Run passes on pokes until idle; 0 when another daemon holds the lock (nothing to do)."""
    root = Path(home)
    fd = os.open(lock_path(root, backend), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return 0
    _say_starting(root, backend)  # before the runtime's imports: endings meanwhile wait for us while we live
    from autoresearch.engine.runtime import Runtime
    from autoresearch.errors import AutoresearchError

    runtime = Runtime(root, backend)
    watcher = Watcher(root, backend, claim=False)
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())  # listening now; for people and tests (the lock is the truth)
    last_busy = time.monotonic()
    owed = False  # a pass failed after it took its pokes' names: the next one polls every attempt
    try:
        runtime.tick()
        runtime.prepare_endings()  # before the first ending, not between it and the next launch
        while True:
            woke = watcher.wait(WAKE_S)
            if runtime.ledger.replaced():  # moved aside or restored: never a pass on the old file's connection
                break
            if woke:
                named = watcher.take()
                try:  # the attempts the pokes named (and the starting ones), not every running one
                    runtime.tick(only=None if owed else named)
                    owed = False
                except AutoresearchError as err:  # the ledger stayed locked: the next poke retries
                    owed = True
                    print(f"autoresearch pass failed: {err.render()}", file=sys.stderr)
            now = time.monotonic()
            unread = runtime.read_unread()  # an ended attempt's output still being read: read on
            if unread or runtime.jobs.any_unfinished(backend):
                last_busy = now
            if now - last_busy >= idle_s or others_listen(root, backend):
                break
    finally:
        watcher.close()  # from here a supervisor's poke finds no reader and runs the pass itself
        try:
            if not runtime.ledger.replaced():
                runtime.tick()  # endings poked before the close, still waiting for their acknowledgement
        finally:
            os.close(fd)
    return 0


def _say_starting(root: Path, backend: str) -> None:
    """Our pid in the start stamp ``ensure`` touched: a supervisor whose ending nobody hears yet waits
    for a daemon that is alive past the spawn grace (backends/_supervisor.py: _poke_starting)."""
    try:
        stamp = os.open(root / f"passd.{fifo_name(backend)}.started",
                        os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        return
    try:
        os.write(stamp, f"{os.getpid()}\n".encode())
    except OSError:
        pass
    finally:
        os.close(stamp)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m autoresearch.engine.passd")
    parser.add_argument("--home", required=True)
    parser.add_argument("--backend", default="local")
    parser.add_argument("--idle", type=float, default=IDLE_S)
    args = parser.parse_args(argv)
    return serve(args.home, args.backend, max(0.0, min(args.idle, 86400.0)))


if __name__ == "__main__":
    sys.exit(main())

