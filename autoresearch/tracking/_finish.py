"""Logs of ended attempts, and the end of runs once their jobs (or loops) are final.

A trial that will never run (skipped when its loop ended, refused at submit) has a run
(created ahead of its launch) but no job: its run ends ``KILLED`` (``FAILED`` for a refused
submit) with the tags ``autoresearch.trial_state`` and ``autoresearch.skipped`` (why), so
that the loop's parent run, which waits for its trials' runs, ends with the loop too.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from autoresearch.tracking._common import Mirror, SyncReport
from autoresearch.util.redact import redact

LOG_HEAD, LOG_TAIL = 256 << 10, 768 << 10  # attempt logs are capped at 1 MiB: head + tail
FINAL = {"succeeded": "FINISHED", "failed": "FAILED", "cancelled": "KILLED"}
NEVER_RAN = {"failed": "FAILED"}  # a trial ended without a job: refused at submit; else skipped (KILLED)
LOOP_FINAL = {"done": "FINISHED", "finished": "FINISHED", "completed": "FINISHED", "succeeded": "FINISHED",
              "failed": "FAILED", "stopped": "KILLED", "cancelled": "KILLED", "killed": "KILLED"}


def finish(syncer: Mirror, report: SyncReport) -> None:
    """Upload logs of ended attempts; terminate runs of final jobs once all their points are in."""
    cursor = syncer.cursor("metrics")
    if syncer.store.any_point_after(cursor):
        return  # points still waiting: finish later, or a run would end before its last point
    rows = syncer.store.job_runs_to_finish()
    syncer.artifact_locations([row["run_id"] for row in rows])  # one query, not one a log
    logs = syncer.store.attempt_logs(row["job_id"] for row in rows if row["logs_done"] < (row["ended_n"] or 0))
    uploaded: list[tuple[str, int]] = []  # (entity, logs done): recorded together, after the uploads
    for row in rows:
        try:
            _upload_logs(syncer, row, report, logs.get(row["job_id"], []), uploaded)
            if row["state"] in FINAL and row["trial_state"] != "paused":  # a paused trial's run goes on
                syncer.end_run(row["entity"], row["run_id"], FINAL[row["state"]],
                               int((row["ended_at"] or time.time()) * 1000), _ended(syncer, row["entity"], report))
        except Exception as err:
            syncer.mark_blocked(row["entity"], err)
    with syncer.store.batch():  # (a crash before it uploads those logs again: the same files)
        for entity, n in uploaded:
            syncer.store.logs_done(entity, n)
    _end_never_ran(syncer, report)
    syncer.flush()  # the trials' runs ended (in the ledger too) before their loop's run is looked at
    for loop in syncer.store.loop_runs_open():
        status = LOOP_FINAL.get(str(loop["state"]).lower())
        if status is None:
            continue
        if syncer.store.loop_has_open_trial_runs(loop["id"]):
            continue
        syncer.client.set_terminated(loop["run_id"], status, int(loop["updated_at"] * 1000))
        syncer.store.finished(loop["entity"])
        report.finished += 1


def _end_never_ran(syncer: Mirror, report: SyncReport) -> None:
    """End the runs of trials that ended without ever having a job (none will come), also a
    run whose creation was cut short (the write-ahead row has no run id: look for it by tag)."""
    for row in syncer.store.never_ran_runs():
        try:
            run_id = row["run_id"] or _find_run(syncer, row["entity"], row["experiment_id"])
            if run_id is None:
                syncer.store.never_ran_finished(row["entity"], None)
                continue
            syncer.log_batch(run_id, tags={"autoresearch.trial_state": row["state"],
                                      "autoresearch.skipped": row["failure"] or "not launched"}, entity=row["entity"])
            syncer.end_run(row["entity"], run_id, NEVER_RAN.get(row["state"], "KILLED"),
                           int((row["ended_at"] or time.time()) * 1000),
                           _never_ran_ended(syncer, row["entity"], run_id, report))
        except Exception as err:
            syncer.mark_blocked(row["entity"], err)


def _ended(syncer: Mirror, entity: str, report: SyncReport) -> Callable[[], None]:
    def done() -> None:
        syncer.store.finished(entity)
        report.finished += 1
    return done


def _never_ran_ended(syncer: Mirror, entity: str, run_id: str, report: SyncReport) -> Callable[[], None]:
    def done() -> None:
        syncer.store.never_ran_finished(entity, run_id)
        report.finished += 1
    return done


def _find_run(syncer: Mirror, entity: str, experiment_id: str | None) -> str | None:
    """The run a create cut short may have made (None: it made none)."""
    if not experiment_id:
        return None
    from mlflow.entities import ViewType

    found = syncer.client.search_runs([experiment_id],
                                      filter_string=f"tags.`autoresearch.entity` = '{syncer.home_id}/{entity}'",
                                      run_view_type=ViewType.ALL, max_results=1)
    return str(found[0].info.run_id) if found else None


def _upload_logs(syncer: Mirror, row: Any, report: SyncReport, attempts: list[Any],
                 uploaded: list[tuple[str, int]]) -> None:
    """The logs of a job's ended attempts not uploaded yet (``attempts``: the job's, in order); what
    went up is added to ``uploaded`` (entity, attempts done) for the caller to record."""
    upto = row["ended_n"] or 0
    attempts = [att for att in attempts if row["logs_done"] < att["n"] <= upto]
    if not attempts:
        return
    spec, secrets = syncer.job_spec(row["spec"])  # from the ledger, whichever process mirrors it
    # a resumed trial's later job (loop/pause.py) logs beside its first job's, not over them
    job = f"job-{row['job_id']}-" if (spec.get("tags") or {}).get("autoresearch.resumed_from_job") else ""
    for att in attempts:
        text = _read_capped(att["log_path"])
        syncer.log_text(row["run_id"], redact(text, secrets), f"logs/{job}attempt-{att['n']}.log")
        report.artifacts += 1
        uploaded.append((row["entity"], att["n"]))


def _read_capped(path: str) -> str:
    """An attempt log for MLflow: whole up to 1 MiB, else its head and its tail."""
    try:  # raw reads: no file object (its fstat, ioctl and seeks) for a file read once
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            if size <= LOG_HEAD + LOG_TAIL:
                return _read_all(fd).decode("utf-8", "replace")
            head = os.pread(fd, LOG_HEAD, 0)
            os.lseek(fd, size - LOG_TAIL, os.SEEK_SET)
            tail = _read_all(fd)
        finally:
            os.close(fd)
    except OSError:
        return ""
    cut = size - LOG_HEAD - LOG_TAIL
    return (head.decode("utf-8", "replace") + f"\n[... {cut} bytes cut by autoresearch ...]\n"
            + tail.decode("utf-8", "replace"))


def _read_all(fd: int) -> bytes:
    """What is left of ``fd`` to its end (a log still growing: what is there now, as ``read()``)."""
    chunks: list[bytes] = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
