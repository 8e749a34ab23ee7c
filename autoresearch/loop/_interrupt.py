"""Ending a running loop from outside its event loop: Ctrl-C (:class:`LoopInterrupted`)
and another thread's request (:func:`wake`, behind ``Controller.request_stop``)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

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


def _stop_hint(name: str, jobs: list[int]) -> str:
    stop = f"stop them with `autoresearch cancel {' '.join(map(str, jobs))}`; " if jobs else ""
    return f"{stop}continue the loop (adopting them) with `autoresearch run <plan.yaml> --resume`"


def wake(home: Path) -> None:
    """Poke the runtime's wake FIFO, so a controller blocked in its watcher's wait looks
    at its stop request now rather than at its next safety poll."""
    with contextlib.suppress(OSError):
        from autoresearch import runtime

        fifo = home / getattr(runtime, "WAKE_FIFO", "wake.fifo")
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.write(fd, b"x")
        os.close(fd)
