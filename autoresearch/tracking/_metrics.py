"""Ledger metrics → MLflow, batched: the ``metrics`` cursor and each run's ``metric_rowid``.

The cursor moves only after MLflow accepted the batch; a replay sends the very same
points (timestamps come from the ledger), which MLflow's SQL store drops as duplicates.
"""

from __future__ import annotations

import math
import re
from typing import Any

from autoresearch.engine.metrics import best_source
from autoresearch.tracking._bulk import executemany
from autoresearch.tracking._common import Mirror, SyncReport

METRIC_WINDOW = 20_000  # ledger rows read per pass step
BATCH = 1_000  # MLflow's limit per log_batch
_BAD_NAME = re.compile(r"[^\w\-. /:]")


def _metric_name(name: str) -> str:
    return _BAD_NAME.sub("_", name)[:250] or "_"


def _run_of_job(syncer: Mirror, job_id: int, report: SyncReport, row: Any = ...) -> tuple[str | None, str]:
    """(the run id of a job's run, its entity); ``row``: the job's :meth:`run_of_job`, read in bulk."""
    if row is ...:
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


def _points(syncer: Mirror, rows: list[Any], job_id: int, reported: set[str] | None = None) -> list[Any]:
    """A job's ledger rows as MLflow points; ``reported``: the job's reported names (read in bulk)."""
    from mlflow.entities import Metric

    if reported is None:
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
        window: list[tuple[str, str, list[Any], int]] = []  # (entity, run id, points, last rowid)
        runs = syncer.store.runs_of_jobs(by_job)  # a query a table for the window, not two a job
        names = syncer.store.reported_names_of(by_job)
        for job_id, job_rows in by_job.items():
            run_id, entity = _run_of_job(syncer, job_id, report, runs.get(job_id))
            if run_id is None:
                continue  # blocked: its points wait in the ledger and are backfilled once it is fixed
            window.append((entity, run_id, _points(syncer, job_rows, job_id, names.get(job_id, set())),
                           job_rows[-1]["rid"]))
        store = syncer.bulk_store()
        refused = {run_id for _, run_id, _, _ in window}
        if store is not None and window:  # the window's points of every run in one transaction
            try:
                refused = bulk_log_many(store, [(run_id, points) for _, run_id, points, _ in window])
            except Exception as err:
                from autoresearch.tracking._common import is_transient

                if is_transient(err):
                    raise
                syncer.warn("bulk-window", f"a window of points went run by run ({type(err).__name__}: {err})")
        sent = []
        for entity, run_id, points, last in window:
            if run_id in refused:
                try:
                    syncer.log_metrics(run_id, points)  # its own error (a deleted run) blocks it
                except Exception as err:
                    syncer.mark_blocked(entity, err)
                    continue
            report.metrics += len(points)
            report.batches += (len(points) + BATCH - 1) // BATCH
            sent.append((entity, last))
        with syncer.store.batch():
            for entity, last in sent:
                syncer.store.points_sent(entity, last)
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
        executemany(session, "metrics+", lambda: insert(table).on_conflict_do_nothing(), rows)  # one executemany
        # the run's latest value per key: one candidate per key, compared with what is stored
        store._update_latest_metrics_if_necessary([SqlMetric(**row) for row in latest.values()], session)


def bulk_log_many(store: Any, batches: list[tuple[str, list[Any]]]) -> set[str]:
    """:func:`bulk_log` for many runs in one transaction: the points of the active runs among
    ``batches`` (run id, points), and each run's latest values, updated in one upsert whose
    condition is MLflow's (a point replaces the latest when its (step, timestamp, value) is
    greater). Returns the runs refused (deleted or gone): nothing of theirs is written, the
    caller sends them through the path that raises MLflow's error."""
    from mlflow.entities import LifecycleStage
    from mlflow.store.tracking.dbmodels.models import SqlLatestMetric, SqlMetric, SqlRun
    from sqlalchemy import select
    from sqlalchemy.dialects.sqlite import insert

    runs = SqlRun.__table__
    ids = sorted({run_id for run_id, _ in batches})
    rows: list[dict[str, Any]] = []
    latest: dict[tuple[str, str], dict[str, Any]] = {}
    with store.ManagedSessionMaker(read_only=False) as session:
        stages: dict[str, str] = {}
        for i in range(0, len(ids), 500):
            stages.update((r, stage) for r, stage in session.execute(
                select(runs.c.run_uuid, runs.c.lifecycle_stage).where(runs.c.run_uuid.in_(ids[i:i + 500]))))
        refused = {r for r in ids if stages.get(r) != LifecycleStage.ACTIVE}
        for run_id, points in batches:
            if run_id in refused:
                continue
            for p in points:
                is_nan, value = store.sanitize_metric_value(p.value)
                row = {"run_uuid": run_id, "key": p.key, "value": value, "timestamp": p.timestamp, "step": p.step,
                       "is_nan": is_nan}
                rows.append(row)
                best = latest.get((run_id, p.key))
                if best is None or (p.step, p.timestamp, value) > (best["step"], best["timestamp"], best["value"]):
                    latest[(run_id, p.key)] = row
        if rows:
            executemany(session, "metrics+", lambda: insert(SqlMetric.__table__).on_conflict_do_nothing(), rows)

            def upsert_latest() -> Any:
                table = SqlLatestMetric.__table__
                stmt = insert(table)
                newer = (stmt.excluded.step > table.c.step) | (
                    (stmt.excluded.step == table.c.step) & ((stmt.excluded.timestamp > table.c.timestamp) | (
                        (stmt.excluded.timestamp == table.c.timestamp) & (stmt.excluded.value > table.c.value))))
                return stmt.on_conflict_do_update(
                    index_elements=[table.c.key, table.c.run_uuid], where=newer,
                    set_={"value": stmt.excluded.value, "timestamp": stmt.excluded.timestamp,
                          "step": stmt.excluded.step, "is_nan": stmt.excluded.is_nan})

            executemany(session, "latest+", upsert_latest, list(latest.values()))
    return refused
