"""The background syncer's lifetime is bounded: jobs that look active but never change do
not keep it forever, and it leaves at once when its home is deleted, even while it backs
off from a tracking server that is down."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_for, wait_state
from tests.tracking.conftest import free_port


def _syncer(home: Path, log: Path, **env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "autoresearch.tracking", "--home", str(home), "--idle", "1"],
                            stdout=subprocess.DEVNULL, stderr=open(log, "wb"), env={**os.environ, **env})


def test_a_job_that_never_changes_does_not_keep_the_syncer(api: Any, quiet: Path, tmp_path: Path) -> None:
    job = api.submit({"command": ["sleep", "300"], "workdir": str(tmp_path)}).id
    wait_state(api, job, "running")
    proc = _syncer(quiet, tmp_path / "syncer.log", AUTORESEARCH_SYNC_BUSY_S="3")
    try:
        code = proc.wait(timeout=100)  # (before: never, while the job runs: it sleeps 300 s)
        assert code == 0, (tmp_path / "syncer.log").read_text()
        assert api.status(job).state == "running"
        run = api._ledger.one("SELECT run_id FROM tracking_runs WHERE entity=?", (f"job:{job}",))
        assert run is not None and run["run_id"]  # it did mirror the job before it left
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        api.cancel([job])
        wait_state(api, job, "cancelled")


def test_the_syncer_leaves_when_its_home_is_deleted_during_an_outage(api: Any, quiet: Path, tmp_path: Path) -> None:
    job = api.submit({"command": ["true"], "workdir": str(tmp_path)}).id
    wait_state(api, job, "succeeded")
    # A ledger already bound to a tracking server, with the job's run made: the server is down now.
    dead = f"http://127.0.0.1:{free_port()}"
    now = time.time()
    with api._ledger.tx() as c:
        c.execute("INSERT INTO tracking_state(name, value) VALUES ('uri', ?)", (dead,))
        c.execute("INSERT INTO tracking_runs(entity, run_id, experiment_id, created_at, updated_at) "
                  "VALUES (?, 'f00d', '0', ?, ?)", (f"job:{job}", now, now))
    log = tmp_path / "syncer.log"
    proc = _syncer(quiet, log, MLFLOW_TRACKING_URI=dead)
    try:
        wait_for(lambda: "(try 1)" in log.read_text(), timeout=60)  # backing off from the dead server
        shutil.rmtree(quiet)
        gone = time.monotonic()
        assert proc.wait(timeout=30) == 0, log.read_text()  # (today: up to 10 minutes of retries)
        assert time.monotonic() - gone < 10
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_sync_of_a_home_removed_as_it_starts_makes_nothing_there(api: Any, quiet: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """mlflow makes the parent directories of a SQLite store it opens: a sync whose home was removed
    after it bound the ledger to the store (then it imports mlflow: seconds) made the home again, with a
    fresh mlflow.db in it."""
    from autoresearch.errors import TrackingError
    from autoresearch.tracking._sync import Syncer

    job = api.submit({"command": ["true"], "workdir": str(tmp_path)}).id
    wait_state(api, job, "succeeded")
    bind = Syncer._bind_uri

    def bind_then_remove(self: Syncer, uri: str | None) -> str:
        bound = bind(self, uri)
        shutil.rmtree(quiet)
        return bound

    monkeypatch.setattr(Syncer, "_bind_uri", bind_then_remove)
    with pytest.raises(TrackingError) as err:
        Syncer(api._ledger).run_once()
    assert "was removed" in err.value.message, err.value.render()
    assert not quiet.exists(), sorted(os.listdir(quiet))


def test_the_syncer_leaves_at_once_when_its_home_is_deleted_while_it_makes_the_store(
        api: Any, quiet: Path, tmp_path: Path) -> None:
    """Deleted while the syncer imported mlflow to make its database (seconds), it went on: mlflow made the
    home again with a fresh database (mlflow.db, mlartifacts/), and the syncer mirrored into it for ~20 s.
    It leaves now, and the home stays gone."""
    ids = [j.id for j in api.submit_many([{"command": ["true"], "workdir": str(tmp_path)}] * 20)]
    for job in ids:
        wait_state(api, job, "succeeded")
    log = tmp_path / "syncer.log"
    proc = _syncer(quiet, log)
    try:
        # Bound to the store (the ledger says so), and now importing mlflow to make it: the home goes.
        wait_for(lambda: api._ledger.one("SELECT 1 FROM tracking_state WHERE name='home_id'"), timeout=120,
                 interval=0.02)
        shutil.rmtree(quiet, ignore_errors=True)  # (ignore: the syncer may add a file as it goes)
        gone = time.monotonic()
        assert proc.wait(timeout=60) == 0
        assert time.monotonic() - gone < 10  # it went on ~20 s; slack for a loaded machine
        if quiet.exists():  # something it made while rmtree ran: removed again, and nothing comes back
            shutil.rmtree(quiet)
        time.sleep(1)
        assert not quiet.exists(), sorted(os.listdir(quiet))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
