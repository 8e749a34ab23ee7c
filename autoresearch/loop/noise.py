"""Keep or discard: the noise floor and whether a finished trial replaces the incumbent.

Pure (no I/O). Values are in the objective's own direction unless said otherwise; ``sign``
(+1 to minimize, -1 to maximize) makes them "lower is better" like
:mod:`autoresearch.loop.stopping`.

* **Noise floor**: the standard deviation of one run of the *incumbent*, estimated from its
  own seeds (the sample standard deviation, n - 1). Noise is not the same everywhere in the
  space (an unstable config with a high learning rate is far noisier than a good one), so the
  seeds of other configurations are not pooled in: one noisy early incumbent would otherwise
  set the floor for every later comparison. A challenger (one run) replaces the incumbent
  only when it beats the incumbent's mean by more than the floor.
* **Before the incumbent's own seeds have ended** (its repeats are launched when it is kept)
  the floor is that of the best configuration measured so far (the lowest mean among those
  with two or more ended seeds): the measured configuration nearest the incumbent in quality.
  With none measured there is no floor yet and any gain replaces the incumbent (whose repeats
  then measure it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


def seed_std(values: Sequence[float]) -> float | None:
    """The noise of one run of a configuration: the sample standard deviation (n - 1) of its runs
    over seeds. None under two values."""
    if len(values) < 2:
        return None
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    return std if math.isfinite(std) else None


@dataclass(frozen=True)
class Floor:
    """The noise floor a challenger is judged with, and what measured it."""

    value: float | None  # None: not measured yet
    config: int | None = None  # the trial (configuration) whose seeds measured it
    seeds: int = 0  # how many of its seeds had ended
    fallback: bool = False  # measured on ``config``, not on the incumbent (whose seeds have not ended)

    def basis(self, incumbent: int | None = None) -> str:
        """What the number is, in words (the report, the live view, decisions' rationale)."""
        if self.value is None:
            return "not measured yet: no configuration has two finished seeds"
        if not self.fallback:
            return f"std of one run of the incumbent #{self.config} over its {self.seeds} seeds"
        return (f"std of one run of #{self.config} over its {self.seeds} seeds, the best configuration measured "
                "so far" + (f" (incumbent #{incumbent}'s own seeds have not ended yet)" if incumbent is not None
                            else ""))


def incumbent_floor(incumbent: int | None, groups: Mapping[int, Sequence[float]], sign: float = 1.0) -> Floor:
    """The noise floor to judge a challenger against ``incumbent`` with.

    ``groups``: the objective values over seeds per configuration with repeats ({trial id:
    values}, the objective's own direction). The incumbent's own seeds when two or more have
    ended; else the best measured configuration's (lowest ``sign * mean``); else not measured.
    """
    own = groups.get(incumbent, ()) if incumbent is not None else ()
    std = seed_std(own)
    if std is not None:
        return Floor(std, incumbent, len(own))
    measured = [(sign * sum(v) / len(v), config, s) for config, v in groups.items()
                if (s := seed_std(v)) is not None]
    if not measured:
        return Floor(None)
    _, best, std = min(measured)
    return Floor(std, best, len(groups[best]), fallback=True)


@dataclass(frozen=True)
class Judgement:
    promote: bool
    margin: float  # how much better than the incumbent (lower-is-better units); +inf with no incumbent
    noise: float
    rationale: str


def judge(candidate: float, incumbent: float | None, noise: float | None, basis: str = "") -> Judgement:
    """Whether ``candidate`` (one run) should replace an incumbent scoring ``incumbent`` (its mean),
    both signed (lower is better); ``noise`` is the floor, ``basis`` what measured it (for the rationale)."""
    if incumbent is None:
        return Judgement(True, math.inf, noise or 0.0, "first finished trial: it is the incumbent")
    margin = incumbent - candidate
    floor = noise or 0.0
    what = f" ({basis})" if basis and noise is not None else ""
    if margin > floor:
        why = f"better than the incumbent by {margin:.4g}"
        why += (f", more than the noise floor {floor:.4g}{what}" if noise is not None
                else " (noise floor not measured yet)")
        return Judgement(True, margin, floor, why)
    if margin > 0:
        return Judgement(False, margin, floor,
                         f"better by {margin:.4g}, within the noise floor {floor:.4g}{what}: kept the incumbent")
    return Judgement(False, margin, floor, "not better than the incumbent")
