"""Replay a search over recorded learning curves: the search benchmark's harness.

A search runs in simulated time on ``parallel`` workers. Each trial's curve comes from a
:class:`~autoresearch.sim.curves.CurveTable` (the nearest recorded config); its step ``k``
is reported when the simulated clock reaches the sum of its first ``k`` step times, and a
searcher answers each reported point with "go on" or "stop". A stop takes effect at the
point that triggered it (event-driven: the trial trains no further step). A free worker asks
the searcher for a new config at once. Compute is the steps (epochs) consumed by all trials,
stopped ones included; the run ends when the compute budget is spent.

Two kinds of searcher, driven the same way:

* :class:`LoopSearcher`: the project's own proposer and stopper objects, built from a plan
  (:func:`~autoresearch.loop.proposers.make_proposer`, :func:`~autoresearch.loop.stopping.make_stopper`)
  and asked as the controller asks them: ``propose(history, n)`` for the free slots,
  ``Stopper.check`` on each reported point with every trial's signed curve, ``observe`` when a
  trial ends.
* :class:`OptunaSearcher`: an Optuna study (sampler + pruner) through ask/tell, ``trial.report``
  and ``should_prune`` on each point.

A strategy is named ``<proposer>[+<stopper>]`` for ours (``tpe+asha``, ``random``; stopper options from
:data:`STOPPER_DEFAULTS`, options in brackets: ``bohb[fit=all]+hyperband[brackets=2]``) or ``optuna:<sampler>[+<pruner>]`` (``optuna:tpe+sh``,
``optuna:tpe+hb``, ``optuna:random``), or ``oracle`` (:class:`OracleSearcher`, the floor). Optuna's pruners on our rungs (the stopper's ``min_steps``,
``reduction_factor`` and the table's ``max_step``): ``hb`` and ``sh-matched``; on Optuna's own
defaults: ``sh`` (min resource auto, factor 4) and ``hb-default`` (max resource auto). bench/bench_search.py runs strategies x seeds x workloads.
"""

from __future__ import annotations

import heapq
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from autoresearch.errors import SpecError
from autoresearch.sim.curves import Curve, CurveTable


class Searcher(Protocol):
    def ask(self, ids: list[int]) -> list[dict[str, Any]]:
        """Configs for new trials ``ids`` (fewer: that many; none: the search is exhausted)."""
        ...

    def report(self, trial: int, step: int, value: float) -> bool:
        """Trial ``trial`` reached ``step`` with ``value`` (the metric's own direction): stop it now?"""
        ...

    def end(self, trial: int, state: str) -> None:
        """Trial ``trial`` ended: ``succeeded`` (its last step) or ``stopped``."""
        ...


@dataclass(frozen=True)
class Point:
    compute: int  # steps consumed by all trials when this point was reported (this one included)
    time: float  # simulated seconds
    trial: int
    step: int
    value: float
    final: bool  # the trial's last step: a fully trained config


@dataclass
class Run:
    """One replayed search: every reported point in order."""

    strategy: str
    workload: str
    seed: int
    parallel: int
    budget: int
    mode: str = "min"
    points: list[Point] = field(default_factory=list)
    trials: int = 0
    stopped: int = 0
    completed: int = 0

    def better(self, a: float, b: float) -> bool:
        return a <= b if self.mode == "min" else a >= b

    @property
    def compute(self) -> int:
        return self.points[-1].compute if self.points else 0

    def compute_to(self, target: float) -> float:
        """Compute when a fully trained trial first reached ``target`` (inf: never, within the budget)."""
        for p in self.points:
            if p.final and self.better(p.value, target):
                return float(p.compute)
        return math.inf

    def best_at(self, compute: float) -> float | None:
        """The best fully trained value found within ``compute`` steps (None: no trial finished)."""
        best: float | None = None
        for p in self.points:
            if p.compute > compute:
                break
            if p.final and (best is None or self.better(p.value, best)):
                best = p.value
        return best

    def steps_of(self, trial: int) -> int:
        return sum(1 for p in self.points if p.trial == trial)


def replay(table: CurveTable, searcher: Searcher, *, parallel: int = 4, budget: int = 2000,
           clock: str = "seconds", max_trials: int = 100_000, strategy: str = "?", seed: int = 0) -> Run:
    """Run ``searcher`` on ``table``'s curves until ``budget`` steps are consumed (or it is exhausted)."""
    if parallel < 1 or budget < 1:
        raise SpecError("parallel and budget must be >= 1", hint="e.g. parallel=4, budget=2000")
    if clock not in ("seconds", "steps"):
        raise SpecError(f"clock {clock!r} is not seconds or steps", hint="seconds: the recorded step times")
    run = Run(strategy, table.workload, seed, parallel, budget, table.mode)
    events: list[tuple[float, int, int, int]] = []  # (time, sequence, trial, step)
    running: dict[int, Curve] = {}
    seq = 0
    now = 0.0

    def step_time(curve: Curve, step: int) -> float:
        return 1.0 if clock == "steps" else curve.seconds[step - 1]

    def fill() -> bool:
        nonlocal seq
        free = parallel - len(running)
        if free <= 0 or run.compute >= budget or run.trials >= max_trials:
            return True
        ids = list(range(run.trials + 1, run.trials + 1 + min(free, max_trials - run.trials)))
        configs = searcher.ask(ids)
        for trial, params in zip(ids, configs, strict=False):
            curve = table.lookup(params)
            running[trial] = curve
            run.trials += 1
            seq += 1
            heapq.heappush(events, (now + step_time(curve, 1), seq, trial, 1))
        return bool(configs)

    fill()
    while events and run.compute < budget:
        now, _, trial, step = heapq.heappop(events)
        curve = running[trial]
        value = curve.values[step - 1]
        final = step >= curve.steps
        run.points.append(Point(run.compute + 1, now, trial, step, value, final))
        stop = searcher.report(trial, step, value)
        if final or stop:
            del running[trial]
            if final:
                run.completed += 1
            else:
                run.stopped += 1
            searcher.end(trial, "succeeded" if final else "stopped")
            if not fill() and not running:
                break
        else:
            seq += 1
            heapq.heappush(events, (now + step_time(curve, step + 1), seq, trial, step + 1))
    return run


# -- our proposers and stoppers ---------------------------------------------------------

STOPPER_DEFAULTS: dict[str, Any] = {"min_steps": 1, "reduction_factor": 3}


class LoopSearcher:
    """The project's proposer and stopper, asked the way the controller asks them."""

    def __init__(self, table: CurveTable, proposer: dict[str, Any], early_stop: dict[str, Any] | None = None,
                 *, seed: int = 0, parallel: int = 4, trials: int = 1000, plan: dict[str, Any] | None = None) -> None:
        from autoresearch.loop.plan import parse_plan
        from autoresearch.loop.proposers import ProposerContext, TrialRecord, make_proposer
        from autoresearch.loop.state import LoopState
        from autoresearch.loop.stopping import make_stopper

        self._record = TrialRecord
        spec: dict[str, Any] = {
            "name": f"replay-{table.workload}"[:64], "objective": {
                "metric": table.metric, "goal": "minimize" if table.mode == "min" else "maximize"},
            "trial": {"command": "true"}, "space": table.raw_space,
            "proposer": {"seed": seed, **proposer}, "budget": {"trials": trials, "parallel": parallel},
            **({"early_stop": early_stop} if early_stop else {}), **(plan or {})}
        self.plan = parse_plan(spec)
        self.sign = self.plan.objective.sign()
        self.proposer = make_proposer(ProposerContext(self.plan, loop_name=self.plan.name))
        self.stopper = make_stopper(self.plan.early_stop)
        self.records: dict[int, Any] = {}  # the controller's LoopState.records: what propose() sees
        self.series: dict[int, list[tuple[int, float]]] = {}  # signed curves: what the stopper sees
        # A controller whose LoopState has history() hands the proposer every trial's curve so far;
        # an older one hands it the trials' rows only (curves reach observe() alone). Do as this tree does.
        self.curves_in_history = hasattr(LoopState, "history")

    def ask(self, ids: list[int]) -> list[dict[str, Any]]:
        history = [self.records[t] for t in sorted(self.records)]
        if self.curves_in_history:
            for record in history:
                series = self.series.get(record.trial_id)
                if series:
                    record.intermediate = [(step, self.sign * v) for step, v in series]
        result = self.proposer.propose(history, len(ids))
        configs = [dict(p.params) for p in result.proposals[: len(ids)]]
        for trial, params in zip(ids, configs, strict=False):
            self.records[trial] = self._record(trial, params, "running", seed=0, role="explore")
        return configs

    def report(self, trial: int, step: int, value: float) -> bool:
        series = self.series.setdefault(trial, [])
        series.append((step, self.sign * value))
        if self.stopper is None:
            return False
        return self.stopper.check(trial, series, self.series) is not None

    def end(self, trial: int, state: str) -> None:
        series = self.series.get(trial, [])
        value = self.sign * series[-1][1] if series else None
        old = self.records[trial]
        # As outcomes.ended: the ledger's row (what later propose() calls see) and, for observe,
        # the same record with its curve in the objective's own direction.
        self.records[trial] = self._record(trial, old.params, state, objective=value,
                                           metrics={self.plan.objective.metric: value}, seed=0, role="explore")
        observed = self._record(trial, old.params, state, objective=value, metrics={self.plan.objective.metric: value},
                                intermediate=[(s, self.sign * v) for s, v in series], seed=0, role="explore")
        self.proposer.observe(observed)

    def close(self) -> None:
        self.proposer.close()


# -- Optuna -----------------------------------------------------------------------------


class OptunaSearcher:
    """An Optuna study through ask/tell: ``sampler`` tpe | random, ``pruner`` sh | hb | median | None."""

    def __init__(self, table: CurveTable, sampler: str = "tpe", pruner: str | None = None, *, seed: int = 0,
                 rungs: dict[str, Any] | None = None) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self._optuna = optuna
        samplers: dict[str, Callable[[], Any]] = {
            "tpe": lambda: optuna.samplers.TPESampler(seed=seed),
            "random": lambda: optuna.samplers.RandomSampler(seed=seed)}
        rungs = {**STOPPER_DEFAULTS, **(rungs or {})}
        low, factor = int(rungs["min_steps"]), int(rungs["reduction_factor"])
        pruners: dict[str | None, Callable[[], Any]] = {
            None: optuna.pruners.NopPruner,
            # Optuna's own defaults: SH min resource "auto" (1 epoch here), reduction factor 4;
            # Hyperband min 1, max "auto" (the first finished trial's last step), factor 3
            "sh": optuna.pruners.SuccessiveHalvingPruner,
            "hb-default": optuna.pruners.HyperbandPruner,
            # on our rungs: the min resource, reduction factor and max of the stopper we run
            "sh-matched": lambda: optuna.pruners.SuccessiveHalvingPruner(min_resource=low, reduction_factor=factor),
            "hb": lambda: optuna.pruners.HyperbandPruner(min_resource=low, max_resource=table.max_step,
                                                         reduction_factor=factor),
            "median": optuna.pruners.MedianPruner}
        if sampler not in samplers or pruner not in pruners:
            raise SpecError(f"unknown optuna strategy {sampler}+{pruner}",
                            hint="samplers: tpe, random; pruners: sh, sh-matched, hb, hb-default, median")
        # a fixed study name: HyperbandPruner puts a trial in a bracket by crc32(study name + trial number), and
        # the default name is a random UUID, so the same seed gave other brackets, another run, every time
        self.study = optuna.create_study(study_name=f"replay-{table.workload}-{seed}"[:120],
                                         direction="minimize" if table.mode == "min" else "maximize",
                                         sampler=samplers[sampler](), pruner=pruners[pruner]())
        d = optuna.distributions
        self.distributions: dict[str, Any] = {}
        for name, p in table.space.items():
            if "choices" in p:
                self.distributions[name] = d.CategoricalDistribution(p["choices"])
            elif p["int"]:
                self.distributions[name] = d.IntDistribution(int(p["low"]), int(p["high"]), log=p["log"])
            else:
                self.distributions[name] = d.FloatDistribution(p["low"], p["high"], log=p["log"])
        self.trials: dict[int, Any] = {}
        self.last: dict[int, float] = {}

    def ask(self, ids: list[int]) -> list[dict[str, Any]]:
        out = []
        for trial in ids:
            self.trials[trial] = self.study.ask(self.distributions)
            out.append(dict(self.trials[trial].params))
        return out

    def report(self, trial: int, step: int, value: float) -> bool:
        t = self.trials[trial]
        t.report(value, step)
        self.last[trial] = value
        return bool(t.should_prune())

    def end(self, trial: int, state: str) -> None:
        State = self._optuna.trial.TrialState
        t = self.trials.pop(trial)
        if state == "succeeded":
            self.study.tell(t, self.last.pop(trial))
        else:
            self.last.pop(trial, None)
            self.study.tell(t, state=State.PRUNED)

    def close(self) -> None:
        pass


# -- the floor ----------------------------------------------------------------------------


class OracleSearcher:
    """A searcher that knows the table: about the floor of compute-to-target at this parallelism.
    Its first trial is the target config (``target_of(table, top)``) that trains fastest (fewest
    recorded seconds), never stopped: no search has a fully trained target config sooner in
    simulated time. Every other trial is a random recorded config stopped at its first step: the
    other workers still consume epochs while the first trains (a search whose other trials train
    faster epochs consumes more of them, one whose are slower fewer: a floor up to that noise)."""

    def __init__(self, table: CurveTable, *, seed: int = 0, top: float = 0.05) -> None:
        import random

        target = target_of(table, top)
        hits = [c for c in table.curves if (c.values[-1] <= target if table.mode == "min" else c.values[-1] >= target)]
        self.first = min(hits, key=lambda c: (c.seconds_to(c.steps), json.dumps(c.params, sort_keys=True)))
        self.rng = random.Random(seed)
        self.table = table
        self.asked = 0

    def ask(self, ids: list[int]) -> list[dict[str, Any]]:
        out = []
        for _ in ids:
            self.asked += 1
            curve = self.first if self.asked == 1 else self.rng.choice(self.table.curves)
            out.append(dict(curve.params or {}))
        return out

    def report(self, trial: int, step: int, value: float) -> bool:
        return trial != 1

    def end(self, trial: int, state: str) -> None:
        pass

    def close(self) -> None:
        pass


# -- strategies by name -----------------------------------------------------------------

OPTUNA_PRUNERS = {"sh": "sh", "sh-matched": "sh-matched", "hb": "hb", "hyperband": "hb", "hb-default": "hb-default",
                  "median": "median"}


def _options_in(kind: str) -> tuple[str, dict[str, Any]]:
    """``bohb[fit=all,gamma=0.2]`` -> ("bohb", {"fit": "all", "gamma": 0.2}): proposer options in a strategy's name."""
    head, sep, rest = kind.partition("[")
    if not sep:
        return kind, {}
    if not rest.endswith("]"):
        raise SpecError(f"strategy {kind[:60]!r}: options are [key=value,...]", hint="e.g. bohb[fit=all]+hyperband")
    out: dict[str, Any] = {}
    for item in filter(None, rest[:-1].split(",")):
        key, eq, raw = item.partition("=")
        if not eq or not key.strip():
            raise SpecError(f"strategy {kind[:60]!r}: {item[:40]!r} is not key=value", hint="e.g. bohb[fit=all]")
        try:
            number = float(raw)
            out[key.strip()] = int(number) if number.is_integer() and "." not in raw else number
        except ValueError:
            out[key.strip()] = raw.strip()
    return head, out


def make_searcher(strategy: str, table: CurveTable, *, seed: int = 0, parallel: int = 4,
                  stopper_options: dict[str, Any] | None = None,
                  proposer_options: dict[str, Any] | None = None) -> Any:
    """``tpe+asha``, ``random``, ``optuna:tpe+sh``, ``optuna:random``, ... (see the module's docstring)."""
    name = strategy.strip()
    if name == "oracle":
        return OracleSearcher(table, seed=seed)
    if name.startswith("optuna:"):
        sampler, _, pruner = name[len("optuna:"):].partition("+")
        if pruner and pruner not in OPTUNA_PRUNERS:
            raise SpecError(f"unknown optuna pruner {pruner!r}", hint=f"one of {', '.join(OPTUNA_PRUNERS)}")
        return OptunaSearcher(table, sampler, OPTUNA_PRUNERS[pruner] if pruner else None, seed=seed,
                              rungs=stopper_options)
    kind, _, stopper = name.partition("+")
    kind, options = _options_in(kind)
    if options:
        proposer_options = {**(proposer_options or {}), "options": {**(proposer_options or {}).get("options", {}),
                                                                   **options}}
    early_stop = None
    if stopper:
        stopper, own = _options_in(stopper)  # hyperband[brackets=2]: the stopper's options (its rungs stay matched)
        rungs = sorted({"min_steps", "reduction_factor", "max_steps"} & set(own))
        if rungs:
            raise SpecError(f"strategy {name[:60]!r}: {', '.join(rungs)} would leave Optuna on other rungs",
                            hint="the rungs are the benchmark's own (STOPPER_DEFAULTS), the same for every tool")
        early_stop = {"kind": stopper, **STOPPER_DEFAULTS, "max_steps": table.max_step, **(stopper_options or {}),
                      **own}
    return LoopSearcher(table, {"kind": kind, **(proposer_options or {})}, early_stop, seed=seed, parallel=parallel)


def run_strategy(strategy: str, table: CurveTable, *, seed: int, parallel: int = 4, budget: int = 2000,
                 clock: str = "seconds", **options: Any) -> Run:
    searcher = make_searcher(strategy, table, seed=seed, parallel=parallel, **options)
    try:
        return replay(table, searcher, parallel=parallel, budget=budget, clock=clock, strategy=strategy, seed=seed)
    finally:
        searcher.close()


def target_of(table: CurveTable, top: float = 0.05) -> float:
    """The value the best ``top`` fraction of the table's configs reach when fully trained."""
    finals = sorted(table.finals(), reverse=table.mode == "max")
    return finals[max(0, math.ceil(top * len(finals)) - 1)]
