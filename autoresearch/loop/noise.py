"""Keep or discard: the noise floor and whether a finished trial replaces the incumbent.

Pure (no I/O), on "lower is better" values like :mod:`autoresearch.loop.stopping`.

* **Noise floor**: the pooled standard deviation of the objective over seeds of the
  same configuration. A challenger replaces the incumbent only when it is better by
  more than that.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def noise_floor(groups: list[list[float]]) -> float | None:
    """Pooled standard deviation over groups of repeated runs (None until one group has 2)."""
    num, dof = 0.0, 0
    for values in groups:
        if len(values) >= 2:
            mean = sum(values) / len(values)
            num += sum((v - mean) ** 2 for v in values)
            dof += len(values) - 1
    if dof == 0:
        return None
    return math.sqrt(num / dof)


@dataclass(frozen=True)
class Judgement:
    promote: bool
    margin: float  # how much better than the incumbent (lower-is-better units); +inf with no incumbent
    noise: float
    rationale: str


def judge(candidate: float, incumbent: float | None, noise: float | None) -> Judgement:
    """Whether ``candidate`` (one run) should replace an incumbent scoring ``incumbent`` (its mean)."""
    if incumbent is None:
        return Judgement(True, math.inf, noise or 0.0, "first finished trial: it is the incumbent")
    margin = incumbent - candidate
    floor = noise or 0.0
    if margin > floor:
        why = f"better than the incumbent by {margin:.4g}"
        why += f", more than the noise floor {floor:.4g}" if noise is not None else " (noise floor not measured yet)"
        return Judgement(True, margin, floor, why)
    if margin > 0:
        return Judgement(False, margin, floor,
                         f"better by {margin:.4g}, within the noise floor {floor:.4g}: kept the incumbent")
    return Judgement(False, margin, floor, "not better than the incumbent")
