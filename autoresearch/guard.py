"""One job's trouble stays that job's: warnings on a job, and the guard around each job's part of a pass.

A pass (reconcile, schedule, launch) handles many jobs. If handling one of them raises
(something it wrote, a record we cannot read, a bug), :func:`surviving` records why as a
``pass_error`` warning on that job and lets the pass go on with the others (docs/architecture.md,
invariant 8). An attempt that keeps every pass failing for :data:`GIVE_UP_S` seconds and
:data:`GIVE_UP_AFTER` passes is ended as ``infra`` and its job failed, so it cannot hold
its GPUs forever. Only a ledger failure (locked, corrupt) stops a pass: it is everybody's.

Warnings are events, one per attempt and kind (:func:`note` adds to the count), so a trial
that writes a million bad lines or a job that fails every pass adds one row; ``status``
shows them as ``warnings`` (:func:`warnings_of`).
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Iterator
from typing import Any

from autoresearch.backends import Backend
from autoresearch.errors import LedgerError
from autoresearch.ledger import Ledger

WARNING_KINDS = ("metrics_dropped", "pass_error")
GIVE_UP_AFTER = 20
GIVE_UP_S = 120.0
_REASON_CHARS = 300


def note(conn: sqlite3.Connection, kind: str, job_id: int, attempt: int | None, reason: str,
         count: int = 1) -> dict[str, Any]:
    """Add ``count`` to the one ``kind`` warning of this attempt (created with ``reason``); return it."""
    reason, now = reason[:_REASON_CHARS], time.time()
    row = conn.execute("SELECT id, data FROM events WHERE job_id=? AND attempt IS ? AND kind=? ORDER BY id LIMIT 1",
                       (job_id, attempt, kind)).fetchone()
    if row is None:
        data: dict[str, Any] = {"count": count, "reason": reason, "first_at": now, "last_at": now}
        Ledger.event(conn, kind, job_id, attempt, **data)
        return data
    try:
        data = json.loads(row["data"])
        data = data if isinstance(data, dict) else {}
    except ValueError:
        data = {}
    data["count"] = int(data.get("count") or 0) + count
    data.setdefault("reason", reason)
    data.setdefault("first_at", now)
    data["last"], data["last_at"] = reason, now
    conn.execute("UPDATE events SET data=? WHERE id=?", (json.dumps(data, default=str), row["id"]))
    return data


def warnings_of(ledger: Ledger, job_id: int) -> list[str]:
    """One line per warning of a job's attempts, oldest first (for ``status``)."""
    marks = ",".join("?" * len(WARNING_KINDS))
    out = []
    for row in ledger.query(f"SELECT attempt, kind, data FROM events WHERE job_id=? AND kind IN ({marks}) "
                            "ORDER BY id", (job_id, *WARNING_KINDS)):
        try:
            data = json.loads(row["data"])
            count, reason = int(data.get("count") or 1), str(data.get("reason") or "")
        except (ValueError, TypeError, AttributeError):
            count, reason = 1, ""
        where = f"attempt {row['attempt']}" if row["attempt"] is not None else "job"
        if row["kind"] == "metrics_dropped":
            out.append(f"{where}: dropped {count} metric point(s) or line(s) it wrote; first: {reason}")
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
        with contextlib.suppress(Exception), ledger.tx() as c:
            seen = note(c, "pass_error", job_id, attempt, reason)
        if (attempt is not None and int(seen.get("count") or 0) >= GIVE_UP_AFTER
                and time.time() - float(seen.get("first_at") or time.time()) >= GIVE_UP_S):
            with contextlib.suppress(Exception):
                give_up(ledger, backend, job_id, attempt, reason)


def give_up(ledger: Ledger, backend: Backend, job_id: int, n: int, reason: str) -> None:
    """End an attempt that every pass fails on, and its job (a retry would fail the same way)."""
    att = ledger.one("SELECT external_id FROM attempts WHERE job_id=? AND n=?", (job_id, n))
    if att is not None and att["external_id"]:
        with contextlib.suppress(Exception):
            backend.stop(att["external_id"], 0)
    detail = f"autoresearch gave up on it after repeated errors ({reason})"[:500]
    now = time.time()
    with ledger.tx() as c:
        cur = c.execute("UPDATE attempts SET state='ended', ended_at=?, end_reason='infra', detail=? "
                        "WHERE job_id=? AND n=? AND state IN ('starting','running')", (now, detail, job_id, n))
        if not cur.rowcount:
            return
        c.execute("UPDATE jobs SET state='failed', end_reason='infra', ended_at=?, updated_at=? WHERE id=? "
                  "AND state NOT IN ('succeeded','failed','cancelled')", (now, now, job_id))
        Ledger.event(c, "end", job_id, n, reason="infra", job_state="failed", detail=detail)
