"""Judging trials: early stopping (ASHA, median rule) and the noise floor.

Everything here is pure (no I/O) and works on "lower is better" values: the
controller multiplies a maximized objective by -1 before asking.

* **ASHA** (asynchronous successive halving, Li et al. 2018; Ray Tune's
  ``AsyncHyperBandScheduler``): rungs at ``min_steps * reduction_factor**k``. When a
  trial first reaches a rung, its value there is compared with the values every
  trial had at that rung; unless it is in the best ``1/reduction_factor`` it stops.
  Each trial is judged once per rung, when it gets there, so no generation barrier.
* **Median rule** (Golovin et al. 2017; optuna's ``MedianPruner``): from
  ``min_steps`` on, a trial whose best value so far is worse than the median of the
  other trials' values at the same step stops, once ``min_trials`` others got there.
* **Noise floor**: the pooled standard deviation of the objective over seeds of the
  same configuration. A challenger replaces the incumbent only when it is better by
  more than that.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

Series = list[tuple[int, float]]  # (step, value), steps ascending, lower is better


@dataclass(frozen=True)
class StopVerdict:
    step: int
    value: float
    threshold: float
    rule: str  # "asha rung 9" | "median"
    rationale: str


def value_at(series: Series, step: int) -> float | None:
    """The value a trial had when it first reached ``step`` (None if it has not)."""
    for s, v in series:
        if s >= step:
            return v
    return None


def _percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    pos = (len(ordered) - 1) * q / 100.0
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


class ASHA:
    def __init__(self, min_steps: int = 1, reduction_factor: int = 3, max_steps: int | None = None) -> None:
        self.min_steps = min_steps
        self.rf = reduction_factor
        self.max_steps = max_steps
        self.judged: dict[int, set[int]] = {}  # trial -> rungs already judged

    def rungs(self, up_to: int) -> list[int]:
        out, rung = [], self.min_steps
        while rung <= up_to and (self.max_steps is None or rung < self.max_steps):
            out.append(rung)
            rung *= self.rf
        return out

    def adopt(self, trial: int, series: Series) -> None:
        """A trial seen first after a restart: the rungs it already passed are not re-judged."""
        last = series[-1][0] if series else -1
        self.judged.setdefault(trial, set()).update(self.rungs(last))

    def check(self, trial: int, series: Series, others: dict[int, Series]) -> StopVerdict | None:
        if not series:
            return None
        judged = self.judged.setdefault(trial, set())
        for rung in self.rungs(series[-1][0]):
            if rung in judged:
                continue
            judged.add(rung)
            mine = value_at(series, rung)
            assert mine is not None
            recorded = [v for t, s in others.items() if t != trial for v in [value_at(s, rung)] if v is not None]
            cutoff = _percentile([*recorded, mine], 100.0 / self.rf)
            if recorded and mine > cutoff:
                return StopVerdict(rung, mine, cutoff, f"asha rung {rung}",
                                   f"at step {rung} its value {mine:.6g} is outside the best 1/{self.rf} of "
                                   f"{len(recorded) + 1} trials there (cutoff {cutoff:.6g})")
        return None


class MedianRule:
    def __init__(self, min_steps: int = 1, min_trials: int = 3) -> None:
        self.min_steps = min_steps
        self.min_trials = min_trials

    def adopt(self, trial: int, series: Series) -> None:
        pass

    def check(self, trial: int, series: Series, others: dict[int, Series]) -> StopVerdict | None:
        if not series:
            return None
        step = series[-1][0]
        if step < self.min_steps:
            return None
        best = min(v for _, v in series)
        at_step = [v for t, s in others.items() if t != trial for v in [value_at(s, step)] if v is not None]
        if len(at_step) < self.min_trials:
            return None
        median = statistics.median(at_step)
        if best > median:
            return StopVerdict(step, best, median, "median",
                               f"at step {step} its best value {best:.6g} is worse than the median {median:.6g} "
                               f"of {len(at_step)} other trials there")
        return None


def make_stopper(cfg: object | None) -> ASHA | MedianRule | None:
    if cfg is None:
        return None
    kind = getattr(cfg, "kind", "asha")
    if kind == "median":
        return MedianRule(getattr(cfg, "min_steps", 1), getattr(cfg, "min_trials", 3))
    return ASHA(getattr(cfg, "min_steps", 1), getattr(cfg, "reduction_factor", 3), getattr(cfg, "max_steps", None))


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
