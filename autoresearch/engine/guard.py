"""One job's trouble stays that job's: warnings on a job, and the guard around each job's part of a pass.

A pass (reconcile, schedule, launch) handles many jobs. If handling one of them raises
(something it wrote, a record we cannot read, a bug), :func:`surviving` records why as a
``pass_error`` warning on that job and lets the pass go on with the others (docs/architecture.md,
invariant 8). An attempt that keeps every pass failing for :data:`GIVE_UP_S` seconds and
:data:`GIVE_UP_AFTER` passes is ended as ``infra`` and its job failed, so it cannot hold
its GPUs forever. Only a ledger failure (locked, corrupt) stops a pass: it is everybody's.

Warnings are events, one per attempt and kind (:meth:`autoresearch.store.jobstore.JobStore.note`
adds to the count), so a trial that writes a million bad lines or a job that fails every
pass adds one row; ``status`` shows them as ``warnings`` (:func:`warnings_of`).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

from autoresearch.backends import Backend
from autoresearch.errors import LedgerError
from autoresearch.store.jobstore import JobStore
from autoresearch.store.ledger import Ledger

WARNING_KINDS = ("metrics_dropped", "pass_error", "unschedulable", "metric_unseen", "preflight", "foreign_run_folder")
GIVE_UP_AFTER = 20
GIVE_UP_S = 120.0


def warnings_of(ledger: Ledger, job_id: int, queued: bool = False) -> list[str]:
    """One line per warning of a job's attempts, oldest first (for ``status``); "no node can run it"
    only while the job is still ``queued``."""
    out = []
    kinds = WARNING_KINDS if queued else tuple(k for k in WARNING_KINDS if k != "unschedulable")
    for row in JobStore(ledger).warning_events(job_id, kinds):
        try:
            data = json.loads(row["data"])
            count, reason = int(data.get("count") or 1), str(data.get("reason") or "")
        except (ValueError, TypeError, AttributeError):
            count, reason = 1, ""
        where = f"attempt {row['attempt']}" if row["attempt"] is not None else "job"
        if row["kind"] == "preflight":
            out.append(f"{where}: preflight turned it away {count} time(s) (not counted as a retry); first: {reason}")
        elif row["kind"] == "metrics_dropped":
            out.append(f"{where}: dropped {count} metric point(s) or line(s) it wrote; first: {reason}")
        elif row["kind"] in ("unschedulable", "metric_unseen", "foreign_run_folder"):
            out.append(f"{where}: {reason}")
        else:
            out.append(f"{where}: autoresearch failed {count} time(s) while handling it; first: {reason}")
    return out



@contextlib.contextmanager
def surviving(ledger: Ledger, backend: Backend, what: str, job_id: int, attempt: int | None = None) -> Iterator[None]:
    """Run one job's part of a pass; if it fails, record why on that job and go on with the others."""
    try:
        yield
    except LedgerError:
        raise
    except Exception as err:
        reason = f"{what}: {type(err).__name__}: {err}"
        seen: dict[str, Any] = {}
        with contextlib.suppress(Exception):
            seen = JobStore(ledger).warn("pass_error", job_id, attempt, reason)
        if (attempt is not None and int(seen.get("count") or 0) >= GIVE_UP_AFTER
                and ledger.clock() - float(seen.get("first_at") or ledger.clock()) >= GIVE_UP_S):
            with contextlib.suppress(Exception):
                give_up(ledger, backend, job_id, attempt, reason)


def give_up(ledger: Ledger, backend: Backend, job_id: int, n: int, reason: str) -> None:
    """End an attempt that every pass fails on, and its job (a retry would fail the same way)."""
    jobs = JobStore(ledger)
    att = jobs.attempt(job_id, n)
    if att is not None and att["external_id"]:
        with contextlib.suppress(Exception):
            backend.stop(att["external_id"], 0)
    detail = f"autoresearch gave up on it after repeated errors ({reason})"[:500]
    jobs.give_up_attempt(job_id, n, detail)
