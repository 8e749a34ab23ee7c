"""Loading plan.yaml: reading the file, and every way it can be wrong as one :class:`PlanError`.

Malformed YAML or non-UTF-8 bytes name their line (and column); an unknown key names the
nearest valid one; a pydantic error becomes ``<file>: <where>: <what>`` with a hint; what each
trial will submit is checked once here, against :class:`~autoresearch.engine.spec.JobSpec`.

The models live in :mod:`autoresearch.loop.plan`, whose :func:`load_plan` and :func:`parse_plan`
call these with its :class:`Plan` model; import them from there. This module never imports the
models (each function is handed the model class), so the two modules form no import circle.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any, TypeVar, get_args

from pydantic import BaseModel, ValidationError

from autoresearch.errors import PlanError, SpecError

M = TypeVar("M", bound=BaseModel)


def _fields_at(root: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The valid keys of the model found at ``loc`` in ``root`` (the plan model; for 'did you mean')."""
    param = get_args(root.model_fields["space"].annotation)[-1]  # space: dict[str, Param]

    model: Any = root
    for part in loc[:-1]:
        if isinstance(part, int) or model is None:
            continue
        if model is root and part == "space":
            model = "space"
            continue
        if model == "space":
            model = param
            continue
        info = model.model_fields.get(part)
        if info is None:
            return []
        annotation = info.annotation
        args = getattr(annotation, "__args__", ())
        candidates = [a for a in (annotation, *args) if isinstance(a, type) and issubclass(a, BaseModel)]
        model = candidates[0] if candidates else None
    return list(getattr(model, "model_fields", {})) if isinstance(model, type) else []


def explain(err: ValidationError, source: str, model: type[BaseModel]) -> PlanError:
    """What is wrong with a plan as one :class:`PlanError`; ``model`` is the plan model that refused it."""
    errors = err.errors()
    # A typo (comand) also makes its key missing (command): name the typo, the cause.
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc = tuple(first["loc"])
    where = ".".join(str(p) for p in loc) or "plan"
    if first["type"] == "extra_forbidden":
        valid = _fields_at(model, loc)
        near = difflib.get_close_matches(str(loc[-1]), valid, n=1, cutoff=0.5)
        what = f"did you mean {near[0]!r}? " if near else ""
        mean = f" (did you mean {near[0]!r}?)" if near else ""
        return PlanError(f"{source}: {where}: unknown key {str(loc[-1])!r}{mean}",
                         hint=f"{what}valid keys here: {', '.join(valid)}")
    if first["type"] == "missing":
        return PlanError(f"{source}: {where} is required",
                         hint="see `autoresearch schema plan`, or start from examples/digits/plan.yaml")
    msg = first["msg"].removeprefix("Value error, ")
    hints = {
        "proposer": "kinds: random, grid, tpe, llm, agent",
        "objective": "e.g. objective: {metric: val_loss, goal: minimize}",
        "budget": "e.g. budget: {trials: 40, parallel: 4}",
        "early_stop": "e.g. early_stop: {kind: asha, min_steps: 3, reduction_factor: 3}; also median, hyperband "
                      "(brackets: 1-10), curve (confidence: 0.5 to below 1)",
        "warm_start": "e.g. warm_start: [digits-mlp] (earlier loops with the same objective and space), or "
                      "warm_start: true (this plan's own earlier loops)",
    }
    hint = hints.get(str(loc[0]) if loc else "", "see `autoresearch schema plan`")
    if not loc and "warm_start" in msg:
        hint = hints["warm_start"]
    if loc and loc[0] == "space":
        hint = "a parameter is {low: 0.001, high: 0.1, log: true} or {choices: [32, 64]}"
        if "prior" in msg or "prior" in loc:
            hint = "a prior is {guess: VALUE, confidence: 0.5}: the guess inside low..high or one of the choices"
    if "placeholder" in msg or "{" in msg:
        hint = "every {name} in trial.command must be a key of space (or seed, trial_id, loop)"
    elif loc[:2] == ("trial", "command") or msg.startswith("trial.command"):
        hint = "write it like a shell line, e.g. python train.py --lr {lr}; close every quote"
    if msg.startswith(f"{where}."):  # a section's own check names the field itself
        return PlanError(f"{source}: {msg}", hint=hint)
    return PlanError(f"{source}: {where}: {msg}", hint=hint)


def parse_plan(model: type[M], data: Any, source: str = "plan", base_dir: str | Path | None = None,
               home: str | os.PathLike[str] | None = None) -> M:
    """Validate a dict into ``model`` (the :class:`~autoresearch.loop.plan.Plan` model); ``trial.workdir``
    becomes absolute (relative to ``base_dir``)."""
    if not isinstance(data, dict):
        raise PlanError(f"{source} must be a mapping of keys (name, objective, trial, ...), got {type(data).__name__}",
                        hint="start from examples/digits/plan.yaml")
    try:
        plan: Any = model.model_validate(data)
    except ValidationError as err:
        raise explain(err, source, model) from None
    except PlanError:
        raise
    except SpecError as err:  # a duration or size the shared parsers refused
        raise PlanError(f"{source}: {err.message}", hint=err.hint) from None
    from autoresearch.backends import check_options, profiles
    from autoresearch.loop.proposers import check_kind

    check_kind(plan.proposer.kind)
    try:  # a profile of ``home``'s config.yaml (``--home``; default $AUTORESEARCH_HOME), else a kind
        profile = profiles.resolve(plan.backend.kind, home)
        check_options(profile.kind, {**profile.options, **plan.backend.options})
    except SpecError as err:
        raise PlanError(f"{source}: {err.message}", hint=err.hint) from None
    _check_trial_spec(plan, source)
    if base_dir is not None:
        workdir = Path(plan.trial.workdir).expanduser()
        if not workdir.is_absolute():
            workdir = Path(base_dir) / workdir
        if not workdir.is_dir():
            raise PlanError(f"{source}: trial.workdir {str(workdir)!r} does not exist",
                            hint="trial.workdir is relative to the plan file; point it at an existing directory")
        plan.trial.workdir = str(workdir.resolve())
    return plan


def _check_trial_spec(plan: Any, source: str) -> None:
    """What every trial will submit, checked once now (NUL bytes, env names, sizes, the command's
    placeholders) instead of failing each trial at submit."""
    from autoresearch.engine.spec import JobSpec

    sample = {name: p.grid_values()[0] for name, p in plan.space.items()}
    try:
        command = plan.render_command(sample, seed=0, trial_id=1)
    except (ValueError, KeyError, IndexError, AttributeError) as err:
        raise PlanError(f"{source}: trial.command cannot be filled in: {err}",
                        hint="placeholders are plain {name}: values arrive as text, so format specs like "
                             "{lr:.3f} do not apply") from None
    t = plan.trial
    try:
        JobSpec.model_validate({"name": plan.name, "command": command or [""], "shell": t.shell, "env": t.env, "gpus": t.gpus,
                                "cpus": t.cpus, "memory": t.memory, "max_retries": t.max_retries,
                                "tags": plan.tags, "image": t.image, "mounts": t.mounts})
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        where = "tags" if where.startswith("tags") else f"trial.{where}" if where else "trial"
        raise PlanError(f"{source}: {where}: {first['msg'].removeprefix('Value error, ')}",
                        hint="see `autoresearch schema plan`") from None
    except SpecError as err:
        raise PlanError(f"{source}: trial: {err.message}", hint=err.hint) from None


def load_plan(model: type[M], path: str | Path, home: str | os.PathLike[str] | None = None) -> M:
    """Read and validate plan.yaml; every problem is one :class:`PlanError` naming where it is."""
    import yaml

    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise PlanError(f"cannot read {path}: {err.strerror}", hint="pass the path of an existing plan.yaml") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[:err.start].count(b"\n") + 1
        raise PlanError(f"{path}: not UTF-8 text (byte {err.start}, line {line})",
                        hint="save the plan as UTF-8") from None
    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "somewhere"
        raise PlanError(f"{path}: malformed YAML at {where}: {err.problem or err}",
                        hint="fix the YAML there (quote values containing ':' or '#'; check brackets)") from None
    except yaml.YAMLError as err:
        raise PlanError(f"{path}: malformed YAML: {err}", hint="fix the YAML syntax") from None
    except (ValueError, RecursionError) as err:  # an integer of 5,000 digits, brackets nested 10,000 deep
        raise PlanError(f"{path}: unreadable YAML: {str(err)[:200]}", hint="fix the value it names") from None
    return parse_plan(model, data, source=str(path), base_dir=path.resolve().parent, home=home)
