"""Crashes, outages and bad input: the mirror neither loses nor duplicates, and no trial fails for it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from autoresearch import tracking
from autoresearch.errors import TrackingError
from tests.conftest import wait_for, wait_state
from tests.tracking.conftest import (
    MlflowServer,
    client,
    free_port,
    make_decision,
    make_loop,
    metric_history,
)

CRASHING_SYNCS = """
import json, os, sys
from mlflow.tracking import MlflowClient
from autoresearch import tracking
from autoresearch.tracking import _metrics
real, real_bulk, real_many = MlflowClient.log_batch, _metrics.bulk_log, _metrics.bulk_log_many
codes = []
for mode, at in json.loads(sys.argv[1]):
    # Each crash in a process of its own, forked before anything touched the store: as fresh as a
    # new interpreter (no client, no store, no connection yet), without importing mlflow again.
    pid = os.fork()
    if pid:
        codes.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
        continue
    calls = [0]
    def log_batch(self, run_id, metrics=(), params=(), tags=(), **kw):
        if metrics:
            calls[0] += 1
            if mode == "before" and calls[0] == at:
                os._exit(9)  # killed before MLflow saw the batch
        out = real(self, run_id, metrics=metrics, params=params, tags=tags, **kw)
        if metrics and mode == "after" and calls[0] == at:
            os._exit(9)  # killed after MLflow took the batch, before the ledger cursor moved
        return out
    MlflowClient.log_batch = log_batch
    def bulk_log(store, run_id, points):  # the SQL store's bulk path (issue 16): killed the same ways
        calls[0] += 1
        if mode == "before" and calls[0] == at:
            os._exit(9)
        real_bulk(store, run_id, points)
        if mode == "after" and calls[0] == at:
            os._exit(9)
    _metrics.bulk_log = bulk_log
    def bulk_log_many(store, batches):  # the same, for several runs' points in one transaction
        calls[0] += 1
        if mode == "before" and calls[0] == at:
            os._exit(9)
        out = real_many(store, batches)
        if mode == "after" and calls[0] == at:
            os._exit(9)
        return out
    _metrics.bulk_log_many = bulk_log_many
    tracking.sync()
    os._exit(0)  # the sync finished: the crash point was never reached
print(json.dumps(codes))
"""


def _ledger_series(api: Any, job_id: int, name: str) -> list[tuple[int, float]]:
    rows = api._ledger.query("SELECT step, value FROM metrics WHERE job_id=? AND name=? ORDER BY step", (job_id, name))
    return [(r["step"], r["value"]) for r in rows]


def _run_of(uri: str, job_id: int) -> Any:
    runs = client(uri).search_runs(["0"], filter_string=f"tags.`autoresearch.job_id` = '{job_id}'")
    assert len(runs) == 1
    return runs[0]


@pytest.mark.parametrize("bulk", ["on", "off"])
def test_sync_killed_mid_batch_resumes_without_duplicate_or_gap(api: Any, quiet: Path, tmp_path: Path, bulk: str,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed before or after a batch reached MLflow, through the bulk SQL path and through log_batch."""
    monkeypatch.setenv("AUTORESEARCH_MIRROR_BULK", bulk)
    script = "from autoresearch import report\nfor i in range(2500):\n    report(step=i, loss=1/(i+1), acc=i/2500)\n"
    jobs = [api.submit({"command": [sys.executable, "-c", script], "workdir": str(tmp_path)}).id for _ in range(3)]
    for job in jobs:
        wait_state(api, job, "succeeded", timeout=60)
    # The bulk path writes a job's points in a few calls, log_batch in many: crash points that both reach.
    crashes = (("after", 1), ("before", 1), ("after", 1)) if bulk == "on" else (("after", 3), ("before", 4), ("after", 2))
    proc = subprocess.run([sys.executable, "-c", CRASHING_SYNCS, json.dumps(crashes)], capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0 and json.loads(proc.stdout) == [9, 9, 9], proc.stdout + proc.stderr[-2000:]
    tracking.sync()
    uri = tracking.tracking_uri(quiet)
    for job in jobs:
        run = _run_of(uri, job)
        for name in ("loss", "acc"):
            assert metric_history(uri, run.info.run_id, name) == _ledger_series(api, job, name)
        assert run.info.status == "FINISHED"


@pytest.mark.slow
def test_background_syncer_rides_out_a_server_outage(api: Any, home: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    server = MlflowServer(tmp_path)  # not started yet: the tracking server is down
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.uri)
    monkeypatch.setenv("AUTORESEARCH_SYNC", "on")  # the real background syncer, kicked by submit
    monkeypatch.setenv("AUTORESEARCH_SYNC_IDLE_S", "3")
    script = "from autoresearch import report\nfor i in range(50):\n    report(step=i, loss=1/(i+1))\n"
    job = api.submit({"command": [sys.executable, "-c", script], "workdir": str(tmp_path)}).id
    assert wait_state(api, job, "succeeded").state == "succeeded"  # work goes on while MLflow is down
    wait_for(lambda: "cannot reach" in (home / "tracking.log").read_text()
             or "unavailable" in (home / "tracking.log").read_text(), timeout=30)
    server.start()
    try:
        def mirrored() -> bool:
            runs = client(server.uri).search_runs(["0"], filter_string=f"tags.`autoresearch.job_id` = '{job}'")
            return bool(runs) and runs[0].info.status == "FINISHED"

        wait_for(mirrored, timeout=60, interval=0.5)
        run = _run_of(server.uri, job)
        assert metric_history(server.uri, run.info.run_id, "loss") == _ledger_series(api, job, "loss")
    finally:
        server.stop()


def test_malformed_or_unreachable_uri_is_a_clear_error_and_the_job_still_runs(
        api: Any, quiet: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "not a uri")
    job = api.submit({"command": [sys.executable, "-c", "print('loss: 1')"], "workdir": str(tmp_path)}).id
    assert wait_state(api, job, ("succeeded", "failed")).state == "succeeded"
    with pytest.raises(TrackingError) as bad:
        tracking.sync()
    assert "malformed" in bad.value.message and "MLFLOW_TRACKING_URI" in bad.value.hint

    with pytest.raises(TrackingError) as down:
        tracking.sync(uri=f"http://127.0.0.1:{free_port()}")
    assert down.value.details["transient"] and "retries" in down.value.hint
    out = subprocess.run([sys.executable, "-m", "autoresearch.cli", "sync"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 1 and "hint:" in out.stderr and "Traceback" not in out.stderr


def test_a_deleted_experiment_blocks_only_its_runs_until_restored(api: Any, quiet: Path, tmp_path: Path) -> None:
    def submit(experiment: str) -> int:
        script = "from autoresearch import report\nfor i in range(10):\n    report(step=i, loss=i)\n"
        job = api.submit({"command": [sys.executable, "-c", script], "workdir": str(tmp_path),
                          "experiment": experiment}).id
        wait_state(api, job, "succeeded")
        return int(job)

    submit("gone")
    tracking.sync()
    uri = tracking.tracking_uri(quiet)
    mlflow = client(uri)
    exp = mlflow.get_experiment_by_name("gone")
    mlflow.delete_experiment(exp.experiment_id)
    blocked, fine = submit("gone"), submit("kept")
    tracking.sync()
    info = api.mirror_status()
    assert [b["entity"] for b in info["blocked"]] == [f"job:{blocked}"]
    assert "restore" in info["blocked"][0]["error"]
    kept = mlflow.get_experiment_by_name("kept")
    assert mlflow.search_runs([kept.experiment_id])[0].data.tags["autoresearch.job_id"] == str(fine)

    mlflow.restore_experiment(exp.experiment_id)
    tracking.sync()
    runs = mlflow.search_runs([exp.experiment_id], filter_string=f"tags.`autoresearch.job_id` = '{blocked}'")
    assert len(runs) == 1 and len(metric_history(uri, runs[0].info.run_id, "loss")) == 10  # backfilled
    assert api.mirror_status()["blocked"] == []


def test_a_non_numeric_metric_is_skipped_with_a_warning(api: Any, quiet: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    job = api.submit({"command": [sys.executable, "-c", "print('loss: 1')\nprint('loss: 2')"],
                      "workdir": str(tmp_path)}).id
    wait_state(api, job, "succeeded")
    with api._ledger.tx() as c:  # a writer that put a string where a number belongs
        c.execute("INSERT INTO metrics(job_id, attempt, name, step, value, ts, source) VALUES (?,?,?,?,?,?,?)",
                  (job, 1, "oops", 0, "abc", time.time(), "report"))
    tracking.sync()
    assert "non-numeric value 'abc'" in capsys.readouterr().err
    uri = tracking.tracking_uri(quiet)
    run = _run_of(uri, job)
    assert metric_history(uri, run.info.run_id, "loss") == [(0, 1.0), (1, 2.0)]
    assert run.info.status == "FINISHED"


def test_llm_call_becomes_one_trace_linked_to_the_loop_run(api: Any, quiet: Path) -> None:
    loop = make_loop(api, "llm-loop")
    decision = make_decision(api, loop, "propose", rationale="try a wider net")
    t0 = time.time()
    call = tracking.record_llm_call(
        api._ledger.home, loop_id=loop, decision_id=decision, name="propose", model="claude-test",
        provider="anthropic", inputs={"messages": [{"role": "user", "content": "propose 2 configs"}]},
        outputs={"text": "lr=0.01"}, started_at=t0, ended_at=t0 + 1.5, tokens_in=100, tokens_out=20,
        prompt_name="propose", prompt_sha256="cd" * 32, temperature=0.2)
    tracking.sync()
    with api._ledger.tx() as c:  # as if the syncer died after creating the trace, before marking it sent
        c.execute("UPDATE tracking_outbox SET done_at=NULL, sent_ref='sending' WHERE id=?", (call,))
    tracking.sync()
    uri = tracking.tracking_uri(quiet)
    mlflow = client(uri)
    exp = mlflow.get_experiment_by_name("llm-loop")
    parent = mlflow.search_runs([exp.experiment_id], filter_string="tags.`autoresearch.kind` = 'loop'")[0]
    traces = mlflow.search_traces(locations=[exp.experiment_id])
    assert len(traces) == 1
    trace = traces[0]
    assert trace.info.tags["autoresearch.decision_id"] == str(decision)
    assert trace.info.trace_metadata.get("mlflow.sourceRun") == parent.info.run_id
    root = trace.data.spans[0]
    assert root.inputs["messages"][0]["content"] == "propose 2 configs"
    assert root.attributes["model"] == "claude-test"
