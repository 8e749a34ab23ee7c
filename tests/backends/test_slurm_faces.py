"""The faces on a Slurm backend: the digits plan runs through Slurm and lands in MLflow; the MCP tools work."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from autoresearch.api import Api
from autoresearch.backends._slurm import SlurmBackend
from autoresearch.loop.controller import Controller
from autoresearch.loop.plan import parse_plan
from tests.conftest import wait_state
from tests.tools.conftest import connect, text

DIGITS = Path(__file__).resolve().parents[2] / "examples" / "digits"


def test_the_digits_plan_runs_on_slurm_and_lands_in_mlflow(home: Path, slurm: Any, monkeypatch: Any) -> None:
    pytest.importorskip("sklearn")
    monkeypatch.setenv("AUTORESEARCH_SYNC", "off")  # synced by hand below, so the assertion does not race a daemon
    data = yaml.safe_load((DIGITS / "plan.yaml").read_text())
    # The example as written, made smaller for the suite (the full plan's wall is in the Slurm bench).
    data.update(budget={"trials": 2, "parallel": 2}, backend={"kind": "slurm", "options": {"conf": slurm.conf}})
    data.pop("repeats", None)
    data.pop("early_stop", None)  # two trials: nothing to stop early
    data["trial"]["command"] = data["trial"]["command"].replace("--epochs 20", "--epochs 2")
    plan = parse_plan(data, base_dir=DIGITS)

    view = Controller(plan, home=home).run()

    assert view.counts == {"succeeded": 2}, view
    api = Api(home)
    jobs = api._ledger.query("SELECT id, backend FROM jobs")
    assert {r["backend"] for r in jobs} == {"slurm"} and len(jobs) == 2
    from autoresearch import tracking
    from autoresearch.store.outbox import tracking_uri
    from tests.tracking.conftest import client

    tracking.sync(home)
    mlflow = client(tracking_uri(home))
    [experiment] = [e for e in mlflow.search_experiments() if e.name == "digits-mlp"]
    runs = mlflow.search_runs([experiment.experiment_id])
    trial_runs = [r for r in runs if "val_loss" in r.data.metrics]
    assert len(trial_runs) == 2, [r.data.tags for r in runs]


@pytest.mark.anyio
async def test_mcp_tools_submit_follow_and_read_logs_on_slurm(home: Path, slurm: Any, workdir: Path) -> None:
    from autoresearch.tools.server import build_server

    api = Api(home, SlurmBackend(conf=slurm.conf))
    server = build_server(api, root=workdir)
    async with connect(server) as mcp:
        sub = await mcp.call_tool("submit", {"command": [sys.executable, "-c", "print('loss: 0.25')"], "gpus": 1})
        assert not sub.is_error, text(sub)
        job_id = sub.structured_content["id"]
        wait_state(api, job_id, "succeeded", timeout=60)
        status = await mcp.call_tool("status", {"job_id": job_id})
        assert status.structured_content["job"]["state"] == "succeeded"
        logs = await mcp.call_tool("logs", {"job_id": job_id})
        assert "loss: 0.25" in text(logs)
        too_big = await mcp.call_tool("submit", {"command": ["true"], "gpus": 64})
        assert too_big.is_error and "[capacity]" in text(too_big) and "hint" in text(too_big)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_a_cli_submit_to_slurm_imports_none_of_the_heavy_packages(home: Path, slurm: Any) -> None:
    """The CLI's submit through a Slurm profile (the backend, its checks, sbatch) stays on the fast path:
    no pydantic, rich, yaml, mlflow, ... (the check can fail: tests/runtime/test_cli_imports.py)."""
    from tests.runtime.test_cli_imports import loaded

    assert loaded("submit", "--backend", "slurm", "--workdir", str(home.parent), "--", "true") == []
