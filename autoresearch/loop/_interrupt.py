"""Ending a running loop from outside its event loop: Ctrl-C (:class:`LoopInterrupted`,
remembered by :class:`SigintFlag`) and another thread's request (:func:`wake`, behind
``Controller.request_stop``)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Any

from autoresearch.errors import AutoresearchError
from autoresearch.loop.views import LoopView


class LoopInterrupted(AutoresearchError):
    """Ctrl-C: the loop stopped proposing; its running trials are left as they are."""

    code = "interrupted"
    exit_code = 130

    def __init__(self, view: LoopView, running_jobs: list[int]) -> None:
        super().__init__(f"loop {view.name} interrupted with {len(running_jobs)} trial(s) still running",
                         hint=_stop_hint(view.name, running_jobs))
        self.view = view
        self.running_jobs = running_jobs


class SigintFlag:
    """Remembers a Ctrl-C while the loop runs, so that none is lost.

    Python raises KeyboardInterrupt wherever the main thread happens to be, and a few
    places swallow it (an after-fork callback prints "Exception ignored in ..."; a library's
    ``except BaseException``). The handler sets :attr:`hit` before it hands over to the
    previous one (which raises), and the controller checks the flag before every launch.
    Installed only from the main thread, over a Python-level handler (not SIG_IGN/SIG_DFL).
    """

    def __init__(self) -> None:
        self.hit = False
        self._previous: Any = None

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            previous = signal.getsignal(signal.SIGINT)
            if callable(previous):
                self._previous = previous
                signal.signal(signal.SIGINT, self._on_sigint)

    def restore(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        self.hit = True
        previous = self._previous if callable(self._previous) else signal.default_int_handler
        previous(signum, frame)

    def check(self) -> None:
        """Raise KeyboardInterrupt if a Ctrl-C came and was swallowed on its way."""
        if self.hit:
            raise KeyboardInterrupt


def _stop_hint(name: str, jobs: list[int]) -> str:
    stop = f"stop them with `autoresearch cancel {' '.join(map(str, jobs))}`; " if jobs else ""
    return f"{stop}continue the loop (adopting them) with `autoresearch run <plan.yaml> --resume`"


def wake(home: Path) -> None:
    """Poke the runtime's wake FIFO, so a controller blocked in its watcher's wait looks
    at its stop request now rather than at its next safety poll."""
    for fifo in home.glob("wake*.fifo"):  # one per backend (watcher.fifo_name): the loop's may be any
        with contextlib.suppress(OSError):
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            os.write(fd, b"x")
            os.close(fd)
