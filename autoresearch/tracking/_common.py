"""What the modules of the MLflow mirror share: the pass's report, the cross-process
lock around creations, and the SQL that maps a job to its entity.

The mirror is :mod:`autoresearch.tracking._sync` (the :class:`Syncer` and its pass);
what it mirrors lives beside it: ``_entities`` (loops, jobs, trials → runs),
``_metrics``, ``_traces`` (decisions and LLM calls), ``_reports`` (loops' report files)
and ``_finish`` (logs, run ends).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_EXPERIMENT = "Default"
# A job belongs to a trial by trials.job_id, or (before the loop wrote it back) by its spec tag.
TRIAL_JOIN = ("t.id=COALESCE((SELECT x.id FROM trials x WHERE x.job_id=j.id LIMIT 1), "
              "CAST(json_extract(j.spec, '$.tags.\"autoresearch.trial_id\"') AS INTEGER))")
ENTITY = "(CASE WHEN t.id IS NULL THEN 'job:' || j.id ELSE 'trial:' || t.id END)"


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
    fd = os.open(home / "tracking.create.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)

