"""Ledger metrics → MLflow, batched: the ``metrics`` cursor and each run's ``metric_rowid``.

The cursor moves only after MLflow accepted the batch; a replay sends the very same
points (timestamps come from the ledger), which MLflow's SQL store drops as duplicates.
"""

from __future__ import annotations

import math
import re
from typing import Any

from autoresearch.metrics import best_source
from autoresearch.tracking._common import Mirror, SyncReport

METRIC_WINDOW = 20_000  # ledger rows read per pass step
BATCH = 1_000  # MLflow's limit per log_batch
_BAD_NAME = re.compile(r"[^\w\-. /:]")


def _metric_name(name: str) -> str:
    return _BAD_NAME.sub("_", name)[:250] or "_"


def _run_of_job(syncer: Mirror, job_id: int, report: SyncReport) -> tuple[str | None, str]:
    row = syncer.store.run_of_job(job_id)
    if row is None:
        return None, f"job:{job_id}"
    if row is not None and row["run_id"] and row["error"] is None:
        return str(row["run_id"]), row["entity"]
    if row is not None and row["error"] is not None:
        return None, row["entity"]
    job = syncer.store.unsynced_job(job_id)
    run_id = syncer.sync_job(job, report) if job is not None else None
    return run_id, row["entity"]


def _points(syncer: Mirror, rows: list[Any], job_id: int) -> list[Any]:
    from mlflow.entities import Metric

    reported = syncer.store.reported_names(job_id)
    points = []
    for r in best_source(rows, reported=reported):  # rows are a window: the reported names are the job's
        value = r["value"]
        try:
            number = math.nan if value is None else float(value)
        except (TypeError, ValueError):
            syncer.warn(f"value:{job_id}:{r['name']}",
                        f"job {job_id}: metric {r['name']!r} has a non-numeric value {value!r}; skipped "
                        "(report numbers only)")
            continue
        points.append(Metric(_metric_name(r["name"]), number, int(r["ts"] * 1000), int(r["step"])))
    return points


def sync_metrics(syncer: Mirror, report: SyncReport, max_batches: int | None = None) -> None:
    cursor = syncer.cursor("metrics")
    while True:
        rows = syncer.store.points_after(cursor, METRIC_WINDOW)
        if not rows:
            return
        by_job: dict[int, list[Any]] = {}
        for r in rows:
            by_job.setdefault(r["job_id"], []).append(r)
        for job_id, job_rows in by_job.items():
            run_id, entity = _run_of_job(syncer, job_id, report)
            if run_id is None:
                continue  # blocked: its points wait in the ledger and are backfilled once it is fixed
            points = _points(syncer, job_rows, job_id)
            try:
                syncer.log_metrics(run_id, points)
            except Exception as err:
                syncer.mark_blocked(entity, err)
                continue
            report.metrics += len(points)
            report.batches += (len(points) + BATCH - 1) // BATCH
            syncer.store.points_sent(entity, job_rows[-1]["rid"])
        cursor = rows[-1]["rid"]
        syncer.move_cursor("metrics", cursor)
        if max_batches is not None and report.batches >= max_batches:
            report.pending = True
            return


def backfill(syncer: Mirror, job_id: int, run_id: str, report: SyncReport) -> None:
    """A run that was blocked is writable again: send the points that waited for it."""
    row = syncer.store.metric_rowid_of(run_id)
    upto = syncer.cursor("metrics")
    if row is None:
        return
    rows = syncer.store.job_points(job_id, row["metric_rowid"], upto)
    if rows:
        points = _points(syncer, rows, job_id)
        syncer.log_metrics(run_id, points)
        report.metrics += len(points)
        syncer.store.backfilled(row["entity"], rows[-1]["rid"])


def bulk_log(store: Any, run_id: str, points: list[Any]) -> None:
    """Points into MLflow's own SQL store in one transaction: one ``INSERT OR IGNORE`` executed
    for all points and one update of the run's latest values, instead of log_batch's ORM
    objects, 1,000 points a call (issue 16: 100k points cold took 16.8 s on SQLite).

    The same rows log_batch writes (values sanitized by the store: NaN as 0 with is_nan, inf
    as the largest float); a replay of points already there is ignored (the table's key is
    the whole point), as log_batch ignores duplicates. A deleted run is refused as there.
    Only for a SqlAlchemyStore on SQLite, whose internals (mlflow 3.17) this uses: any other
    store, or a change in them, goes through log_batch (:meth:`Syncer.log_metrics`)."""
    from mlflow.store.tracking.dbmodels.models import SqlMetric
    from sqlalchemy.dialects.sqlite import insert

    rows: list[dict[str, Any]] = []
    latest: dict[str, dict[str, Any]] = {}
    for p in points:
        is_nan, value = store.sanitize_metric_value(p.value)
        row = {"run_uuid": run_id, "key": p.key, "value": value, "timestamp": p.timestamp, "step": p.step,
               "is_nan": is_nan}
        rows.append(row)
        best = latest.get(p.key)
        if best is None or (p.step, p.timestamp, value) > (best["step"], best["timestamp"], best["value"]):
            latest[p.key] = row
    if not rows:
        return
    table = SqlMetric.__table__
    with store.ManagedSessionMaker(read_only=False) as session:
        store._check_run_is_active(store._get_run(run_uuid=run_id, session=session))
        session.execute(insert(table).on_conflict_do_nothing(), rows)  # one executemany
        # the run's latest value per key: one candidate per key, compared with what is stored
        store._update_latest_metrics_if_necessary([SqlMetric(**row) for row in latest.values()], session)
