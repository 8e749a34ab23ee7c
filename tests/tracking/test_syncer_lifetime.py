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
        started = time.monotonic()
        code = proc.wait(timeout=60)  # (today: never, while the job runs)
        assert code == 0, (tmp_path / "syncer.log").read_text()
        assert time.monotonic() - started < 40
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
