"""plan.yaml validation: every bad input is one clear PlanError, before anything launches."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from autoresearch.errors import PlanError
from autoresearch.loop.plan import load_plan, parse_plan

GOOD = """\
name: demo
objective: {metric: val_loss, goal: minimize}
trial:
  command: python train.py --lr {lr} --hidden {hidden}
space:
  lr: {low: 1.0e-4, high: 0.3, log: true}
  hidden: {choices: [32, 64]}
proposer: {kind: tpe}
budget: {trials: 4, parallel: 2}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text(text)
    return path


def error_of(tmp_path: Path, text: str) -> PlanError:
    with pytest.raises(PlanError) as info:
        load_plan(write(tmp_path, text))
    return info.value


def test_good_plan_resolves_workdir_and_renders_commands(tmp_path: Path) -> None:
    plan = load_plan(write(tmp_path, GOOD))
    assert plan.trial.workdir == str(tmp_path.resolve())
    assert plan.render_command({"lr": 0.001, "hidden": 64}, seed=0, trial_id=1) == [
        "python", "train.py", "--lr", "0.001", "--hidden", "64"]
    assert plan.space["hidden"].choices == [32, 64]


def test_malformed_yaml_names_line_and_column(tmp_path: Path) -> None:
    err = error_of(tmp_path, GOOD.replace("budget: {trials: 4, parallel: 2}", "budget: {trials: 4, parallel: 2"))
    assert "line 9" in err.message or "line 10" in err.message
    assert "column" in err.message


def test_unknown_key_names_the_nearest_valid_key(tmp_path: Path) -> None:
    err = error_of(tmp_path, GOOD.replace("budget: {trials: 4", "budget: {trails: 4"))
    assert "budget.trails" in err.message
    assert "'trials'" in err.hint
    err = error_of(tmp_path, GOOD + "early_stopping: {kind: asha}\n")
    assert "'early_stop'" in err.hint


def test_placeholder_without_parameter(tmp_path: Path) -> None:
    err = error_of(tmp_path, GOOD.replace("--hidden {hidden}", "--hidden {hiden}"))
    assert "{hiden}" in err.message and "did you mean {hidden}" in err.message


@pytest.mark.parametrize(("old", "new", "words"), [
    ("lr: {low: 1.0e-4, high: 0.3, log: true}", "lr: {low: 0.3, high: 0.1}", "low (0.3) > high (0.1)"),
    ("budget: {trials: 4, parallel: 2}", "budget: {trials: 0, parallel: 2}", "trials is 0"),
    ("proposer: {kind: tpe}", "proposer: {kind: tpee}", "unknown proposer kind 'tpee'"),
    ("hidden: {choices: [32, 64]}", "hidden: {choices: []}", "choices is empty"),
])
def test_bad_values(tmp_path: Path, old: str, new: str, words: str) -> None:
    err = error_of(tmp_path, GOOD.replace(old, new))
    assert words in err.message
    assert err.hint


def test_empty_space_is_an_error(tmp_path: Path) -> None:
    text = GOOD.replace("--lr {lr} --hidden {hidden}", "").split("space:")[0] + "space: {}\n"
    err = error_of(tmp_path, text)
    assert "space is empty" in err.message


def test_missing_workdir_and_file(tmp_path: Path) -> None:
    err = error_of(tmp_path, GOOD.replace("  command:", "  workdir: nowhere\n  command:"))
    assert "trial.workdir" in err.message
    with pytest.raises(PlanError, match="cannot read"):
        load_plan(tmp_path / "missing.yaml")


def test_parse_plan_accepts_shorthands() -> None:
    plan = parse_plan({"name": "x", "objective": {"metric": "acc", "goal": "max"},
                       "trial": {"command": "run {a}"}, "space": {"a": [1, 2, 3]}, "proposer": "grid",
                       "early_stop": "median"})
    assert plan.objective.goal == "maximize"
    assert plan.proposer.kind == "grid"
    assert plan.early_stop is not None and plan.early_stop.kind == "median"
    assert plan.space["a"].grid_values() == [1, 2, 3]


def test_schema_command_prints_json_schema(home: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "autoresearch.cli", "schema", "plan"], capture_output=True,
                         text=True, check=True)
    schema = json.loads(out.stdout)
    assert {"name", "objective", "trial", "space", "budget", "proposer"} <= set(schema["properties"])


def test_cli_plan_error_is_one_line_with_hint(tmp_path: Path, home: Path) -> None:
    path = write(tmp_path, GOOD.replace("budget: {trials: 4", "budget: {trails: 4"))
    out = subprocess.run([sys.executable, "-m", "autoresearch.cli", str(path)], capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.startswith("error: ") and "hint: did you mean 'trials'" in out.stderr
    assert "Traceback" not in out.stderr
