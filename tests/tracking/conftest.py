"""Fixtures for the MLflow mirror: a real ``mlflow server`` per session, and a loop in the ledger.

Tests drive the sync by hand (``AUTORESEARCH_SYNC=off``) unless they test the background
syncer itself, so what they assert does not depend on a race with a daemon.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class MlflowServer:
    """A real `mlflow server` on 127.0.0.1 that a test may stop and start again on the same port."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 90.0) -> None:
        log = open(self.root / "server.log", "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{self.root / 'server.db'}",
             "--artifacts-destination", str(self.root / "artifacts"), "--host", "127.0.0.1",
             "--port", str(self.port), "--workers", "1"],
            stdout=log, stderr=log, start_new_session=True, cwd=self.root,
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})  # no job-runner processes
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited: {(self.root / 'server.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=1) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        raise RuntimeError("mlflow server did not become healthy")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self.proc = None


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    server = MlflowServer(tmp_path_factory.mktemp("mlflow-server"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "server"])
def store(request: pytest.FixtureRequest, home: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The tracking URI a test mirrors into: the embedded SQLite default, or a real server."""
    monkeypatch.setenv("AUTORESEARCH_SYNC", "off")
    if request.param == "server":
        server = request.getfixturevalue("mlflow_server")
        if server.proc is None:
            server.start()
        monkeypatch.setenv("MLFLOW_TRACKING_URI", server.uri)
        return str(server.uri)
    return f"sqlite:///{home.resolve() / 'mlflow.db'}"


@pytest.fixture
def quiet(home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The embedded store, synced by hand."""
    monkeypatch.setenv("AUTORESEARCH_SYNC", "off")
    return home


def client(uri: str) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def make_loop(api: Any, name: str, plan: dict[str, Any] | None = None) -> int:
    """A loop row, as the loop controller writes it."""
    now = time.time()
    with api._ledger.tx() as c:
        cur = c.execute("INSERT INTO loops(name, plan, state, experiment, created_at, updated_at) "
                        "VALUES (?,?,?,?,?,?)", (name, json.dumps(plan or {"name": name}), "running", "", now, now))
        return int(cur.lastrowid or 0)


def make_decision(api: Any, loop_id: int, kind: str = "propose", rationale: str = "", **fields: Any) -> int:
    now = time.time()
    with api._ledger.tx() as c:
        cur = c.execute(
            "INSERT INTO decisions(loop_id, kind, inputs, outputs, rationale, proposer, tokens_in, tokens_out, "
            "cost_usd, latency_s, created_at) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (loop_id, kind, json.dumps(fields.get("inputs", {})), json.dumps(fields.get("outputs", {})), rationale,
             json.dumps(fields.get("proposer", {"kind": "random"})), fields.get("tokens_in", 0),
             fields.get("tokens_out", 0), fields.get("cost_usd", 0.0), fields.get("latency_s", 0.0), now))
        return int(cur.lastrowid or 0)


def make_trial(api: Any, loop_id: int, decision_id: int, params: dict[str, Any], proposer: str = "random",
               patch: str | None = None, parent_trial: int | None = None, seed: int | None = None) -> int:
    now = time.time()
    with api._ledger.tx() as c:
        cur = c.execute(
            "INSERT INTO trials(loop_id, decision_id, parent_trial, params, patch, seed, proposer, state, "
            "created_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?,?)",
            (loop_id, decision_id, parent_trial, json.dumps(params), patch, seed, proposer, "queued", now, now))
        return int(cur.lastrowid or 0)


def submit_trial(api: Any, trial_id: int, command: list[str], workdir: Path) -> int:
    """Submit a trial's job the way the loop does: tagged with its trial id, then linked back."""
    view = api.submit({"command": command, "workdir": str(workdir), "tags": {"autoresearch.trial_id": str(trial_id)}})
    with api._ledger.tx() as c:
        c.execute("UPDATE trials SET job_id=?, state='running', updated_at=? WHERE id=?", (view.id, time.time(),
                                                                                          trial_id))
    return int(view.id)


def metric_history(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client(uri).get_metric_history(run_id, key))
