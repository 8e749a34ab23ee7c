"""Where a user looks: `autoresearch health` (and as Slurm's HealthCheckProgram), `autoresearch
nodes`, `status` of a failed job, MCP cluster_status and status."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.health.conftest import FIXTURES, Fleet, configure, setup, submit

CLI = [sys.executable, "-m", "autoresearch.cli"]


def health(*args: str, fixture: str = "healthy", env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "AUTORESEARCH_NVML_FAKE": str(FIXTURES / f"{fixture}.json"), **(env or {})}
    return subprocess.run([*CLI, "health", *args], capture_output=True, text=True, timeout=60, env=full)


def test_health_prints_the_local_gpus_and_exits_0_when_healthy(home: Path) -> None:
    out = health()
    assert out.returncode == 0, out.stderr
    assert "NVIDIA H100" in out.stdout and "healthy" in out.stdout
    data = json.loads(health("--json", fixture="thermal").stdout)
    assert data["healthy"] is True and data["gpus"][1]["clock_event_reasons"] == ["SwThermal", "HwThermal"]
    assert any(line.startswith("throttling") for line in data["findings"])


def test_slurm_hc_is_silent_when_healthy_and_names_the_fault_with_exit_1_when_not(home: Path) -> None:
    ok = health("--slurm-hc")
    assert (ok.returncode, ok.stdout) == (0, "")
    bad = health("--slurm-hc", fixture="xid79")
    assert bad.returncode == 1 and "xid_79" in bad.stdout and "GPU 5" in bad.stdout
    assert health("--slurm-hc", "--expect-gpus", "8", fixture="missing_gpu").returncode == 1
    assert health("--slurm-hc", fixture="missing_gpu").returncode == 0  # without a count, 7 GPUs are 7 GPUs


def test_slurm_hc_drains_its_own_node_with_the_reason_when_asked(home: Path, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n")
    scontrol.chmod(scontrol.stat().st_mode | stat.S_IEXEC)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURMD_NODENAME": "gpu-17"}
    out = health("--slurm-hc", "--drain", fixture="ecc", env=env)
    assert out.returncode == 1 and "drained gpu-17" in out.stdout
    words = calls.read_text()
    assert "nodename=gpu-17 state=drain reason=autoresearch health: [hard] ecc_uncorrectable on gpu-17 GPU 3" in words
    assert health("--slurm-hc", "--drain", env=env).returncode == 0  # healthy: it only asks (show), never updates
    assert [c for c in calls.read_text().splitlines() if c.startswith("update")] == words.splitlines()


def test_invalid_thresholds_fail_the_health_command_with_a_hint(home: Path) -> None:
    configure(home, "patterns: ['(unclosed']")
    out = health()
    assert out.returncode == 2 and "does not compile" in out.stderr and "hint:" in out.stderr
    assert "Traceback" not in out.stderr
    (home / "config.yaml").unlink()
    bad = health("--expect-gpus", "-1")
    assert bad.returncode == 2 and "hint:" in bad.stderr


def test_nodes_and_status_show_health_at_the_terminal(home: Path, fleet: Fleet, capsys: Any,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from autoresearch.cli._render import render_job, render_nodes

    monkeypatch.setenv("COLUMNS", "300")
    fleet.set("fake-0", "xid79")
    api, fake = setup(home)
    job = submit(api, gpus=1, max_retries=0)
    fake.emit(f"{job}.1", "torch.OutOfMemoryError: CUDA out of memory.\n")
    fake.finish(f"{job}.1", 1)
    api._runtime.tick()
    render_nodes(api.cluster())
    render_job(api.status(job))
    out = capsys.readouterr().out
    assert "cordoned" in out and "xid_79 on fake-0 GPU 5" in out and "SINCE" in out
    assert "the program's error (user)" in out and "batch size" in out


@pytest.mark.anyio
async def test_mcp_cluster_status_and_status_say_it_in_few_tokens(home: Path, fleet: Fleet) -> None:
    from autoresearch.tools.server import build_server
    from tests.tools.conftest import connect

    fleet.set("fake-0", "xid79")
    fleet.set("fake-1", "thermal")
    api, fake = setup(home)
    job = submit(api, gpus=1, max_retries=0)
    fake.emit(f"{job}.1", "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or "
                          "device error.\n")
    fake.finish(f"{job}.1", 1)
    api._runtime.tick()
    async with connect(build_server(api, root=home)) as client:
        cluster = (await client.call_tool("cluster_status", {})).structured_content
        status = (await client.call_tool("status", {"job_id": job})).structured_content
    nodes = {n["name"]: n for n in cluster["nodes"]}
    assert nodes["fake-0"]["state"] == "cordoned" and len(nodes["fake-0"]["findings"]) <= 2
    assert cluster["degraded"] and cluster["degraded"][0].startswith("fake-1: health: ")
    assert status["job"]["failure_class"] == "infra-suspect" and "nccl_error" in status["job"]["failure_why"]
    assert status["job"]["attempt_list"][0]["failure_class"] == "infra-suspect"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
