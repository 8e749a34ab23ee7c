"""What the facade returns: plain dataclasses (cheap to import, JSON-ready).

The MCP server returns these as structured output; the CLI renders them as rich
tables or ``--json``. Times are Unix seconds; :func:`with_iso` adds their ISO 8601 twins
for the faces.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass
class AttemptView:
    """One attempt of a job: where it ran and how it ended."""

    n: int
    state: str
    node: str | None
    gpus: list[str]
    started_at: float | None
    ended_at: float | None
    exit_code: int | None
    signal: int | None
    end_reason: str | None
    detail: str | None
    peak_rss_mb: float | None
    failure_class: str | None = None  # infra | infra-suspect | unknown | user, when it failed


@dataclass
class JobView:
    """A job as the faces show it: its state, its attempts, and why it failed."""

    id: int
    name: str
    state: str
    priority: str
    gpus: int
    command: str
    workdir: str
    experiment: str
    submitted_at: float
    started_at: float | None
    ended_at: float | None
    attempts: int
    exit_code: int | None
    end_reason: str | None
    cancelling: bool = False
    tags: dict[str, str] = field(default_factory=dict)
    attempt_list: list[AttemptView] = field(default_factory=list)
    failure_class: str | None = None  # infra | infra-suspect | unknown | user, when the job failed
    failure_why: str | None = None  # the signature that decided it, with its log line (autoresearch/health/)
    failure_hint: str | None = None  # what happens now / what to do
    log_excerpt: str | None = None  # last lines of the failed attempt's log
    next_step: str | None = None  # what to call next (for agents)
    warnings: list[str] = field(default_factory=list)  # what was dropped or failed while handling it
    backend: str = ""  # the backend (profile or kind) it runs on


@dataclass
class JobPage:
    """A page of jobs, newest first, and the cursor of the next page."""

    jobs: list[JobView]
    next_cursor: int | None  # pass as cursor= for older jobs; None when this is the last page


@dataclass
class ArrayView:
    """A job array as submitted (``submit --array``): its jobs' ids run from ``first_id`` to
    ``last_id`` in index order, one job per index."""

    array: str  # its id: each job's ``array`` tag
    first_id: int
    last_id: int
    count: int
    indices: str  # as --array writes them, e.g. 0-99 or 1,3,5-7
    max_running: int | None  # its %N: at most this many start or run at once (None: no cap)
    states: dict[str, int] = field(default_factory=dict)  # its jobs' states right after the submit
    warnings: list[str] = field(default_factory=list)
    next_step: str | None = None


@dataclass
class LogPage:
    """A page of an attempt's log, secrets masked, and where the next page starts."""

    job_id: int
    attempt: int
    text: str
    offset: int  # byte offset of the first byte of text
    next_offset: int  # byte offset after the last byte returned
    size: int  # bytes in the log so far
    truncated: bool
    hint: str = ""


@dataclass
class MetricView:
    """One metric of a job: its last and best values, last step and number of points (a series on request)."""

    name: str
    last: float | None
    best: float | None
    step: int
    count: int
    mode: str
    series: list[tuple[int, float | None]] | None = None


@dataclass
class NodeView:
    """A node of the cluster: its GPUs, its state and what runs on it."""

    name: str
    backend: str
    state: str
    reason: str
    gpus: int
    gpus_free: int
    free_ids: list[str]
    running: int
    since: float | None = None  # when it entered its state
    findings: list[str] = field(default_factory=list)  # the last health findings, newest first
    warning: str = ""  # e.g. cordoning the last healthy node while critical jobs queue


@dataclass
class ClusterView:
    """The cluster: its nodes and what the queue holds."""

    nodes: list[NodeView]
    gpus_total: int
    gpus_free: int
    queued: dict[str, int]  # priority -> count
    running: int
    cordoned: list[str]
    degraded: list[str] = field(default_factory=list)  # 'node: reason' (placed last)
    projects: list[ProjectUsageView] = field(default_factory=list)  # fair share: each project's use


@dataclass
class ProjectUsageView:
    """A project's use of the GPUs against its fair share (config.yaml's scheduler:, docs/scheduling.md)."""

    project: str
    gpus_used: int  # held by its starting and running jobs
    best_effort_gpus: int  # of those, held by best-effort jobs (not counted against the quota; preempted first)
    quota: int | None  # GPUs its normal and critical jobs may hold; None: no cap
    weight: float
    running: int
    queued: int


@dataclass
class GpuHealthView:
    """One GPU of a node's last health reading."""

    index: int
    name: str
    temperature_c: float | None
    ecc_uncorrected: int
    clock_event_reasons: list[str]
    xids: list[int]


@dataclass
class HealthView:
    """This machine's GPUs, checked now (``autoresearch health``)."""

    node: str
    healthy: bool
    driver_version: str
    gpus: list[GpuHealthView]
    findings: list[str]  # one line each: signature on node GPU n: what
    reason: str = ""  # why it is not healthy (Slurm's drain reason)
    action: str = ""  # what was done about it (drained, ...)


def iso(ts: float | None) -> str | None:
    """A Unix time as ISO 8601 in UTC, to the second (``2026-11-30T15:17:27Z``); None stays None."""
    if ts is None or isinstance(ts, bool) or not isinstance(ts, (int, float)):
        return None
    import datetime as _dt

    try:
        moment = _dt.datetime.fromtimestamp(ts, _dt.UTC)
    except (OverflowError, OSError, ValueError):
        return None
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


TIME_KEYS = ("last_sync",)  # Unix times whose name does not end in _at


def with_iso(data: Any) -> Any:
    """JSON-ready data with an ``<key>_iso`` twin after every Unix-time field (``*_at``, ``last_sync``)."""
    if isinstance(data, list):
        return [with_iso(v) for v in data]
    if not isinstance(data, dict):
        return data
    out: dict[str, Any] = {}
    for key, value in data.items():
        out[key] = with_iso(value)
        if isinstance(key, str) and (key.endswith("_at") or key in TIME_KEYS) and f"{key}_iso" not in data \
                and (value is None or isinstance(value, (int, float))):
            out[f"{key}_iso"] = iso(value)
    return out


def to_dict(view: Any) -> Any:
    if dataclasses.is_dataclass(view) and not isinstance(view, type):
        return dataclasses.asdict(view)
    if isinstance(view, list):
        return [to_dict(v) for v in view]
    return view
