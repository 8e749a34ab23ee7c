"""The mirror heals (issue 13, item 8): a failed sync is retried with back-off while anything is
unmirrored, with no new kick, and ``status``/``sync --status`` say that the mirror is behind and why.

The race is reproduced with the real store: another MLflow client that has created part of the
same SQLite database (tables made, migrations not recorded yet) when our syncer starts, and
finishes it a moment later."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_for, wait_state
from tests.tracking.conftest import MlflowServer


def _syncer(home: Path, log: Path, **env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "autoresearch.tracking", "--home", str(home), "--idle", "2"],
                            stdout=subprocess.DEVNULL, stderr=open(log, "wb"),
                            env={**os.environ, "AUTORESEARCH_SYNC_RETRY_S": "0.5", **env})


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def _half_made(full: Path, target: Path) -> tuple[str, str]:
    """Copy a complete MLflow database to ``target`` as another client leaves it mid-creation: its
    last table and its schema version not written yet. Returns what is missing (the table's SQL, the version)."""
    shutil.copy(full, target)
    with sqlite3.connect(target) as conn:
        version = conn.execute("SELECT version_num FROM alembic_version").fetchone()[0]
        name, sql = conn.execute("SELECT name, sql FROM sqlite_master WHERE type='table' AND name NOT LIKE "
                                 "'alembic%' ORDER BY rowid DESC LIMIT 1").fetchone()
        conn.execute("DROP TABLE alembic_version")
        conn.execute(f"DROP TABLE {name}")
    return sql, version


def _finish(target: Path, sql: str, version: str) -> None:
    """The other client completes the database (the table, the version), as MLflow's own creation would."""
    with sqlite3.connect(target, timeout=30) as conn:
        conn.execute(sql.replace("CREATE TABLE", "CREATE TABLE IF NOT EXISTS", 1))
        conn.execute("CREATE TABLE IF NOT EXISTS alembic_version (version_num VARCHAR(32) NOT NULL PRIMARY KEY)")
        conn.execute("DELETE FROM alembic_version")
        conn.execute("INSERT INTO alembic_version VALUES (?)", (version,))


@pytest.mark.timeout(400)
def test_a_store_creation_race_heals_without_a_new_kick(api: Any, quiet: Path, tmp_path: Path) -> None:
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    job = api.submit({"command": ["true"], "workdir": str(tmp_path)}).id
    wait_state(api, job, "succeeded")
    full = tmp_path / "full.db"
    SqlAlchemyStore(f"sqlite:///{full}", (tmp_path / "art").as_uri())
    sql, version = _half_made(full, quiet / "mlflow.db")
    log = tmp_path / "syncer.log"
    proc = _syncer(quiet, log)
    try:
        # it fails, says why, and stays (today: it gives up for good at the first failure)
        lag = wait_for(api.mirror_lag, timeout=120)
        assert "MLflow mirror behind" in lag and "1 jobs" in lag, lag
        assert proc.poll() is None, log.read_text()
        out = subprocess.run([sys.executable, "-m", "autoresearch.cli", "status"], capture_output=True, text=True,
                             timeout=120, env={**os.environ, "AUTORESEARCH_HOME": str(quiet)})
        assert "warning: MLflow mirror behind" in out.stderr, out.stderr
        _finish(quiet / "mlflow.db", sql, version)
        # no kick: the back-off finds the store whole and mirrors the job
        run = wait_for(lambda: api._ledger.one("SELECT run_id FROM tracking_runs WHERE entity=? AND run_id IS NOT "
                                               "NULL", (f"job:{job}",)), timeout=120)
        assert run["run_id"]
        wait_for(lambda: api.mirror_lag() is None and api.mirror_status()["error"] is None, timeout=60)
    finally:
        _stop(proc)
    assert "sync works again" in log.read_text()


@pytest.mark.timeout(400)  # an mlflow server starts in the middle
def test_a_server_down_at_start_is_retried_and_reported(api: Any, quiet: Path, tmp_path: Path) -> None:
    server = MlflowServer(tmp_path / "server")  # its port is chosen; nothing listens on it yet
    (tmp_path / "server").mkdir()
    job = api.submit({"command": ["true"], "workdir": str(tmp_path)}).id
    wait_state(api, job, "succeeded")
    log = tmp_path / "syncer.log"
    proc = _syncer(quiet, log, MLFLOW_TRACKING_URI=server.uri)
    try:
        lag = wait_for(api.mirror_lag, timeout=120)
        assert server.uri in lag and "retrying in" in lag, lag
        server.start()
        run = wait_for(lambda: api._ledger.one("SELECT run_id FROM tracking_runs WHERE entity=? AND run_id IS NOT "
                                               "NULL", (f"job:{job}",)), timeout=180)
        assert run["run_id"]
        wait_for(lambda: api.mirror_lag() is None and api.mirror_status()["error"] is None, timeout=60)
    finally:
        _stop(proc)
        server.stop()


@pytest.mark.timeout(300)
def test_a_foreground_sync_waits_for_a_creation_in_progress_instead_of_failing(api: Any, quiet: Path,
                                                                               tmp_path: Path) -> None:
    """Another process of ours (the loop's run maker) is creating ``mlflow.db`` under the creation
    lock when ``autoresearch sync`` starts: the sync waits for it, then mirrors; it never opens the
    half-made file (which fails: "table ... already exists", "duplicate column name")."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    from autoresearch.store.outbox import creation_lock

    job = api.submit({"command": ["true"], "workdir": str(tmp_path)}).id
    wait_state(api, job, "succeeded")
    full = tmp_path / "full.db"
    SqlAlchemyStore(f"sqlite:///{full}", (tmp_path / "art").as_uri())
    env = {**os.environ, "AUTORESEARCH_HOME": str(quiet)}
    with creation_lock(quiet) as held:
        assert held
        sql, version = _half_made(full, quiet / "mlflow.db")
        sync = subprocess.Popen([sys.executable, "-m", "autoresearch.cli", "sync"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            with pytest.raises(subprocess.TimeoutExpired):  # it waits for the lock (past its mlflow import)
                sync.wait(20)
        finally:
            if sync.poll() is not None:
                print(sync.communicate())
        _finish(quiet / "mlflow.db", sql, version)
    out, err = sync.communicate(timeout=180)
    assert sync.returncode == 0, (out, err)
    run = api._ledger.one("SELECT run_id FROM tracking_runs WHERE entity=?", (f"job:{job}",))
    assert run is not None and run["run_id"], (out, err)
