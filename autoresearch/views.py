"""What the facade returns: plain dataclasses (cheap to import, JSON-ready).

The MCP server returns these as structured output; the CLI renders them as rich
tables or ``--json``. Times are Unix seconds; :func:`with_iso` adds their ISO 8601 twins
for the faces.

The views of jobs and their pages are defined here; the cluster's, a node's, a metric's,
the health and doctor views live in :mod:`autoresearch._views_more` and are imported from
here as ever (``from autoresearch.views import NodeView``), at their first use: making a
dataclass compiles its methods (~0.8 ms each on a 2-core VM), which a submit, whose one-line
answer needs none of them, would pay at every start.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from autoresearch.util._record import NEW, record

if TYPE_CHECKING:
    from autoresearch._views_more import ClusterView as ClusterView
    from autoresearch._views_more import DoctorView as DoctorView
    from autoresearch._views_more import GpuHealthView as GpuHealthView
    from autoresearch._views_more import HealthView as HealthView
    from autoresearch._views_more import MetricView as MetricView
    from autoresearch._views_more import NodeView as NodeView
    from autoresearch._views_more import ProjectUsageView as ProjectUsageView

_MORE = ("ClusterView", "DoctorView", "GpuHealthView", "HealthView", "MetricView", "NodeView", "ProjectUsageView")


def __getattr__(name: str) -> Any:
    """The views defined in :mod:`autoresearch._views_more`, imported at their first use (PEP 562)."""
    if name in _MORE:
        from autoresearch import _views_more

        value = getattr(_views_more, name)
        globals()[name] = value  # (asked once)
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@record()
@dataclass(init=False, repr=False, eq=False)
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
    nodes: list[str] = field(default_factory=list)  # a gang's every node, first to last (``node`` is the first)

    def __init__(self, n: int, state: str, node: str | None, gpus: list[str], started_at: float | None,
                 ended_at: float | None, exit_code: int | None, signal: int | None, end_reason: str | None,
                 detail: str | None, peak_rss_mb: float | None, failure_class: str | None = None,
                 nodes: list[str] = NEW) -> None:
        self.n = n
        self.state = state
        self.node = node
        self.gpus = gpus
        self.started_at = started_at
        self.ended_at = ended_at
        self.exit_code = exit_code
        self.signal = signal
        self.end_reason = end_reason
        self.detail = detail
        self.peak_rss_mb = peak_rss_mb
        self.failure_class = failure_class
        self.nodes = [] if nodes is NEW else nodes


@record()
@dataclass(init=False, repr=False, eq=False)
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
    # Metric points (estimated) of its ended attempts' output still being read: its metrics are partial
    # until this is 0 (an ending is recorded before all of a huge output is read; detail views only).
    unread_points: int = 0
    # A tenant job's limits and how they were enforced (rlimits, or why not a cgroup), its last attempt's:
    # one line (detail views only; None for a job that ran without a sandbox).
    limits: str | None = None
    # A starting job the engine holds, in the engine's words ("PENDING, Resources"): it waits in the
    # engine's queue, not on its node (the faces show "queued (engine: PENDING, Resources)").
    engine_state: str = ""

    def __init__(self, id: int, name: str, state: str, priority: str, gpus: int, command: str, workdir: str,
                 experiment: str, submitted_at: float, started_at: float | None, ended_at: float | None, attempts: int,
                 exit_code: int | None, end_reason: str | None, cancelling: bool = False, tags: dict[str, str] = NEW,
                 attempt_list: list[AttemptView] = NEW, failure_class: str | None = None,
                 failure_why: str | None = None, failure_hint: str | None = None, log_excerpt: str | None = None,
                 next_step: str | None = None, warnings: list[str] = NEW, backend: str = "", unread_points: int = 0,
                 limits: str | None = None, engine_state: str = "") -> None:
        self.id = id
        self.name = name
        self.state = state
        self.priority = priority
        self.gpus = gpus
        self.command = command
        self.workdir = workdir
        self.experiment = experiment
        self.submitted_at = submitted_at
        self.started_at = started_at
        self.ended_at = ended_at
        self.attempts = attempts
        self.exit_code = exit_code
        self.end_reason = end_reason
        self.cancelling = cancelling
        self.tags = {} if tags is NEW else tags
        self.attempt_list = [] if attempt_list is NEW else attempt_list
        self.failure_class = failure_class
        self.failure_why = failure_why
        self.failure_hint = failure_hint
        self.log_excerpt = log_excerpt
        self.next_step = next_step
        self.warnings = [] if warnings is NEW else warnings
        self.backend = backend
        self.unread_points = unread_points
        self.limits = limits
        self.engine_state = engine_state


@record()
@dataclass(init=False, repr=False, eq=False)
class JobPage:
    """A page of jobs, newest first, and the cursor of the next page."""

    jobs: list[JobView]
    next_cursor: int | None  # pass as cursor= for older jobs; None when this is the last page

    def __init__(self, jobs: list[JobView], next_cursor: int | None) -> None:
        self.jobs = jobs
        self.next_cursor = next_cursor


@record()
@dataclass(init=False, repr=False, eq=False)
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

    def __init__(self, array: str, first_id: int, last_id: int, count: int, indices: str, max_running: int | None,
                 states: dict[str, int] = NEW, warnings: list[str] = NEW, next_step: str | None = None) -> None:
        self.array = array
        self.first_id = first_id
        self.last_id = last_id
        self.count = count
        self.indices = indices
        self.max_running = max_running
        self.states = {} if states is NEW else states
        self.warnings = [] if warnings is NEW else warnings
        self.next_step = next_step


@record()
@dataclass(init=False, repr=False, eq=False)
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

    def __init__(self, job_id: int, attempt: int, text: str, offset: int, next_offset: int, size: int, truncated: bool,
                 hint: str = "") -> None:
        self.job_id = job_id
        self.attempt = attempt
        self.text = text
        self.offset = offset
        self.next_offset = next_offset
        self.size = size
        self.truncated = truncated
        self.hint = hint


def iso(ts: float | None) -> str | None:
    """A Unix time as ISO 8601 in UTC, to the second (``2026-11-30T15:17:27Z``); None stays None."""
    if ts is None or isinstance(ts, bool) or not isinstance(ts, (int, float)):
        return None
    if 0 <= ts < 253402300800:  # 1970 to 9999: time's C functions, twice datetime's speed (a final view has thousands)
        return _iso_second(int(ts))  # (int floors a positive time, as gmtime does)
    import datetime as _dt

    try:
        moment = _dt.datetime.fromtimestamp(ts, _dt.UTC)
    except (OverflowError, OSError, ValueError):
        return None
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


@functools.lru_cache(maxsize=8192)
def _iso_second(second: int) -> str:
    """One second's text, remembered: a loop's trials are created, start and end in the same seconds
    (a 5,000-trial final view has ~15,000 times in a few hundred seconds), and a lookup is a fraction
    of ``strftime``'s cost."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(second))


TIME_KEYS = ("last_sync",)  # Unix times whose name does not end in _at


@functools.lru_cache(maxsize=4096)
def _time_key(key: str) -> str | None:
    """``key``'s ``_iso`` twin when ``key`` names a Unix time, else None (asked once per distinct key)."""
    return f"{key}_iso" if key.endswith("_at") or key in TIME_KEYS else None


def with_iso(data: Any) -> Any:
    """JSON-ready data with an ``<key>_iso`` twin after every Unix-time field (``*_at``, ``last_sync``)."""
    if isinstance(data, list):
        return [with_iso(v) if isinstance(v, (list, dict)) else v for v in data]
    if not isinstance(data, dict):
        return data
    out: dict[str, Any] = {}
    for key, value in data.items():
        out[key] = with_iso(value) if isinstance(value, (list, dict)) else value
        twin = _time_key(key) if isinstance(key, str) else None
        if twin is not None and twin not in data and (value is None or isinstance(value, (int, float))):
            out[twin] = iso(value)
    return out


@functools.lru_cache(maxsize=256)
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def _plain(value: Any) -> Any:
    """``dataclasses.asdict``'s result (dataclasses, lists, tuples and dicts copied into plain ones), without
    its deep copy of every leaf: a 5,000-trial loop's final view is converted in a fraction of the time."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return type(value)(*(_plain(v) for v in value)) if hasattr(value, "_fields") else tuple(
            _plain(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {name: _plain(getattr(value, name)) for name in _field_names(type(value))}
    return copy.deepcopy(value)


_LEAVES = frozenset((str, float, int, bool))


@functools.lru_cache(maxsize=256)
def _iso_fields(cls: type) -> tuple[tuple[str, str | None], ...]:
    """A dataclass's fields, each with its ``_iso`` twin (None: not a time, or a field of that name exists)."""
    names = _field_names(cls)
    return tuple((name, twin if (twin := _time_key(name)) is not None and twin not in names else None)
                 for name in names)


_DATACLASS_FIELDS: dict[type, tuple[tuple[str, str | None], ...] | None] = {}  # a type's _iso_fields, None: no dataclass


def json_ready(value: Any) -> Any:
    """``with_iso(to_dict(value))`` in one walk: a view's dataclasses, dicts and lists copied into plain
    ones, with an ``<key>_iso`` twin after every Unix-time field. A 5,000-trial loop's final ``--json``
    view is ~150,000 leaves; two walks (a copy, then a copy with twins) were ~0.3 s of the command's
    tail after its last trial, one is about half."""
    kind = type(value)
    if kind in _LEAVES or value is None:
        return value
    if kind is list:
        return [v if type(v) in _LEAVES or v is None else json_ready(v) for v in value]
    if isinstance(value, list):
        return [json_ready(v) for v in value]
    out: dict[Any, Any] = {}
    fields = _DATACLASS_FIELDS.get(kind)
    if fields is None and kind not in _DATACLASS_FIELDS:
        if len(_DATACLASS_FIELDS) > 1024:  # (types made on the fly: bounded)
            _DATACLASS_FIELDS.clear()
        fields = _DATACLASS_FIELDS[kind] = (_iso_fields(kind) if dataclasses.is_dataclass(kind) else None)
    if fields is not None:
        for name, twin in fields:
            item = getattr(value, name)
            if type(item) not in _LEAVES and item is not None:  # (a call a leaf saved: most are)
                item = json_ready(item)
            out[name] = item
            if twin is not None and (item is None or isinstance(item, (int, float))):
                out[twin] = iso(item)
        return out
    if not isinstance(value, dict):
        return _plain(value)  # a tuple, a leaf of another type: as to_dict makes it (with_iso leaves it)
    pairs = [(_plain(k), v) for k, v in value.items()]
    keys = {k for k, _ in pairs}
    for key, item in pairs:
        if type(item) not in _LEAVES and item is not None:
            item = json_ready(item)
        out[key] = item
        twin = _time_key(key) if isinstance(key, str) else None
        if twin is not None and twin not in keys and (item is None or isinstance(item, (int, float))):
            out[twin] = iso(item)
    return out


def to_dict(view: Any) -> Any:
    if dataclasses.is_dataclass(view) and not isinstance(view, type):
        return _plain(view)
    if isinstance(view, list):
        return [to_dict(v) for v in view]
    return view
