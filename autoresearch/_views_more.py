"""The facade's views that no job submit, status or list returns: a metric's, a node's, the
cluster's, the health and doctor views. Imported through :mod:`autoresearch.views` (its
``__getattr__``) at their first use, so the commands that never show them do not pay for making
their dataclasses at start. Plain dataclasses, JSON-ready, as every view.
"""

from __future__ import annotations

from dataclasses import dataclass, field


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
    unread_points: int = 0  # the job's points (estimated) still being read: the values are partial while > 0


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
    guaranteed: int = 0  # GPUs it takes back from projects that borrow (Kueue's nominal quota)
    borrow: int | None = None  # GPUs past its guarantee it may hold while others are idle; None: unset
    decayed_gpu_h: float = 0.0  # its past usage in GPU-hours, decayed with the half-life (ended and running)
    share: float = 0.0  # what the queue orders by (GPUs part): (GPU share now + past share) / weight, least first


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


@dataclass
class DoctorView:
    """``autoresearch doctor``: whether a home's ledger opens, whose run folders it holds, and, with
    ``--move-aside``, where the old ledger and run folders were kept."""

    home: str
    ledger_ok: bool
    ledger_id: str = ""  # the ledger's identity (its run folders' requests name it)
    run_folders: int = 0  # job folders under jobs/
    problem: str = ""  # why the ledger does not open
    hint: str = ""
    aside: str = ""  # the folder the old state was moved to
    moved: list[str] = field(default_factory=list)  # what was moved there (names in the home)
    aside_run_folders: int = 0  # job folders among them
