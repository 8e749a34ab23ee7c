"""What the facade returns: plain dataclasses (cheap to import, JSON-ready).

The MCP server returns these as structured output; the CLI renders them as rich
tables or ``--json``. Times are Unix seconds.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass
class AttemptView:
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


@dataclass
class JobView:
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
    failure_class: str | None = None  # "user" or "infra", when the job failed
    log_excerpt: str | None = None  # last lines of the failed attempt's log
    next_step: str | None = None  # what to call next (for agents)
    warnings: list[str] = field(default_factory=list)  # what was dropped or failed while handling it
    backend: str = ""  # the backend (profile or kind) it runs on


@dataclass
class JobPage:
    jobs: list[JobView]
    next_cursor: int | None  # pass as cursor= for older jobs; None when this is the last page


@dataclass
class LogPage:
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
    name: str
    last: float | None
    best: float | None
    step: int
    count: int
    mode: str
    series: list[tuple[int, float | None]] | None = None


@dataclass
class NodeView:
    name: str
    backend: str
    state: str
    reason: str
    gpus: int
    gpus_free: int
    free_ids: list[str]
    running: int


@dataclass
class ClusterView:
    nodes: list[NodeView]
    gpus_total: int
    gpus_free: int
    queued: dict[str, int]  # priority -> count
    running: int
    cordoned: list[str]


def to_dict(view: Any) -> Any:
    if dataclasses.is_dataclass(view) and not isinstance(view, type):
        return dataclasses.asdict(view)
    if isinstance(view, list):
        return [to_dict(v) for v in view]
    return view
