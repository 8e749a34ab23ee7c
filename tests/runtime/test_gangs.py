"""Gang jobs on the local backend (issue 11): all-or-nothing placement of N members on the host,
the torchrun environment (checked by a real rendezvous over 127.0.0.1), a failing member ending
the gang's attempt, and impossible gangs refused before anything runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from autoresearch.errors import CapacityError
from tests.conftest import wait_for, wait_state

PY = sys.executable

# Rank 0 listens on MASTER_ADDR:MASTER_PORT and waits for every other rank to say hello; each
# member prints its environment. A wrong address, port, world size or rank never completes.
RENDEZVOUS = r"""
import json, os, socket, sys, time
keys = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "NODE_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
        "CUDA_VISIBLE_DEVICES", "AUTORESEARCH_NODE")
env = {k: os.environ.get(k) for k in keys}
print("ENV " + json.dumps(env), flush=True)
addr, port = env["MASTER_ADDR"], int(env["MASTER_PORT"])
world, rank = int(env["WORLD_SIZE"]), int(env["RANK"])
if rank == 0:
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((addr, port))
    srv.listen()
    srv.settimeout(60)
    seen = set()
    while len(seen) < world - 1:
        conn, _ = srv.accept()
        seen.add(int(conn.recv(16).decode()))
        conn.sendall(b"ok")
        conn.close()
    print(f"RENDEZVOUS rank 0 met ranks {sorted(seen)}", flush=True)
else:
    deadline = time.time() + 60
    while True:
        try:
            conn = socket.create_connection((addr, port), timeout=5)
            break
        except OSError:
            if time.time() > deadline:
                sys.exit(9)
            time.sleep(0.1)
    conn.sendall(str(rank).encode())
    assert conn.recv(2) == b"ok"
    print(f"RENDEZVOUS rank {rank} ok", flush=True)
"""


def submit(api: Any, command: list[str], **spec: Any) -> int:
    spec.setdefault("workdir", os.getcwd())
    return int(api.submit({"command": command, **spec}).id)


@pytest.fixture
def four_gpus(home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AUTORESEARCH_GPUS", "4")
    return home


def test_two_member_gang_gets_torchrun_env_and_meets_over_loopback(four_gpus: Path, api: Any) -> None:
    job = submit(api, [PY, "-c", RENDEZVOUS], nodes=2, gpus=2)
    view = wait_state(api, job, ("succeeded", "failed"), timeout=60)
    text = api.logs(job).text
    assert view.state == "succeeded", text
    envs = sorted((json.loads(line[4:]) for line in text.splitlines() if line.startswith("ENV ")),
                  key=lambda e: e["RANK"])
    assert [e["RANK"] for e in envs] == ["0", "1"] and [e["NODE_RANK"] for e in envs] == ["0", "1"]
    assert {e["WORLD_SIZE"] for e in envs} == {"2"} and {e["LOCAL_RANK"] for e in envs} == {"0"}
    assert {e["LOCAL_WORLD_SIZE"] for e in envs} == {"1"}
    assert {e["MASTER_ADDR"] for e in envs} == {"127.0.0.1"} and len({e["MASTER_PORT"] for e in envs}) == 1
    slots = [set(e["CUDA_VISIBLE_DEVICES"].split(",")) for e in envs]
    assert all(len(s) == 2 for s in slots) and not slots[0] & slots[1]  # each member its own GPU slots
    assert "RENDEZVOUS rank 0 met ranks [1]" in text and "RENDEZVOUS rank 1 ok" in text
    # the placement and the port are recorded with the launch
    row = api._ledger.one("SELECT data FROM events WHERE job_id=? AND kind='launch'", (job,))
    data = json.loads(row["data"])
    assert data["master_port"] == int(envs[0]["MASTER_PORT"]) and len(data["members"]) == 2


def test_gang_is_all_or_nothing_on_the_host(four_gpus: Path, api: Any) -> None:
    hog = submit(api, ["sleep", "60"], gpus=1)
    wait_state(api, hog, "running")
    gang = submit(api, [PY, "-c", "print('ran')"], nodes=2, gpus=2)  # 4 slots, 3 free: waits whole
    assert api.status(gang).state == "queued"
    assert api._ledger.one("SELECT COUNT(*) AS n FROM attempts WHERE job_id=?", (gang,))["n"] == 0
    api.cancel([hog])
    assert wait_state(api, gang, "succeeded", timeout=30).state == "succeeded"
    assert api.logs(gang).text.count("ran") == 2


def test_a_failing_member_ends_the_gang_with_its_exit(four_gpus: Path, api: Any) -> None:
    script = ("import os, sys, time\n"
              "if os.environ['RANK'] == '1':\n    sys.exit(3)\n"
              "print('rank 0 waiting', flush=True)\ntime.sleep(120)\n")
    job = submit(api, [PY, "-c", script], nodes=2, gpus=1, grace=1, max_retries=0)
    view = wait_state(api, job, ("failed", "succeeded"), timeout=60)
    assert (view.state, view.exit_code, view.end_reason) == ("failed", 3, "exit")
    assert "gang member 1 (RANK=1) ended with exit 3; stopping the other 1 member(s)" in api.logs(job).text
    run_dir = api._ledger.one("SELECT external_id FROM attempts WHERE job_id=?", (job,))["external_id"]
    state = json.loads(Path(run_dir, "state.json").read_text())
    wait_for(lambda: all(not Path(f"/proc/{pid}").exists() for pid in [state["pid"]]))  # rank 0 was stopped
    assert json.loads(Path(run_dir, "exit.json").read_text())["failed_member"] == 1


def test_impossible_gang_is_refused_before_anything_runs(four_gpus: Path, api: Any) -> None:
    with pytest.raises(CapacityError, match="gang of 3 members with 2 GPU") as err:
        submit(api, ["true"], nodes=3, gpus=2)
    assert "at most 2 node(s)" in err.value.hint
    assert api._ledger.one("SELECT COUNT(*) AS n FROM jobs")["n"] == 0


def test_cli_refuses_an_impossible_gang_with_exit_2_and_a_hint(four_gpus: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    out = subprocess.run([sys.executable, "-m", "autoresearch.cli", "submit", "--nodes", "5", "--gpus", "1", "--",
                          "true"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert out.returncode == 2, out
    assert "needs 5 GPU slots but this host has 4" in out.stderr and "hint: ask for at most 4 node(s)" in out.stderr
    assert "Traceback" not in out.stderr


def test_on_a_fleet_each_member_gets_its_node_and_keeps_its_slots(home: Path) -> None:
    from autoresearch.api import Api
    from autoresearch.backends.fake import FakeBackend

    fake = FakeBackend(nodes=3, gpus=1)
    api = Api(home, backend=fake)
    gang = submit(api, ["train"], nodes=2, gpus=1)
    request = fake.attempt(f"{gang}.1").request
    assert len({node for node, _ in request.alloc}) == 2 and (request.node, request.gpu_ids) == request.alloc[0]
    assert request.env["WORLD_SIZE"] == "2" and request.env["MASTER_ADDR"] == request.alloc[0][0]
    # later passes see every member's slot taken (not member 0's only): two more jobs, one free node
    first, second = submit(api, ["train"], gpus=1), submit(api, ["train"], gpus=1)
    api.status(first)
    busy = {node for node, _ in request.alloc}
    placed = [fake.attempt(f"{j}.1").request.node for j in (first, second) if f"fake:{j}.1" in
              {a.external_id for a in fake.attempts()}]
    assert len(placed) == 1 and placed[0] not in busy
    assert sum(n.gpus_free for n in api.nodes()) == 0  # nodes counts every member too
