"""What the modules of the MLflow mirror share: the pass's report, the cross-process
lock around creations, which errors are worth retrying (:func:`is_transient`), the trials an
outbox request names, and :class:`Mirror`, what they may use of the syncer (its queries
are :class:`autoresearch.tracking._store.MirrorStore`'s).

The mirror is :mod:`autoresearch.tracking._sync` (the :class:`Syncer` and its pass);
what it mirrors lives beside it, as functions of a :class:`Mirror`: ``_entities``
(loops, jobs, trials → runs), ``_metrics``, ``_traces`` (decisions and LLM calls),
``_reports`` (loops' report files) and ``_finish`` (logs, run ends).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from autoresearch.errors import TrackingError
from autoresearch.store.outbox import creation_lock

DEFAULT_EXPERIMENT = "Default"
# Another MLflow client (a trial's own mlflow, `mlflow ui`) creating or migrating the same SQLite
# store at the same moment: its schema is half-made for a while. Retried with back-off, not final.
STORE_RACE = re.compile(r"table \S+ already exists|duplicate column|no such (table|column)|sqlite3\.OperationalError")


@dataclass
class SyncReport:
    runs_created: int = 0
    metrics: int = 0
    batches: int = 0
    decisions: int = 0
    traces: int = 0
    artifacts: int = 0
    finished: int = 0
    warnings: list[str] = field(default_factory=list)
    pending: bool = False  # more work than one pass handled

    @property
    def did_work(self) -> bool:
        return bool(self.runs_created or self.metrics or self.decisions or self.traces or self.artifacts
                    or self.finished)


@contextlib.contextmanager
def _critical(home: Path) -> Iterator[None]:
    """Serializes what must happen once across processes (a foreground `sync`, the
    background syncer, the loop's :func:`prepare_runs`): creating the database, a run,
    a trace. Held for one MLflow call or two, never across a pass."""
    with creation_lock(home):
        yield


def is_transient(err: BaseException) -> bool:
    """Worth retrying later (server down, DB busy) as opposed to a rejected write."""
    if isinstance(err, TrackingError):
        return bool(err.details.get("transient"))
    if isinstance(err, (ConnectionError, TimeoutError)):
        return True
    name = type(err).__name__
    if name in ("ConnectionError", "ReadTimeout", "ConnectTimeout", "MaxRetryError", "OperationalError"):
        return True
    code = getattr(err, "error_code", "")
    text = str(err)
    return code in ("TEMPORARILY_UNAVAILABLE", "REQUEST_LIMIT_EXCEEDED") or any(
        s in text for s in ("API request to", "Max retries exceeded", "Connection refused", "database is locked",
                            "timed out", "503", "502")) or bool(STORE_RACE.search(text))


def requested_trials(row: Any) -> list[int]:
    """The trial ids a ``trial_run`` outbox entry asks runs for ([] when its payload is unreadable)."""
    try:
        return [int(i) for i in json.loads(row["payload"])]
    except (ValueError, TypeError):
        return []


class Mirror(Protocol):
    """The syncer as the mirror's modules see it (:class:`autoresearch.tracking._sync.Syncer` is one)."""

    ledger: Any  # autoresearch.store.ledger.Ledger
    store: Any  # autoresearch.tracking._store.MirrorStore: every query of the ledger
    client: Any  # mlflow.tracking.MlflowClient
    uri: str
    home_id: str  # tags runs as this ledger's (autoresearch.entity = HOME_ID/ENTITY)
    secrets: list[str]  # ambient secrets, redacted from everything sent
    jobs_since: float | None  # the jobs changed after this are looked at (None: all; kept in memory only)

    def warn(self, key: str, message: str) -> None:
        """Print ``message`` once per ``key``."""

    def cursor(self, name: str) -> int:
        """Where the mirror got to in the ledger (``metrics``: a rowid; ``decisions``: an id)."""
        ...

    def move_cursor(self, name: str, value: int) -> None:
        """Move a cursor once MLflow accepted everything before it."""

    def experiment_id(self, name: str) -> str:
        """The MLflow experiment named ``name`` (created if needed)."""
        ...

    def ensure_run(self, entity: str, experiment: str, run_name: str, parent: str | None,
                   report: SyncReport | None = None, started: float | None = None) -> tuple[str, bool]:
        """The run of ``entity`` (created if needed, exactly once): (run id, created)."""
        ...

    def create_runs(self, wanted: list[tuple[str, str, str, str | None, float | None]], report: SyncReport) -> None:
        """The runs of entities that have none yet, (entity, experiment, run name, parent run id,
        start time) each, made together where the store allows; :meth:`ensure_run` makes the rest."""

    def bulk_store(self) -> Any:
        """MLflow's SQL store on SQLite, to write into in batches (None: another store, or bulk off)."""

    def log_metrics(self, run_id: str, points: list[Any]) -> None:
        """Metric points (mlflow Metric entities) to a run, in bulk where the store allows."""

    def mark_blocked(self, entity: str, err: Exception) -> None:
        """A permanent problem with one run: record it, warn once (a transient one is raised)."""

    def clear_error(self, entity: str) -> bool:
        """Forget a run's recorded problem; whether there was one."""
        ...

    def log_batch(self, run_id: str, metrics: list[Any] = ..., params: dict[str, str] | None = None,
                  tags: dict[str, str] | None = None, secrets: list[str] | None = None,
                  entity: str | None = None, then: Callable[[], None] | None = None) -> None:
        """Metrics, params and tags to a run, params and tags redacted. ``entity``: in a pass, the
        params and tags may wait for the pass's next flush (one transaction for many runs), and
        ``then`` (the ledger's bookkeeping) runs once they are in; a refused run is blocked."""

    def end_run(self, entity: str, run_id: str, status: str, end_ms: int, then: Callable[[], None]) -> None:
        """End a run (as ``set_terminated``), in the pass's next flush where the store allows; ``then``
        once it is in."""

    def job_spec(self, text: str) -> tuple[dict[str, Any], list[str]]:
        """A job's spec (its ledger JSON, parsed) and the secrets to redact from it, parsed once; read only."""
        ...

    def artifact_locations(self, run_ids: list[str]) -> None:
        """Learn the artifact locations of runs about to get artifacts (one query for all)."""

    def artifact_folder(self, run_id: str) -> str | None:
        """The local folder of a run's artifacts, to write into directly (None: upload them)."""

    def log_text(self, run_id: str, text: str, artifact_path: str) -> None:
        """An artifact of a run: written into a local artifact folder directly, else uploaded."""

    def flush(self) -> None:
        """Send what waits for a flush (one transaction), then run the bookkeeping of what went in."""

    def sync_job(self, job: Any, report: SyncReport) -> str | None:
        """Mirror one job's run now; its run id (None while blocked)."""
        ...
