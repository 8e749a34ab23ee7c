"""A loop's trials' objective series, read from the ledger: what the stoppers, the pauses and the
controller's adoption after a restart judge (apart from outcomes.py, which pause.py's resume needs
without a circle)."""

from __future__ import annotations

from typing import Any

from autoresearch.engine import metrics as M
from autoresearch.loop.state import LoopHost
from autoresearch.store.jobstore import JobStore


def read_series(c: LoopHost, rows: list[Any]) -> dict[int, list[tuple[int, float]]]:
    """The signed objective series of ``rows``' trials (their jobs' last attempt; reported
    values win over ones parsed from the log), also kept in ``c.series``."""
    by_job = {r["job_id"]: r["id"] for r in rows if r["job_id"] is not None}
    if not by_job:
        return {}
    for job_id in by_job:
        c.runtime.ingest(job_id)
    points = JobStore(c.ledger).metric_series(c.plan.objective.metric, by_job)
    out: dict[int, list[tuple[int, float]]] = {}
    last_attempt: dict[int, int] = {}
    for p in points:
        last_attempt[p["job_id"]] = max(last_attempt.get(p["job_id"], 0), p["attempt"])
    for p in M.best_source(points, key=lambda p: (p["job_id"], p["attempt"])):  # one metric: per attempt
        if p["attempt"] != last_attempt[p["job_id"]]:
            continue
        out.setdefault(by_job[p["job_id"]], []).append((int(p["step"]), c.sign * float(p["value"])))
    for trial_id in out:
        out[trial_id].sort(key=lambda sv: sv[0])
        before = c.state.prefix.get(trial_id)
        if before:  # resumed after a pause: its curve goes on from there
            out[trial_id] = before + [sv for sv in out[trial_id] if sv[0] > before[-1][0]]
    c.series.update(out)
    return out
