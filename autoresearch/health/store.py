"""The health store: every query of findings, node health and the preflight cache (migration
``health-1`` in :mod:`autoresearch.store.ledger`).

A finding is an ``events`` row of kind ``finding`` (job and attempt set when it came from
one); its data holds node, GPU, signature, class, severity, source and excerpt. Node
health lives on the ``nodes`` row (state, reason, ``since``, ``cleared_at``), with the
preflight cache (``checked_at``, ``check_result``) and the monitor's rate limit
(``poll_due_at``). Stdlib only: it is on the pass.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from typing import Any

from autoresearch.health.findings import Finding
from autoresearch.health.policy import Differential, NodeStatus
from autoresearch.store.ledger import Ledger

DEDUPE_S = 3600.0  # the same fault of the same GPU is one finding per hour, not one per poll
RECENT = 500


class HealthStore:
    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    # -- findings ---------------------------------------------------------------------------

    def record(self, findings: Iterable[Finding], throttle_dedupe_s: float = DEDUPE_S) -> list[Finding]:
        """Store new findings (a repeat within DEDUPE_S, ``throttle_dedupe_s`` for throttling, which must
        be seen again within ``degraded_for`` to keep a node degraded, or of the same attempt, is
        dropped); the stored ones."""
        findings = list(findings)
        if not findings:
            return []
        stored: list[Finding] = []
        with self.ledger.tx() as c:
            seen = set()
            cleared = {r["name"]: r["cleared_at"] or 0.0 for r in c.execute("SELECT name, cleared_at FROM nodes")}
            for row in c.execute("SELECT ts, job_id, attempt, data FROM events WHERE kind='finding' "
                                 "ORDER BY id DESC LIMIT ?", (RECENT,)):
                old = Finding.from_json(_load(row["data"]), row["ts"], row["job_id"], row["attempt"])
                if old is not None and old.ts > cleared.get(old.node, 0.0):  # an uncordon forgave the rest
                    seen.add(_key(old, row["ts"], _span(old, throttle_dedupe_s)))
            for f in findings:
                span = _span(f, throttle_dedupe_s)
                key = _key(f, f.ts, span)
                if key in seen or _key(f, f.ts - span, span) in seen:
                    continue
                seen.add(key)
                c.execute("INSERT INTO events(ts, job_id, attempt, kind, data) VALUES (?,?,?,?,?)",
                          (f.ts or self.ledger.clock(), f.job_id, f.attempt, "finding", json.dumps(f.to_json())))
                stored.append(f)
                if f.owner == "machine" and f.severity != "info" and f.node:  # a cached check older is stale
                    c.execute("UPDATE nodes SET machine_event_at=MAX(COALESCE(machine_event_at, 0), ?) WHERE name=?",
                              (f.ts or self.ledger.clock(), f.node))
        return stored

    def node_findings(self, node: str, since: float = 0.0, limit: int = RECENT) -> list[Finding]:
        """A node's findings since ``since``, oldest first (the most recent ``limit``)."""
        rows = self.ledger.query("SELECT ts, job_id, attempt, data FROM events WHERE kind='finding' AND ts>=? "
                                 "ORDER BY id DESC LIMIT ?", (since, RECENT * 4))
        out = [f for f in (_finding(r) for r in rows) if f is not None and f.node == node]
        return list(reversed(out[:limit]))

    def recent_findings(self, limit: int = 200) -> list[Finding]:
        """The newest findings of every node, newest first."""
        rows = self.ledger.query("SELECT ts, job_id, attempt, data FROM events WHERE kind='finding' "
                                 "ORDER BY id DESC LIMIT ?", (limit,))
        return [f for f in (_finding(r) for r in rows) if f is not None]

    def attempt_findings(self, job_id: int, n: int) -> list[Finding]:
        rows = self.ledger.query("SELECT ts, job_id, attempt, data FROM events WHERE job_id=? AND attempt=? "
                                 "AND kind='finding' ORDER BY id", (job_id, n))
        return [f for f in (_finding(r) for r in rows) if f is not None]

    # -- node health --------------------------------------------------------------------------

    def node(self, node: str) -> sqlite3.Row | None:
        return self.ledger.one("SELECT * FROM nodes WHERE name=?", (node,))

    def nodes(self) -> list[sqlite3.Row]:
        return self.ledger.query("SELECT * FROM nodes ORDER BY name")

    def set_status(self, node: str, before: NodeStatus, after: NodeStatus) -> bool:
        """Move a node from ``before`` to ``after`` with an event (cordon, degrade, healthy); False
        when someone changed it meanwhile (their word stands)."""
        with self.ledger.tx() as c:
            cur = c.execute("UPDATE nodes SET state=?, reason=?, since=?, cleared_at=?, updated_at=? "
                            "WHERE name=? AND state=? AND reason=?",
                            (after.state, after.reason, after.since, after.cleared_at, self.ledger.clock(), node,
                             before.state, before.reason))
            if not cur.rowcount:
                return False
            kind = {"cordoned": "cordon", "degraded": "degrade"}.get(after.state, "uncordon")
            Ledger.event(c, kind, node=node, reason=after.reason, by="health", _ts=self.ledger.clock())
        return True

    def claim_poll(self, node: str, now: float, interval: float) -> bool:
        """Whether this process polls ``node`` now (at most once per ``interval`` across processes)."""
        with self.ledger.tx() as c:
            cur = c.execute("UPDATE nodes SET poll_due_at=? WHERE name=? AND (poll_due_at IS NULL OR poll_due_at<=?)",
                            (now + interval, node, now))
            return bool(cur.rowcount)

    def mark_checked(self, node: str, at: float, result: dict[str, Any]) -> None:
        """Remember a preflight's result (``{"bad": {gpu: signature}}``) for the cache."""
        with self.ledger.tx() as c:
            c.execute("UPDATE nodes SET checked_at=?, check_result=? WHERE name=?", (at, json.dumps(result), node))

    def request_recheck(self, node: str) -> None:
        """Forget the node's cached check and make its poll due: the next pass looks at the machine again
        (a job's output pointed at it; the machine's answer decides)."""
        with self.ledger.tx() as c:
            c.execute("UPDATE nodes SET checked_at=NULL, poll_due_at=NULL WHERE name=?", (node,))

    def suspect_nodes(self, job_id: int, before: int) -> list[str]:
        """The nodes where attempts of ``job_id`` before ``before`` failed as infra-suspect (every member's
        node of a gang)."""
        found: list[str] = []
        for r in self.ledger.query("SELECT node, alloc FROM attempts WHERE job_id=? AND n<? "
                                   "AND failure_class='infra-suspect' AND node IS NOT NULL", (job_id, before)):
            names = [str(r["node"])]
            alloc = _load(r["alloc"]) if r["alloc"] else None
            if isinstance(alloc, list):
                names += [str(m[0]) for m in alloc if isinstance(m, list) and m]
            found += [n for n in names if n not in found]
        return found

    def kernel_cursor(self, node: str) -> str | None:
        row = self.ledger.one("SELECT kernel_cursor FROM nodes WHERE name=?", (node,))
        return str(row["kernel_cursor"]) if row is not None and row["kernel_cursor"] else None

    def set_kernel_cursor(self, node: str, cursor: str | None) -> None:
        if cursor:
            with self.ledger.tx() as c:
                c.execute("UPDATE nodes SET kernel_cursor=? WHERE name=?", (cursor[:500], node))

    def differential(self, node: str, failed_jobs: Iterable[int], since: float) -> Differential:
        """The fleet's word on ``node``'s infra-suspect failures: the other schedulable nodes, and which of
        the failed jobs (or their projects) succeeded on another node since ``since``."""
        jobs = sorted({int(j) for j in failed_jobs})[:500]
        row = self.ledger.one("SELECT COUNT(*) AS n FROM nodes WHERE name!=? AND state IN ('healthy','degraded') "
                              "AND backend=(SELECT backend FROM nodes WHERE name=?)", (node, node))
        others = int(row["n"]) if row else 0
        if not jobs or not others:
            return Differential(others)
        marks = ",".join("?" * len(jobs))
        projects = {r["id"]: str(r["project"] or "") for r in
                    self.ledger.query(f"SELECT id, project FROM jobs WHERE id IN ({marks})", tuple(jobs))}
        names = sorted(set(projects.values()))
        ok_jobs: set[int] = set()
        ok_projects: set[str] = set()
        for r in self.ledger.query(
                "SELECT a.job_id, j.project FROM attempts a JOIN jobs j ON j.id=a.job_id WHERE a.node IS NOT NULL "
                "AND a.node!=? AND a.end_reason='exit' AND a.exit_code=0 AND a.ended_at>=? AND "
                f"(a.job_id IN ({marks}) OR j.project IN ({','.join('?' * len(names))}))",
                (node, since, *jobs, *names)):
            ok_jobs.add(int(r["job_id"]))
            ok_projects.add(str(r["project"] or ""))
        elsewhere = {int(r["job_id"]) for r in self.ledger.query(
            f"SELECT DISTINCT job_id FROM attempts WHERE job_id IN ({marks}) AND node IS NOT NULL AND node!=? "
            "AND failure_class='infra-suspect' AND ended_at>=?", (*jobs, node, since))}
        return Differential(others, frozenset(ok_jobs), frozenset(ok_projects), tuple(sorted(projects.items())),
                            frozenset(elsewhere))

    # -- attempts: progress (hangs) and failure classes ------------------------------------------

    def note_progress(self, job_id: int, n: int, size: int, at: float) -> None:
        with self.ledger.tx() as c:
            c.execute("UPDATE attempts SET seen_bytes=?, seen_at=? WHERE job_id=? AND n=?", (size, at, job_id, n))

    def running_on(self, node: str) -> list[sqlite3.Row]:
        """Active attempts on ``node`` with their job's spec."""
        return self.ledger.query("SELECT a.*, j.spec FROM attempts a JOIN jobs j ON j.id=a.job_id "
                                 "WHERE a.node=? AND a.state IN ('starting','running')", (node,))

    def job_secrets(self, job_id: int) -> list[str]:
        """What to mask in a job's output (its env's and command's secrets, and this process's)."""
        from autoresearch.util.redact import ambient_secrets, job_secrets

        row = self.ledger.one("SELECT spec FROM jobs WHERE id=?", (job_id,))
        spec = _load(row["spec"]) if row is not None else None
        return job_secrets(spec) if isinstance(spec, dict) else ambient_secrets()

    def critical_queued(self) -> int:
        row = self.ledger.one("SELECT COUNT(*) AS n FROM jobs WHERE state='queued' AND priority='critical'")
        return int(row["n"]) if row else 0


def _load(text: str) -> Any:
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return None


def _finding(row: sqlite3.Row) -> Finding | None:
    return Finding.from_json(_load(row["data"]), row["ts"], row["job_id"], row["attempt"])


def _span(f: Finding, throttle_dedupe_s: float) -> float:
    return max(1.0, throttle_dedupe_s) if f.cls == "throttle" or f.signature == "nvml_error" else DEDUPE_S


def _key(f: Finding, ts: float, span: float) -> tuple[Any, ...]:
    if f.job_id is not None:
        return (f.node, f.gpu, f.signature, f.job_id, f.attempt)
    return (f.node, f.gpu, f.signature, int(ts // span))
