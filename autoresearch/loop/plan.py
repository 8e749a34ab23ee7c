"""plan.yaml: what a research loop runs, as a pydantic model (``autoresearch schema plan``).

A plan is validated completely before anything launches: malformed YAML names its
line and column, an unknown key names the nearest valid one, and a command
placeholder with no parameter, ``low > high``, an empty space or a zero budget are
each one clear :class:`~autoresearch.errors.PlanError` with a hint.

Other proposers plug in through ``proposer`` (``kind`` is looked up in
:mod:`autoresearch.loop.proposers`; ``provider``/``model``/``base_url``/... are for
LLM proposers, ``options`` for anything else) and ``code`` (code-edit search).

This module holds the models; reading a file and turning what is wrong into one
:class:`~autoresearch.errors.PlanError` is :mod:`autoresearch.loop._plan_load`, which
:func:`load_plan` and :func:`parse_plan` call with the :class:`Plan` model (it never imports this module).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import os
import re
import shlex
import string
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from autoresearch.engine.spec import parse_duration, parse_grace, parse_memory_mb, str_values
from autoresearch.loop import _plan_load, stopping

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
MAX_GRID_POINTS = 100_000  # a range whose step makes more points than this is a typo, not a plan
# Placeholders the controller fills in besides the space's parameters.
BUILTIN_PLACEHOLDERS = ("seed", "trial_id", "loop")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Objective(_Model):
    metric: str = Field(description="Name of the metric trials report (report(...) or a `name: value` log line).")
    goal: Literal["minimize", "maximize"] = "minimize"
    target: float | None = Field(None, description="Stop the loop once the best value reaches this.")

    @field_validator("goal", mode="before")
    @classmethod
    def _goal(cls, value: object) -> object:
        aliases = {"min": "minimize", "max": "maximize", "minimise": "minimize", "maximise": "maximize"}
        return aliases.get(str(value).lower(), str(value).lower()) if isinstance(value, str) else value

    def sign(self) -> float:
        """Multiply by this to turn the objective into 'lower is better'."""
        return 1.0 if self.goal == "minimize" else -1.0


class Trial(_Model):
    command: str = Field(description="Command template; {param} is replaced by the trial's value of param, "
                                     "{seed} by its seed, {trial_id} by its id.")
    workdir: str = Field(".", description="Directory the trial runs in, relative to the plan file.")
    shell: bool = Field(False, description="Run through /bin/sh -c (pipes, &&); otherwise split like a shell.")
    gpus: int = Field(0, ge=0)
    cpus: float = Field(0, ge=0, allow_inf_nan=False)
    memory: int | str = 0
    timeout: float | None = Field(None, description="Per attempt: seconds or '5m'.")
    grace: float = Field(10.0, description="SIGTERM to SIGKILL when a trial is stopped early, seconds or '30s'.")
    priority: Literal["critical", "normal", "best-effort"] = "normal"
    max_retries: int = Field(2, ge=0, description="Retries after infrastructure failures (not user errors).")
    env: dict[str, str] = Field(default_factory=dict)
    checkpoint: bool | str = False
    image: str = Field("", max_length=512, description="Container image each trial runs in (a backend with "
                                                      "containers, e.g. docker); empty: the host's environment.")
    mounts: dict[str, str] = Field(default_factory=dict, description="target path -> source path (a container's "
                                   "bind mounts; links on the local backend).")

    @field_validator("command", mode="after")
    @classmethod
    def _command(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("is empty; give the program to run, e.g. python train.py")
        return value

    @model_validator(mode="after")
    def _split(self) -> Trial:
        if not self.shell:  # the controller splits it for every trial: refuse it here, once
            try:
                shlex.split(self.command)
            except ValueError as err:
                raise ValueError(f"trial.command cannot be split into arguments ({err}); close the quote, "
                                 "or set shell: true") from None
        return self

    @field_validator("memory", mode="before")
    @classmethod
    def _memory(cls, value: object) -> object:
        parse_memory_mb(value, "trial.memory")  # kept as written, so the plan's digest does not change
        return value

    @field_validator("timeout", mode="before")
    @classmethod
    def _timeout(cls, value: object) -> float | None:
        return parse_duration(value, "trial.timeout")

    @field_validator("grace", mode="before")
    @classmethod
    def _grace(cls, value: object) -> float:
        return parse_grace(value, "trial.grace")

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, value: object) -> object:
        return str_values(value)

    def placeholders(self) -> list[str]:
        names = []
        try:
            for _, field, _, _ in string.Formatter().parse(self.command):
                if field is not None:
                    names.append(field)
        except ValueError as err:
            raise ValueError(f"trial.command: {err}; write {{{{ and }}}} for literal braces") from None
        return names


class Prior(_Model):
    """A best guess for one parameter and how sure of it one is (0 < confidence < 1): model-based
    proposers (tpe, bohb) sample around it at first, and less so as trials teach them."""

    guess: Any = Field(description="A value inside the parameter's range, or one of its choices.")
    confidence: float = Field(0.5, gt=0, lt=1, allow_inf_nan=False,
                              description="0..1: how narrow the prior is and how long it outweighs the data.")

    @model_validator(mode="before")
    @classmethod
    def _short(cls, data: Any) -> Any:
        return data if isinstance(data, dict) else {"guess": data}  # prior: 0.01


class Param(_Model):
    """One dimension: a range (``low``/``high``, optionally ``log``/``step``) or ``choices``."""

    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = Field(None, gt=0, description="Grid spacing; also makes an int range discrete.")
    type: Literal["float", "int"] | None = Field(None, description="Inferred: int when low and high are integers.")
    choices: list[Any] | None = None
    grid: int | None = Field(None, ge=2, description="Points of a continuous range on a grid (default 5).")
    prior: Prior | None = Field(None, description="A best guess and a confidence, e.g. {guess: 0.01, "
                                                  "confidence: 0.7} (tpe, bohb).")

    @model_validator(mode="before")
    @classmethod
    def _infer_type(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("type") is None and "choices" not in data:
            low, high = data.get("low"), data.get("high")
            if isinstance(low, int) and isinstance(high, int) and not isinstance(low, bool):
                data = {**data, "type": "int"}
        return data

    @model_validator(mode="after")
    def _check(self) -> Param:
        if self.choices is not None:
            if self.low is not None or self.high is not None:
                raise ValueError("give either choices or low/high, not both")
            if not self.choices:
                raise ValueError("choices is empty; list at least one value")
            if self.prior is not None and self.prior.guess not in self.choices:
                raise ValueError(f"prior guess {self.prior.guess!r:.40} is not one of the choices "
                                 f"{str(self.choices)[:80]}; guess one of them")
            return self
        if self.low is None or self.high is None:
            raise ValueError("a parameter needs low and high, or choices")
        for key, number in (("low", self.low), ("high", self.high), ("step", self.step)):
            if number is not None and not math.isfinite(number):
                raise ValueError(f"{key} is {number}; give a finite number")
        if not math.isfinite(self.high - self.low):
            raise ValueError(f"the range {self.low:g}..{self.high:g} is too wide to sample; narrow it")
        if self.low > self.high:
            raise ValueError(f"low ({self.low:g}) > high ({self.high:g}); swap them")
        if self.log and self.low <= 0:
            raise ValueError(f"log: true needs low > 0, got {self.low:g}")
        if self.step is not None and (self.low + self.step == self.low or self.high + self.step == self.high):
            raise ValueError(f"step {self.step:g} is too small to move a value of {max(abs(self.low), abs(self.high)):g}; "
                             "use a larger step, or leave it out")
        if self.step is not None and (self.high - self.low) / self.step > MAX_GRID_POINTS:
            raise ValueError(f"step {self.step:g} makes more than {MAX_GRID_POINTS} points in "
                             f"{self.low:g}..{self.high:g}; use a larger step, or leave it out")
        if self.type is None:
            self.type = "float"
        if self.prior is not None:
            guess = self.prior.guess
            if isinstance(guess, bool) or not isinstance(guess, (int, float)) or not math.isfinite(guess):
                raise ValueError(f"prior guess {guess!r:.40} is not a finite number; give a value in "
                                 f"{self.low:g}..{self.high:g}")
            if not self.low <= guess <= self.high:
                raise ValueError(f"prior guess {guess:g} is outside the range {self.low:g}..{self.high:g}; "
                                 "give a guess inside it (or widen the range)")
        return self

    @property
    def is_int(self) -> bool:
        return self.type == "int"

    def grid_values(self) -> list[Any]:
        if self.choices is not None:
            return list(self.choices)
        assert self.low is not None and self.high is not None
        if self.step is not None:
            count = int(math.floor((self.high - self.low) / self.step + 1e-9)) + 1
            values: list[Any] = [self.low + i * self.step for i in range(count)]
        else:
            n = self.grid or (min(5, int(self.high - self.low) + 1) if self.is_int else 5)
            if n <= 1 or self.low == self.high:
                values = [self.low]
            elif self.log:
                a, b = math.log(self.low), math.log(self.high)
                values = [math.exp(a + (b - a) * i / (n - 1)) for i in range(n)]
            else:
                values = [self.low + (self.high - self.low) * (i / (n - 1)) for i in range(n)]  # never past high
        if self.is_int:
            return list(dict.fromkeys(int(round(v)) for v in values))
        return [float(f"{v:.6g}") for v in values]


class Proposer(_Model):
    kind: str = Field("bohb", description="bohb | tpe | random | grid | llm | agent (or a registered third-party "
                                          "kind); bohb by default (docs/search-benchmark.md).")
    seed: int | None = Field(None, description="Seed of random/tpe sampling (reproducible plans).")
    n_startup: int | None = Field(None, ge=0, description="tpe: random trials before the model kicks in.")
    # LLM proposers (anthropic, openai or an OpenAI-compatible server such as vLLM or Ollama).
    provider: str | None = Field(None, description="llm: anthropic | openai")
    model: str | None = None
    base_url: str | None = Field(None, description="llm: an OpenAI-compatible or Anthropic-compatible endpoint.")
    temperature: float | None = Field(None, ge=0, le=2)
    max_tokens: int | None = Field(None, ge=1)
    api_key_env: str | None = Field(None, description="llm: the environment variable holding the API key.")
    prompt: str | None = Field(None, description="llm: prompt template name under prompts/.")
    batch: int | None = Field(None, ge=1, description="Most proposals asked for in one call.")
    options: dict[str, Any] = Field(default_factory=dict, description="Anything else a proposer kind reads.")


class Budget(_Model):
    trials: int = Field(20, ge=1, description="Trials to launch (repeats count; infra crashes do not).")
    parallel: int = Field(4, ge=1, description="Trials in flight at once.")
    wall: float | None = Field(None, description="Stop after this long, e.g. '2h' (running trials are stopped).")
    gpu_hours: float | None = Field(None, gt=0, description="Stop launching once trials used this many GPU-hours.")
    llm_usd: float | None = Field(None, gt=0, description="Stop proposing once LLM calls cost this much.")
    steps: int | None = Field(None, ge=1, description="Compute budget: steps (epochs) reported by all trials "
                                                     "together, stopped ones included; launching stops once spent.")
    stop_in_flight: bool | None = Field(None, description="steps, gpu_hours: stop the trials still running when "
                                                           "one is spent, so the budget holds (the default); false: "
                                                           "let them finish (the overshoot is theirs).")
    fail_fast: int | None = Field(None, ge=0, description="Stop the loop (exit 1) when its first N trials all fail "
                                                      "the same way or never report the objective: it cannot learn "
                                                      "(default: max(3, parallel); 0: never).")

    @model_validator(mode="before")
    @classmethod
    def _zero(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in ("trials", "parallel"):
                if data.get(key) is not None and not isinstance(data[key], bool) and data[key] == 0:
                    raise ValueError(f"{key} is 0: nothing would run; give a positive number")
        return data

    @field_validator("wall", mode="before")
    @classmethod
    def _wall(cls, value: object) -> float | None:
        return parse_duration(value, "budget.wall")


def _stop_kinds(schema: dict[str, Any]) -> None:
    schema["enum"] = stopping.kinds()


class EarlyStop(_Model):
    kind: str = Field("hyperband", description="A registered stopper (autoresearch.loop.stopping): hyperband (the "
                                               "default), asha, median, curve, ...",
                      json_schema_extra=_stop_kinds)
    min_steps: int = Field(1, ge=1, description="Never stop a trial before this step (ASHA's grace period; curve: "
                                                "at least 3 points).")
    reduction_factor: int = Field(3, ge=2, description="asha: keep the top 1/reduction_factor at each rung.")
    max_steps: int | None = Field(None, ge=1, description="asha, hyperband: rungs are below it; curve: the step to "
                                                          "forecast (default: the longest curve seen).")
    min_trials: int = Field(3, ge=1, description="median: trials that must have reached a step before it applies.")
    brackets: int | None = Field(None, ge=1, le=10, description="hyperband: brackets (default: one per rung below "
                                                                 "max_steps plus one that trains in full, as Hyperband's "
                                                                 "s_max + 1; 3 without max_steps).")
    allocation: Literal["geometric", "hyperband"] = Field(
        "hyperband", description="hyperband: how trials are shared among brackets: geometric (bracket b gets "
                                 "reduction_factor**(brackets-1-b) shares) or hyperband (the default: Hyperband's own "
                                 "ceil(brackets * rf**s / (s+1)) for s = brackets-1-b: more trials in the laxer brackets).")
    adapt: bool = Field(False, description="asha, hyperband: learn from the run how well ranks at each rung predict "
                                           "later ones (Kendall's tau over trials that went past it) and keep "
                                           "(1/reduction_factor)**tau there: fewer stops where curves cross.")
    pause: bool = Field(False, description="asha, hyperband: pause a losing trial at its rung (it must checkpoint "
                                           "in AUTORESEARCH_CHECKPOINT_DIR) and resume it when promoted.")
    confidence: float = Field(0.95, ge=0.5, lt=1.0, description="curve: how sure the forecast must be that a trial "
                                                                 "ends worse than the incumbent to stop it.")

    @model_validator(mode="after")
    def _pause(self) -> EarlyStop:
        if self.pause and self.kind not in ("asha", "hyperband"):
            raise ValueError(f"pause: true needs kind asha or hyperband (promotion happens at rungs), not {self.kind!r}")
        return self

    @field_validator("kind", mode="before")
    @classmethod
    def _kind(cls, value: object) -> object:
        stopping.check_kind(value)  # the same words as a Literal's error: "Input should be 'asha' or 'median'"
        return value


class Repeats(_Model):
    seeds: int = Field(3, ge=2, description="Runs of each new incumbent with different seeds (noise floor).")


AMOUNT = r"^\s*([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?\s*%?\s*$"  # '1%', '0.5 %', '2e-3'


def _amount_schema(schema: dict[str, Any]) -> None:
    schema.pop("anyOf", None)
    schema["anyOf"] = [{"type": "number", "minimum": 0}, {"type": "string", "pattern": AMOUNT}]


class Gate(_Model):
    """The CI regression gate (``autoresearch plan.yaml --ci --baseline REF``): the sweep's best
    (the noise-aware incumbent) may be worse than the baseline's by at most ``max_regression``
    (and by no more than the noise floor when one is measured)."""

    metric: str = Field(description="The metric gated: the objective's (the incumbent and the noise floor "
                                    "are measured on it).")
    max_regression: float | str = Field(
        "0%", description="How much worse than the baseline passes: '1%' (relative to the baseline's value) "
                          "or a number (absolute, in the metric's units).", json_schema_extra=_amount_schema)

    @field_validator("max_regression", mode="before")
    @classmethod
    def _max_regression(cls, value: object) -> object:
        gate_tolerance(value)  # refused here; kept as written, so the plan's digest does not change
        return value

    def tolerance(self, baseline: float) -> float:
        """The largest allowed worsening against a baseline of ``baseline``, in the metric's units."""
        amount, relative = gate_tolerance(self.max_regression)
        return amount * abs(baseline) if relative else amount


def gate_tolerance(value: object) -> tuple[float, bool]:
    """``'1%'`` -> (0.01, relative); ``0.002`` -> (0.002, absolute). ValueError on anything else."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError("give a percentage like '1%' or a number like 0.002")
    text = str(value).strip()
    if isinstance(value, str) and not re.match(AMOUNT, text):
        raise ValueError(f"{text[:40]!r} is not an amount; give e.g. '1%' or 0.002")
    relative = text.endswith("%")
    try:
        amount = float(text[:-1] if relative else text)
    except ValueError:
        raise ValueError(f"{text[:40]!r} is not a number; give e.g. '1%' or 0.002") from None
    if not math.isfinite(amount) or amount < 0:
        raise ValueError(f"{text[:40]!r}: give a finite amount >= 0, e.g. '1%'")
    return (amount / 100 if relative else amount), relative


class BackendRef(_Model):
    """``backend: NAME`` (a profile of config.yaml, or a kind), ``{kind: K, option: value, ...}`` or
    ``{kind: K, options: {...}}``."""

    kind: str = Field("local", description="A backend profile (config.yaml's backends:) or a kind: local, docker, "
                                           "slurm, ray, ...")
    options: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _forms(cls, data: Any) -> Any:
        if isinstance(data, str):
            return {"kind": data}
        if isinstance(data, dict) and set(data) - {"kind", "options"}:
            if "kind" not in data:
                raise ValueError("give kind: (a profile or a backend kind), e.g. backend: {kind: docker}")
            extra = {k: v for k, v in data.items() if k not in ("kind", "options")}
            options = data.get("options")
            return {"kind": data["kind"], "options": {**(options if isinstance(options, dict) else {}), **extra}}
        return data


class Code(_Model):
    files: list[str] = Field(description="Files (relative to trial.workdir) the proposer may edit.")
    instructions: str | None = Field(None, description="A file (program.md) with the human-written instructions.")

    @field_validator("files")
    @classmethod
    def _files(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("files is empty; name the files the proposer may edit, e.g. [train.py]")
        return value


class Plan(_Model):
    name: str = Field(description="Names the loop (resume key) and its MLflow experiment.")
    description: str = ""
    objective: Objective
    trial: Trial
    space: dict[str, Param] = Field(default_factory=dict)
    proposer: Proposer = Field(default_factory=lambda: Proposer.model_validate({}))
    budget: Budget = Field(default_factory=lambda: Budget.model_validate({}))
    early_stop: EarlyStop | None = None
    repeats: Repeats | None = None
    backend: BackendRef = Field(default_factory=lambda: BackendRef.model_validate({}))
    code: Code | None = None
    gate: Gate | None = Field(None, description="CI regression gate against --baseline (see docs/ci.md).")
    tags: dict[str, str] = Field(default_factory=dict)
    warm_start: list[str] | bool = Field(default_factory=list, description=(
        "Earlier loops whose trials, with the same objective and a compatible space, are the proposer's prior "
        "(tpe, bohb): a list of loop names, or true for this plan's own earlier loops (the newest finished ones, "
        "up to 5; running the plan again after its loop finished starts a new loop and keeps the finished one "
        "as NAME-N). See docs/loop.md#warm-starts."))

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not NAME.match(value):
            raise ValueError(f"name {value!r} must be 1-64 letters, digits, '.', '_' or '-'")
        return value

    @field_validator("warm_start", mode="before")
    @classmethod
    def _warm_start(cls, value: object) -> object:
        if isinstance(value, bool):
            return value if value else []  # true: this plan's own earlier loops (proposers/_warm.py)
        names = [value] if isinstance(value, str) else value
        if not isinstance(names, list):
            raise ValueError(f"warm_start is a list of earlier loops' names or true, not {str(value)[:70]!r}")
        if isinstance(names, list):
            for name in names:
                if not isinstance(name, str) or not NAME.match(name):
                    raise ValueError(f"{str(name)[:70]!r} is not a loop name (1-64 letters, digits, '.', '_' or '-')")
        return names

    @field_validator("proposer", mode="before")
    @classmethod
    def _proposer(cls, value: object) -> object:
        return {"kind": value} if isinstance(value, str) else value

    @field_validator("early_stop", mode="before")
    @classmethod
    def _early_stop(cls, value: object) -> object:
        return {"kind": value} if isinstance(value, str) else value

    @field_validator("space", mode="before")
    @classmethod
    def _space(cls, value: object) -> object:
        if isinstance(value, dict):  # a bare list means choices
            return {k: {"choices": v} if isinstance(v, list) else v for k, v in value.items()}
        return value

    @model_validator(mode="after")
    def _check(self) -> Plan:
        known = set(self.space) | set(BUILTIN_PLACEHOLDERS)
        for name in self.trial.placeholders():
            if name == "":
                raise ValueError("trial.command has an empty placeholder {}; write {param_name}")
            if name not in known:
                near = difflib.get_close_matches(name, sorted(known), n=1)
                hint = f" (did you mean {{{near[0]}}}?)" if near else ""
                raise ValueError(f"trial.command uses {{{name}}} but space has no parameter {name!r}{hint}")
        if self.gate is not None and self.gate.metric != self.objective.metric:
            raise ValueError(f"gate.metric {self.gate.metric!r} is not a metric this plan's loop measures: the "
                             f"incumbent and the noise floor are on the objective {self.objective.metric!r}; "
                             f"set gate.metric: {self.objective.metric}")
        if not self.space and self.code is None and self.proposer.kind not in ("agent", "llm"):
            raise ValueError("space is empty: give at least one parameter, or a code: section for code-edit search")
        if isinstance(self.warm_start, list) and self.name in self.warm_start:
            raise ValueError(f"warm_start names this loop itself ({self.name!r}); its own trials are already its "
                             "history (run it again with --resume), so name earlier loops only, or write "
                             "warm_start: true to start each new run from this plan's earlier loops")
        return self

    # -- helpers the controller uses --------------------------------------------------

    def digest(self) -> str:
        # Fields added later stay out while unset, so a loop made before them keeps its digest (and resumes).
        later = {k for k in ("image", "mounts") if not getattr(self.trial, k)}
        budget = {k for k in ("steps", "stop_in_flight") if not getattr(self.budget, k)}
        if self.budget.fail_fast is None:  # (0, "never stop early", is a choice: digested)
            budget.add("fail_fast")
        exclude: dict[str, Any] = {"trial": later, "budget": budget,
                                   "space": {k: {"prior"} for k, p in self.space.items() if p.prior is None}}
        if self.gate is None:
            exclude["gate"] = True
        if not self.warm_start:
            exclude["warm_start"] = True
        if self.early_stop is not None:
            unset = {k for k in ("allocation", "adapt") if k not in self.early_stop.model_fields_set}
            if unset:
                exclude["early_stop"] = unset
        # Kinds a plan did not name are digested as the defaults they had before bohb/hyperband became
        # the defaults, so a loop made then still resumes (it goes on with today's defaults).
        legacy: dict[str, Any] = {}
        if "kind" not in self.proposer.model_fields_set:
            legacy["proposer"] = self.proposer.model_copy(update={"kind": "tpe"})
        if self.early_stop is not None and "kind" not in self.early_stop.model_fields_set:
            legacy["early_stop"] = self.early_stop.model_copy(update={"kind": "asha"})
        plan = self.model_copy(update=legacy) if legacy else self
        return hashlib.sha256(plan.model_dump_json(exclude=exclude).encode()).hexdigest()[:16]

    def backend_choice(self) -> tuple[str | None, dict[str, Any]]:
        """The backend the plan names and its options; (None, {}) when it names none (the home's default)."""
        if "backend" not in self.model_fields_set or "kind" not in self.backend.model_fields_set:
            return None, dict(self.backend.options)
        return self.backend.kind, dict(self.backend.options)

    def render_command(self, params: dict[str, Any], seed: int, trial_id: int) -> list[str] | str:
        values = {**{k: _fmt(v) for k, v in params.items()}, "seed": str(seed), "trial_id": str(trial_id),
                  "loop": self.name}
        if self.trial.shell:
            return self.trial.command.format(**{k: shlex.quote(v) for k, v in values.items()})
        # Split first, then fill each word, so a value with spaces stays one argument.
        return [word.format(**values) for word in shlex.split(self.trial.command)]


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}" if value != int(value) or abs(value) >= 1e6 else repr(value)
    return str(value)


def parse_plan(data: Any, source: str = "plan", base_dir: str | Path | None = None,
               home: str | os.PathLike[str] | None = None) -> Plan:
    """Validate a dict into a :class:`Plan`; ``trial.workdir`` becomes absolute (relative to ``base_dir``)."""
    return _plan_load.parse_plan(Plan, data, source, base_dir, home)


def load_plan(path: str | Path, home: str | os.PathLike[str] | None = None) -> Plan:
    """Read and validate plan.yaml; every problem is one :class:`PlanError` naming where it is."""
    return _plan_load.load_plan(Plan, path, home)


def plan_schema() -> dict[str, Any]:
    """The JSON Schema of what :func:`load_plan` accepts (``autoresearch schema plan``)."""
    from autoresearch.backends import backend_names, backend_options
    from autoresearch.loop._plan_schema import input_schema

    backends: dict[str, list[str] | None] = {}
    for name in backend_names():
        try:
            backends[name] = backend_options(name)
        except Exception:  # noqa: BLE001 - a broken plugin: its kind is listed, its options unchecked
            backends[name] = None
    return input_schema(Plan.model_json_schema(), stopping.kinds(), backends)


def plan_json(plan: Plan) -> str:
    return json.dumps(plan.model_dump(mode="json"), sort_keys=True)
