"""The plan loader is total: whatever the YAML, one PlanError/SpecError or a plan whose every
trial can be submitted (nothing that passes load fails each trial later)."""

from __future__ import annotations

import copy
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from autoresearch.errors import AutoresearchError
from autoresearch.loop.plan import Param, Plan, parse_plan
from tests.properties.strategies import FAST, NASTY_TEXT, NUMBERS, TEXT, mapping_over, values

VALID: dict[str, Any] = {
    "name": "prop",
    "objective": {"metric": "loss", "goal": "minimize"},
    "trial": {"command": "python train.py --lr {lr} --width {width}", "memory": "1G", "timeout": "5m",
              "env": {"A": "1"}},
    "space": {"lr": {"low": 1e-4, "high": 0.1, "log": True}, "width": {"choices": [32, 64]}},
    "budget": {"trials": 4, "parallel": 2},
}
SECTIONS = {
    "trial": ["command", "workdir", "shell", "gpus", "cpus", "memory", "timeout", "grace", "priority",
              "max_retries", "env", "checkpoint"],
    "objective": ["metric", "goal", "target"],
    "budget": ["trials", "parallel", "wall", "gpu_hours", "llm_usd"],
    "proposer": ["kind", "seed", "n_startup", "temperature", "batch", "options"],
    "backend": ["kind", "options"],
    "early_stop": ["kind", "min_steps", "reduction_factor", "max_steps"],
}


def assert_submittable(plan: Plan) -> None:
    """What the controller will do with an accepted plan must not raise."""
    from autoresearch.engine.spec import make_spec
    from autoresearch.loop._launch import trial_spec
    from autoresearch.loop.proposers._space import sample

    params = sample(plan.space, random.Random(0)) if plan.space else {}
    command = plan.render_command(params, seed=1, trial_id=1)
    row = {"id": 1, "seed": 1, "decision_id": 1, "role": "explore"}
    make_spec(trial_spec(plan, 1, row, params, command, plan.trial.workdir), check_paths=False)
    for param in plan.space.values():
        assert param.grid_values()


def load(data: Any) -> Plan | None:
    try:
        plan = parse_plan(data, source="plan.yaml")
    except AutoresearchError as err:
        assert err.message and err.hint is not None
        return None
    assert_submittable(plan)
    return plan


@FAST
@given(data=values(max_leaves=12))
def test_any_document_is_a_plan_or_one_error(data: Any) -> None:
    load(data)


@FAST
@given(section=st.sampled_from(sorted(SECTIONS)), data=st.data())
def test_a_valid_plan_with_one_section_garbled(section: str, data: st.DataObject) -> None:
    plan = copy.deepcopy(VALID)
    plan[section] = data.draw(mapping_over(SECTIONS[section], values()))
    if section == "trial" and isinstance(plan[section], dict) and "command" not in plan[section]:
        plan[section]["command"] = data.draw(st.one_of(TEXT, NASTY_TEXT, st.just("run {lr}")))
    load(plan)


@FAST
@given(key=st.sampled_from(SECTIONS["trial"]), value=values())
@example(key="memory", value="lots").via("issue 14")
@example(key="memory", value=-5).via("issue 14")
@example(key="timeout", value=float("nan")).via("issue 14")
@example(key="command", value="").via("issue 14")
@example(key="command", value="python 'unclosed {lr}").via("issue 14")
@example(key="env", value={"A=B": "1"}).via("issue 14")
def test_one_trial_value_garbled(key: str, value: Any) -> None:
    plan = copy.deepcopy(VALID)
    plan["trial"][key] = value
    load(plan)


@FAST
@given(low=NUMBERS, high=NUMBERS, step=st.one_of(st.none(), NUMBERS), log=st.booleans(),
       kind=st.sampled_from([None, "int", "float"]))
@example(low=0, high=float("nan"), step=None, log=False, kind=None).via("issue 14")
@example(low=0, high=10**400, step=None, log=False, kind=None).via("issue 14")
@example(low=-1e308, high=1e308, step=None, log=False, kind=None)
@example(low=0.0, high=1.0, step=1e-12, log=False, kind=None)
def test_a_range_is_sampleable_or_refused(low: Any, high: Any, step: Any, log: bool, kind: str | None) -> None:
    spec = {"low": low, "high": high, "log": log, "type": kind, **({"step": step} if step is not None else {})}
    plan = load({**VALID, "space": {"lr": spec}, "trial": {"command": "run {lr}"}})
    if plan is None:
        return
    param: Param = plan.space["lr"]
    assert param.low is not None and param.high is not None and param.low <= param.high
    assume(len(param.grid_values()) > 0)


@FAST
@given(blob=st.binary(max_size=300), text=st.one_of(TEXT, NASTY_TEXT))
def test_any_file_is_a_plan_or_one_error(tmp_path_factory: pytest.TempPathFactory, blob: bytes, text: str) -> None:
    from autoresearch.loop.plan import load_plan

    path: Path = tmp_path_factory.mktemp("plan") / "plan.yaml"
    for content in (blob, f"name: p\nobjective: {{metric: {text}}}\ntrial: {{command: 'run {{lr}}'}}\n".encode()
                    + blob):
        path.write_bytes(content)
        try:
            plan = load_plan(path)
        except AutoresearchError as err:
            assert err.message
        else:
            assert_submittable(plan)


def test_a_range_near_the_float_limit_grids_within_its_bounds() -> None:
    # (high - low) * i overflowed to inf before dividing: an int range 0..1e308 raised OverflowError.
    for kind in ("int", None):
        values = Param(low=0, high=1e308, type=kind).grid_values()
        assert values[0] == 0 and all(0 <= v <= 1e308 for v in values) and len(values) == 5
