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
from autoresearch.backends._slurm_cli import expand_hostlist, placed_on
from autoresearch.backends._slurm_wrap import PORT_BASE, PORT_SPAN, first_host, master_port
from tests.conftest import wait_for, wait_state
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


def test_a_gangs_attempt_records_and_shows_every_node_slurm_gave_it(gapi: Api, tmp_path: Path,
                                                                     slurm_two_nodes: Any) -> None:
    go = tmp_path / "go"
    view = gapi.submit({"command": f"while [ ! -e {go} ]; do sleep 0.2; done", "shell": True, "nodes": 2,
                        "gpus": 1, "cpus": 1, "memory": "256M", "timeout": "5m", "workdir": str(tmp_path)})
    names = slurm_two_nodes.kit.node_names(2)

    def placed() -> Any:
        attempts = gapi.status(view.id).attempt_list  # type: ignore[union-attr]
        return attempts and attempts[0].nodes == names and attempts[0]

    attempt = wait_for(placed, timeout=90)
    assert attempt.node == names[0] and attempt.gpus == ["0"]
    row = gapi._ledger.one("SELECT alloc FROM attempts WHERE job_id=?", (view.id,))
    assert json.loads(row["alloc"]) == [[names[0], ["0"]], [names[1], ["0"]]]
    go.write_text("")
    assert wait_state(gapi, view.id, ("succeeded", "failed"), timeout=120).state == "succeeded"


def test_a_slurm_host_list_is_expanded_and_placed_per_node() -> None:
    assert expand_hostlist("gpu[07-09,12],cpu1") == ["gpu07", "gpu08", "gpu09", "gpu12", "cpu1"]
    assert expand_hostlist("r[1-2]n[01-02]") == ["r1n01", "r1n02", "r2n01", "r2n02"]
    assert expand_hostlist("x[a-b]") == [] and expand_hostlist("x[[1]]") == [] and expand_hostlist("") == []
    assert len(expand_hostlist("n[0-999999999]")) == 1024  # bounded, whatever Slurm (or a forger) says
    placed = placed_on({"nodes": "vm-[0-1]", "gres_detail": ["gpu:1(IDX:0)", "gpu:2(IDX:0-1)"]})
    assert placed == {"node": "vm-0", "gpu_ids": ("0",), "members": (("vm-0", ("0",)), ("vm-1", ("0", "1")))}
    assert placed_on({"nodes": "vm-0", "gres_detail": ["gpu:2(IDX:0-1)"]}) == {"node": "vm-0", "gpu_ids": ("0", "1")}
    named = {"nodes": "ignored[0-1]", "job_resources": {"allocated_nodes": [{"nodename": "a"}, {"nodename": "b"}]}}
    assert placed_on(named)["members"] == (("a", ()), ("b", ()))
    assert placed_on({"nodes": "bad\x1b[0m"}) == {} and placed_on(None) == {}
