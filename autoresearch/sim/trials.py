"""What a simulated trial does: how many steps, how long each takes, what it reports.

A plan's ``backend: {kind: sim, trial: {...}}``:

* ``model: duration`` (the default): ``steps`` steps over ``seconds`` in all, fixed, or
  lognormal around that median with ``sigma`` > 0 (drawn per job from the seed); the
  reported ``metric`` falls along a power law set by the trial's parameters;
* ``model: curve``: per-step metric and step time replayed from a curve table ``file``
  (:mod:`autoresearch.sim.curves`: the nearest recorded configuration to the trial's params);
* ``model: function``: ``function: "module:func"``, called with the params, returns a curve.

``checkpoint_every``: a number of steps, or a duration (``"30m"``) of simulated time. A fault
or a preemption loses the work since the last checkpoint; the next attempt resumes there.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import dataclass
from typing import Any

from autoresearch.errors import SpecError
from autoresearch.sim.fleet import count, duration, mapping, number

KEYS = ("model", "metric", "steps", "seconds", "sigma", "file", "function", "checkpoint_every")
MAX_STEPS = 100_000  # an attempt's record holds its steps' times


@dataclass(frozen=True, slots=True)
class Work:
    """One trial's whole run: step i+1 takes ``seconds[i]`` (at speed 1) and reports ``values[i]``."""

    seconds: tuple[float, ...]
    values: tuple[float, ...]
    metric: str = "loss"

    @property
    def steps(self) -> int:
        return len(self.seconds)


@dataclass(frozen=True, slots=True)
class TrialModel:
    model: str = "duration"
    metric: str = "loss"
    steps: int = 100
    seconds: float = 600.0
    sigma: float = 0.0
    file: str = ""
    function: str = ""
    checkpoint_steps: int = 0  # 0: none by steps
    checkpoint_s: float = 0.0  # 0: none by time

    @property
    def checkpoints(self) -> bool:
        return self.checkpoint_steps > 0 or self.checkpoint_s > 0

    def work(self, params: dict[str, Any], draw: str = "") -> Work:
        """The run of a trial with ``params``; ``draw`` varies a lognormal duration (a job id)."""
        if self.model == "curve":
            return _from_curve(_table(self.file).lookup(params), self.metric)
        if self.model == "function":
            return _from_curve(_function(self.function)(params), self.metric)
        key = json.dumps(params, sort_keys=True, default=str)
        shape = random.Random(hashlib.sha256(key.encode()).hexdigest())
        total = self.seconds
        if self.sigma > 0:
            total *= math.exp(self.sigma * random.Random(f"{key}:{draw}").gauss(0.0, 1.0))
        floor, alpha = shape.uniform(0.05, 0.5), shape.uniform(0.3, 1.0)
        values = tuple(floor + (1 - floor) * (i + 1) ** -alpha for i in range(self.steps))
        return Work((total / self.steps,) * self.steps, values, self.metric)


def parse(trial: Any) -> TrialModel:
    """The trial model of a plan's ``backend: {trial: ...}``; SpecError with a hint when wrong."""
    t = mapping(trial, "trial", KEYS)
    model = t.get("model", "duration")
    if model not in ("duration", "curve", "function"):
        raise SpecError(f"sim: trial.model is {str(model)[:40]!r}",
                        hint="use duration (steps over seconds), curve (file: a curve table) or function "
                             "(function: module:func)")
    metric = t.get("metric", "loss")
    if not isinstance(metric, str) or not metric or len(metric) > 100:
        raise SpecError("sim: trial.metric must be a metric name", hint="e.g. metric: loss")
    steps_every, seconds_every = 0, 0.0
    every = t.get("checkpoint_every")
    if isinstance(every, int) and not isinstance(every, bool):
        steps_every = count(every, "trial.checkpoint_every", 1, MAX_STEPS)
    elif every is not None:
        seconds_every = duration(every, "trial.checkpoint_every")
        if seconds_every <= 0:
            raise SpecError("sim: trial.checkpoint_every is 0", hint="leave it out for no checkpoints")
    model_obj = TrialModel(model, metric, count(t.get("steps", 100), "trial.steps", 1, MAX_STEPS),
                           duration(t.get("seconds", 600.0), "trial.seconds"),
                           number(t.get("sigma", 0.0), "trial.sigma", 0.0, 5.0), str(t.get("file") or ""),
                           str(t.get("function") or ""), steps_every, seconds_every)
    if model == "curve":
        if not model_obj.file:
            raise SpecError("sim: trial.model curve needs trial.file", hint="give file: a curve table (.json or .json.gz)")
        _table(model_obj.file)  # a file with no steps is refused now, before anything runs
    if model == "function":
        if ":" not in model_obj.function:
            raise SpecError("sim: trial.model function needs trial.function: 'module:func'",
                            hint="e.g. function: mypkg.curves:resnet")
        _function(model_obj.function)
    if model_obj.seconds <= 0 and model == "duration":
        raise SpecError("sim: trial.seconds is 0", hint="give the trial's length, e.g. seconds: 30m")
    return model_obj


def _table(path: str) -> Any:
    return _curves().CurveTable.load(path)


def _function(target: str) -> Any:
    return _curves().curve_from_function(target)


def _curves() -> Any:
    """The curve tables (autoresearch/sim/curves.py), loaded only for a curve or function model."""
    import importlib

    return importlib.import_module("autoresearch.sim.curves")


def _from_curve(curve: Any, metric: str) -> Work:
    values = tuple(float(v) for v in curve.values)
    if not values:
        raise SpecError("sim: the trial's curve has no steps", hint="record at least one step per configuration")
    seconds = curve.seconds
    per = tuple(float(s) for s in seconds) if isinstance(seconds, (list, tuple)) else (float(seconds),) * len(values)
    if len(per) < len(values):
        per = per + (per[-1] if per else 1.0,) * (len(values) - len(per))
    return Work(tuple(max(1e-3, s) if math.isfinite(s) else 1.0 for s in per[:len(values)]), values, metric)
