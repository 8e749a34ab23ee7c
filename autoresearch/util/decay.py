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
    ended attempt, never a scan of history."""

    def __init__(self, half_life: float) -> None:
        self.half_life = half_life
        self.at = 0.0
        self.usage: dict[str, float] = {}

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

    def now(self, now: float, running: Iterable[tuple[str, float, float]] = ()) -> dict[str, float]:
        """Past usage at ``now``: the ended attempts' and ``running``'s (project, gpus, started at) so far."""
        self.advance(now)
        out = dict(self.usage)
        for project, gpus, start in running:
            got = accrued(gpus, start, now, now, self.half_life)
            if got > 0:
                out[project] = out.get(project, 0.0) + got
        return out
