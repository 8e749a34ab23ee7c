"""Health policy as pure functions, like the scheduler (docs/architecture.md, invariant 4).

:func:`node_state`: what a node's findings make of it.

* ``down`` is the backend's word (it stopped reporting the node): findings do not change it.
* ``cordoned``: one hard fault (uncorrectable ECC, a hard Xid, a missing GPU...) or infra
  failures of ``cordon_after`` different jobs within ``cordon_window`` (one job failing
  again and again is more likely its own trouble than the node's). It stays
  cordoned until a person uncordons it, or, with ``uncordon: preflight``, until a
  preflight passes after the cordon (only for a cordon the health checks made: a cordon
  by hand is lifted by hand).
* ``degraded``: it throttled (clock-event reasons, temperature near slowdown) within
  ``degraded_for``; the scheduler places it last. Healthy again once that passes.

Findings up to the node's last clearing (an uncordon) no longer count.

:func:`failure_class`: whose fault an ended attempt was. ``infra`` (the machine's:
retried elsewhere, from its checkpoint, not against the user's retries being wasted on
a bug) or ``user`` (the program's: not retried, the excerpt and a hint say why).
No I/O, no clock: ``now`` is an argument.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autoresearch.health.config import HealthConfig
from autoresearch.health.findings import Finding

PREFIX = "health: "  # the reason of a state the health checks set (not a person)


@dataclass(frozen=True, slots=True)
class NodeStatus:
    state: str  # healthy | degraded | cordoned | down
    reason: str = ""
    since: float = 0.0
    cleared_at: float = 0.0  # last uncordon: findings before it are forgiven

    @property
    def by_health(self) -> bool:
        return self.reason.startswith(PREFIX)


def _window(findings: Sequence[Finding], start: float) -> list[Finding]:
    return [f for f in findings if f.ts >= start]


def _after(findings: Sequence[Finding], cleared_at: float) -> list[Finding]:
    """The findings a clearing (an uncordon at ``cleared_at``) did not forgive."""
    return [f for f in findings if f.ts > cleared_at]


def node_state(current: NodeStatus, findings: Sequence[Finding], config: HealthConfig, now: float,
               preflight_passed_at: float | None = None) -> NodeStatus:
    """The node's state after ``findings`` (this node's, any age; those that no longer count are ignored)."""
    if current.state == "down":
        return current
    if current.state == "cordoned":
        if (current.by_health and config.uncordon == "preflight" and preflight_passed_at is not None
                and preflight_passed_at >= current.since):
            return NodeStatus("healthy", "", now, now)
        return current
    live = _after(findings, current.cleared_at)
    hard = [f for f in live if f.severity == "hard" and f.cls == "infra"]
    if hard:
        first = min(hard, key=lambda f: f.ts)
        return NodeStatus("cordoned", PREFIX + first.line()[:240], now, current.cleared_at)
    endings = _window([f for f in live if f.source == "ending" and f.cls == "infra"], now - config.cordon_window_s)
    jobs = {f.job_id if f.job_id is not None else -i for i, f in enumerate(endings, 1)}
    if len(jobs) >= config.cordon_after:
        last = max(endings, key=lambda f: f.ts)
        return NodeStatus("cordoned", PREFIX + f"infra failures of {len(jobs)} jobs within "
                          f"{_span(config.cordon_window_s)} (last: {last.excerpt[:160]})", now, current.cleared_at)
    throttled = _window([f for f in live if f.cls == "throttle"], now - config.degraded_for_s)
    if throttled:
        last = max(throttled, key=lambda f: f.ts)
        reason = PREFIX + last.line()[:240]
        if current.state == "degraded":
            return NodeStatus("degraded", reason, current.since, current.cleared_at)
        return NodeStatus("degraded", reason, now, current.cleared_at)
    if current.state == "degraded" and current.by_health:
        return NodeStatus("healthy", "", now, current.cleared_at)
    return current


def _span(seconds: float) -> str:
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


@dataclass(frozen=True, slots=True)
class Classified:
    cls: str  # infra | user
    why: str
    excerpt: str = ""
    hint: str = ""
    signature: str = ""


_USER_HINTS = {
    "cuda_oom": "the program ran out of GPU memory: lower the batch size or model size, or ask for more GPUs; "
                "it is not retried",
    "python_exception": "the program raised an exception (see the excerpt); fix it and resubmit; it is not retried",
}
INFRA_HINT = "the machine's fault, not the program's: it is retried on another node (from its checkpoint, if it keeps one)"


def _tier(f: Finding) -> int:
    if f.severity == "info":
        return 9  # shown, never decisive
    if f.cls == "infra" and f.severity == "hard":
        return 0
    if f.signature == "cuda_oom":
        return 2
    if f.cls == "infra" and f.signature not in ("nccl_warn", "hang"):
        return 3
    if f.cls == "user" and f.severity != "info":
        return 4
    if f.cls == "infra":
        return 5  # an NCCL WARN or a hang alone: more likely the machine's than not
    return 9


def failure_class(end_reason: str | None, exit_code: int | None, detail: str,
                  findings: Sequence[Finding]) -> Classified | None:
    """Whose fault an ended attempt was; None when it did not fail (succeeded, cancelled, preempted).

    ``findings``: the attempt's own (log signatures, NVML on its GPUs while it ran, a hang).
    A hard fault of the machine wins; then CUDA running out of memory (the program's); then
    the machine's NCCL and memory faults; then the program's exceptions.
    """
    if end_reason in ("cancelled", "preempted", None) or (end_reason == "exit" and exit_code == 0):
        return None
    ranked = sorted((f for f in findings if _tier(f) < 9), key=lambda f: (_tier(f), f.ts))
    if ranked:
        top = ranked[0]
        if top.cls == "infra":
            return Classified("infra", top.line()[:300], top.excerpt, INFRA_HINT, top.signature)
        return Classified("user", top.line()[:300], top.excerpt,
                          _USER_HINTS.get(top.signature, "the program's own error: it is not retried"), top.signature)
    if end_reason == "infra":
        return Classified("infra", detail or "the attempt was lost", "", INFRA_HINT, "lost")
    if end_reason == "timeout":
        return Classified("user", detail or "ran past its timeout", "",
                          "raise the job's timeout or make it faster; a hang with no output is a finding "
                          "(health.hang_after)", "timeout")
    return Classified("user", detail or f"exited {exit_code}", "",
                      "the program failed on its own (no fault of the machine was seen): see the log", "exit")
