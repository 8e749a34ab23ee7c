"""Stop at the rung, not after it: the controller's half of the rung handshake.

A trial's ``report()`` (:mod:`autoresearch.report`, trial side) at a step where the stopper
decides (an ASHA rung; :meth:`~autoresearch.loop.stopping.Stopper.decision_steps`) writes
its point, pokes the loop's wake FIFO with ``r`` (the controller wakes and judges at once
instead of at its next 0.5 s monitor) and then waits, at most ``AUTORESEARCH_STOP_WAIT_S``,
for the verdict file to say it may go on. The controller answers every judged point: a
step number (go on) or ``<step> stop`` after it cancelled the trial (SIGTERM is on its way).
So a stopped trial never trains past the rung it was judged at.

Everything degrades to the polled behaviour: no FIFO reader (no controller) -> no wait; a
verdict file the trial cannot see (another machine, a sandbox) -> no wait; a lost poke ->
the answer comes with the next regular monitor.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from autoresearch.engine.watcher import fifo_name

WAIT_S = 5.0  # the longest a trial waits for a verdict at a rung
MAX_STEPS_LISTED = 64


class RungSync:
    """Per loop: the trials' env for the handshake and the controller's answers."""

    def __init__(self, home: Path, loop: str, backend: str, stopper: object, metric: str,
                 wait_s: float = WAIT_S) -> None:
        self.dir = home / "loops" / loop / "verdicts"
        self.fifo = home / fifo_name(backend)
        self.stopper = stopper
        self.metric = metric
        self.wait_s = wait_s
        self.answered: dict[int, int] = {}  # trial -> last step answered

    def path(self, trial_id: int) -> Path:
        return self.dir / str(int(trial_id))

    def env(self, trial_id: int) -> dict[str, str]:
        """What a trial's report() needs; {} when the stopper decides at no fixed step."""
        steps = self.stopper.decision_steps(trial_id)  # type: ignore[attr-defined]
        if not steps:
            return {}
        self.dir.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.dir.mkdir(mode=0o700, exist_ok=True)  # private, as everything under the home (docs/security.md)
        _write(self.path(trial_id), "")  # exists: the trial may wait on it
        return {"AUTORESEARCH_STOP_STEPS": ",".join(str(s) for s in steps[:MAX_STEPS_LISTED]),
                "AUTORESEARCH_STOP_FILE": str(self.path(trial_id)), "AUTORESEARCH_STOP_FIFO": str(self.fifo),
                "AUTORESEARCH_STOP_METRIC": self.metric,
                "AUTORESEARCH_STOP_WAIT_S": f"{self.wait_s:g}"}

    def answer(self, trial_id: int, step: int, stop: bool = False) -> None:
        """Tell a trial waiting at ``step`` (or before) what was decided."""
        if self.answered.get(trial_id, -1) >= step and not stop:
            return
        self.answered[trial_id] = step
        path = self.path(trial_id)
        if not path.exists():
            return
        tmp = path.with_name(f".{path.name}.tmp")
        with contextlib.suppress(OSError):
            _write(tmp, f"{step} stop" if stop else str(step))
            os.replace(tmp, path)

    def forget(self, trial_id: int) -> None:
        self.answered.pop(trial_id, None)
        with contextlib.suppress(OSError):
            self.path(trial_id).unlink()


def _write(path: Path, text: str) -> None:
    """``text`` into ``path``, made 0600 whatever the umask (never through a link put there)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
