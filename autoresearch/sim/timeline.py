"""One attempt's life, as a pure function of its launch record, the fault schedule, the
cordons so far and the stop it was sent: the same inputs give the same life in any process.

The attempt resumes at ``record.resume`` (its job's last checkpoint) and runs its steps on
its nodes at the slowest member's speed, slower while any member throttles. The first of a
node loss (lost), an Xid (crash, the driver's line in the log), an NCCL hang (frozen, then
the watchdog's timeout), a stop or its timeout (SIGTERM) ends it; else it exits 0 after its
last step. Checkpoints fall every ``checkpoint_every`` steps or seconds; the work after the
last one is what a fault or a preemption loses.

A *script* record (the conformance suite's programs) instead writes its output at once and
exits with its code, or runs until it is stopped (and dies, exits, or ignores SIGTERM until
SIGKILL after the grace period).
"""

from __future__ import annotations

import math
import signal
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from autoresearch.sim.faults import Schedule, hang_line, xid_line

LOG_LINES = 20  # progress lines per run (not one per step: a million-step run stays a small log)


@dataclass(frozen=True, slots=True)
class Record:
    """What ``start`` wrote about an attempt (JSON in its run dir)."""

    key: str
    t0: float
    nodes: tuple[str, ...]
    gpus: int = 0  # all members together
    speed: float = 1.0  # the slowest member's
    timeout: float | None = None
    grace: float = 10.0
    resume: int = 0
    seconds: tuple[float, ...] = ()
    values: tuple[float, ...] = ()
    metric: str = "loss"
    checkpoint_steps: int = 0
    checkpoint_s: float = 0.0
    script: dict[str, Any] | None = None  # {output, exit_code, on_term, term_output}

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Record:
        data = dict(data)
        for k in ("nodes", "seconds", "values"):
            data[k] = tuple(data.get(k) or ())
        return cls(**{k: data[k] for k in cls.__slots__ if k in data})


@dataclass(frozen=True, slots=True)
class Ending:
    t: float
    state: Literal["exited", "lost"] = "exited"
    exit_code: int | None = None
    signal: int | None = None
    timed_out: bool = False
    stopped: bool = False
    detail: str = ""
    cause: str = "done"  # done | stop | timeout | node_loss | xid | nccl_hang | exit


@dataclass(slots=True)
class Life:
    lines: list[tuple[float, str]] = field(default_factory=list)  # (t, log line)
    points: list[tuple[float, int, float]] = field(default_factory=list)  # (t, step, value)
    checkpoints: list[tuple[float, int]] = field(default_factory=list)  # (t, steps done)
    ending: Ending | None = None  # None: runs until stopped

    def checkpoint_at(self, t: float, resume: int = 0) -> int:
        """Steps kept by the last checkpoint at or before ``t``."""
        kept = resume
        for at, step in self.checkpoints:
            if at > t:
                break
            kept = step
        return kept

    def next_after(self, t: float) -> float | None:
        """The first observable moment after ``t`` (a line, a point, the ending)."""
        best = self.ending.t if self.ending is not None and self.ending.t > t else None
        for at, _ in self.lines:
            if at > t:
                best = at if best is None else min(best, at)
                break
        for at, _, _ in self.points:
            if at > t:
                best = at if best is None else min(best, at)
                break
        return best


def live(rec: Record, schedule: Schedule | None, cordons: Sequence[tuple[str, float]] = (),
         stop: tuple[float, float] | None = None, output: bool = True) -> Life:
    """The attempt's whole life. ``stop``: (simulated time, grace) of the first stop request."""
    if rec.script is not None:
        return _script(rec, stop)
    life = Life()
    def say(item: tuple[float, str]) -> None:
        if output:
            life.lines.append((item[0], item[1] + "\n"))

    term_t, term_cause = _term(rec, stop)
    t = rec.t0
    say((t, f"sim: attempt {rec.key} on {','.join(rec.nodes)} ({rec.gpus} GPUs), from step {rec.resume} "
            f"of {len(rec.seconds)}"))
    if rec.resume:
        say((t, f"sim: resumed from the checkpoint at step {rec.resume}"))
    f = schedule.f if schedule is not None else None
    kinds = ("node_loss", "xid", "nccl_hang") if rec.gpus >= 2 else ("node_loss", "xid")
    early: tuple[float, str, str, int] | None = None  # (t, kind, node, gpu): a fault known at start
    if schedule is not None and f is not None:
        for node in rec.nodes:
            if schedule.down(node, t) is not None:
                early = (t, "node_loss", node, 0)
                break
            sick = schedule.sick(node, t, cordons)
            if sick is not None and (early is None or t + f.sick_crash_after < early[0]):
                early = (t + f.sick_crash_after, "xid", node, sick.gpu)
    every = max(1, len(rec.seconds) // LOG_LINES)
    last_ckpt = t
    along = schedule.along(rec.nodes, t, kinds) if schedule is not None else None
    # The faults are read as the life goes (Along): the last thermal fault so far and when the next may come
    # (``hot_until``), and a time before which no fault of ``kinds`` comes (``clear``), so that a step asks
    # the schedule only when it reaches one of them: the same answers as asking at every step.
    thermal = along is not None and f is not None and f.thermal > 0 and along.thermal_for > 0
    thermal_for = along.thermal_for if along is not None else 0.0
    hot_last: float | None = None
    hot_until = clear = -math.inf
    for i in range(rec.resume, len(rec.seconds)):
        slow = 1.0
        if thermal and f is not None and along is not None:
            if t >= hot_until:
                hot_last, hot_until = along.hot_at(t)
            if hot_last is not None and hot_last > t - thermal_for:
                slow = f.thermal_slowdown
        end = t + rec.seconds[i] / rec.speed * slow
        hit = early if early is not None and early[0] <= end else None
        if hit is None and along is not None and end >= clear and end > t:
            x = along.first(t, end)
            if x is not None:
                hit = (x.t, x.kind, x.node, x.gpu)
            else:
                clear = along.clear_after(end)
        if term_t is not None and term_t <= end and (hit is None or term_t <= hit[0]):
            life.ending = _sigterm(rec, term_t, term_cause)
            return life
        if hit is not None and f is not None:
            life.ending = _fault(rec, hit, f.hang_timeout, term_t, term_cause, say)
            return life
        t = end
        if output:
            life.points.append((t, i + 1, rec.values[i] if i < len(rec.values) else 0.0))
            if (i + 1) % every == 0:
                say((t, f"sim: step {i + 1}/{len(rec.seconds)} done"))
        if (rec.checkpoint_steps and (i + 1) % rec.checkpoint_steps == 0) or (
                rec.checkpoint_s and t - last_ckpt >= rec.checkpoint_s):
            life.checkpoints.append((t, i + 1))
            last_ckpt = t
    if term_t is not None and term_t <= t:
        life.ending = _sigterm(rec, term_t, term_cause)
        return life
    say((t, "sim: finished"))
    life.ending = Ending(t, exit_code=0, detail="exited 0", cause="done")
    return life


def _term(rec: Record, stop: tuple[float, float] | None) -> tuple[float | None, str]:
    limit = rec.t0 + rec.timeout if rec.timeout is not None else None
    if stop is not None and (limit is None or stop[0] <= limit):
        return max(stop[0], rec.t0), "stop"
    return limit, "timeout"


def _sigterm(rec: Record, t: float, cause: str) -> Ending:
    return Ending(t, signal=int(signal.SIGTERM), timed_out=cause == "timeout", stopped=cause == "stop",
                  detail="ended by SIGTERM", cause=cause)


def _fault(rec: Record, hit: tuple[float, str, str, int], hang_timeout: float, term_t: float | None,
           term_cause: str, say: Any) -> Ending:
    t, kind, node, gpu = hit
    if kind == "node_loss":
        return Ending(t, state="lost", detail=f"node {node} was lost (simulated node failure)", cause="node_loss")
    if kind == "xid":
        say((t, xid_line(node, gpu)))
        say((t, "RuntimeError: CUDA error: unspecified launch failure"))
        return Ending(t, exit_code=1, detail="exited 1", cause="xid")
    # nccl_hang: no progress until the watchdog fires (or a stop/timeout comes first)
    if term_t is not None and term_t <= t + hang_timeout:
        return _sigterm(rec, max(term_t, t), term_cause)
    say((t + hang_timeout, hang_line(hang_timeout)))
    return Ending(t + hang_timeout, exit_code=1, detail="exited 1", cause="nccl_hang")


def _script(rec: Record, stop: tuple[float, float] | None) -> Life:
    s = rec.script or {}
    life = Life()
    out = str(s.get("output") or "")
    if out:
        life.lines.append((rec.t0, out))
    code = s.get("exit_code")
    if code is not None:
        life.ending = Ending(rec.t0, exit_code=int(code), detail=f"exited {code}", cause="exit")
        return life
    term_t, cause = _term(rec, stop)
    if term_t is None:
        return life
    on_term = s.get("on_term", "die")
    if on_term == "exit":
        if s.get("term_output"):
            life.lines.append((term_t, str(s["term_output"])))
        life.ending = Ending(term_t, exit_code=0, timed_out=cause == "timeout", stopped=cause == "stop",
                             detail="exited 0", cause=cause)
    elif on_term == "ignore":
        grace = stop[1] if cause == "stop" and stop is not None else rec.grace
        life.ending = Ending(term_t + grace, signal=int(signal.SIGKILL), timed_out=cause == "timeout",
                             stopped=cause == "stop", detail="killed after the grace period", cause=cause)
    else:
        life.ending = _sigterm(rec, term_t, cause)
    return life
