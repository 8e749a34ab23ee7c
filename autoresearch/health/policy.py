"""Health policy as pure functions, like the scheduler (docs/architecture.md, invariant 4).

:func:`node_state`: what a node's findings make of it. Only evidence the machine owns
(invariant 10: NVML, the kernel log, the probe, the engine) decides about a node; what a
job printed, its exit code or a signal it sent itself never cordons, alone.

* ``down`` is the backend's word (it stopped reporting the node): findings do not change it.
* ``cordoned``: one hard fault the machine reported (uncorrectable ECC, a hard Xid in the
  driver or the kernel log, a missing GPU, a failed probe...); or infra failures of
  ``cordon_after`` different jobs within ``cordon_window`` when the machine's own evidence
  classed them ``infra``; or, for ``infra-suspect`` failures (job-owned evidence: an NCCL
  error, a watchdog timeout, a lost attempt), the differential rule (:class:`Differential`):
  they count only for jobs that (or whose project's jobs) succeeded on another node in
  the window and did not fail the same way on another node, the counted ones must come
  from at least two projects, and never on the only node. It stays cordoned until a person uncordons it, or, with ``uncordon:
  preflight``, until a check passes after the cordon and the cool-down (``cooldown``) is
  over; a hard cause (Xid 79/48, uncorrectable ECC, a row remap failed or pending) always
  waits for a person.
* ``degraded``: it throttled (clock-event reasons, temperature near slowdown) within
  ``degraded_for``; the scheduler places it last. Healthy again once that passes.

Findings up to the node's last clearing (an uncordon) no longer count.

:func:`failure_class`: whose fault an ended attempt was: ``infra`` (the machine said so),
``infra-suspect`` (the job's output or ending points at the machine: retried elsewhere,
the node re-checked), ``unknown`` (killed by a signal nobody owns up to: retried, counts
against nothing) or ``user`` (the program's: not retried, the excerpt and a hint say why).
No I/O, no clock: ``now`` is an argument.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from autoresearch.health.config import HealthConfig
from autoresearch.health.findings import Finding

PREFIX = "health: "  # the reason of a state the health checks set (not a person)
HARD_CAUSE = "[hard] "  # after PREFIX: a cause that waits for a person whatever ``uncordon`` says
SUSPECT = "infra-suspect"
RETRIED = frozenset({"infra", SUSPECT, "unknown"})
# Hard causes: the GPU needs a reset or a replacement; a passing check is not enough to trust it again.
HARD_SIGNATURES = frozenset({"xid_48", "xid_79", "ecc_uncorrectable", "row_remap_failure", "row_remap_pending",
                             "retired_pages_pending"})


@dataclass(frozen=True, slots=True)
class Differential:
    """What the fleet says about a node's infra-suspect failures (the store reads it; pure here).

    ``other_nodes``: schedulable nodes besides this one; ``ok_jobs`` / ``ok_projects``: jobs and
    projects with an attempt that succeeded on another node within the window; ``projects``:
    the project of each job that failed here."""

    other_nodes: int = 0
    ok_jobs: frozenset[int] = frozenset()
    ok_projects: frozenset[str] = frozenset()
    projects: tuple[tuple[int, str], ...] = ()
    failed_elsewhere: frozenset[int] = frozenset()  # failed as infra-suspect on another node too: not this node's


def vouched(endings: Sequence[Finding], diff: Differential | None) -> list[Finding]:
    """The infra-suspect endings that count toward a cordon under the differential rule: their job (or a
    job of its project) succeeded elsewhere; none when the node is the only one, or when the ones that
    qualify come from fewer than two projects."""
    if diff is None or diff.other_nodes < 1:
        return []
    project = dict(diff.projects)
    out = [f for f in endings if f.job_id is not None and f.job_id not in diff.failed_elsewhere and (
        f.job_id in diff.ok_jobs or project.get(f.job_id, "\0none") in diff.ok_projects)]
    if len({project.get(f.job_id or -1, "") for f in out}) < 2:
        return []
    return out


@dataclass(frozen=True, slots=True)
class NodeStatus:
    """A node's health state, why and since when."""

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
               preflight_passed_at: float | None = None, diff: Differential | None = None) -> NodeStatus:
    """The node's state after ``findings`` (this node's, any age; those that no longer count are ignored).
    ``diff``: the fleet's word on its infra-suspect failures (None: they do not count)."""
    if current.state == "down":
        return current
    if current.state == "cordoned":
        hard_cause = current.reason.startswith(PREFIX + HARD_CAUSE)
        if (current.by_health and not hard_cause and config.uncordon == "preflight" and preflight_passed_at is not None
                and preflight_passed_at >= current.since + config.cooldown_s):
            return NodeStatus("healthy", "", now, now)
        return current
    live = _after(findings, current.cleared_at)
    hard = [f for f in live if f.severity == "hard" and f.machine_fault]
    if hard:
        first = min(hard, key=lambda f: f.ts)
        tag = HARD_CAUSE if any(f.signature in HARD_SIGNATURES for f in hard) else ""
        return NodeStatus("cordoned", PREFIX + tag + first.line()[:240], now, current.cleared_at)
    recent = _window([f for f in live if f.source in ("ending", "verdict") and f.cls in ("infra", SUSPECT)],
                     now - config.cordon_window_s)
    counted = ([f for f in recent if f.machine_fault]  # the machine's evidence classed these endings infra
               + vouched([f for f in recent if not f.machine_fault], diff))
    jobs = {f.job_id if f.job_id is not None else -i for i, f in enumerate(counted, 1)}
    if len(jobs) >= config.cordon_after:
        last = max(counted, key=lambda f: f.ts)
        return NodeStatus("cordoned", PREFIX + f"infra failures of {len(jobs)} jobs within "
                          f"{_span(config.cordon_window_s)} that ran elsewhere (last: {last.excerpt[:160]})", now,
                          current.cleared_at)
    throttled = _window([f for f in live if f.cls == "throttle" or (f.signature == "nvml_error" and f.machine_fault)],
                        now - config.degraded_for_s)
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
    """Whose fault a failed attempt looks like, why, and the log line that says it."""

    cls: str  # infra | infra-suspect | unknown | user
    why: str
    excerpt: str = ""
    hint: str = ""
    signature: str = ""

    @property
    def retried(self) -> bool:
        return self.cls in RETRIED


@dataclass(frozen=True, slots=True)
class Attribution:
    """Whose fault a failed attempt was, settled: its class (after the machine's re-check), the re-check's
    blocking findings and the nodes the failure is weighed against (an ``infra_failure`` on each)."""
    classified: Classified
    confirmed: tuple[Finding, ...]
    blamed: tuple[str, ...]


def attribute(classified: Classified, members: Sequence[str], found: Sequence[Finding],
              recheck: Callable[[str], list[Finding]]) -> Attribution:
    """The runtime's attribution of a classified failure (:func:`failure_class`), after its findings
    ``found``: an ``infra-suspect`` ending (the job's word) re-checks every member's node (``recheck``: that
    node's blocking findings now, uncached); a fault found there makes it the machine's (``infra``, the first
    finding's words); then :func:`blamed` over what was found. ``Health.on_ending`` (health/monitor.py) and
    the simulated driver (autoresearch/sim/driver.py) both settle endings with this."""
    confirmed: list[Finding] = []
    if classified.cls == SUSPECT:
        for node in dict.fromkeys(members):
            confirmed += recheck(node)
        if confirmed:  # the machine confirms it: the machine's fault
            top = confirmed[0]
            classified = Classified("infra", top.line()[:300], top.excerpt, INFRA_HINT, top.signature)
    return Attribution(classified, tuple(confirmed), tuple(blamed(classified, members, [*found, *confirmed])))


def verdict(node: str, classified: Classified, excerpt: str, ts: float, job_id: int | None,
            attempt: int | None) -> Finding:
    """The finding that weighs a failure against ``node`` (what :func:`node_state` counts toward a cordon):
    a ``verdict`` when the machine's evidence classed it infra, else an ``ending`` (the differential decides)."""
    return Finding(node, "infra_failure", classified.cls, "soft", "verdict" if classified.cls == "infra" else "ending",
                   None, excerpt[:300], ts, job_id, attempt)


def blamed(classified: Classified, members: Sequence[str], findings: Sequence[Finding]) -> list[str]:
    """The nodes an ended attempt's failure is weighed against (an ``infra_failure`` on each): for
    ``infra``, the members' nodes the machine's own evidence of that fault names (member k's node for a
    gang whose fault was there), else every member's; for ``infra-suspect`` (the job's word, nobody's
    confirmation), every member's node, where the differential rule decides; nothing for ``user`` and
    ``unknown``. The runtime (health.monitor) and the simulated driver both decide with this."""
    if classified.cls not in ("infra", SUSPECT):
        return []
    nodes = list(dict.fromkeys(members))
    if classified.cls == "infra":
        named = {f.node for f in findings if f.machine_fault and f.signature == classified.signature}
        return [n for n in nodes if n in named] or nodes
    return nodes


_USER_HINTS = {
    "cuda_oom": "the program ran out of GPU memory: lower the batch size or model size, or ask for more GPUs; "
                "it is not retried",
    "illegal_memory_access": "the program's kernel read or wrote memory it does not own (an index out of range, a "
                             "freed tensor); run with CUDA_LAUNCH_BLOCKING=1 to find the line; it is not retried",
    "device_assert": "a device-side assertion failed in the program (often an index out of range); run with "
                     "CUDA_LAUNCH_BLOCKING=1 to find the line; it is not retried",
    "nccl_invalid_usage": "the program called NCCL wrongly (mismatched collectives, ranks or sizes); run with "
                          "NCCL_DEBUG=WARN for details; it is not retried",
    "python_exception": "the program raised an exception (see the excerpt); fix it and resubmit; it is not retried",
    "oom_kill": "the kernel's OOM killer ended it: the program ran out of host memory; ask for more memory "
                "(--memory) or use less; it is not retried",
}
INFRA_HINT = "the machine's fault, not the program's: it is retried on another node (from its checkpoint, if it keeps one)"
SUSPECT_HINT = ("the log points at the machine (not proven): the node was re-checked and the attempt is retried on "
                "another node; the node is cordoned only on the machine's own evidence")
UNKNOWN_HINT = ("killed by a signal nobody owns up to (no fault of the machine was seen): retried per --retries; "
                "it counts against no node")


def _tier(f: Finding) -> int:
    if f.owner == "machine" and f.signature == "oom_kill":
        return 2  # the kernel's OOM killer (an info finding of the node: decisive for the attempt it killed)
    if f.severity == "info" or f.signature in ("hang", "infra_failure"):
        return 9  # shown, never decisive (a hang report is not a verdict; a killed hang is "hang_killed")
    if f.machine_fault:
        return 0 if f.severity == "hard" else 1
    if f.cls == "user" and f.signature != "python_exception":
        return 3  # a specific bug of the program: CUDA OOM, illegal memory access, device assert, NCCL misuse
    if f.cls == SUSPECT:
        return 4
    if f.cls == "user":
        return 5
    return 9


def failure_class(end_reason: str | None, exit_code: int | None, detail: str,
                  findings: Sequence[Finding], signal: int | None = None) -> Classified | None:
    """Whose fault an ended attempt was; None when it did not fail (succeeded, cancelled, preempted).

    ``findings``: the attempt's own (log signatures, NVML and the kernel log on its node while it
    ran, a hang). A fault the machine reported wins (``infra``); then an OOM kill in the kernel log
    (``user``); then the program's specific bugs (``user``); then what points at the machine in the
    job's own output (``infra-suspect``); then the program's exceptions. With none of these: a lost
    attempt is ``infra-suspect``, a signal nobody sent ``unknown``, an exit code or a timeout ``user``.
    """
    if end_reason in ("cancelled", "preempted", None) or (end_reason == "exit" and exit_code == 0):
        return None
    ranked = sorted((f for f in findings if _tier(f) < 9), key=lambda f: (_tier(f), f.ts))
    if ranked:
        top = ranked[0]
        if top.cls == "infra":
            return Classified("infra", top.line()[:300], top.excerpt, INFRA_HINT, top.signature)
        if top.cls == SUSPECT:
            return Classified(SUSPECT, top.line()[:300], top.excerpt, SUSPECT_HINT, top.signature)
        return Classified("user", top.line()[:300], top.excerpt,
                          _USER_HINTS.get(top.signature, "the program's own error: it is not retried"), top.signature)
    if end_reason == "infra" and signal is not None:
        return Classified("unknown", detail or f"killed by signal {signal}", "", UNKNOWN_HINT, "signal")
    if end_reason == "infra":
        return Classified(SUSPECT, detail or "the attempt was lost", "", SUSPECT_HINT, "lost")
    if end_reason == "timeout":
        return Classified("user", detail or "ran past its timeout", "",
                          "raise the job's timeout or make it faster; a hang with no output is a finding "
                          "(health.hang_after)", "timeout")
    return Classified("user", detail or f"exited {exit_code}", "",
                      "the program failed on its own (no fault of the machine was seen): see the log", "exit")
