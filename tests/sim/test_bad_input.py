"""A sim config that contradicts itself is refused before anything runs, with a hint (invariant 8)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from autoresearch.backends import get_backend
from autoresearch.backends.sim import SimBackend
from autoresearch.errors import PlanError, SpecError
from autoresearch.loop.plan import parse_plan

PLAN = {"name": "s", "objective": {"metric": "loss"}, "trial": {"command": "train --lr {lr}", "gpus": 1},
        "space": {"lr": {"low": 0.001, "high": 0.1, "log": True}}}


@pytest.mark.parametrize(("options", "words"), [
    ({"faults": {"xid": -0.1}}, "faults.xid"),
    ({"faults": {"thermal": float("nan")}}, "faults.thermal"),
    ({"faults": {"nccl_hang": 1e300}}, "faults.nccl_hang"),
    ({"faults": {"repair": "soon"}}, "faults.repair"),
    ({"faults": {"meltdown": 1}}, "unknown key"),
    ({"nodes": [{"name": "a", "count": 0, "gpus": 8}]}, "nodes[0].count"),
    ({"nodes": [{"name": "a", "count": 2, "gpus": -1}]}, "nodes[0].gpus"),
    ({"nodes": [{"name": "../etc", "count": 2}]}, "nodes[0].name"),
    ({"nodes": [{"name": "<b>x</b>", "count": 2}]}, "nodes[0].name"),
    ({"nodes": [{"name": "a", "count": 10**9}]}, "nodes[0].count"),
    ({"nodes": [{"name": "a", "speed": 0}]}, "nodes[0].speed"),
    ({"nodes": [{"name": "a"}, {"name": "a"}]}, "named twice"),
    ({"nodes": []}, "nodes"),
    ({"nodes": "many"}, "nodes"),
    ({"seed": -1}, "seed"),
    ({"seed": "x"}, "seed"),
    ({"clock": {"mode": "fast"}}, "clock.mode"),
    ({"clock": {"speed": -5}}, "clock.speed"),
    ({"trial": {"model": "magic"}}, "trial.model"),
    ({"trial": {"steps": 0}}, "trial.steps"),
    ({"trial": {"seconds": "forever"}}, "trial.seconds"),
    ({"trial": {"checkpoint_every": -3}}, "trial.checkpoint_every"),
    ({"trial": {"model": "curve"}}, "trial.file"),
    ({"trial": {"model": "function", "function": "nocolon"}}, "trial.function"),
])
def test_a_contradictory_fleet_is_refused_with_a_hint(tmp_path: Path, options: dict[str, Any], words: str) -> None:
    with pytest.raises(SpecError) as err:
        SimBackend(home_dir=str(tmp_path), **options)
    assert words in err.value.message and err.value.hint
    assert "\n" not in err.value.message
    assert not (tmp_path / "sim").exists() or not any((tmp_path / "sim").glob("*/epoch"))  # nothing was set up


def test_a_curve_file_with_no_steps_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "empty.json"
    path.write_text(json.dumps({"format": "autoresearch-curves/1", "workload": "w", "metric": "m", "mode": "min",
                                "space": {"x": [1, 2]}, "step_unit": "epoch", "max_step": 1,
                                "configs": [{"params": {"x": 1}, "values": [], "seconds": 1}]}))
    with pytest.raises(SpecError) as err:
        SimBackend(home_dir=str(tmp_path), trial={"model": "curve", "file": str(path)})
    assert err.value.hint
    with pytest.raises(SpecError):
        SimBackend(home_dir=str(tmp_path), trial={"model": "curve", "file": str(tmp_path / "missing.json")})


def test_more_gpus_per_job_than_any_node_type_or_a_gang_larger_than_the_fleet(tmp_path: Path) -> None:
    sim = get_backend("sim", nodes=[{"name": "a", "count": 2, "gpus": 4}, {"name": "b", "count": 1, "gpus": 8}],
                      home_dir=str(tmp_path))

    class Spec:
        def __init__(self, gpus: int, nodes: int) -> None:
            self.gpus, self.nodes = gpus, nodes

    sim.check(Spec(8, 1))
    sim.check(Spec(4, 3))
    with pytest.raises(SpecError, match="largest node type has 8") as err:
        sim.check(Spec(16, 1))
    assert "at most 8" in err.value.hint
    with pytest.raises(SpecError, match="fleet has 1 such nodes"):
        sim.check(Spec(8, 2))


def test_a_plan_on_the_sim_loads_and_a_bad_one_is_a_plan_error(home: Path) -> None:
    good = {**PLAN, "backend": {"kind": "sim", "nodes": [{"name": "h100", "count": 32, "gpus": 8, "speed": 1.2}],
                                "trial": {"model": "duration", "steps": 50, "seconds": "1h", "sigma": 0.3,
                                          "checkpoint_every": "10m"},
                                "faults": {"xid": 0.001, "node_loss": 0.0005, "repair": "4h"}, "seed": 7,
                                "clock": {"mode": "events", "speed": 1}}}
    plan = parse_plan(good, "plan.yaml", home=home)
    assert plan.backend.kind == "sim" and plan.backend.options["seed"] == 7
    bad = {**good, "backend": {**good["backend"], "faults": {"xid": -1}}}
    with pytest.raises(PlanError) as err:
        parse_plan(bad, "plan.yaml", home=home)
    assert "faults.xid" in err.value.message and err.value.hint
    typo = {**good, "backend": {**good["backend"], "fautls": {}}}
    with pytest.raises(PlanError, match="fautls"):
        parse_plan(typo, "plan.yaml", home=home)


def test_the_cli_refuses_a_bad_sim_profile_and_an_impossible_gang(home: Path) -> None:
    def cli(where: Path, config: str, *args: str) -> subprocess.CompletedProcess[str]:
        where.mkdir(parents=True, exist_ok=True)
        (where / "config.yaml").write_text(config)
        return subprocess.run([sys.executable, "-m", "autoresearch.cli", "--home", str(where), *args],
                              capture_output=True, text=True, timeout=120)

    out = cli(home / "a", "backends:\n  bad: {kind: sim, faults: {xid: -2}}\n", "submit", "--backend", "bad", "--",
              "train")
    assert out.returncode == 2 and "faults.xid" in out.stderr and "hint:" in out.stderr
    assert "Traceback" not in out.stderr
    out = cli(home / "b", "backends:\n  small: {kind: sim, nodes: [{name: a, count: 2, gpus: 4}]}\n",
              "submit", "--backend", "small", "--gpus", "4", "--nodes", "3", "--", "train")
    assert out.returncode == 2 and "fleet has 2 such nodes" in out.stderr and "hint: ask for at most 2" in out.stderr
    assert "Traceback" not in out.stderr


def test_the_published_schema_takes_a_sims_options_inline_and_refuses_a_typo() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    from autoresearch.loop.plan import plan_schema

    validator = jsonschema.Draft202012Validator(plan_schema())
    inline = {**PLAN, "backend": {"kind": "sim", "nodes": [{"name": "h", "count": 2, "gpus": 8}], "seed": 3,
                                  "clock": {"mode": "events"}}}
    assert validator.is_valid(inline)
    assert validator.is_valid({**PLAN, "backend": {"kind": "sim", "options": {"seed": 3}}})
    assert not validator.is_valid({**PLAN, "backend": {"kind": "sim", "fautls": {}}})
    assert not validator.is_valid({**PLAN, "backend": {"kind": "local", "bogus": 1}})
