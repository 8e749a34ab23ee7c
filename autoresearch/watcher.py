"""The watcher: a long-lived process hears attempt endings and runs the pass itself.

Stdlib only. See docs/DESIGN-NOTES.md ("Who starts queued jobs").
"""

from __future__ import annotations

import os
import select
from pathlib import Path

WAKE_FIFO = "wake.fifo"


def fifo_name(backend: str) -> str:
    """The FIFO of one backend's endings: a pass reconciles only its own backend's attempts, so a
    watcher on backend A must not swallow the pokes of backend B's attempts (their supervisors
    then run B's pass themselves). ``local`` keeps the historic name."""
    return WAKE_FIFO if backend == "local" else f"wake.{backend}.fifo"


class Watcher:
    """Hear attempt endings, so a long-lived process (a loop, a server) runs the pass.

    While a watcher is open, a finishing supervisor pokes ``$AUTORESEARCH_HOME/wake.fifo``
    instead of starting a fresh interpreter for the pass (~150 ms of CPU each): at 16
    parallel short trials that is the difference between keeping up and not. When the
    watcher's process dies nobody reads the FIFO, and supervisors go back to running
    the pass themselves — nothing depends on the watcher staying alive.

        watcher = runtime.watch()
        while running:
            if watcher.wait(0.5):
                runtime.tick()
    """

    def __init__(self, home: Path, backend: str = "local") -> None:
        path = home / fifo_name(backend)
        try:
            os.mkfifo(path, 0o600)
        except FileExistsError:
            pass
        # O_RDWR: we are also a writer, so the FIFO never reports EOF and select() blocks.
        self.fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        self.points = False  # the last wait heard a reported point that waits for a verdict

    def wait(self, timeout: float) -> bool:
        """True when at least one attempt ended since the last call (pokes are coalesced)."""
        self.points = False
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return False
        try:
            while chunk := os.read(self.fd, 4096):
                self.points = self.points or b"r" in chunk  # a trial's report() at a rung (loop/rungsync.py)
        except BlockingIOError:
            pass
        return True

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Watcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
