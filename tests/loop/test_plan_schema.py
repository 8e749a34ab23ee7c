"""The schema is the loader (issue 13, item 4): ``autoresearch schema plan`` accepts every plan
``load_plan`` accepts (the examples, the shorthands people write) and rejects what it rejects (the
bad-plan corpus), checked with a real JSON Schema validator on the CLI's own output."""

from __future__ import annotations

import json
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from autoresearch.errors import PlanError
from autoresearch.loop.plan import load_plan

jsonschema = pytest.importorskip("jsonschema")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(ROOT.glob("examples/**/plan*.yaml"))
BAD = sorted((ROOT / "tests/loop/corpus/bad_plans").glob("*.yaml"))
# Arithmetic JSON Schema cannot express; the schema's description names each one.
LOADER_ONLY = {"step_below_precision": "a step moves a value", "tiny_step": "100000 points",
               "too_wide_range": "too wide to sample", "prior_outside_range": "a prior's guess lies inside the range",
               "prior_not_a_choice": "or among the choices", "warm_start_self": "not the loop itself"}

GOOD = {  # shorthands and forms the loader accepts, beyond the examples
    "shorthands": """name: s
objective: {metric: loss, goal: max}
trial: {command: "python train.py --lr {lr} --w {w}", timeout: 1h30m, grace: 0, memory: 16G, env: {N: 3}}
space: {lr: {low: 1.0e-4, high: 0.1, log: true}, w: [16, 32]}
proposer: random
early_stop: asha
budget: {trials: 4, parallel: 2, wall: 90s}
tags: {team: vision}
""",
    "shell_and_numbers": """name: n
objective: {metric: acc, goal: maximize}
trial: {command: "echo '{x}' | python train.py", shell: true, timeout: 300, memory: 4096, cpus: 1.5}
space: {x: {low: 1, high: 9, step: 2}}
backend: {kind: local}
repeats: {seeds: 2}
""",
    "priors_and_steps": """name: w
objective: {metric: loss}
trial: {command: "python train.py --lr {lr} --h {h}"}
space: {lr: {low: 1.0e-4, high: 0.1, log: true, prior: {guess: 0.01, confidence: 0.7}}, h: {choices: [16, 32], prior: 32}}
proposer: {kind: bohb, options: {gamma: 0.2}}
budget: {trials: 40, steps: 500, stop_in_flight: true}
warm_start: [w-old]
""",
    "agent_without_space": """name: a
objective: {metric: loss}
trial: {command: python train.py}
proposer: {kind: agent}
""",
}
BAD_EXTRA = {  # refused by the loader; the schema must refuse them too
    "zero_trials": "name: z\nobjective: {metric: l}\ntrial: {command: t {x}}\nspace: {x: [1]}\nbudget: {trials: 0}\n",
    "empty_space": "name: e\nobjective: {metric: l}\ntrial: {command: t}\nspace: {}\n",
    "log_at_zero": "name: g\nobjective: {metric: l}\ntrial: {command: t {x}}\nspace: {x: {low: 0, high: 1, log: true}}\n",
    "both_kinds": "name: b\nobjective: {metric: l}\ntrial: {command: t {x}}\nspace: {x: {low: 0, high: 1, choices: [1]}}\n",
    "bad_goal": "name: b\nobjective: {metric: l, goal: lowest}\ntrial: {command: t {x}}\nspace: {x: [1]}\n",
    "bad_duration": "name: d\nobjective: {metric: l}\ntrial: {command: t {x}, timeout: soon}\nspace: {x: [1]}\n",
    "bad_name": "name: 'a b'\nobjective: {metric: l}\ntrial: {command: t {x}}\nspace: {x: [1]}\n",
    "numeric_tag": "name: t\nobjective: {metric: l}\ntrial: {command: t {x}}\nspace: {x: [1]}\ntags: {run: 1}\n",
    "unknown_stopper": "name: u\nobjective: {metric: l}\ntrial: {command: t {x}}\nspace: {x: [1]}\nearly_stop: hyperband\n",
}


@cache
def cli_schema() -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "autoresearch.cli", "schema", "plan"], capture_output=True,
                         text=True, timeout=120, check=True)
    schema: dict[str, Any] = json.loads(out.stdout)
    jsonschema.Draft202012Validator.check_schema(schema)
    return schema


def schema_accepts(text: str) -> bool:
    """As a JSON Schema tool sees the plan: YAML that is not a JSON document (NaN, .inf, bytes
    that are not UTF-8, nesting too deep to read) is no valid instance."""
    try:
        data = yaml.safe_load(text)
        json.dumps(data, allow_nan=False)
    except (ValueError, RecursionError, yaml.YAMLError):
        return False
    return jsonschema.Draft202012Validator(cli_schema()).is_valid(data)


def loader_accepts(path: Path) -> bool:
    try:
        load_plan(path)
    except PlanError:
        return False
    return True


def read(path: Path) -> str:
    return path.read_bytes().decode("utf-8", errors="surrogateescape")


def test_there_is_something_to_check() -> None:
    assert EXAMPLES and len(BAD) >= 20


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.parent.name for p in EXAMPLES])
def test_schema_accepts_every_example(path: Path) -> None:
    assert loader_accepts(path)
    assert schema_accepts(read(path)), "the published schema refuses a plan the loader runs"


@pytest.mark.parametrize("name", sorted(GOOD))
def test_schema_accepts_what_the_loader_accepts(name: str, tmp_path: Path) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(GOOD[name])
    assert loader_accepts(path) and schema_accepts(GOOD[name])


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_schema_rejects_the_bad_plan_corpus(path: Path) -> None:
    assert not loader_accepts(path)
    if path.stem in LOADER_ONLY:  # arithmetic beyond JSON Schema: the schema says the loader checks it
        assert LOADER_ONLY[path.stem] in cli_schema()["description"]
        return
    assert not schema_accepts(read(path)), "the schema accepts a plan the loader refuses"


@pytest.mark.parametrize("name", sorted(BAD_EXTRA))
def test_schema_rejects_what_the_loader_rejects(name: str, tmp_path: Path) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(BAD_EXTRA[name])
    assert not loader_accepts(path) and not schema_accepts(BAD_EXTRA[name])
