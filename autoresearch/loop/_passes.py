"""The controller's pass thread: it hears attempt endings on the runtime's wake FIFO and runs the
pass at once, beside the main thread, which records outcomes, proposes and submits (issue 16).

With the loop's trials queued ahead under its job group's running cap (``jobs.submit_many``'s
``max_running``), the pass that records an ending starts the next trial: when the main thread
ran that pass itself, an ending that came while it was busy with the previous wake (outcomes,
a propose() call, a submit) waited for all of it. Here it waits for nothing but the pass.

The main thread waits on :attr:`PassThread.heard` instead of the FIFO; a pass the thread cannot
run (an error: the ledger stayed locked) is handed to it (:attr:`error`), as when it ran the pass.
Passes are exclusive across threads as across processes (``Ledger.pass_lock``: a ``flock`` on
a file opened per pass). Without an ending the thread still runs a pass every ``safety_s``
(an attempt killed -9 pokes nobody).
"""

from __future__ import annotations

import os
import select
import threading
from typing import Any


class PassThread(threading.Thread):
    def __init__(self, runtime: Any, watcher: Any, safety_s: float = 1.0) -> None:
        super().__init__(daemon=True, name="autoresearch-passes")
        self.runtime, self.watcher, self.safety_s = runtime, watcher, safety_s
        self.heard = threading.Event()  # a pass ran since the main thread last looked
        self.points = False  # a trial's report() at a rung waits for a verdict (loop/rungsync.py)
        self.error: BaseException | None = None
        self.passes = 0
        self._stop_r, self._stop_w = os.pipe()
        self._closed = False

    def run(self) -> None:
        while True:
            try:
                ready, _, _ = select.select([self.watcher.fd, self._stop_r], [], [], self.safety_s)
            except (OSError, ValueError):
                return  # closed under us
            if self._stop_r in ready:
                return
            if bool(ready) and self.watcher.wait(0) and self.watcher.points:  # (drains the pokes)
                self.points = True  # a report() waits at its rung for a verdict: the main thread judges it now,
                self.heard.set()  # not after this pass
            try:
                self.runtime.tick(wait=True)
                self.passes += 1
            except BaseException as err:  # noqa: BLE001 - handed to the main thread
                self.error = err
            self.heard.set()

    def wait(self, timeout: float) -> bool:
        """The main thread's wait: True when a pass ran (an ending, a poke, the safety pass)."""
        heard = self.heard.wait(timeout)
        self.heard.clear()
        return heard

    def take_points(self) -> bool:
        points, self.points = self.points, False
        return points

    def raise_error(self) -> None:
        error, self.error = self.error, None
        if error is not None:
            raise error

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        os.write(self._stop_w, b"x")
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=30)
        os.close(self._stop_r)
        os.close(self._stop_w)
