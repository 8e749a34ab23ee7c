"""The seeded fault schedule of every node, and what its GPUs read like at a moment.

Faults of each kind arrive on each node as a Poisson process at the configured rate per
node-hour, drawn per (seed, node, kind, simulated day), so any process can ask about any
moment without replaying history: the same seed gives the same faults everywhere.

* ``node_loss``: the node is gone (unreachable) for ``repair``; its attempts are lost.
* ``xid``: one GPU fails (Xid 79, fallen off the bus): running attempts crash with the
  driver's line in their log, and every attempt started there crashes ``sick_crash_after``
  in, until the node is fixed: ``repair`` after the health checks cordon it, else
  ``unattended_repair`` after the fault (someone notices).
* ``nccl_hang``: collectives on the node stop; an attempt using NCCL (two or more GPUs) makes
  no progress and ends ``hang_timeout`` later with the watchdog's collective-timeout line.
* ``thermal``: for ``thermal_for`` the node throttles: steps take ``thermal_slowdown`` times longer.
"""

from __future__ import annotations

import bisect
import functools
import random
from collections.abc import Sequence
from dataclasses import dataclass

from autoresearch.health.nvml import HW_THERMAL, GpuSample, NodeSample
from autoresearch.sim.fleet import FAULT_KINDS, Fleet

DAY = 86400.0
SLOWDOWN_C, SHUTDOWN_C = 87.0, 92.0


@dataclass(frozen=True, slots=True)
class Fault:
    t: float  # simulated seconds since the fleet's start
    kind: str  # node_loss | xid | nccl_hang | thermal
    node: str
    gpu: int = 0  # the GPU an xid hit


class Schedule:
    """The faults of ``fleet``'s nodes; ``cordons``: (node, simulated time) the health checks cordoned it."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.f = fleet.faults
        self._gpus = {name: t.gpus for name, t in fleet.nodes()}
        self._chunk = functools.lru_cache(maxsize=65536)(self._draw)
        self._times = functools.lru_cache(maxsize=65536)(self._draw_times)
        self._day = functools.lru_cache(maxsize=64)(self._draw_day)
        self._any = self.f.any

    def _draw(self, node: str, day: int) -> tuple[Fault, ...]:
        out: list[Fault] = []
        for kind in FAULT_KINDS:
            rate = getattr(self.f, kind) / 3600.0
            if rate <= 0:
                continue
            rng = random.Random(f"{self.fleet.seed}:{node}:{kind}:{day}")
            t = day * DAY
            while True:
                t += rng.expovariate(rate)
                if t >= (day + 1) * DAY:
                    break
                out.append(Fault(t, kind, node, rng.randrange(max(1, self._gpus.get(node, 1)))))
        out.sort(key=lambda x: x.t)
        return tuple(out)

    def _draw_times(self, node: str, day: int, kind: str = "") -> tuple[float, ...]:
        return tuple(x.t for x in self._chunk(node, day) if not kind or x.kind == kind)

    def _has(self, node: str, kind: str, t0: float, t1: float) -> float | None:
        """The first ``kind`` fault on ``node`` with ``t0 < t <= t1`` (its time), if any."""
        if not self._any or t1 <= t0:
            return None
        for day in range(max(0, int(t0 // DAY)), int(t1 // DAY) + 1):
            times = self._times(node, day, kind)
            i = bisect.bisect_right(times, t0)
            if i < len(times) and times[i] <= t1:
                return times[i]
        return None

    def _draw_day(self, day: int, kind: str) -> tuple[tuple[float, ...], tuple[str, ...]]:
        """Every node's ``kind`` faults of one simulated day (all kinds: ""), in time order: (times, nodes)."""
        hits = sorted((x.t, x.node) for node in self._gpus for x in self._chunk(node, day) if not kind or x.kind == kind)
        return tuple(t for t, _ in hits), tuple(n for _, n in hits)

    def touched(self, t0: float, t1: float, kind: str = "") -> set[str]:
        """The nodes with a ``kind`` fault (any: "") in ``(t0, t1]``: the fleet's faults are indexed by
        day, so a question about the whole fleet costs O(faults in the window), not O(nodes)."""
        out: set[str] = set()
        if not self._any or t1 <= t0:
            return out
        for day in range(max(0, int(t0 // DAY)), int(t1 // DAY) + 1):
            times, nodes = self._day(day, kind)
            out.update(nodes[bisect.bisect_right(times, t0):bisect.bisect_right(times, t1)])
        return out

    def events(self, node: str, t0: float, t1: float) -> list[Fault]:
        """Faults on ``node`` with ``t0 < t <= t1``, in time order."""
        if not self._any or t1 <= t0:
            return []
        out: list[Fault] = []
        for day in range(max(0, int(t0 // DAY)), int(t1 // DAY) + 1):
            times = self._times(node, day)
            lo, hi = bisect.bisect_right(times, t0), bisect.bisect_right(times, t1)
            if lo < hi:
                out += self._chunk(node, day)[lo:hi]
        return out

    def next_of(self, node: str, t0: float, t1: float, kinds: tuple[str, ...] = FAULT_KINDS) -> float | None:
        """The time of the first fault of ``kinds`` on ``node`` in ``(t0, t1]``, if any: O(days in the window)
        look-ups (the driver's monitor leaves a node that reads clean alone until then)."""
        if not self._any or t1 <= t0:
            return None
        for day in range(max(0, int(t0 // DAY)), int(t1 // DAY) + 1):
            times = self._times(node, day)
            chunk = self._chunk(node, day)
            for i in range(bisect.bisect_right(times, t0), len(times)):
                if times[i] > t1:
                    return None
                if chunk[i].kind in kinds:
                    return times[i]
        return None

    def first(self, nodes: Sequence[str], t0: float, t1: float, kinds: tuple[str, ...]) -> Fault | None:
        """The first fault of ``kinds`` on any of ``nodes`` in ``(t0, t1]``."""
        best: Fault | None = None
        for node in nodes:
            for x in self.events(node, t0, t1):
                if x.kind in kinds:
                    if best is None or x.t < best.t:
                        best = x
                    break
        return best

    def along(self, nodes: Sequence[str], t0: float, kinds: tuple[str, ...]) -> Along:
        """The faults of ``nodes`` from ``t0`` on, for one attempt's life (:func:`~autoresearch.sim.timeline.live`):
        :meth:`Along.throttling` and :meth:`Along.first` answer as :meth:`throttling` (any of the nodes) and
        :meth:`first` do, from the nodes' faults merged in time order and read a day at a time as the life
        goes on, not a look-up per node and step."""
        return Along(self, tuple(dict.fromkeys(nodes)), t0, kinds)

    def down(self, node: str, t: float) -> Fault | None:
        """The node loss that keeps ``node`` unreachable at ``t``, if any."""
        if self.f.node_loss <= 0 or self._has(node, "node_loss", t - self.f.repair, t) is None:
            return None
        for x in self.events(node, t - self.f.repair, t):
            if x.kind == "node_loss":
                return x
        return None

    def back_at(self, loss: Fault) -> float:
        return loss.t + self.f.repair

    def repaired_at(self, xid: Fault, cordons: Sequence[tuple[str, float]]) -> float:
        """When a GPU that failed at ``xid`` is fixed: ``repair`` after the first cordon since, else unattended."""
        fixed = xid.t + self.f.unattended_repair
        for node, at in cordons:
            if node == xid.node and at >= xid.t:
                fixed = min(fixed, at + self.f.repair)
        return fixed

    def sick(self, node: str, t: float, cordons: Sequence[tuple[str, float]] = ()) -> Fault | None:
        """The Xid whose failed GPU is not fixed yet at ``t``, if any."""
        if self.f.xid <= 0 or self._has(node, "xid", t - max(self.f.unattended_repair, self.f.repair) - 1.0, t) is None:
            return None
        for x in self.events(node, t - max(self.f.unattended_repair, self.f.repair) - 1.0, t):
            if x.kind == "xid" and t < self.repaired_at(x, cordons):
                return x
        return None

    def throttling(self, node: str, t: float) -> bool:
        return self.f.thermal > 0 and self._has(node, "thermal", t - self.f.thermal_for, t) is not None

    def sample(self, node: str, t: float, cordons: Sequence[tuple[str, float]] = ()) -> NodeSample:
        """What NVML would read on ``node`` at ``t`` (the health monitor's input)."""
        sick = self.sick(node, t, cordons)
        hot = self.throttling(node, t)
        gpus = []
        for i in range(self._gpus.get(node, 0)):
            xids = (79,) if sick is not None and sick.gpu == i else ()
            gpus.append(GpuSample(index=i, uuid=f"GPU-sim-{node}-{i}", name="Simulated GPU",
                                  temperature_c=SLOWDOWN_C + 1 if hot else 55.0, slowdown_c=SLOWDOWN_C,
                                  shutdown_c=SHUTDOWN_C, clock_event_reasons=HW_THERMAL if hot else 0, xids=xids))
        return NodeSample(driver_version="550.54.15", gpus=tuple(gpus))


class Along:
    """Some nodes' faults in time order (ties: the nodes' order, then each node's own), from the day of
    ``t0 - thermal_for`` on: the thermal ones' times, and those of ``kinds`` (:meth:`Schedule.along`)."""

    __slots__ = ("schedule", "nodes", "kinds", "day", "hot", "times", "faults", "thermal_for")

    def __init__(self, schedule: Schedule, nodes: tuple[str, ...], t0: float, kinds: tuple[str, ...]) -> None:
        self.schedule, self.nodes, self.kinds = schedule, nodes, kinds
        self.thermal_for = schedule.f.thermal_for
        self.day = max(0, int((t0 - max(0.0, self.thermal_for)) // DAY)) - 1  # the last day read
        self.hot: list[float] = []
        self.times: list[float] = []
        self.faults: list[Fault] = []

    def _read(self, t: float) -> None:
        """Read the days up to the one of ``t``."""
        last = int(t // DAY)
        s = self.schedule
        while self.day < last:
            self.day += 1
            if not s._any:
                continue
            found: list[tuple[float, int, int, Fault]] = []
            for rank, node in enumerate(self.nodes):
                for i, x in enumerate(s._chunk(node, self.day)):
                    found.append((x.t, rank, i, x))
            found.sort(key=lambda f: f[:3])
            for at, _, _, x in found:
                if x.kind == "thermal":
                    self.hot.append(at)
                if x.kind in self.kinds:
                    self.times.append(at)
                    self.faults.append(x)

    def throttling(self, t: float) -> bool:
        """Whether any of the nodes throttles at ``t`` (a thermal fault in ``(t - thermal_for, t]``)."""
        if self.schedule.f.thermal <= 0 or not self.thermal_for > 0:
            return False
        self._read(t)
        i = bisect.bisect_right(self.hot, t)
        return i > 0 and self.hot[i - 1] > t - self.thermal_for

    def first(self, t0: float, t1: float) -> Fault | None:
        """The first fault of ``kinds`` on any of the nodes in ``(t0, t1]``."""
        if t1 <= t0:
            return None
        self._read(t1)
        i = bisect.bisect_right(self.times, t0)
        return self.faults[i] if i < len(self.times) and self.times[i] <= t1 else None

    def hot_at(self, t: float) -> tuple[float | None, float]:
        """For :meth:`throttling` at ``t`` and after: (the last thermal fault at or before ``t``, None if none;
        a time before which no other comes). Until that time, ``throttling(u)`` for ``u >= t`` is
        ``last is not None and last > u - thermal_for``: a life asks only when it passes it."""
        self._read(t)
        i = bisect.bisect_right(self.hot, t)
        return (self.hot[i - 1] if i else None), (self.hot[i] if i < len(self.hot) else (self.day + 1) * DAY)

    def clear_after(self, t: float) -> float:
        """A time before which no fault of ``kinds`` comes after ``t`` (the next one's, or the end of the days
        read): :meth:`first` over ``(u, v]`` with ``t <= u`` and ``v`` before it is None."""
        i = bisect.bisect_right(self.times, t)
        return self.times[i] if i < len(self.times) else (self.day + 1) * DAY


def xid_line(node: str, gpu: int) -> str:
    """The driver's line for a GPU that fell off the bus, as it reaches a job's log."""
    return f"NVRM: Xid (PCI:0000:{0x18 + gpu:02x}:00): 79, pid=4242, GPU has fallen off the bus. [node {node} GPU {gpu}]"


def hang_line(timeout_s: float) -> str:
    ms = int(timeout_s * 1000)
    return (f"[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1843, OpType=ALLREDUCE, "
            f"NumelIn=1048576, Timeout(ms)={ms}) ran for {ms + 17} milliseconds before timing out.")
