"""The mirror reads live metrics of a job on a backend profile from the profile's own home
(the ledger stores the profile's name; config.yaml of that home says what it is)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from autoresearch.engine import jobs
from autoresearch.engine.runtime import Runtime
from autoresearch.tracking._store import MirrorStore
from autoresearch.tracking._sync import Syncer
from tests.conftest import wait_for


def test_live_metrics_of_a_profiles_job_are_ingested(tmp_path: Path, home: Path) -> None:
    other = tmp_path / "other-home"  # not $AUTORESEARCH_HOME: the profile exists only here
    other.mkdir()
    (other / "config.yaml").write_text("backends: {beta: {kind: local, node_name: node-b}}\n")
    runtime = Runtime(other, "beta")
    script = "import time; print('loss: 0.5', flush=True); time.sleep(30)"
    job = jobs.submit(runtime, {"command": [sys.executable, "-c", script], "workdir": os.getcwd()})
    try:
        wait_for(lambda: b"loss" in runtime.backend.read_log(runtime.jobs.latest_attempt(job)["external_id"]))
        wait_for(lambda: (runtime.tick(), runtime.jobs.job(job)["state"])[1] == "running")
        syncer = Syncer.__new__(Syncer)  # the live-ingest half only: no MLflow client
        syncer.ledger, syncer.store, syncer._backends, syncer._warned = runtime.ledger, MirrorStore(runtime.ledger), {}, set()
        syncer._ingest_live()
        assert not syncer._warned
        assert [(r["name"], r["value"]) for r in runtime.jobs.metric_points(job)] == [("loss", 0.5)]
    finally:
        jobs.cancel(runtime, [job])
        wait_for(lambda: (runtime.tick(), runtime.jobs.job(job)["state"])[1] == "cancelled")
