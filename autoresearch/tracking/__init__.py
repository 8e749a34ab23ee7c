"""The MLflow mirror of the ledger (docs/architecture.md, "mirror via outbox").

The ledger is the truth; MLflow is the record people read. A background syncer
(``python -m autoresearch.tracking``, one per ``$AUTORESEARCH_HOME``, guarded by
``tracking.lock``) copies jobs, trials, loops, metrics, decisions and LLM-call
traces into MLflow with ``log_batch``, remembering how far it got in the ledger
(``tracking_runs``, ``tracking_state``, ``tracking_outbox``), so a crash at any
line replays at most one batch, which MLflow de-duplicates.

The engine never imports this package: what it needs (:func:`kick`, :func:`attempt_env`)
and :func:`record_llm_call` live in :mod:`autoresearch.store.outbox` (stdlib only) and are
re-exported here. This module itself stays cheap to import; the heavy parts live in
``_sync`` (the mirror) and ``_daemon`` (the background loop) and are imported lazily.

    kick(home)                  start the background syncer unless one runs (~1 ms)
    sync(home)                  one foreground pass; returns a SyncReport
    prepare_runs(home, ...)     create the MLflow runs of trials before they launch
    log_report(home, ...)       attach a loop's report files to its MLflow run (via the outbox)
    log_to_mlflow(ledger, view) the same for a written loop report; a failure is printed, not raised
    record_llm_call(home, ...)  store one LLM call; the syncer emits it as a trace
    attempt_env(ledger, job_id) MLFLOW_* variables for a launching attempt
    start_run()                 inside a trial: the job's own MLflow run, active
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

from autoresearch.store.outbox import (
    KICK_FILE,
    LOCK_FILE,
    LOG_FILE,
    TRIAL_TAG,
    attempt_env,
    background_enabled,
    default_uri,
    kick,
    record_llm_call,
    tracking_enabled,
    tracking_uri,
)

if TYPE_CHECKING:
    from autoresearch.store.ledger import Ledger
    from autoresearch.tracking._sync import SyncReport

__all__ = ["KICK_FILE", "LOCK_FILE", "LOG_FILE", "TRIAL_TAG", "attempt_env", "background_enabled", "default_uri",
           "kick", "log_report", "log_to_mlflow", "prepare_runs", "record_llm_call", "start_run", "sync",
           "tracking_enabled", "tracking_uri"]


def sync(home: str | os.PathLike[str] | None = None, *, uri: str | None = None,
         max_batches: int | None = None) -> SyncReport:
    """One foreground pass of the mirror (imports mlflow). Raises TrackingError on an
    unusable tracking URI; everything else is retried by the next pass."""
    from autoresearch.tracking._sync import Syncer, fail_fast_http

    with fail_fast_http():
        return Syncer(home, uri=uri).run_once(max_batches=max_batches)


def prepare_runs(home: str | os.PathLike[str] | Ledger | None, trial_ids: list[int]) -> dict[int, str]:
    """Create the MLflow runs of trials (and their loop's parent run) ahead of launch, so
    the attempts get ``MLFLOW_RUN_ID``. Imports mlflow: call it from the loop's worker
    thread, between writing the trial row and submitting its job. Returns trial → run id;
    a tracking failure returns {} (the trial still runs; the syncer catches up)."""
    from autoresearch.errors import TrackingError
    from autoresearch.tracking._sync import Syncer, fail_fast_http

    try:
        with fail_fast_http():  # a tracking outage must not hold trials for MLflow's retries
            return Syncer(home).prepare_trials(trial_ids)
    except TrackingError as err:
        print(f"autoresearch: tracking: {err.render()}", file=sys.stderr)
        return {}


def log_report(home: str | os.PathLike[str] | Ledger | None, loop_id: int, report_dir: str | os.PathLike[str],
               attempts: int = 3) -> str | None:
    """Attach ``report_dir`` to loop ``loop_id``'s MLflow run (under ``report/``) through the
    outbox, syncing in the foreground so the caller gets the run id. Returns it, or None
    when the loop's run is not available (the background syncer sends the files later).
    Imports mlflow. Raises when the sync keeps failing or MLflow refuses the files.

    The background syncer may be creating the MLflow database at the same moment (the
    first loop in a fresh home), so a failed sync is retried after a pause."""
    import logging
    import time

    from autoresearch.errors import TrackingError
    from autoresearch.store import outbox
    from autoresearch.store.ledger import Ledger

    ledger = home if isinstance(home, Ledger) else Ledger(home)
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    entry = outbox.record_report(ledger, loop_id, report_dir)
    for attempt in range(attempts):
        try:
            sync(ledger.home)
            break
        except Exception:
            if attempt == attempts - 1:
                raise
            time.sleep(1.0 + attempt)
    row = outbox.entry(ledger, entry)
    if row is None or row["done_at"] is None:
        return None
    ref = str(row["sent_ref"] or "")
    if ref.startswith("error:"):
        raise TrackingError(ref.removeprefix("error:").strip())
    return ref or None


def log_to_mlflow(ledger: Ledger, view: Any, attempts: int = 3) -> str | None:
    """Attach a loop's written report (a :class:`~autoresearch.loop.views.LoopView` with its
    ``report_dir``) to the loop's MLflow run; returns the run id (None when tracking is off or fails).

    :func:`log_report` does the writing (it retries while the background syncer may be
    creating the MLflow database); a failure is reported here, since the report on disk is
    what matters."""
    if not tracking_enabled() or view.report_dir is None:
        return None
    try:
        return log_report(ledger.home, view.loop_id, view.report_dir, attempts=attempts)
    except Exception as error:  # noqa: BLE001 - the report on disk is what matters; retried, then reported
        print(f"autoresearch: could not log the report to MLflow ({error}); it is on disk, and "
              f"`autoresearch report {view.name}` logs it again", file=sys.stderr)
        return None


def start_run() -> Any:
    """Inside a job: make the job's MLflow run the active run and return it.

    Use it when the job logs to MLflow itself and may have started before its run
    existed (``MLFLOW_RUN_ID`` unset): ``import mlflow; start_run(); mlflow.log_metric(...)``.
    """
    import mlflow

    from autoresearch.tracking._sync import Syncer

    if os.environ.get("MLFLOW_RUN_ID"):
        return mlflow.start_run()
    job = os.environ.get("AUTORESEARCH_JOB_ID")
    if not job:
        return mlflow.start_run()
    syncer = Syncer(os.environ.get("AUTORESEARCH_HOME"))
    run_id = syncer.ensure_job_run(int(job))
    mlflow.set_tracking_uri(syncer.uri)
    return mlflow.start_run(run_id=run_id)

