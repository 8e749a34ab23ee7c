"""Search tools other than Optuna as searchers of the replay harness (autoresearch/sim/replay.py):
the search benchmark's external baselines (bench/bench_search.py). Bench-only: each tool is an
optional install (``pip install -e '.[bench-search]'``), imported only when its strategy is run,
and never a dependency of the package or its tests.

* ``dehb``: DEHB (``dehb.DEHB``, ask/tell) with fidelity = epochs on our rungs (min 1, factor 3,
  max 27). DEHB trains each job from scratch to its fidelity: a job below the last rung is a
  trial that stops at that epoch (its epochs count as compute; its value is not a fully trained
  one), a job at the last rung is a full training.
* ``smac:hyperband``: SMAC3's ``MultiFidelityFacade`` (random forest) with its ``Hyperband``
  intensifier on our rungs, through ask/tell; trials train from scratch to their budget, as DEHB's.
* ``synetune:<scheduler>``: a Syne Tune scheduler driven through ``suggest`` /
  ``on_trial_result`` (CONTINUE / STOP at each epoch, as Syne Tune's own backend does with
  ASHA's "stopping" rule) / ``on_trial_complete``, with ``grace_period`` 1, ``reduction_factor`` 3,
  ``max_t`` 27.

A tool that does not install here is absent from the benchmark; docs/search-benchmark.md says which
and why.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from autoresearch.errors import SpecError
from autoresearch.sim.curves import CurveTable
from autoresearch.sim.replay import STOPPER_DEFAULTS

EXTERNAL_PREFIXES = ("dehb", "synetune:", "smac:")


def is_external(strategy: str) -> bool:
    return strategy.startswith(EXTERNAL_PREFIXES)


def _configspace(table: CurveTable, seed: int) -> tuple[Any, dict[str, list[Any]]]:
    """The table's space as a ConfigSpace space; categoricals as their indices ("0", "1", ...), mapped back
    with the returned choices (a choice may be a number, which ConfigSpace's categoricals order oddly)."""
    import ConfigSpace as CS

    cs = CS.ConfigurationSpace(seed=seed)
    choices: dict[str, list[Any]] = {}
    for name, p in table.space.items():
        if "choices" in p:
            choices[name] = list(p["choices"])
            cs.add(CS.Categorical(name, [str(i) for i in range(len(p["choices"]))]))
        elif p["int"]:
            cs.add(CS.Integer(name, (int(p["low"]), int(p["high"])), log=p["log"]))
        else:
            cs.add(CS.Float(name, (p["low"], p["high"]), log=p["log"]))
    return cs, choices


def _params(config: Any, choices: dict[str, list[Any]]) -> dict[str, Any]:
    params = dict(config)
    for name, values in choices.items():
        params[name] = values[int(params[name])]
    return params


class SMACSearcher:
    """SMAC3's multi-fidelity facade with its Hyperband intensifier (random forest + Hyperband on our rungs),
    through ask/tell; as DEHB, each trial trains from scratch to the budget SMAC asked for."""

    def __init__(self, table: CurveTable, *, seed: int = 0, rungs: dict[str, Any] | None = None) -> None:
        import tempfile

        from smac import MultiFidelityFacade, Scenario
        from smac.intensifier.hyperband import Hyperband

        rungs = {**STOPPER_DEFAULTS, **(rungs or {})}
        self.sign = 1.0 if table.mode == "min" else -1.0
        cs, self.choices = _configspace(table, seed)
        self._tmp = tempfile.TemporaryDirectory(prefix="smac-")
        scenario = Scenario(cs, output_directory=Path(self._tmp.name), deterministic=True, n_trials=100_000,
                            min_budget=int(rungs["min_steps"]), max_budget=table.max_step, seed=seed)
        intensifier = Hyperband(scenario, eta=int(rungs["reduction_factor"]), seed=seed)
        self.smac = MultiFidelityFacade(scenario, target_function=lambda config, seed, budget: 0.0,
                                        intensifier=intensifier, overwrite=True, logging_level=40)
        self.infos: dict[int, Any] = {}
        self.budget: dict[int, int] = {}
        self.last: dict[int, float] = {}
        self.max_step = table.max_step

    def ask(self, ids: list[int]) -> list[dict[str, Any]]:
        out = []
        for trial in ids:
            info = self.smac.ask()
            self.infos[trial] = info
            self.budget[trial] = max(1, min(self.max_step, int(round(float(info.budget or self.max_step)))))
            out.append(_params(info.config, self.choices))
        return out

    def report(self, trial: int, step: int, value: float) -> bool:
        self.last[trial] = value
        return step >= self.budget[trial]

    def end(self, trial: int, state: str) -> None:
        from smac.runhistory.dataclasses import TrialValue

        self.budget.pop(trial)
        self.smac.tell(self.infos.pop(trial), TrialValue(cost=self.sign * self.last.pop(trial)))

    def close(self) -> None:
        self._tmp.cleanup()


class DEHBSearcher:
    """DEHB through ask/tell; each trial trains to the fidelity DEHB asked for."""

    def __init__(self, table: CurveTable, *, seed: int = 0, rungs: dict[str, Any] | None = None) -> None:
        from dehb import DEHB

        logging.getLogger("distributed").setLevel(logging.ERROR)
        try:
            from loguru import logger

            logger.remove()
        except ImportError:  # pragma: no cover - dehb depends on loguru
            pass
        rungs = {**STOPPER_DEFAULTS, **(rungs or {})}
        self.sign = 1.0 if table.mode == "min" else -1.0
        cs, self.choices = _configspace(table, seed)
        import tempfile

        self._tmp = tempfile.TemporaryDirectory(prefix="dehb-")
        self.dehb = DEHB(cs=cs, dimensions=len(table.space), min_fidelity=int(rungs["min_steps"]),
                         max_fidelity=table.max_step, eta=int(rungs["reduction_factor"]), n_workers=1, seed=seed,
                         output_path=self._tmp.name, save_freq=None)
        self.jobs: dict[int, dict[str, Any]] = {}
        self.fidelity: dict[int, int] = {}
        self.last: dict[int, float] = {}
        self.max_step = table.max_step

    def ask(self, ids: list[int]) -> list[dict[str, Any]]:
        out = []
        for trial in ids:
            job = self.dehb.ask()
            self.jobs[trial] = job
            self.fidelity[trial] = max(1, min(self.max_step, int(round(float(job["fidelity"])))))
            out.append(_params(job["config"], self.choices))
        return out

    def report(self, trial: int, step: int, value: float) -> bool:
        self.last[trial] = value
        return step >= self.fidelity[trial]

    def end(self, trial: int, state: str) -> None:
        job = self.jobs.pop(trial)
        fidelity = self.fidelity.pop(trial)
        self.dehb.tell(job, {"fitness": self.sign * self.last.pop(trial), "cost": float(fidelity)})

    def close(self) -> None:
        self._tmp.cleanup()


class SyneTuneSearcher:
    """A Syne Tune scheduler (``asha-bore``: ASHA with a BORE model per rung; ``bohb``: ASHA with KDE;
    ``asha``: ASHA with random search), driven as Syne Tune's tuner drives it."""

    SCHEDULERS = {"asha-bore": "ASHABORE", "bohb": "BOHB", "asha": "ASHA"}

    def __init__(self, table: CurveTable, scheduler: str, *, seed: int = 0,
                 rungs: dict[str, Any] | None = None) -> None:
        import datetime

        import numpy as np
        from syne_tune import config_space as sp
        from syne_tune.backend.trial_status import Trial
        from syne_tune.optimizer import baselines

        if scheduler not in self.SCHEDULERS:
            raise SpecError(f"unknown Syne Tune scheduler {scheduler[:40]!r}", hint=", ".join(self.SCHEDULERS))
        logging.getLogger("syne_tune").setLevel(logging.ERROR)
        np.random.seed(seed)  # ASHA draws its bracket from numpy's global generator
        rungs = {**STOPPER_DEFAULTS, **(rungs or {})}
        space: dict[str, Any] = {}
        for name, p in table.space.items():
            if "choices" in p:
                space[name] = sp.choice(list(p["choices"]))
            elif p["int"]:
                space[name] = (sp.lograndint if p["log"] else sp.randint)(int(p["low"]), int(p["high"]))
            else:
                space[name] = (sp.loguniform if p["log"] else sp.uniform)(p["low"], p["high"])
        cls = getattr(baselines, self.SCHEDULERS[scheduler])
        self.scheduler = cls(space, metric="value", time_attr="epoch", max_t=table.max_step,
                             do_minimize=table.mode == "min", random_seed=seed,
                             grace_period=int(rungs["min_steps"]), reduction_factor=int(rungs["reduction_factor"]))
        self._trial, self._now = Trial, datetime.datetime.now
        self.trials: dict[int, Any] = {}
        self.last: dict[int, dict[str, Any]] = {}

    def ask(self, ids: list[int]) -> list[dict[str, Any]]:
        out = []
        for trial in ids:
            suggestion = self.scheduler.suggest()
            if suggestion is None or suggestion.config is None:
                break
            t = self._trial(trial_id=trial, config=dict(suggestion.config), creation_time=self._now())
            self.scheduler.on_trial_add(t)
            self.trials[trial] = t
            out.append(dict(suggestion.config))
        return out

    def report(self, trial: int, step: int, value: float) -> bool:
        result = {"value": value, "epoch": step}
        self.last[trial] = result
        return str(self.scheduler.on_trial_result(self.trials[trial], result)).upper().endswith("STOP")

    def end(self, trial: int, state: str) -> None:
        t, result = self.trials.pop(trial), self.last.pop(trial)
        if state == "succeeded":
            self.scheduler.on_trial_complete(t, result)

    def close(self) -> None:
        pass


def make_external(strategy: str, table: CurveTable, *, seed: int = 0, parallel: int = 4,
                  stopper_options: dict[str, Any] | None = None) -> Any:
    if strategy == "dehb":
        return DEHBSearcher(table, seed=seed, rungs=stopper_options)
    if strategy == "smac:hyperband":
        return SMACSearcher(table, seed=seed, rungs=stopper_options)
    if strategy.startswith("synetune:"):
        return SyneTuneSearcher(table, strategy.partition(":")[2], seed=seed, rungs=stopper_options)
    raise SpecError(f"unknown external baseline {strategy[:60]!r}", hint="dehb, smac:hyperband, synetune:<scheduler>")
