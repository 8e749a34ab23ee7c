"""Signatures in a job's new log lines become findings, as the log is ingested (autoresearch/engine/ingest.py).

Apart from the monitor (autoresearch/health/monitor.py) so that the ingestion, which the monitor
runs to read an attempt's log, and this, which the ingestion calls, import each other in no circle.
"""

from __future__ import annotations

from typing import Any

from autoresearch.health import config as C
from autoresearch.health import policy
from autoresearch.health.findings import Finding
from autoresearch.health.store import HealthStore
from autoresearch.store.ledger import Ledger
from autoresearch.util.redact import ambient_secrets, redact


def record_log_hits(ledger: Ledger, backend: Any, att: Any, lines: list[str]) -> None:
    """Signatures in new log lines of an attempt become findings (called by the ingestion)."""
    config = C.load(ledger.home)
    if not config.enabled or not lines:
        return
    from autoresearch.health.signatures import scan

    hits = scan(lines, config)
    if not hits:
        return
    node = att["node"] or ""
    now = ledger.clock()
    store = HealthStore(ledger)
    stored = store.record(redacted([
        Finding(node, h.signature, h.cls, h.severity, "log", h.gpu, h.line, now, att["job_id"], att["n"])
        for h in hits], store.job_secrets(att["job_id"])))
    # The job's output is its own word (invariant 10): it never reviews the node. A line that points at
    # the machine asks the machine: the node's cached check is dropped and its poll made due.
    if node and any(f.cls == policy.SUSPECT for f in stored):
        store.request_recheck(node)


def redacted(findings: list[Finding], secrets: list[str] | None = None) -> list[Finding]:
    """Excerpts quote trial output: secrets (the job's, else this process's environment's) are
    masked before they are stored, like every other view of trial output."""
    secrets = ambient_secrets() if secrets is None else secrets
    return [Finding(f.node, f.signature, f.cls, f.severity, f.source, f.gpu, redact(f.excerpt, secrets), f.ts,
                    f.job_id, f.attempt) for f in findings]
