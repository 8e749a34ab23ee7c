"""What the health checks find, as plain data, and the rules that turn NVML samples into findings.

A :class:`Finding` names a node, a GPU (or none), a ``signature`` (``xid_79``,
``ecc_uncorrectable``, ``nccl_error``, ``cuda_oom``...), whose fault it is (``cls``:
``infra``, ``infra-suspect``, ``user``, or ``throttle`` for a node that slows down), how
bad (``severity``: ``hard`` cordons a node at once, ``soft`` may count toward
``cordon_after``, ``info`` is only shown) and where it came from (``source``), which
says who owns the evidence (:func:`owner`): the machine (NVML, the kernel log, the probe,
the engine) or the job (its output, its exit code or signal, its silence). Only
machine-owned evidence decides about a node (invariant 10). :func:`check_sample` is pure: a sample, the GPUs an attempt
was given and the thresholds in, findings out. Stdlib only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from autoresearch.health.config import HealthConfig
from autoresearch.health.nvml import NodeSample, reason_names

EXCERPT_CHARS = 400
# Where evidence comes from, and who owns it. Anything not listed is the job's.
# ("verdict": an attempt's ending that the machine's own evidence classed infra; "ending": one the job's
# evidence classed infra-suspect.)
MACHINE_SOURCES = frozenset({"nvml", "preflight", "probe", "health", "kernel", "engine", "dcgm", "verdict"})
JOB_SOURCES = frozenset({"log", "ending", "hang", "exit", "signal"})


def owner(source: str) -> str:
    """``machine`` for evidence the machine gave (the driver, the kernel log, the probe, the engine),
    ``job`` for what a job printed or did (its output, exit code, signal, silence)."""
    return "machine" if source in MACHINE_SOURCES else "job"


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing a check found about a node (NVML, the kernel log, a preflight, a probe, a hang)."""

    node: str
    signature: str
    cls: str  # infra | user | throttle
    severity: str  # hard | soft | info
    source: str  # nvml | log | preflight | probe | hang
    gpu: str | None = None
    excerpt: str = ""
    ts: float = 0.0
    job_id: int | None = None
    attempt: int | None = None

    @property
    def owner(self) -> str:
        return owner(self.source)

    @property
    def machine_fault(self) -> bool:
        """A fault the machine itself reported (a hard one cordons its node)."""
        return self.cls == "infra" and self.owner == "machine"

    def to_json(self) -> dict[str, Any]:
        data = {k: v for k, v in asdict(self).items() if v not in (None, "")}
        data["owner"] = self.owner
        return data

    @classmethod
    def from_json(cls, data: Any, ts: float = 0.0, job_id: int | None = None,
                  attempt: int | None = None) -> Finding | None:
        """A finding read back from the ledger; None when the record is not one."""
        if not isinstance(data, dict):
            return None
        try:
            return cls(node=str(data.get("node") or ""), signature=str(data["signature"])[:60],
                       cls=str(data.get("cls") or "infra"), severity=str(data.get("severity") or "info"),
                       source=str(data.get("source") or ""), gpu=None if data.get("gpu") is None else str(data["gpu"]),
                       excerpt=str(data.get("excerpt") or "")[:EXCERPT_CHARS], ts=float(data.get("ts") or ts),
                       job_id=job_id, attempt=attempt)
        except (KeyError, TypeError, ValueError):
            return None

    def line(self) -> str:
        """One short line: ``xid_79 on node-a GPU 1: <excerpt>``."""
        where = f"{self.node} GPU {self.gpu}" if self.gpu is not None else self.node
        text = f"{self.signature} on {where}" if where else self.signature
        return f"{text}: {self.excerpt}" if self.excerpt else text


def _version(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in text.split(".")[:4] if p != "")
    except ValueError:
        return ()


def check_sample(node: str, sample: NodeSample, gpu_ids: tuple[str, ...] | None, config: HealthConfig,
                 now: float = 0.0, source: str = "nvml") -> list[Finding]:
    """Findings of one node's sample. ``gpu_ids``: the GPUs that must be present and healthy
    (an attempt's); None: every GPU the sample has."""

    def found(signature: str, cls: str, severity: str, gpu: Any, excerpt: str) -> Finding:
        return Finding(node, signature, cls, severity, source, None if gpu is None else str(gpu), excerpt[:EXCERPT_CHARS],
                       now)

    out: list[Finding] = []
    if sample.error:
        return [found("nvml_unavailable", "infra", "hard", None, sample.error)]
    by_index = {str(g.index): g for g in sample.gpus}
    wanted = list(by_index) if gpu_ids is None else [str(g) for g in gpu_ids]
    for gpu in wanted:
        if gpu not in by_index:
            out.append(found("gpu_missing", "infra", "hard", gpu,
                             f"GPU {gpu} is not among the {sample.device_count} the driver reports"))
    if config.min_driver and sample.driver_version and _version(sample.driver_version) < _version(config.min_driver):
        out.append(found("driver_old", "infra", "soft", None,
                         f"driver {sample.driver_version} is older than {config.min_driver}"))
    for gpu in wanted:
        g = by_index.get(gpu)
        if g is None:
            continue
        if g.ecc_volatile_uncorrected > config.ecc_uncorrected_max:
            out.append(found("ecc_uncorrectable", "infra", "hard", gpu,
                             f"{g.ecc_volatile_uncorrected} uncorrectable ECC error(s) since the driver loaded "
                             f"({g.ecc_aggregate_uncorrected} in its lifetime)"))
        if g.retired_pages_pending:
            out.append(found("retired_pages_pending", "infra", "hard", gpu,
                             "retired pages are pending: the GPU needs a reset"))
        if g.row_remap_failure:
            out.append(found("row_remap_failure", "infra", "hard", gpu, "a memory row could not be remapped"))
        if g.row_remap_pending:
            out.append(found("row_remap_pending", "infra", "hard", gpu,
                             "a memory row remap is pending: the GPU needs a reset"))
        for xid in sorted(set(g.xids)):
            hard = xid in config.hard_xids
            out.append(found(f"xid_{xid}", "infra" if hard else "user", "hard" if hard else "info", gpu,
                             f"Xid {xid} reported by the driver"))
        throttled = g.clock_event_reasons & config.throttle_reasons
        if throttled:
            out.append(found("throttling", "throttle", "soft", gpu,
                             f"clocks slowed: {', '.join(reason_names(throttled)) or hex(throttled)}"))
        if g.temperature_c is not None and g.slowdown_c is not None and \
                g.temperature_c >= g.slowdown_c - config.temperature_margin_c:
            out.append(found("hot", "throttle", "soft", gpu,
                             f"{g.temperature_c:.0f} C, slowdown at {g.slowdown_c:.0f} C"))
        if g.errors:  # NVML failed on this GPU after open: its other readings are not "healthy", they are unknown
            out.append(found("nvml_error", "infra", "soft", gpu, "NVML failed after open: " + "; ".join(g.errors)))
        if not g.persistence_mode:
            out.append(found("persistence_off", "infra", "info", gpu, "persistence mode is off (slow first start)"))
    return out


def blocking(findings: list[Finding]) -> list[Finding]:
    """The findings that stop an attempt from starting (hard faults the machine reported)."""
    return [f for f in findings if f.severity == "hard" and f.machine_fault]
