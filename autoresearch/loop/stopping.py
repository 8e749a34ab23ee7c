"""Early stopping: a :class:`Stopper` base class, a registry from ``early_stop.kind`` to a
stopper (built in: ``asha``, ``median``, ``hyperband``, ``curve``; :func:`register` adds more),
and the built-in rules.

Everything here is pure (no I/O) and works on "lower is better" values: the
controller multiplies a maximized objective by -1 before asking.

* **ASHA** (asynchronous successive halving, Li et al. 2018; Ray Tune's
  ``AsyncHyperBandScheduler``): rungs at ``min_steps * reduction_factor**k``. When a
  trial first reaches a rung, its value there is compared with the values every
  trial had at that rung; unless it is in the best ``1/reduction_factor`` it stops.
  Each trial is judged once per rung, when it gets there, so no generation barrier. With
  ``adapt`` the share kept at a rung follows how well ranks there predicted later ones in this
  run (:func:`rank_agreement`): ``(1/reduction_factor)**tau``.
* **Median rule** (Golovin et al. 2017; optuna's ``MedianPruner``): from
  ``min_steps`` on, a trial whose best value so far is worse than the median of the
  other trials' values at the same step stops, once ``min_trials`` others got there.

* **Hyperband** and **curve** (learning-curve extrapolation): see :class:`Hyperband`, :class:`CurveStop`.

A rung or step that no trial went past may be a trial's last epoch: it is not judged (the
trial would be cancelled while it wraps up) until one goes past it, unless ``max_steps`` says
where the end is.

The noise floor and keep-or-discard live in :mod:`autoresearch.loop.noise`.
"""

from __future__ import annotations

import abc
import math
import statistics
from dataclasses import dataclass
from typing import Any, ClassVar

Series = list[tuple[int, float]]  # (step, value), steps ascending, lower is better


@dataclass(frozen=True)
class StopVerdict:
    step: int
    value: float
    threshold: float
    rule: str  # "asha rung 9" | "median"
    rationale: str


def passed(step: int, trial: int, series: Series, others: dict[int, Series]) -> bool:
    """Whether ``step`` is known not to be the last step of a trial: ``trial`` went past it, or
    another trial did. Without that a rung may be a trial's final epoch, and stopping it there
    cancels a trial that has finished its training while it wraps up (saves, evaluates)."""
    if series and series[-1][0] > step:
        return True
    return any(s and s[-1][0] > step for t, s in others.items() if t != trial)


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


ADAPT_MIN_PAIRS = 15  # pairs of trials past a rung before ``adapt`` trusts their rank agreement there
ADAPT_MAX_ROWS = 200  # the latest trials past a rung it is learnt from: a judgement costs O(200**2), not O(n**2)


def rank_agreement(curves: dict[int, Series], rung: int, levels: list[int]) -> tuple[float, int]:
    """How well ranks at ``rung`` predict later ones in this run: Kendall's tau over the pairs of
    trials that both reached a level in ``levels`` (steps above ``rung``), each pair compared at the
    highest level both reached, and the number of such pairs ((0.0, 0) with none). Of the latest
    ``ADAPT_MAX_ROWS`` such trials (by trial number), so a long run's judgements stay cheap."""
    if not levels:
        return 0.0, 0
    rows: list[tuple[float, list[float]]] = []
    for _, s in sorted(curves.items(), reverse=True):  # (the latest trials first: a long run's recent behaviour)
        if len(rows) >= ADAPT_MAX_ROWS:
            break
        at = value_at(s, rung) if s else None
        if at is None:
            continue
        later = [v for lv in levels for v in [value_at(s, lv)] if v is not None]
        if later:
            rows.append((at, later))
    if len(rows) < 2:
        return 0.0, 0
    concordant, total = 0.0, 0
    for i, (a, la) in enumerate(rows):
        for b, lb in rows[i + 1:]:
            k = min(len(la), len(lb)) - 1  # the highest level both reached
            here, there = a - b, la[k] - lb[k]
            total += 1
            if here * there > 0:
                concordant += 1
            elif here * there < 0:
                concordant -= 1
    return concordant / total, total


class Stopper(abc.ABC):
    """Decides, as a running trial's curve grows, whether to stop it. Built once per
    controller run by :func:`make_stopper` from the plan's ``early_stop`` section."""

    kind: ClassVar[str] = "?"
    sign: float = 1.0  # the objective's sign (-1: maximized), set by make_stopper: rationales show real values

    def shown(self, value: float) -> float:
        """A signed value as the user reads it (a score of 7.4 maximized is -7.4 inside)."""
        return value * self.sign

    @classmethod
    @abc.abstractmethod
    def from_config(cls, cfg: Any) -> Stopper:
        """The stopper for a plan's ``early_stop`` section (an :class:`~autoresearch.loop.plan.EarlyStop`)."""

    def decision_steps(self, trial: int) -> list[int]:
        """The steps at which this stopper judges ``trial`` (ascending), if fixed in advance: its
        report() there waits for the verdict (autoresearch/loop/rungsync.py). [] : any step."""
        return []

    def promotable(self, trial: int, series: Series, others: dict[int, Series]) -> bool:
        """A paused trial (its curve ends at the rung where it lost): may it resume now?"""
        return False

    def adopt(self, trial: int, series: Series) -> None:  # noqa: B027 - optional
        """A trial seen first after a restart (its curve so far): do not judge it again for the past."""

    def judged_rungs(self, trial: int) -> set[int]:
        """The rungs ``trial`` was judged at so far (and kept: a stopped trial is judged no further)."""
        return set()

    def peers(self, trial: int, other: int) -> bool:
        """Whether ``other``'s curve is compared with ``trial``'s (Hyperband: the same bracket)."""
        return True

    def waiting_rung(self, trial: int, series: Series, everyone: dict[int, Series]) -> int | None:
        """The rung ``trial`` stands at (its last step) when it is not judged there only because no
        trial went past it yet (no ``max_steps``: it may be the last epoch); None otherwise."""
        return None

    def keep_at(self, trial: int, rung: int) -> None:  # noqa: B027 - optional
        """Judge ``trial`` kept at ``rung`` (the first-wave lead, :func:`first_wave`)."""

    @abc.abstractmethod
    def check(self, trial: int, series: Series, others: dict[int, Series]) -> StopVerdict | None:
        """A verdict to stop ``trial`` (its signed curve ``series``) given every trial's curve, or None."""


class ASHA(Stopper):
    kind = "asha"

    @classmethod
    def from_config(cls, cfg: Any) -> ASHA:
        return cls(getattr(cfg, "min_steps", 1), getattr(cfg, "reduction_factor", 3), getattr(cfg, "max_steps", None),
                   bool(getattr(cfg, "adapt", False)))

    def __init__(self, min_steps: int = 1, reduction_factor: int = 3, max_steps: int | None = None,
                 adapt: bool = False) -> None:
        self.min_steps = min_steps
        self.rf = reduction_factor
        self.max_steps = max_steps
        self.adapt = adapt
        self.judged: dict[int, set[int]] = {}  # trial -> rungs already judged

    def keep_percentile(self, rung: int, everyone: dict[int, Series]) -> tuple[float, str]:
        """The percentile of the trials at ``rung`` kept there (0-100) and how it reads.
        ``100/reduction_factor``, or with ``adapt`` as the run shows low rungs to predict later ranks
        (:func:`rank_agreement` over ``everyone``): ``100 * (1/rf) ** tau``, so the reduction at
        ``rung`` is ``rf ** tau``: rf where ranks hold (tau 1), none where curves cross (tau <= 0),
        rf until ``ADAPT_MIN_PAIRS`` pairs went past the rung."""
        if not self.adapt:
            return 100.0 / self.rf, f"the best 1/{self.rf}"
        tau, pairs = rank_agreement(everyone, rung, self.levels_above(rung))
        if pairs < ADAPT_MIN_PAIRS:
            return 100.0 / self.rf, f"the best 1/{self.rf} ({pairs} pairs past step {rung} so far)"
        q = 100.0 / self.rf ** max(0.0, tau)  # (tau 1: 100/rf exactly, the cutoff without adapt)
        return q, f"the best {q:.0f}% (ranks at step {rung} agree with later ones at tau {tau:.2f}, {pairs} pairs)"

    def levels_above(self, rung: int) -> list[int]:
        """The steps a rung's ranking is checked against: the rungs above it and ``max_steps``."""
        top = self.max_steps or 0
        return sorted({r for r in [*self.rungs(2**53 if self.max_steps else rung * self.rf ** 4), top] if r > rung})

    def rungs(self, up_to: int) -> list[int]:
        out, rung = [], self.min_steps
        while rung <= up_to and (self.max_steps is None or rung < self.max_steps):
            out.append(rung)
            rung *= self.rf
        return out

    def decision_steps(self, trial: int) -> list[int]:
        return self.rungs(2**53)

    def promotable(self, trial: int, series: Series, others: dict[int, Series],
                   everyone: dict[int, Series] | None = None) -> bool:
        """Within the best 1/reduction_factor of every trial's value at its rung (later ones did worse).
        ``everyone``: the curves ``adapt`` learns its rank agreement from (default: ``others``)."""
        if not series:
            return False
        rung, mine = series[-1]
        recorded = [v for t, s in others.items() if t != trial for v in [value_at(s, rung)] if v is not None]
        q, _ = self.keep_percentile(rung, others if everyone is None else everyone)
        return bool(recorded) and mine <= _percentile([*recorded, mine], q)

    def adopt(self, trial: int, series: Series) -> None:
        """A trial seen first after a restart: the rungs it already passed are not re-judged."""
        last = series[-1][0] if series else -1
        self.judged.setdefault(trial, set()).update(self.rungs(last))

    def judged_rungs(self, trial: int) -> set[int]:
        return self.judged.get(trial, set())

    def waiting_rung(self, trial: int, series: Series, everyone: dict[int, Series]) -> int | None:
        if self.max_steps is not None or not series:
            return None
        rung = series[-1][0]
        if rung in self.judged.get(trial, set()) or rung not in self.rungs(rung) or passed(rung, trial, series, everyone):
            return None
        return rung

    def keep_at(self, trial: int, rung: int) -> None:
        self.judged.setdefault(trial, set()).add(rung)

    def check(self, trial: int, series: Series, others: dict[int, Series],
              everyone: dict[int, Series] | None = None) -> StopVerdict | None:
        """``everyone``: the curves that tell whether a rung is below the end (default: ``others``)."""
        if not series:
            return None
        judged = self.judged.setdefault(trial, set())
        for rung in self.rungs(series[-1][0]):
            if rung in judged:
                continue
            if self.max_steps is None and not passed(rung, trial, series, others if everyone is None else everyone):
                break  # maybe the last epoch: judged once a trial goes past it (a rung is below the end)
            judged.add(rung)
            mine = value_at(series, rung)
            assert mine is not None
            recorded = [v for t, s in others.items() if t != trial for v in [value_at(s, rung)] if v is not None]
            q, share = self.keep_percentile(rung, others if everyone is None else everyone)
            cutoff = _percentile([*recorded, mine], q)
            if recorded and mine > cutoff:
                return StopVerdict(rung, mine, cutoff, f"asha rung {rung}",
                                   f"at step {rung} its value {self.shown(mine):.6g} is outside {share} "
                                   f"of {len(recorded) + 1} trials there (cutoff {self.shown(cutoff):.6g})")
        return None


class MedianRule(Stopper):
    kind = "median"

    @classmethod
    def from_config(cls, cfg: Any) -> MedianRule:
        return cls(getattr(cfg, "min_steps", 1), getattr(cfg, "min_trials", 3))

    def __init__(self, min_steps: int = 1, min_trials: int = 3) -> None:
        self.min_steps = min_steps
        self.min_trials = min_trials

    def check(self, trial: int, series: Series, others: dict[int, Series]) -> StopVerdict | None:
        if not series:
            return None
        step = series[-1][0]
        if step < self.min_steps or not passed(step, trial, series, others):
            return None
        best = min(v for _, v in series)
        at_step = [v for t, s in others.items() if t != trial for v in [value_at(s, step)] if v is not None]
        if len(at_step) < self.min_trials:
            return None
        median = statistics.median(at_step)
        if best > median:
            return StopVerdict(step, best, median, "median",
                               f"at step {step} its best value {self.shown(best):.6g} is worse than the median "
                               f"{self.shown(median):.6g} "
                               f"of {len(at_step)} other trials there")
        return None


ALLOCATIONS = ("geometric", "hyperband")


def bracket_weight(allocation: str, n: int, b: int, rf: int) -> int:
    """Bracket ``b``'s share (unnormalized) of ``n`` brackets' trials. ``geometric``: ``rf**s`` for
    ``s = n - 1 - b`` (the aggressive bracket 0 gets rf**(n-1)); ``hyperband``: Hyperband's own count
    ``ceil(n * rf**s / (s + 1))`` (Li et al. 2018, n_s for B = (s_max + 1) R), which gives the later,
    laxer brackets more trials (27/12/6/4 of 49 for 4 brackets, factor 3, against 27/9/3/1 of 40)."""
    s = n - 1 - b
    if allocation == "hyperband":
        return math.ceil(n * rf**s / (s + 1))
    return int(rf**s)


class Hyperband(Stopper):
    """Hyperband's brackets, asynchronously (Li et al. 2018; Ray Tune's ``AsyncHyperBandScheduler``):
    bracket ``b`` is an ASHA whose first rung is ``min_steps * reduction_factor**b``, and a trial is
    compared only with the trials of its own bracket. Aggressive brackets (early first rung) get
    more trials, as in Hyperband: bracket ``b`` gets a share set by ``allocation``
    (:func:`bracket_weight`; ``hyperband``, Hyperband's own counts, by default). A trial's bracket follows from its id (the same after a
    restart). The proposer is untouched: every trial asks for the full budget and is cut at rungs."""

    kind = "hyperband"

    @classmethod
    def from_config(cls, cfg: Any) -> Hyperband:
        return cls(getattr(cfg, "min_steps", 1), getattr(cfg, "reduction_factor", 3),
                   getattr(cfg, "max_steps", None), getattr(cfg, "brackets", None),
                   getattr(cfg, "allocation", None) or "hyperband", bool(getattr(cfg, "adapt", False)))

    def __init__(self, min_steps: int = 1, reduction_factor: int = 3, max_steps: int | None = None,
                 brackets: int | None = None, allocation: str = "hyperband", adapt: bool = False) -> None:
        if brackets is None:  # Hyperband's s_max + 1: a bracket per rung below max_steps, and one that trains in full
            brackets = len(ASHA(min_steps, reduction_factor, max_steps).rungs(max_steps or 0)) + 1 if max_steps else 3
        self.n = max(1, brackets)
        self.rf = reduction_factor
        self.asha = [ASHA(min_steps * reduction_factor**b, reduction_factor, max_steps, adapt) for b in range(self.n)]
        self.allocation = allocation
        weights = [bracket_weight(allocation, self.n, b, reduction_factor) for b in range(self.n)]
        total = float(sum(weights))
        self.edges = [sum(weights[: b + 1]) / total for b in range(self.n)]

    def bracket(self, trial: int) -> int:
        u = (trial * 0.6180339887498949) % 1.0  # low-discrepancy: shares are met after a few trials
        return next(b for b, edge in enumerate(self.edges) if u < edge or b == self.n - 1)

    def decision_steps(self, trial: int) -> list[int]:
        return self.asha[self.bracket(trial)].decision_steps(trial)

    def adopt(self, trial: int, series: Series) -> None:
        self.asha[self.bracket(trial)].adopt(trial, series)

    def judged_rungs(self, trial: int) -> set[int]:
        return self.asha[self.bracket(trial)].judged_rungs(trial)

    def waiting_rung(self, trial: int, series: Series, everyone: dict[int, Series]) -> int | None:
        return self.asha[self.bracket(trial)].waiting_rung(trial, series, everyone)

    def keep_at(self, trial: int, rung: int) -> None:
        self.asha[self.bracket(trial)].keep_at(trial, rung)

    def peers(self, trial: int, other: int) -> bool:
        return self.bracket(trial) == self.bracket(other)

    def promotable(self, trial: int, series: Series, others: dict[int, Series]) -> bool:
        b = self.bracket(trial)  # compared with its bracket's trials; adapt's rank agreement learnt from every one's
        return self.asha[b].promotable(trial, series, {t: s for t, s in others.items() if self.bracket(t) == b},
                                       everyone=others)

    def check(self, trial: int, series: Series, others: dict[int, Series]) -> StopVerdict | None:
        b = self.bracket(trial)
        peers = {t: s for t, s in others.items() if self.bracket(t) == b}
        self.asha[b].sign = self.sign  # (make_stopper sets this one's): its rationale shows real values
        verdict = self.asha[b].check(trial, series, peers, everyone=others)  # every trial tells where the end is
        if verdict is None:
            return None
        return StopVerdict(verdict.step, verdict.value, verdict.threshold, f"hyperband bracket {b} rung {verdict.step}",
                           f"bracket {b} of {self.n}: {verdict.rationale}")


def first_wave(stopper: Stopper, at_rung: dict[int, int], curves: dict[int, Series], running: set[int],
               finished: set[int]) -> dict[int, str]:
    """What to do with running trials that stand at a rung nobody went past yet (``at_rung``: trial
    -> rung, from :meth:`Stopper.waiting_rung`), so that none trains a step past a rung it could be
    stopped at. ``curves``: every trial's signed curve; ``running``: the trials running (not being
    stopped); ``finished``: the trials that ended by themselves (succeeded). Per trial:

    * ``end``: a trial finished with its last step at this rung: the rung may be every trial's last
      epoch, so it goes on unjudged (as it did before);
    * ``lead``: no peer (a trial it is compared with) was kept at this rung yet, every running peer
      that reached the rung below (any step, at the first rung) is waiting at it too (the quorum:
      a trial that started later is not waited for), and it is the best of them
      (ties: the lower id): it is kept at the rung (the best of those that reached it is within the
      best ``1/reduction_factor`` of them) and goes on; its next step shows the rung is below the end;
    * ``hold``: it waits at the rung (its ``report()`` or its supervisor holds it, at most
      ``AUTORESEARCH_STOP_WAIT_S``): for its running peers to arrive, then for the lead to go past
      the rung, and is judged there.
    """
    out: dict[int, str] = {}
    contenders: list[int] = []
    for trial, rung in sorted(at_rung.items()):
        peers = [j for j, s in curves.items() if j != trial and stopper.peers(trial, j) and value_at(s, rung) is not None]
        if any(j in finished and s and s[-1][0] == rung for j, s in curves.items() if j != trial):
            out[trial] = "end"
        elif any(rung in stopper.judged_rungs(j) for j in peers):
            out[trial] = "hold"
        else:
            contenders.append(trial)
    for trial in contenders:
        rung = at_rung[trial]
        below = max((r for r in stopper.decision_steps(trial) if r < rung), default=0)
        coming = [j for j in running if j != trial and stopper.peers(trial, j) and curves.get(j)
                  and (below == 0 or value_at(curves[j], below) is not None)]  # a trial that just started is not
        quorum = all(at_rung.get(j) == rung for j in coming)
        rivals = [j for j in contenders if at_rung[j] == rung and (j == trial or stopper.peers(trial, j))]
        best = min(rivals, key=lambda j: (value_at(curves[j], rung), j))
        out[trial] = "lead" if quorum and best == trial else "hold"
    return out


class CurveStop(Stopper):
    """Learning-curve extrapolation: from ``min_steps`` points on, fit the trial's curve
    (:mod:`autoresearch.loop._curvefit`) and stop it when even an optimistic forecast of its final
    value (at ``max_steps``, else the longest curve seen) is worse than the incumbent's final
    value with probability ``confidence``. The incumbent: the best value at that horizon among
    the trials that got there."""

    kind = "curve"

    @classmethod
    def from_config(cls, cfg: Any) -> CurveStop:
        return cls(max(3, getattr(cfg, "min_steps", 3)), getattr(cfg, "max_steps", None),
                   getattr(cfg, "confidence", 0.95))

    def __init__(self, min_steps: int = 3, max_steps: int | None = None, confidence: float = 0.95) -> None:
        self.min_steps = min_steps
        self.max_steps = max_steps
        self.confidence = confidence
        self.seen: dict[int, int] = {}  # trial -> points at its last forecast

    def check(self, trial: int, series: Series, others: dict[int, Series]) -> StopVerdict | None:
        if len(series) < self.min_steps or self.seen.get(trial) == len(series):
            return None
        self.seen[trial] = len(series)
        horizon = self.max_steps or max((s[-1][0] for t, s in others.items() if s and t != trial), default=0)
        step = series[-1][0]
        if horizon <= step:
            return None  # the trial is at (or past) the end: nothing to forecast
        finals = [v for t, s in others.items() if t != trial and s and s[-1][0] >= horizon
                  for v in [value_at(s, horizon)] if v is not None]
        if not finals:
            return None
        incumbent = min(finals)
        if min(v for _, v in series) <= incumbent:
            return None
        from autoresearch.loop._curvefit import forecast

        fc = forecast([st for st, _ in series], [v for _, v in series], horizon, self.confidence)
        if fc is None or fc.low <= incumbent:
            return None
        return StopVerdict(step, series[-1][1], incumbent, "curve",
                           f"at step {step} its curve forecasts {self.shown(fc.mean):.6g} at step {horizon} "
                           f"(at best {self.shown(fc.low):.6g} with {self.confidence:.0%} confidence), worse than "
                           f"the incumbent's {self.shown(incumbent):.6g}")


_BUILTIN: dict[str, type[Stopper]] = {"asha": ASHA, "median": MedianRule, "hyperband": Hyperband, "curve": CurveStop}
_REGISTERED: dict[str, type[Stopper]] = {}


def register(kind: str, cls: type[Stopper]) -> None:
    """Add an ``early_stop.kind`` at run time (a :class:`Stopper` subclass)."""
    _REGISTERED[kind] = cls


def kinds() -> list[str]:
    """Every known kind: the built-in ones first, in order, then the registered ones."""
    return [*_BUILTIN, *(k for k in _REGISTERED if k not in _BUILTIN)]


def check_kind(kind: object) -> None:
    """Raise ValueError (worded like pydantic's for a Literal) for an unknown kind."""
    if isinstance(kind, str) and (kind in _REGISTERED or kind in _BUILTIN):
        return
    quoted = [repr(k) for k in kinds()]
    listed = quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"
    raise ValueError(f"Input should be {listed}")


def make_stopper(cfg: Any | None, sign: float = 1.0) -> Stopper | None:
    """The stopper for a plan's ``early_stop`` section (None: no early stopping); ``sign``: the
    objective's (-1 when maximized), for the values its rationales show."""
    if cfg is None:
        return None
    kind = str(getattr(cfg, "kind", "asha"))
    check_kind(kind)
    stopper = (_REGISTERED.get(kind) or _BUILTIN[kind]).from_config(cfg)
    stopper.sign = sign
    return stopper
