"""A plan's backend (a profile name or a kind with options) and its trials' containers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from autoresearch.errors import PlanError
from autoresearch.loop._launch import trial_spec
from autoresearch.loop.plan import parse_plan
from tests.conftest import wait_for
from tests.runtime.test_cli import cli


def plan(**extra: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"name": "d", "objective": {"metric": "loss"},
                            "trial": {"command": "python t.py --lr {lr}"},
                            "space": {"lr": {"low": 0.001, "high": 0.1, "log": True}}}
    for key, value in extra.items():
        base[key] = {**base[key], **value} if key == "trial" else value
    return base


@pytest.mark.parametrize(("backend", "choice"), [
    (None, (None, {})),
    ("cluster", ("cluster", {})),
    ({"kind": "docker", "image": "python:3.11"}, ("docker", {"image": "python:3.11"})),
    ({"kind": "local", "options": {"node_name": "n"}}, ("local", {"node_name": "n"})),
])
def test_backend_forms(backend: Any, choice: tuple[Any, Any], home: Path) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.yaml").write_text("backends: {cluster: {kind: local, node_name: c}}\n")
    data = plan() if backend is None else plan(backend=backend)
    assert parse_plan(data).backend_choice() == choice


@pytest.mark.parametrize(("backend", "words"), [
    ({"image": "python:3.11"}, "give kind"),
    ({"kind": "docker", "imag": "x"}, "did you mean 'image'"),
    ({"kind": "local", "options": {"node_nme": "x"}}, "did you mean 'node_name'"),
    (42, "backend"),
    ("clustr", "unknown backend 'clustr'"),  # and its hint lists the profiles and kinds
    ({"kind": "cluster", "node_nme": "x"}, "did you mean 'node_name'"),  # a profile's options plus the plan's
])
def test_bad_backends_are_one_plan_error(backend: Any, words: str, home: Path) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.yaml").write_text("backends: {cluster: {kind: local, node_name: c}}\n")
    with pytest.raises(PlanError) as err:
        parse_plan(plan(backend=backend))
    assert words in err.value.render()


def test_a_plans_digest_is_unchanged_by_the_new_fields() -> None:
    # Digests computed by the code before image/mounts existed: loops made then still resume.
    assert parse_plan(plan(backend={"kind": "local"}, trial={"env": {"A": "1"}})).digest() == "9a60195e4b474503"
    assert parse_plan(plan()).digest() == "e5e3de5e6aa3b6b0"
    assert parse_plan(plan(trial={"image": "python:3.11"})).digest() != "e5e3de5e6aa3b6b0"


def test_a_plan_naming_no_proposer_keeps_its_digest_across_the_new_defaults() -> None:
    # bohb and hyperband became the defaults after loops were made with tpe and asha unnamed: those
    # loops still resume, while naming a different kind is still a different plan.
    unnamed = parse_plan(plan())
    assert unnamed.proposer.kind == "bohb"
    assert unnamed.digest() == "e5e3de5e6aa3b6b0"
    assert parse_plan(plan(proposer={"kind": "random"})).digest() != unnamed.digest()
    stopped = parse_plan(plan(early_stop={"min_steps": 3}))
    assert stopped.early_stop is not None and stopped.early_stop.kind == "hyperband"
    assert stopped.digest() == parse_plan(plan(early_stop={"kind": "asha", "min_steps": 3})).digest()
    assert stopped.digest() != parse_plan(plan(early_stop={"kind": "median", "min_steps": 3})).digest()


def test_a_trials_image_and_mounts_reach_its_job_spec() -> None:
    p = parse_plan(plan(trial={"image": "pytorch/pytorch:2.3", "mounts": {"/data": "/srv/data"}}))
    row = {"id": 3, "seed": 0, "decision_id": 1, "role": "explore"}
    spec = trial_spec(p, 1, row, {"lr": 0.01}, ["python", "t.py"], "/tmp")
    assert spec["image"] == "pytorch/pytorch:2.3" and spec["mounts"] == {"/data": "/srv/data"}
    with pytest.raises(PlanError, match="NUL"):
        parse_plan(plan(trial={"mounts": {"/data": "/srv/\0"}}))


LOOP = """\
name: tiny
objective: {metric: loss}
trial:
  command: python -c "print('loss:', {x})"
  %s
space:
  x: {choices: [0.5]}
proposer: grid
budget: {trials: 1, parallel: 1}
"""


def test_an_image_on_a_local_loop_is_refused_naming_docker(home: Path, tmp_path: Path) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(LOOP % "image: python:3.11-slim")
    proc = cli(str(path), "--json", "--no-report", check=False)
    assert proc.returncode == 2 and "cannot run containers" in proc.stderr
    assert "docker" in proc.stderr.split("hint:")[1]


def test_run_backend_flag_puts_the_trials_on_that_profile(home: Path, tmp_path: Path) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.yaml").write_text("backends:\n  beta: {kind: local, node_name: node-b}\n")
    path = tmp_path / "plan.yaml"
    path.write_text(LOOP % "")
    cli(str(path), "--backend", "beta", "--json", "--no-report")
    jobs = json.loads(cli("list", "--json").stdout)["jobs"]
    assert len(jobs) == 1
    view = wait_for(lambda: (v := json.loads(cli("status", str(jobs[0]["id"]), "--json").stdout))["attempt_list"] and v)
    assert view["attempt_list"][0]["node"] == "node-b"
    proc = cli(str(path), "--backend", "gamma", "--json", "--no-report", check=False)
    assert proc.returncode == 2 and "unknown backend 'gamma'" in proc.stderr
