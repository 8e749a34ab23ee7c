"""Simulated time (the shared contract 9): ``now()`` and ``wait(timeout_s)``.

* ``wall``: simulated seconds = ``speed`` x wall seconds since the fleet's epoch (the wall time
  the fleet was first used, persisted once in its state directory, so every process agrees);
* ``events``: simulated now lives in a small file; ``wait`` advances it, at once, to the next
  observable event (a reported point, an ending) or by ``timeout_s``, whichever comes first.
  Nothing moves unless someone waits: a loop drives the fleet as fast as it can think.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

NextEvent = Callable[[float], "float | None"]


class SimClock:
    def __init__(self, state_dir: Path, mode: str = "wall", speed: float = 1.0,
                 next_event: NextEvent | None = None) -> None:
        self.dir = state_dir
        self.mode = mode
        self.speed = speed
        self.next_event: NextEvent = next_event or (lambda _t: None)
        self.epoch = self._epoch()

    def _epoch(self) -> float:
        """The wall time the fleet started, written once (the first process to need it wins)."""
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = self.dir / "epoch"
        with contextlib.suppress(FileExistsError):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(repr(time.time()))
        for _ in range(50):
            with contextlib.suppress(ValueError):
                return float(path.read_text())
            time.sleep(0.01)  # the writer is between its create and its write
        return time.time()

    def now(self) -> float:
        """Simulated seconds since the fleet's start."""
        if self.mode == "wall":
            return max(0.0, (time.time() - self.epoch) * self.speed)
        try:
            return float((self.dir / "now").read_text() or 0.0)
        except (OSError, ValueError):
            return 0.0

    def wall(self, t: float) -> float:
        """A simulated moment as a timestamp (what ``ts`` and ``started_at`` carry)."""
        return self.epoch + t

    def wait(self, timeout_s: float) -> bool:
        """Let simulated time pass up to ``timeout_s``; whether an observable event came first."""
        timeout_s = max(0.0, float(timeout_s))
        if self.mode == "wall":
            now = self.now()
            nxt = self.next_event(now)
            hit = nxt is not None and nxt <= now + timeout_s
            time.sleep(((nxt - now) if hit and nxt is not None else timeout_s) / self.speed)
            return hit
        with self._locked():
            now = self.now()
            nxt = self.next_event(now)
            hit = nxt is not None and nxt <= now + timeout_s
            self._set(nxt if hit and nxt is not None else now + timeout_s)
        return hit

    def advance_to(self, t: float) -> None:
        """Events mode: move simulated now forward to ``t`` (never back)."""
        with self._locked():
            if t > self.now():
                self._set(t)

    def _set(self, t: float) -> None:
        tmp = self.dir / f"now.{os.getpid()}"
        tmp.write_text(repr(t))
        os.replace(tmp, self.dir / "now")

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self.dir / "clock.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield
