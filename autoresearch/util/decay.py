"""Usage that fades with a half-life (fair share's past usage, docs/scheduling.md): a value decays as
2^-(dt / half_life), and a resource held from ``start`` to ``end`` counts as its decayed integral.
Pure arithmetic, stdlib only: the store folds the ledger's endings with it, the engine and the
simulated fleet's driver add what runs now.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def decayed(value: float, dt: float, half_life: float) -> float:
    """``value`` after ``dt`` seconds of decay (a negative ``dt``: clock skew, no decay)."""
    return value * 2.0 ** (-max(0.0, dt) / half_life)


def accrued(gpus: float, start: float, end: float, now: float, half_life: float) -> float:
    """GPU-seconds of ``gpus`` held from ``start`` to ``end``, each second weighed by its decay at
    ``now``: the integral of gpus x 2^-((now - t) / half_life) dt (``end`` past ``now`` counts to now)."""
    end = min(end, now)
    if not gpus > 0 or not end > start:
        return 0.0
    tau = half_life / math.log(2)
    return gpus * tau * (2.0 ** (-(now - end) / half_life) - 2.0 ** (-(now - start) / half_life))


class Decayed:
    """Each project's past usage in GPU-seconds, decayed to one time: O(projects) to move on, O(1) per
    attempt that starts or ends, never a scan of history.

    Attempts still running are kept as two sums per project, so that what they used so far costs
    O(projects) to read, not O(attempts): their GPUs, and their GPUs weighed by 2^((start - ref) / h).
    An attempt that started at s has used g * tau * (1 - 2^-((now - s) / h)) by now (tau = h / ln 2),
    so the project's running part is tau * (sum g - 2^-((now - ref) / h) * sum weighed). ``ref`` moves
    forward (the weighed sums scaled) before the weights could overflow."""

    def __init__(self, half_life: float) -> None:
        self.half_life = half_life
        self.at = 0.0
        self.usage: dict[str, float] = {}
        self.ref: float | None = None
        self.run_gpus: dict[str, float] = {}
        self.run_weighed: dict[str, float] = {}

    def advance(self, now: float) -> None:
        if now > self.at:
            factor = 2.0 ** (-(now - self.at) / self.half_life)
            self.usage = {p: v * factor for p, v in self.usage.items() if v * factor > 1e-9}
            self.at = now

    def add(self, project: str, gpus: float, start: float, end: float) -> None:
        """An attempt that held ``gpus`` from ``start`` to ``end`` (at or before :attr:`at`)."""
        got = accrued(gpus, start, end, self.at, self.half_life)
        if got > 0:
            self.usage[project] = self.usage.get(project, 0.0) + got

    def started(self, project: str, gpus: float, start: float) -> None:
        """An attempt holds ``gpus`` from ``start`` on (until :meth:`ended`)."""
        if not gpus > 0:
            return
        self._rebase(start)
        self.run_gpus[project] = self.run_gpus.get(project, 0.0) + gpus
        self.run_weighed[project] = self.run_weighed.get(project, 0.0) + self._weigh(gpus, start)

    def ended(self, project: str, gpus: float, start: float, end: float) -> None:
        """The attempt :meth:`started` at ``start`` ended at ``end``: its use moves to the past."""
        if gpus > 0 and project in self.run_gpus:
            self.run_gpus[project] -= gpus
            self.run_weighed[project] -= self._weigh(gpus, start)
            if self.run_gpus[project] <= 0:
                del self.run_gpus[project], self.run_weighed[project]
        self.advance(end)
        self.add(project, gpus, start, end)

    def now(self, now: float, running: Iterable[tuple[str, float, float]] = ()) -> dict[str, float]:
        """Past usage at ``now``: the ended attempts', the :meth:`started` ones' so far, and ``running``'s
        (project, gpus, started at) so far."""
        self.advance(now)
        out = dict(self.usage)
        if self.run_gpus:
            assert self.ref is not None
            tau = self.half_life / math.log(2)
            factor = 2.0 ** (-(now - self.ref) / self.half_life)
            for project, gpus in self.run_gpus.items():
                got = tau * (gpus - factor * self.run_weighed[project])
                if got > 0:
                    out[project] = out.get(project, 0.0) + got
        for project, gpus, start in running:
            got = accrued(gpus, start, now, now, self.half_life)
            if got > 0:
                out[project] = out.get(project, 0.0) + got
        return out

    def _weigh(self, gpus: float, start: float) -> float:
        assert self.ref is not None
        return gpus * 2.0 ** (max(-1000.0, (start - self.ref) / self.half_life))

    def _rebase(self, t: float) -> None:
        if self.ref is None:
            self.ref = t
        elif (t - self.ref) / self.half_life > 200.0:  # 2^200: far from overflow, and rebased rarely
            factor = 2.0 ** (-(t - self.ref) / self.half_life)
            self.run_weighed = {p: w * factor for p, w in self.run_weighed.items()}
            self.ref = t
