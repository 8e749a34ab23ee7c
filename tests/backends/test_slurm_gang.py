"""Gangs on a real 2-node Slurm (the kit with two slurmd): every member sees the torchrun
contract, set per task from Slurm's own facts, and the members meet over TCP at MASTER_ADDR:
MASTER_PORT; a member that fails gives the attempt its own exit code, not srun's SIGTERM."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from autoresearch.api import Api
from autoresearch.backends._slurm import SlurmBackend
from autoresearch.backends._slurm_wrap import PORT_BASE, PORT_SPAN, first_host, master_port
from tests.conftest import wait_state
from tests.runtime.test_gangs import RENDEZVOUS

PY = sys.executable
KEYS = ('("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "NODE_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", '
        '"SLURM_PROCID", "SLURM_NODEID", "AUTORESEARCH_NODE", "CUDA_VISIBLE_DEVICES")')
CHECKED = RENDEZVOUS.replace(RENDEZVOUS[RENDEZVOUS.index("keys = ("):RENDEZVOUS.index("\nenv = ")], f"keys = {KEYS}")


@pytest.fixture
def gapi(home: Path, slurm_two_nodes: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("SLURM_CONF", slurm_two_nodes.conf)
    yield Api(home, SlurmBackend(conf=slurm_two_nodes.conf))
    subprocess.run(["scancel", "--me"], env={"SLURM_CONF": slurm_two_nodes.conf, "PATH": "/usr/bin:/bin"},
                   capture_output=True, timeout=30)


def test_a_two_node_gang_gets_the_torchrun_contract_per_member_and_meets(gapi: Api, tmp_path: Path) -> None:
    view = gapi.submit({"command": [PY, "-c", CHECKED], "nodes": 2, "gpus": 1, "cpus": 1, "memory": "256M",
                        "timeout": "5m", "workdir": str(tmp_path)})
    done = wait_state(gapi, view.id, ("succeeded", "failed"), timeout=120)
    text = gapi.logs(view.id).text
    assert done.state == "succeeded", text
    envs = sorted((json.loads(line[4:]) for line in text.splitlines() if line.startswith("ENV ")),
                  key=lambda e: e["RANK"])
    assert [e["RANK"] for e in envs] == ["0", "1"] == [e["SLURM_PROCID"] for e in envs]
    assert [e["NODE_RANK"] for e in envs] == ["0", "1"] == [e["SLURM_NODEID"] for e in envs]
    assert len({e["AUTORESEARCH_NODE"] for e in envs}) == 2  # one member per node
    assert {e["WORLD_SIZE"] for e in envs} == {"2"} and {e["LOCAL_RANK"] for e in envs} == {"0"}
    assert {e["LOCAL_WORLD_SIZE"] for e in envs} == {"1"}
    assert {e["MASTER_ADDR"] for e in envs} == {"127.0.0.1"}  # the first node's NodeAddr in the kit
    [port] = {int(e["MASTER_PORT"]) for e in envs}
    assert PORT_BASE <= port < PORT_BASE + PORT_SPAN
    assert "RENDEZVOUS rank 0 met ranks [1]" in text and "RENDEZVOUS rank 1 ok" in text


FAILS = "import os, sys, time\nif os.environ['RANK'] == '1':\n    sys.exit(3)\ntime.sleep(120)\n"


def test_the_attempt_keeps_the_failing_members_exit_code(gapi: Api, tmp_path: Path) -> None:
    view = gapi.submit({"command": [PY, "-c", FAILS], "nodes": 2, "cpus": 1, "memory": "256M", "timeout": "5m",
                        "workdir": str(tmp_path), "max_retries": 0})
    done = wait_state(gapi, view.id, ("succeeded", "failed"), timeout=120)
    assert done.state == "failed"
    row = gapi._ledger.one("SELECT exit_code, signal, detail FROM attempts WHERE job_id=?", (view.id,))
    assert (row["exit_code"], row["signal"]) == (3, None), dict(row)
    assert "gang member 1" in gapi.logs(view.id).text


def test_first_host_of_a_slurm_hostlist() -> None:
    assert first_host("gpu[07-09,12],cpu1") == "gpu07"
    assert first_host("node1,node2") == "node1"
    assert first_host("vm-[0-1]") == "vm-0"
    assert first_host("a[3]-ib") == "a3-ib"
    assert first_host("") == ""


def test_master_port_is_derived_from_the_job_and_skips_busy_ports() -> None:
    first = master_port("4242", free=lambda p: True)
    assert first == master_port("4242", free=lambda p: True) and PORT_BASE <= first < PORT_BASE + PORT_SPAN
    assert master_port("4243", free=lambda p: True) != first
    busy = {first}
    second = master_port("4242", free=lambda p: p not in busy)
    assert second != first and PORT_BASE <= second < PORT_BASE + PORT_SPAN


def test_a_kit_that_fails_to_start_leaves_no_daemon_running(tmp_path: Path) -> None:
    from tests.backends.conftest import _installed, _kit_module

    if not _installed():
        pytest.skip("Slurm is not installed here")
    kit = _kit_module()
    with pytest.raises(SystemExit, match="did not come up"):
        kit.start(tmp_path / "kit", gpus=1, nodes=2, wait_s=0.0)  # no node can be idle within 0 s
    assert not any(kit.status(tmp_path / "kit").values()), kit.status(tmp_path / "kit")
