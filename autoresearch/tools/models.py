"""Pydantic return models: the structured output every tool declares.

Kept flat and small so a result fits in a model's context window: times are Unix
seconds with an ISO 8601 twin (``*_iso``, UTC), lists are capped by the tools that fill
them, and every model that can lead somewhere has a ``next_step`` telling the agent
what to call next.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, computed_field

from autoresearch.views import iso


class Attempt(BaseModel):
    n: int = Field(description="Attempt number, from 1.")
    state: str
    node: str | None
    gpus: list[str] = Field(description="GPU slots it ran on.")
    started_at: float | None
    ended_at: float | None
    exit_code: int | None
    signal: int | None
    end_reason: str | None = Field(description="exit | timeout | cancelled | stopped (by its research loop) | "
                                                 "preempted | infra")
    detail: str | None
    failure_class: str | None = Field(default=None, description="When it failed: 'infra' (the machine's own "
                                      "evidence: retried on another node), 'infra-suspect' (the job's output or a lost "
                                      "attempt points at the machine, not confirmed by it: retried elsewhere), "
                                      "'unknown' (a signal nobody sent: retried) or 'user' (the program's: not "
                                      "retried).")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def started_at_iso(self) -> str | None:
        return iso(self.started_at)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def ended_at_iso(self) -> str | None:
        return iso(self.ended_at)


class JobSummary(BaseModel):
    id: int
    name: str
    state: str = Field(description="queued | starting | running | succeeded | failed | cancelled")
    priority: str
    gpus: int
    attempts: int
    exit_code: int | None
    end_reason: str | None
    experiment: str
    submitted_at: float
    started_at: float | None
    ended_at: float | None
    cancelling: bool = False

    @computed_field  # type: ignore[prop-decorator]
    @property
    def submitted_at_iso(self) -> str | None:
        return iso(self.submitted_at)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def started_at_iso(self) -> str | None:
        return iso(self.started_at)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def ended_at_iso(self) -> str | None:
        return iso(self.ended_at)


class JobDetail(JobSummary):
    command: str
    workdir: str
    tags: dict[str, str] = Field(default_factory=dict)
    attempt_list: list[Attempt] = Field(default_factory=list)
    failure_class: str | None = Field(default=None, description="On failure: 'user' (the program: its exit code, "
                                      "its own crash, CUDA out of memory, illegal memory access, NCCL invalid usage, "
                                      "an exception, a timeout, an OOM kill), 'infra' (the machine said so: an Xid or "
                                      "ECC fault from the driver or the kernel log, a failed probe), 'infra-suspect' "
                                      "(what points at the machine came from the job: an NCCL system error or watchdog "
                                      "timeout in its log, a lost attempt, a killed hang; the node was re-checked and "
                                      "found clean) or 'unknown' (a signal nobody sent, e.g. kill -9). All but 'user' "
                                      "are retried on another node.")
    failure_why: str | None = Field(default=None, description="On failure: the signature that decided the class "
                                    "and its log line or GPU finding.")
    failure_hint: str | None = Field(default=None, description="On failure: what happens next or what to fix.")
    log_excerpt: str | None = Field(default=None, description="On failure: the last lines of the failed attempt's log.")
    warnings: list[str] = Field(default_factory=list, description="Metrics the job wrote that were dropped "
                                "(bad step or value), or errors autoresearch hit while handling it.")
    unread_points: int = Field(default=0, description="Points (estimated) of its ended output still being read: "
                                                     "its metrics are partial while this is above 0.")
    limits: str | None = Field(default=None, description="A sandboxed (tenant) job's limits and how they are "
                                                        "enforced (rlimits, or a cgroup), from its last attempt.")


class SubmitResult(BaseModel):
    id: int
    state: str
    name: str
    next_step: str
    warnings: list[str] = Field(default_factory=list, description="e.g. no node can run it now (all cordoned).")
    last_id: int | None = Field(default=None, description="An array's last job: its jobs are id to last_id, "
                                                          "in index order.")
    count: int | None = Field(default=None, description="An array's number of jobs.")


class StatusResult(BaseModel):
    job: JobDetail | None = Field(default=None, description="The job asked for, in detail.")
    jobs: list[JobSummary] = Field(default_factory=list, description="The recent jobs, when no job_id was given.")
    next_step: str = ""


class JobList(BaseModel):
    jobs: list[JobSummary]
    next_cursor: int | None = Field(description="Pass as cursor to get the next (older) page; null on the last page.")


class LogResult(BaseModel):
    job_id: int
    attempt: int = Field(description="The attempt this text comes from (0: the job has not started).")
    text: str
    offset: int = Field(description="Byte offset of the first byte of text.")
    next_offset: int = Field(description="Byte offset just after text: pass as offset to read on.")
    size: int = Field(description="Bytes in the log so far.")
    truncated: bool = Field(description="True when more text exists than was returned.")
    hint: str = Field(default="", description="How to get the rest, when truncated.")


class Metric(BaseModel):
    name: str
    last: float | None
    best: float | None
    step: int
    count: int
    mode: str = Field(description="'min' or 'max': which direction 'best' means.")
    series: list[tuple[int, float | None]] | None = Field(default=None, description="(step, value), at most max_points.")


class MetricsResult(BaseModel):
    job_id: int
    state: str
    metrics: list[Metric]
    unread_points: int = Field(default=0, description="Points (estimated) of the job's ended output still being "
                                                     "read: the values are partial while this is above 0.")
    next_step: str = ""


class CancelResult(BaseModel):
    id: int
    state: str
    cancelling: bool = Field(description="True while a running attempt is being stopped (SIGTERM, grace, SIGKILL).")
    next_step: str
    states: dict[str, int] | None = Field(default=None, description="With last_job_id: how many of the range "
                                                                    "are in each state now.")


class Node(BaseModel):
    name: str
    backend: str
    state: str = Field(description="healthy | degraded | cordoned | down")
    reason: str
    gpus: int
    gpus_free: int
    running: int
    since: float | None = Field(default=None, description="When it entered its state.")
    findings: list[str] = Field(default_factory=list, description="Its last health findings (at most 2): "
                                "'signature on node GPU n: what'.")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def since_iso(self) -> str | None:
        return iso(self.since)


class ProjectUsage(BaseModel):
    project: str
    gpus_used: int = Field(description="GPUs its running jobs hold (best-effort ones included).")
    quota: int | None = Field(description="GPUs its normal and critical jobs may hold; null: no cap.")
    weight: float = Field(description="Its fair-share weight: the queue favours the project furthest below it.")
    queued: int
    guaranteed: int = Field(0, description="GPUs it takes back from projects that borrow (preempting them).")
    borrow: int | None = Field(None, description="GPUs past its guarantee it may hold; null: unset.")
    decayed_gpu_h: float = Field(0.0, description="Past usage in GPU-hours, decayed with the half-life.")
    share: float = Field(0.0, description="(GPU share now + past share) / weight: the lowest goes next.")


class ClusterResult(BaseModel):
    nodes: list[Node]
    gpus_total: int
    gpus_free: int
    gpus_used: int
    running: int
    queued: dict[str, int] = Field(description="Queued jobs per priority class (critical, normal, best-effort).")
    cordoned: list[str] = Field(description="'node: reason' for each cordoned node.")
    degraded: list[str] = Field(default_factory=list, description="'node: reason' for each degraded (throttling) "
                                "node: jobs go there last.")
    projects: list[ProjectUsage] = Field(default_factory=list, description="Fair share: each project's GPUs in use, "
                                         "quota, weight and queued jobs (yours only, on a tokened server).")


class BackendInfo(BaseModel):
    name: str = Field(description="A profile of config.yaml, or a kind with its default options.")
    kind: str
    default: bool = Field(description="Where a submit that names no backend goes.")
    capabilities: list[str] = Field(description="gpus, preemption, multi_node, containers, places, ...")
    ok: bool | None = Field(description="Whether it answered (None: not probed).")
    nodes: int | None
    gpus: int | None
    error: str = ""
    hint: str = ""


class BackendsResult(BaseModel):
    backends: list[BackendInfo]
    next_step: str


def from_view(model: type[BaseModel], view: Any) -> Any:
    """Build a model from a facade dataclass view, keeping only the model's fields."""
    data = {name: getattr(view, name) for name in model.model_fields if hasattr(view, name)}
    if "attempt_list" in data:
        data["attempt_list"] = [from_view(Attempt, a) for a in data["attempt_list"]]
    return model.model_validate(data)
