"""Scheduling as a pure function (docs/architecture.md, invariant 4): queue + cluster -> decisions.

No I/O, no clock, no randomness: the same inputs always give the same placements,
which is what makes it testable and lets the local and sim backends share it.

Policy (what a Slurm or Kueue user would expect):

* Order: priority class (critical, normal, best-effort), then submit order. With fair share
  on (``fair=``), within a class the project with the smallest dominant share (its GPUs or
  cores in use over the fleet's, the larger of the two, divided by its weight) goes next,
  then submit order inside a project; shares move as jobs are placed in the pass.
  With ``past=`` (decayed GPU-seconds per project, ``FairShare.half_life``), the project's past
  usage as a share of the fleet adds to its share (Slurm's PriorityDecayHalfLife).
* Quotas: a project whose normal and critical attempts hold its ``quota`` GPUs gets nothing
  more (not placed, no preemption, no reservation). Best-effort jobs are exempt: they
  backfill idle capacity ("the weekend") and are the first preempted when others need it.
  A project below its ``guaranteed`` GPUs takes them back (Kueue's reclaim within a cohort):
  a job of it (a gang too) that fits within the guarantee preempts the normal attempts of projects
  that hold more than their own guarantee, only while they do, those that lose least work first.
* Gangs (``nodes > 1``): all members or none, one member per node; with ``pack_gangs``
  (a single-host backend: local) members may share a node, each with its own GPU slots.
* Placement: best fit — the node with the fewest free GPUs that still fits, so big
  holes stay open for big jobs. GPU slots are never shared between attempts. Degraded
  nodes (throttling) and the nodes a job already failed on for the machine's fault
  come last: used only when nothing else fits.
* Backfill: when a job cannot fit yet, later (smaller) jobs that fit still start.
  To keep a big job from starving behind a stream of small ones, a job that has
  waited ``reserve_after_s`` reserves the node closest to fitting it: nothing that
  comes after it in the queue is placed there. At most ``max_reservations`` jobs (the first
  in queue order, 16 by default) hold a node in one pass, as Slurm's ``bf_max_job_test``
  bounds the jobs its backfill plans for: the rest wait their turn without holding anything.
* Group caps: a job of a group (a research loop's trials) starts only while fewer than the
  group's cap of its jobs run, like Slurm's array throttle (``--array=0-99%16``); one that
  waits for its group holds nothing back (no reservation, no preemption).
* Preemption: a critical or normal job that cannot fit may stop best-effort attempts: those
  that lose the least work (GPU-seconds since their last checkpoint, ``Running.saved_at``, or
  since their start: the youngest and the recently saved first), then the fewest, on the
  node(s) where that costs least, and never one more than the job needs. Victims keep
  their slots until they exit (grace period); meanwhile their slots are claimed by
  the job they were stopped for, so later passes do not pick more victims, and the nodes are
  held for it (``held``, ``Decisions.held``) until its turn in a later pass: no job of its class
  or a lower one sorted ahead of it takes them, whether the victims still stop or have ended.
* Cost: free capacity is indexed by health tier and free GPUs (placement and reservations look
  only at nodes that fit), preemptible nodes by price in lazily refreshed heaps: a pass is
  O(nodes + running + queue), not O(nodes x queue); a class is given up once nothing more of it
  can start, and a project at its quota leaves fair share's order (docs/scheduling.md, "Cost").
"""

from __future__ import annotations

import bisect
import functools
import gc
import heapq
import itertools
import operator
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from typing import Any, Final, Self

RANK = {"critical": 0, "normal": 1, "best-effort": 2}
BEST_EFFORT = RANK["best-effort"]
# how many long-waiting jobs hold a node against backfill in one pass (the first in queue order)
MAX_RESERVATIONS = 16
# how many jobs one pass starts (placed, or stopping new victims for them): then it stops, ``capped``,
# and the caller passes again at once (Slurm's sched_max_job_start): a pass's time stays bounded
MAX_STARTS = 256
# The pass's shortcuts (a class given up once nothing more of it can start, a project at its quota
# dropped from the order): they must never change a decision; tests/properties/test_scheduler_shortcuts.py
# compares the pass with them and without them.
_SHORTCUTS = True

# The records are plain slotted classes, not dataclasses: a frozen dataclass costs ~1.5 ms to define
# (its methods are compiled from source) and a submit imports this module; NamedTuples define fast
# but read their fields at half the speed of slots, in the loops below (docs/DESIGN-NOTES.md,
# "What a command costs to start"). Their fields are Final: mypy refuses an assignment.


class _Record:
    """Equality, hash, repr and ``_replace`` from ``__slots__`` (the fields, in order)."""

    __slots__: tuple[str, ...] = ()

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._values() == other._values()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{n}={getattr(self, n)!r}' for n in self.__slots__)})"

    def _replace(self, **changes: Any) -> Self:
        unknown = changes.keys() - set(self.__slots__)
        if unknown:
            raise TypeError(f"{type(self).__name__} has no field {', '.join(sorted(unknown))}")
        return type(self)(**{name: changes.get(name, getattr(self, name)) for name in self.__slots__})


class NodeState(_Record):
    __slots__ = ("name", "gpu_ids", "cpus", "memory", "schedulable", "degraded")

    def __init__(self, name: str, gpu_ids: tuple[str, ...], cpus: float = 0.0, memory: int = 0,
                 schedulable: bool = True, degraded: bool = False) -> None:
        self.name: Final = name
        self.gpu_ids: Final = gpu_ids
        self.cpus: Final = cpus
        self.memory: Final = memory
        self.schedulable: Final = schedulable
        self.degraded: Final = degraded  # throttling (autoresearch/health/): placed last


class Pending(_Record):
    __slots__ = ("job_id", "priority", "gpus", "nodes", "cpus", "memory", "waited_s", "avoid", "project", "group",
                 "order")

    def __init__(self, job_id: int, priority: str, gpus: int = 0, nodes: int = 1, cpus: float = 0.0,
                 memory: int = 0, waited_s: float = 0.0, avoid: frozenset[str] = frozenset(), project: str = "",
                 group: str = "", order: int | None = None) -> None:
        self.job_id: Final = job_id
        self.priority: Final = priority
        self.gpus: Final = gpus
        self.nodes: Final = nodes
        self.cpus: Final = cpus
        self.memory: Final = memory
        self.waited_s: Final = waited_s
        self.avoid: Final = avoid  # nodes where it failed for the machine's fault: placed last
        self.project: Final = project
        self.group: Final = group  # a capped group (a research loop's trials): see ``room``
        # its place in its priority class (None: its id; a paused trial's resume: its paused job's)
        self.order: Final = order


class Running(_Record):
    __slots__ = ("job_id", "attempt", "priority", "alloc", "started_at", "cpus", "memory", "stopping", "project",
                 "saved_at")

    def __init__(self, job_id: int, attempt: int, priority: str, alloc: tuple[tuple[str, tuple[str, ...]], ...],
                 started_at: float = 0.0, cpus: float = 0.0, memory: int = 0, stopping: bool = False,
                 project: str = "", saved_at: float | None = None) -> None:
        self.job_id: Final = job_id
        self.attempt: Final = attempt
        self.priority: Final = priority
        self.alloc: Final = alloc  # (node, gpu ids) per node
        self.started_at: Final = started_at
        self.cpus: Final = cpus
        self.memory: Final = memory
        self.stopping: Final = stopping
        self.project: Final = project
        # when its last checkpoint was written (None: none known): a preemption loses the work since
        self.saved_at: Final = saved_at


class Share(_Record):
    """A project's weight (its share of the fleet, relative to others), its GPU cap (``quota``: what
    its normal and critical attempts may hold at once; None: no cap) and its ``guaranteed`` GPUs
    (Kueue's nominal quota: while it holds fewer, its normal and critical jobs may preempt the
    attempts of projects that borrow, youngest first)."""

    __slots__ = ("weight", "quota", "guaranteed", "borrow")

    def __init__(self, weight: float = 1.0, quota: int | None = None, guaranteed: int = 0,
                 borrow: int | None = None) -> None:
        self.weight: Final = weight
        self.quota: Final = quota  # GPUs its normal and critical attempts may hold at once; None: no cap
        self.guaranteed: Final = guaranteed  # GPUs it gets back from borrowers when it asks
        self.borrow: Final = borrow  # its cap past the guarantee (then quota = guaranteed + borrow); None: unset


DAY = 86_400.0


class FairShare(_Record):
    """The projects' shares; ``half_life``: how fast past usage fades (seconds; Slurm's
    ``PriorityDecayHalfLife``, 7 days by default)."""

    __slots__ = ("projects", "default_weight", "half_life")

    def __init__(self, projects: Mapping[str, Share] | None = None, default_weight: float = 1.0,
                 half_life: float = 7 * DAY) -> None:
        self.projects: Final[Mapping[str, Share]] = {} if projects is None else projects
        self.default_weight: Final = default_weight
        self.half_life: Final = half_life

    def share(self, project: str) -> Share:
        return self.projects.get(project) or Share(self.default_weight)


class Placement(_Record):
    __slots__ = ("job_id", "alloc")

    def __init__(self, job_id: int, alloc: tuple[tuple[str, tuple[str, ...]], ...]) -> None:
        self.job_id: Final = job_id
        self.alloc: Final = alloc


class Preemption(_Record):
    __slots__ = ("job_id", "attempt", "for_job")

    def __init__(self, job_id: int, attempt: int, for_job: int) -> None:
        self.job_id: Final = job_id
        self.attempt: Final = attempt
        self.for_job: Final = for_job


class Decisions(_Record):
    __slots__ = ("placements", "preemptions", "reserved", "capped", "held")
    __hash__ = None  # type: ignore[assignment]  # (mutable: the pass appends to it)

    def __init__(self, placements: list[Placement] | None = None, preemptions: list[Preemption] | None = None,
                 reserved: dict[str, int] | None = None, capped: bool = False,
                 held: dict[str, int] | None = None) -> None:
        self.placements: list[Placement] = [] if placements is None else placements
        self.preemptions: list[Preemption] = [] if preemptions is None else preemptions
        self.reserved: dict[str, int] = {} if reserved is None else reserved  # node -> job it is held for
        # the pass stopped at ``max_starts``: the rest of the queue was not read (the caller passes again)
        self.capped: bool = capped
        # node -> the job whose victims' slots it holds (a preemption's or reclaim's): the next pass's ``held``
        self.held: dict[str, int] = {} if held is None else held


_VERSIONS = itertools.count(1)


class _Node:
    __slots__ = ("name", "total", "free", "cpus", "memory", "tier", "best_effort", "priced", "stopping",
                 "reserved_for", "ver", "rank", "base", "base_ver")

    def __init__(self, name: str, total: int, free: tuple[str, ...], cpus: float, memory: int,
                 degraded: bool = False) -> None:
        self.name, self.total, self.free, self.cpus, self.memory = name, total, free, cpus, memory
        self.tier = 1 if degraded else 0  # health tier: degraded (throttling) nodes are used last
        self.best_effort: list[Running] = []  # best-effort attempts on it: preemption's victims
        self.priced: list[_Victim] | None = None  # the same, priced, least work lost first (when first asked)
        self.stopping: list[Running] = []  # already being stopped, unclaimed
        self.reserved_for: int | None = None
        # changed on every change, unique across passes: an entry of a preemption or reclaim index with another is
        # stale; base_ver: the version of its state as the running attempts leave it (Scheduler: back after a pass)
        self.ver = self.base_ver = next(_VERSIONS)
        self.rank = 0  # its place in the nodes' list (Scheduler: a bucket is kept in that order)
        # (free, cpus, memory, stopping) as the running attempts leave it (Scheduler: put back after a pass)
        self.base: tuple[tuple[str, ...], float, int, tuple[Running, ...]] = (free, cpus, memory, ())


class _Victim:
    """A best-effort attempt on one node: what stopping it frees there and the work it loses."""

    __slots__ = ("att", "gpus", "cpus", "memory", "lost", "rank", "whole")

    def __init__(self, att: Running, name: str, now: float) -> None:
        alloc = att.alloc
        if len(alloc) == 1 and alloc[0][0] == name:  # (one member, on this node: the common case, no loops)
            members, gpus = 1, len(alloc[0][1])
            total = gpus
        else:
            members = _members_on(att, name)
            gpus = sum(len(ids) for n, ids in alloc if n == name)
            total = sum(len(ids) for _, ids in alloc)
        self.att = att
        self.gpus = gpus  # (on this node)
        self.whole = total  # (all its members': what its project gives up)
        self.cpus = att.cpus * members
        self.memory = att.memory * members
        since = att.started_at if att.saved_at is None else max(att.started_at, att.saved_at)
        # GPU-seconds since its last checkpoint (or its start): what a preemption throws away
        self.lost = max(0.0, now - since) * max(1, total)
        self.rank = (self.lost, -att.started_at, -att.job_id)  # then youngest first, then the later job


def _cores(cpus: float) -> float:
    return cpus if cpus > 0 else 1.0  # an attempt takes at least a core (Ray's entrypoint, a Slurm task)


def admit(pending: list[Pending], nodes: list[NodeState], running: list[tuple[int, float]],
          preempts: bool = False, room: Mapping[str, int] | None = None) -> Decisions:
    """What to hand an engine that places jobs itself (Slurm, Ray): ``running`` is (gpus, cpus)
    of our attempts on it.

    An engine that preempts by priority gets everything, in priority order. One that cannot
    (Ray) gets, in priority order, only what its schedulable nodes hold besides our running
    attempts, and nothing past the first job that does not fit: a critical job is never
    queued in the engine behind normal ones. A job no node could hold now waits without
    blocking the others; with no schedulable node (the engine does not answer) nothing goes.
    A job of a group at its cap (``room``, as in :func:`schedule`) waits without blocking others.
    """
    left = _Room(room)
    order = [p for p in sorted(pending, key=lambda p: (RANK[p.priority], *_place(p))) if left.take(p)]
    if preempts:
        return Decisions(placements=[Placement(p.job_id, ()) for p in order])
    up = [n for n in nodes if n.schedulable]
    free_gpus = sum(len(n.gpu_ids) for n in up) - sum(g for g, _ in running)
    count_cpus = any(n.cpus > 0 for n in up)
    free_cpus = sum(n.cpus for n in up) - sum(_cores(c) for _, c in running)
    out = Decisions()
    for p in order:
        if not any(p.gpus <= len(n.gpu_ids) and (not count_cpus or _cores(p.cpus) <= n.cpus) for n in up):
            continue
        if p.gpus > free_gpus or (count_cpus and _cores(p.cpus) > free_cpus):
            break
        out.placements.append(Placement(p.job_id, ()))
        free_gpus -= p.gpus
        free_cpus -= _cores(p.cpus)
    return out


def schedule(
    pending: list[Pending],
    nodes: list[NodeState],
    running: list[Running],
    *,
    reserve_after_s: float = 300.0,
    fair: FairShare | None = None,
    pack_gangs: bool = False,
    room: Mapping[str, int] | None = None,
    now: float | None = None,
    max_reservations: int = MAX_RESERVATIONS,
    past: Mapping[str, float] | None = None,
    max_starts: int | None = MAX_STARTS,
    held: Mapping[str, int] | None = None,
) -> Decisions:
    """``room``: per capped group, how many more of its jobs may start (a group's running cap less
    its running jobs, like Slurm's ``--array=0-99%16``); a job of a group with none left waits,
    without reserving or preempting anything, and the jobs behind it go on. ``now``: the time
    ``started_at`` and ``saved_at`` are on, to weigh the work a preemption loses (None: the
    latest of them, which keeps the order: youngest and most recently saved first).
    ``max_reservations``: how many long-waiting jobs may hold a node in one pass (the first ones in
    queue order), as Slurm's ``bf_max_job_test`` bounds the jobs its backfill plans for.
    ``past``: with ``fair``, each project's past usage in GPU-seconds decayed with ``fair.half_life``
    (ended and running attempts, up to now: engine/shares.py keeps it); it adds to the project's
    share the fraction of the fleet it held on average over that decay.
    ``max_starts``: how many jobs one pass starts (placed, or new victims stopped for them, a reclaim's
    too) before it stops with ``capped`` set (None: no cap), as Slurm's ``sched_max_job_start``: what it
    decided is exactly what an uncapped pass decides first, and the caller passes again for the rest.
    ``held``: node -> a queued job it is held for, the last pass's ``Decisions.held`` (the nodes where
    victims were stopped, or free slots claimed, for a job that has not started yet): until that job's
    turn in the pass no job of its class or a lower one takes what one member of it needs there (the
    rest of the node stays open); a more urgent class may.
    The job's turn releases the hold (it is placed, or claims its stopping victims again and holds the
    node for one more pass); a job no longer queued holds nothing."""
    with _collector_paused():
        state, max_gpus, total_gpus, total_cpus = _build(nodes, running)
        if now is None:
            now = _latest(running)
        usage = None
        if fair is not None:
            usage = _Usage(fair, total_gpus, total_cpus, past)
            usage.add_running(running)
        preemptible = [slot for slot in state.values() if slot.best_effort or slot.stopping]
        index = _Index(state.values(), max_gpus, preemptible, now)
        return _decide(pending, index, usage, running, reserve_after_s, pack_gangs, room, max_reservations,
                       max_starts, held)


class _collector_paused:  # noqa: N801  (a context manager, used as a function)
    """The cyclic garbage collector off for one pass, back on after it (when it was on). A pass allocates
    tens of thousands of small records and frees nearly all of them when it ends; with the collector on,
    those allocations set off collections in the middle of the pass, and every few passes a full one that
    walks every object of the process (the queue's and the attempts' records: ~12 ms at 10,000 queued and
    16,384 GPUs, the slowest passes' whole excess). What the pass frees it frees by reference counts (a
    reclaim's recursive search leaves one small cycle, collected later): the collector's count is back near
    where it was after the pass, so collections come fewer, between passes, not in them."""

    __slots__ = ("was",)

    def __enter__(self) -> None:
        self.was = gc.isenabled()
        if self.was:
            gc.disable()

    def __exit__(self, *exc: object) -> None:
        if self.was:
            gc.enable()


class Scheduler:
    """:func:`schedule` with its node records kept between passes, for a caller that passes again and
    again (the runtime, the simulated fleet's driver): the same decisions as :func:`schedule` on the
    same inputs, at the cost of what changed since the last pass plus the placements.

    It keeps each schedulable node's record as the running attempts leave it (free slots, cores,
    memory, best-effort and stopping attempts), the free-capacity index over them, and each
    project's GPUs and cores in use. A pass compares its inputs with the last pass's by identity
    (a node or attempt given as the same object is the same; another object with equal fields is
    too): the nodes an attempt started or ended on, or whose state changed, are worked out again
    from their attempts; the records the pass itself changed are put back afterwards. A full
    rebuild (what :func:`schedule` does) when it cannot tell what changed: the first pass, nodes
    added, removed or reordered, a node's GPU count past the largest, one object twice. ``rebuilds``
    counts them. It keeps the holds too (``held``: the last pass's ``Decisions.held``), handed to the
    next pass unless the caller gives its own."""

    def __init__(self) -> None:
        self.rebuilds = 0
        self.held: dict[str, int] = {}
        self._index: _Index | None = None
        self._nodes: list[NodeState] = []
        self._by_name: dict[str, NodeState] = {}
        self._rank: dict[str, int] = {}
        self._totals: tuple[int, float] = (0, 0.0)
        self._atts: dict[int, Running] = {}  # id -> each attempt of the last pass (held: ids stay theirs)
        self._on: dict[str, dict[int, Running]] = {}  # per node name, the attempts with a member there
        self._preemptible: set[str] = set()  # nodes with a best-effort or stopping attempt
        self._dirty: set[tuple[int, int]] = set()  # (tier, free GPUs): buckets to put back in nodes' order
        # per project, GPUs, cores and quota GPUs its attempts hold (exact while every figure is whole)
        self._gpus: dict[str, int] = {}
        self._cpus: dict[str, float] = {}
        self._quota: dict[str, int] = {}
        self._exact = True
        self._queue = _Queue()  # the queue by class and project, patched with what was added and removed
        self._latest: float | None = None  # the running attempts' latest start or checkpoint (None: unknown)
        self._claimants: dict[str, int] = {}  # per project, its attempts a reclaim may stop (_claimable)
        # the last pass's now and its preemption and reclaim heaps, lent to the next pass (_lend), and the
        # nodes changed since
        self._kept: tuple[float, dict[int, _KeptHeap], dict[int, _KeptHeap]] | None = None
        self._moved: set[str] = set()
        self._restored: set[str] = set()  # the nodes the last pass changed, put back as they were

    def schedule(self, pending: list[Pending], nodes: list[NodeState], running: list[Running], *,
                 reserve_after_s: float = 300.0, fair: FairShare | None = None, pack_gangs: bool = False,
                 room: Mapping[str, int] | None = None, now: float | None = None,
                 max_reservations: int = MAX_RESERVATIONS, past: Mapping[str, float] | None = None,
                 max_starts: int | None = MAX_STARTS, held: Mapping[str, int] | None = None) -> Decisions:
        """:func:`schedule`'s pass (the same arguments, the same decisions); ``held`` None: the holds
        the last pass left (``self.held``)."""
        with _collector_paused():
            return self._pass(pending, nodes, running, reserve_after_s, fair, pack_gangs, room, now,
                              max_reservations, past, max_starts, held)

    def _pass(self, pending: list[Pending], nodes: list[NodeState], running: list[Running], reserve_after_s: float,
              fair: FairShare | None, pack_gangs: bool, room: Mapping[str, int] | None, now: float | None,
              max_reservations: int, past: Mapping[str, float] | None, max_starts: int | None,
              held: Mapping[str, int] | None) -> Decisions:
        try:
            index = self._sync(nodes, running)
        except BaseException:
            self._index = None  # (half updated: the next pass builds afresh)
            raise
        if now is None:
            if self._latest is None:
                at = [max(a.started_at, a.saved_at or 0.0) for a in running]
                now = max(at, default=0.0)  # (_latest's)
                if all(v == v for v in at):  # (no NaN: then the latest is known from the changes alone)
                    self._latest = now
            else:
                now = self._latest
        index.now = now
        index.heaps, reclaim_heaps = self._lend(now, index.state)
        index.touched = {}
        index.priced = []
        index.held = set()
        index.preemptible = [index.state[name] for name in self._preemptible]
        index.preemptible_names = None
        index.victims_left = sum(len(slot.best_effort) + len(slot.stopping) for slot in index.preemptible)
        usage = None
        if fair is not None:
            usage = _Usage(fair, self._totals[0], self._totals[1], past)
            if self._exact:
                usage.gpus, usage.cpus, usage.quota_used = dict(self._gpus), dict(self._cpus), dict(self._quota)
            else:
                usage.add_running(running)
            usage.victims = _Victims(self._on, now, running)
            usage.victim_projects = set(self._claimants)
            usage.reclaim_heaps = reclaim_heaps
        try:
            out = _decide(pending, index, usage, running, reserve_after_s, pack_gangs, room, max_reservations,
                          max_starts, self.held if held is None else held, self._queue)
        except BaseException:
            self._queue = _Queue()  # (perhaps half patched: the next pass groups afresh)
            raise
        finally:
            self._restore(index)
        self._kept = (now, index.heaps, usage.reclaim_heaps if usage is not None else {})
        self.held = dict(out.held)
        return out

    def _lend(self, now: float, state: dict[str, _Node]) -> tuple[dict[int, _KeptHeap], dict[int, _KeptHeap]]:
        """The last pass's preemption and reclaim heaps for this one (_KeptHeap), still lower bounds when
        ``now`` is no earlier (the work a victim would lose only grows), with the nodes that may be cheaper
        than their entry to be priced again: those changed since the pass (attempts started or ended, a new
        node state), and those the pass changed and put back whose entry it priced while they were changed
        (or dropped: a reservation); a node put back has its version from before the pass again, so its
        entries priced then hold. None kept, or an earlier (or unknown) now: none lent, both built afresh
        when first asked."""
        kept, self._kept = self._kept, None
        moved, restored, self._moved, self._restored = self._moved, self._restored - self._moved, set(), set()
        if kept is None or not now >= kept[0]:
            return {}, {}
        then, preempt, reclaim = kept
        later = now != then
        preemptible = self._preemptible
        for heaps, only in ((preempt, preemptible), (reclaim, None)):
            for heap in heaps.values():
                live, saved, heap.saved = heap.live, heap.saved, {}
                again, back = set(moved), {}
                for name in restored:
                    slot = state.get(name)
                    if slot is None:
                        again.add(name)
                    elif (cur := live.get(name)) is None or cur[1] != slot.ver:  # (priced while changed, or dropped)
                        entry = saved.get(name)
                        if entry is not None and entry[1] == slot.ver:
                            back[name] = entry  # (priced as it is again: it holds)
                        else:
                            again.add(name)
                if later:
                    heap.tag = next(_TAGS)
                    again |= heap.greedy
                    heap.greedy = set()
                if only is not None:  # (the preemptible nodes at the pass's start, as a heap built afresh)
                    for name in again - only:
                        live.pop(name, None)
                    again &= only
                for name, (low, ver, tag) in back.items():
                    if name not in again and (only is None or name in only):
                        heap.push(low, name, ver, tag)
                heap.again(again)
        return preempt, reclaim

    # -- between passes -------------------------------------------------------------------------

    def _rebuild(self, nodes: list[NodeState], running: list[Running]) -> _Index:
        self.rebuilds += 1
        state, max_gpus, total_gpus, total_cpus = _build(nodes, running)
        self._totals = (total_gpus, total_cpus)
        self._nodes = list(nodes)
        self._by_name = {node.name: node for node in nodes}
        self._rank = {node.name: i for i, node in enumerate(nodes)}
        for slot in state.values():
            slot.rank = self._rank[slot.name]
            slot.base = (slot.free, slot.cpus, slot.memory, tuple(slot.stopping))
        self._preemptible = {name for name, slot in state.items() if slot.best_effort or slot.stopping}
        self._atts, self._on = {}, {}
        self._gpus, self._cpus, self._quota, self._exact = {}, {}, {}, True
        self._latest = None
        self._claimants, self._kept, self._moved, self._restored = {}, None, set(), set()
        for att in running:
            self._add(att)
        index = _Index(state.values(), max_gpus, [], 0.0)
        self._dirty = set()
        # (a name or an attempt twice: kept for this pass only, the next one builds afresh)
        keep = len(self._by_name) == len(nodes) and len(self._atts) == len(running)
        self._index = index if keep else None
        return index

    def _add(self, att: Running) -> None:
        self._note(att, True)
        self._atts[id(att)] = att
        for name in {name for name, _ in att.alloc}:
            self._on.setdefault(name, {})[id(att)] = att
        self._count(att, 1)
        if _claimable(att):
            self._claimants[att.project] = self._claimants.get(att.project, 0) + 1

    def _remove(self, att: Running) -> None:
        self._note(att, False)
        del self._atts[id(att)]
        for name in {name for name, _ in att.alloc}:
            on = self._on.get(name)
            if on is not None:
                on.pop(id(att), None)
                if not on:
                    del self._on[name]
        self._count(att, -1)
        if _claimable(att):
            left = self._claimants[att.project] - 1
            if left:
                self._claimants[att.project] = left
            else:
                del self._claimants[att.project]

    def _note(self, att: Running, added: bool) -> None:
        """The latest start or checkpoint with ``att`` added or gone; None (worked out afresh when a pass
        asks) when it cannot tell: the latest one gone, or a figure that is not a number."""
        latest = self._latest
        if latest is None:
            return
        try:
            at = max(att.started_at, att.saved_at or 0.0)
            if added:
                if at > latest:
                    self._latest = at
                elif not at <= latest:
                    self._latest = None
            elif not at < latest:
                self._latest = None
        except TypeError:
            self._latest = None

    def _count(self, att: Running, sign: int) -> None:
        """Add (+1) or take off (-1) what ``att`` holds from its project's figures (_Usage.add_running's)."""
        alloc = att.alloc
        g = sum(len(ids) for _, ids in alloc)
        c = float(att.cpus) * len(alloc)
        if not (c.is_integer() and abs(c) < 2.0 ** 50):
            self._exact = False  # (a fraction of a core: sums in another order could differ in the last bit)
            return
        p = att.project
        for figures, value in ((self._gpus, g), (self._cpus, c), *(((self._quota, g),)
                                                                   if att.priority != "best-effort" else ())):
            total = figures.get(p, 0) + sign * value
            if total:
                figures[p] = total
            else:
                figures.pop(p, None)

    def _sync(self, nodes: list[NodeState], running: list[Running]) -> _Index:
        """The index as ``nodes`` and ``running`` leave the nodes, from the last pass's: O(nodes) identity
        checks, O(running) look-ups, and the nodes that changed worked out again."""
        index, prev = self._index, self._nodes
        if index is None or len(nodes) != len(prev):
            return self._rebuild(nodes, running)
        changed: list[NodeState] = []
        if nodes != prev:  # (a list compares its items by identity first, in C: the usual pass stops here)
            for node, old in zip(nodes, prev, strict=True):
                if node is not old:
                    if node.name != old.name:
                        return self._rebuild(nodes, running)
                    if node != old:
                        changed.append(node)
            self._nodes = list(nodes)
        dirty: set[str] = set()
        if changed:
            max_gpus = total_gpus = 0
            total_cpus = 0.0
            for node in nodes:  # (in the nodes' order: the same sums as a rebuild's)
                total_gpus += len(node.gpu_ids)
                total_cpus += node.cpus
                if node.schedulable and len(node.gpu_ids) > max_gpus:
                    max_gpus = len(node.gpu_ids)
            if max_gpus != index.max_gpus:
                return self._rebuild(nodes, running)
            self._totals = (total_gpus, total_cpus)
            for node in changed:
                self._by_name[node.name] = node
                dirty.add(node.name)
        seen = self._atts
        keys = list(map(id, running))
        now_by = dict(zip(keys, running, strict=True))
        if len(now_by) != len(running):
            return self._rebuild(nodes, running)
        for key in seen.keys() - now_by.keys():  # (set operations on the ids: in C)
            att = seen[key]
            self._remove(att)
            dirty.update(name for name, _ in att.alloc)
        for key in now_by.keys() - seen.keys():
            att = now_by[key]
            self._add(att)
            dirty.update(name for name, _ in att.alloc)
        self._moved |= dirty
        pos = dict(zip(keys, range(len(keys)), strict=True)) if dirty else {}
        buckets = index.buckets
        for name in dirty:
            cur = self._by_name.get(name)
            if cur is None:
                continue  # (an attempt on a node not in the list)
            old_slot = index.state.pop(name, None)
            if old_slot is not None:
                buckets[old_slot.tier][len(old_slot.free)].pop(name, None)
            self._preemptible.discard(name)
            if not cur.schedulable:
                continue
            on = self._on.get(name)
            slot = _one(cur, sorted(on.values(), key=lambda a: pos[id(a)]) if on else [])
            slot.rank = self._rank[name]
            index.state[name] = slot
            self._put(buckets, slot, len(slot.free))
            if slot.best_effort or slot.stopping:
                self._preemptible.add(name)
        self._order(index)
        return index

    def _restore(self, index: _Index) -> None:
        """Put back the records the pass changed (as the running attempts leave them)."""
        try:
            buckets = index.buckets
            touched = sorted(index.touched.values(), key=_rank)
            for slot in touched:  # (all out first: what stays is in the nodes' order, as before the pass)
                if slot.reserved_for is None:
                    buckets[slot.tier][len(slot.free)].pop(slot.name, None)
            for slot in touched:
                free, slot.cpus, slot.memory, stopping = slot.base
                slot.free, slot.stopping = free, list(stopping)
                slot.priced = slot.reserved_for = None
                slot.ver = slot.base_ver
                self._restored.add(slot.name)
                self._put(buckets, slot, len(free))
            index.touched = {}
            for slot in index.priced:
                slot.priced = None
            index.priced = []
            self._order(index)
        except BaseException:
            self._index = None  # (the next pass builds afresh)
            raise

    def _put(self, buckets: tuple[list[dict[str, _Node]], ...], slot: _Node, free: int) -> None:
        """File ``slot`` under ``free`` GPUs; a bucket it lands in out of the nodes' order is sorted later."""
        bucket = buckets[slot.tier][free]
        last = next(reversed(bucket.values()), None)
        bucket[slot.name] = slot
        if last is not None and last.rank > slot.rank:
            self._dirty.add((slot.tier, free))

    def _order(self, index: _Index) -> None:
        """The buckets that gained a node out of order, in the nodes' order again (best fit takes the first)."""
        for tier, k in self._dirty:
            bucket = index.buckets[tier][k]
            index.buckets[tier][k] = {slot.name: slot for slot in sorted(bucket.values(), key=_rank)}
        self._dirty = set()


_rank = operator.attrgetter("rank")


def _one(node: NodeState, atts: list[Running]) -> _Node:
    """One schedulable node's record with ``atts`` (those with a member on it, in the pass's order)
    taken off: :func:`_build`'s arithmetic for this node, in the same order."""
    name = node.name
    ids = node.gpu_ids
    slot = _Node(name, len(ids), _sorted_ids(ids), node.cpus, node.memory, node.degraded)
    held: set[str] = set()
    for att in atts:
        alloc = att.alloc
        if len(alloc) == 1:
            held.update(alloc[0][1])
            _charge(slot, att, 1)
        else:
            count = 0
            for n, got in alloc:
                if n == name:
                    count += 1
                    held.update(got)
            _charge(slot, att, count)
    if held:
        slot.free = tuple(g for g in slot.free if g not in held)
    slot.base = (slot.free, slot.cpus, slot.memory, tuple(slot.stopping))
    return slot


def _charge(slot: _Node, att: Running, count: int) -> None:
    """Take ``count`` members of ``att`` off ``slot``'s cores and memory, and note it there when it is
    stopping or best-effort (a preemption's candidates). :func:`_build`'s one-member case does the
    same inline: its loop runs once per running attempt at every full build, so no call there."""
    slot.cpus -= att.cpus * count
    slot.memory -= att.memory * count
    if att.stopping:
        slot.stopping.append(att)
    elif att.priority == "best-effort":
        slot.best_effort.append(att)


def _latest(running: list[Running]) -> float:
    """The latest start or checkpoint of ``running`` (``now`` when the caller gives none)."""
    return max((max(a.started_at, a.saved_at or 0.0) for a in running), default=0.0)


def _decide(pending: list[Pending], index: _Index, usage: _Usage | None, running: list[Running],
            reserve_after_s: float, pack_gangs: bool, room: Mapping[str, int] | None, max_reservations: int,
            max_starts: int | None, held: Mapping[str, int] | None = None,
            queue: _Queue | None = None) -> Decisions:
    """The pass proper, on the nodes' records as ``running`` leaves them (``index``): the queue, class
    by class, placed, preempted for, reclaimed for or reserved for. It changes the records it uses
    (the caller builds them afresh, or :class:`Scheduler` puts them back)."""
    out = Decisions()
    left = _Room(room)
    preemptible = index.preemptible
    holds = _holds(held, pending, index, pack_gangs) if held else {}  # per class, job -> its member, its nodes
    waiting: dict[int, list[_Hold]] = {}  # the current class's held-for jobs whose turn has not come

    # Free resources only shrink during one pass, so a shape that failed once fails again:
    # remembering the smallest failing GPU count keeps 10,000-job queues linear.
    fail_fit: dict[tuple[int, float, int], int] = {}
    fail_preempt: dict[tuple[int, float, int, int], int] = {}
    fail_reserve = 1 << 30
    fail_reclaim: dict[tuple[str, int, float, int], int] = {}
    reservations = max(0, max_reservations)
    starts_left = -1 if max_starts is None else max(1, max_starts)  # -1: no cap

    for rank, least, jobs in (_classes(pending, usage) if queue is None else queue.classes(pending, usage)):
        if holds:  # this class's holds, of what a more urgent class left on their nodes
            for job_id, (member, slots) in holds.pop(rank, {}).items():
                kept = [hold for slot in slots if (hold := index.keep(slot, job_id, member)) is not None]
                if kept:
                    waiting[job_id] = kept
        for job in jobs:
            members = job.nodes
            if pack_gangs and members > 1:  # one host: the gang is one request N times the size, split below
                job = job._replace(gpus=job.gpus * members, cpus=job.cpus * members, memory=job.memory * members,
                                   nodes=1)
            if waiting and job.job_id in waiting:
                # its turn: what was held is open again (to it first; a job its quota or group cap keeps
                # waiting does not hold it any longer: nothing would start there)
                released = waiting.pop(job.job_id)
                for hold in released:
                    index.release(hold)
                if usage is not None:
                    for heap in usage.reclaim_heaps.values():
                        heap.again([hold.slot.name for hold in released])  # (their bounds may have fallen)
                fail_fit.clear()  # (free room grew: what failed before may fit now)
                fail_preempt.clear()
                fail_reclaim.clear()
                fail_reserve = 1 << 30
            if usage is not None and not usage.admits(job):
                continue  # its project holds its quota
            if not left.has(job):
                continue  # its group runs its cap
            shape = (job.nodes, job.cpus, job.memory)
            if job.gpus < fail_fit.get(shape, 1 << 30):
                chosen = index.fit(job)
                if chosen is not None:
                    given: list[tuple[str, tuple[str, ...]]] = []
                    for slot in chosen:
                        taken, slot.free = slot.free[: job.gpus], slot.free[job.gpus:]
                        slot.cpus -= job.cpus
                        slot.memory -= job.memory
                        index.moved(slot, len(slot.free) + job.gpus)
                        given.append((slot.name, taken))
                    if job.nodes != members:
                        given = _split(given[0], members)
                    out.placements.append(Placement(job.job_id, tuple(given)))
                    left.take(job)
                    if usage is not None:
                        usage.add(job.project, job.priority, job.gpus * job.nodes, _cores(job.cpus) * job.nodes)
                    starts_left -= 1
                    if starts_left == 0:
                        out.capped = True
                        return _carry(out, waiting, holds)
                    continue
                fail_fit[shape] = job.gpus
            if rank < BEST_EFFORT and (index.victims_left or not _SHORTCUTS and preemptible):
                key = (*shape, rank)
                if job.gpus < fail_preempt.get(key, 1 << 30):
                    stopped = len(out.preemptions)
                    if _preempt(job, index, out):
                        left.take(job)  # the slots it claims are its: a later pass starts it
                        if usage is not None:  # its slots are claimed: they count as its project's from now on
                            usage.add(job.project, job.priority, job.gpus * job.nodes, _cores(job.cpus) * job.nodes)
                        # (claiming only attempts already stopping for it is no start: each capped pass makes
                        # progress, placed jobs leave the queue and new victims stop, so passing again ends)
                        if len(out.preemptions) > stopped:
                            starts_left -= 1
                            if starts_left == 0:
                                out.capped = True
                                return _carry(out, waiting, holds)
                        continue
                    fail_preempt[key] = job.gpus
            if usage is not None and usage.guaranteed and usage.reclaims(job) \
                    and job.gpus < fail_reclaim.get(own := (job.project, *shape), 1 << 30):
                stopped = len(out.preemptions)
                if _reclaim(job, index, usage, running, out):
                    left.take(job)  # its guarantee, taken back from projects that borrow
                    usage.add(job.project, job.priority, job.gpus * job.nodes, _cores(job.cpus) * job.nodes)
                    if len(out.preemptions) > stopped:  # (new victims: a start, as a preemption's)
                        starts_left -= 1
                        if starts_left == 0:
                            out.capped = True
                            return _carry(out, waiting, holds)
                    continue
                fail_reclaim[own] = job.gpus  # victims only grow fewer in a pass
            if reservations and job.waited_s >= reserve_after_s and job.gpus < fail_reserve:
                if index.reserve(job, out):
                    reservations -= 1
                else:
                    fail_reserve = job.gpus  # held nodes only grow in a pass: no bigger job finds one either
            # Nothing left for the rest of the class? No unreserved node with room for its smallest
            # job, nothing to preempt (or a class that does not preempt), no reservation to give.
            if (_SHORTCUTS and index.most_free() < least and (rank == BEST_EFFORT or not index.victims_left)
                    and (not reservations or fail_reserve <= least)
                    and (rank == BEST_EFFORT or usage is None or not usage.guaranteed) and not waiting):
                break
        _carry(out, waiting, {})  # (the class's jobs not read: what they hold stays, in this pass and the next)
        waiting = {}
    return _carry(out, waiting, holds)


_Member = tuple[int, float, int]  # (GPUs, cores, memory) of one member of a job
_Holds = dict[int, dict[int, tuple[_Member, list[_Node]]]]


def _holds(held: Mapping[str, int], pending: list[Pending], index: _Index, pack_gangs: bool) -> _Holds:
    """``held`` (node -> job) per class of the jobs still queued that may preempt: rank -> job -> (one
    member's GPUs, cores and memory; its schedulable nodes). O(queue), only when something is held."""
    jobs = set(held.values())
    found = {p.job_id: p for p in pending if p.job_id in jobs}
    out: _Holds = {}
    for name, job_id in held.items():
        job = found.get(job_id)
        slot = index.state.get(name)
        if job is None or slot is None or RANK.get(job.priority, 1) >= BEST_EFFORT:
            continue
        n = job.nodes if pack_gangs else 1  # (one host: the gang's members share the node)
        by_job = out.setdefault(RANK.get(job.priority, 1), {})
        if job_id not in by_job:
            by_job[job_id] = ((job.gpus * n, job.cpus * n, job.memory * n), [])
        by_job[job_id][1].append(slot)
    return out


def _carry(out: Decisions, waiting: dict[int, list[_Hold]], holds: _Holds) -> Decisions:
    """The holds of the jobs whose turn did not come in the pass (a capped pass's rest, a class given
    up, a job not read) carry over to the next pass as they were."""
    for job_id, kept in waiting.items():
        for hold in kept:
            out.held.setdefault(hold.slot.name, job_id)
    for by_job in holds.values():
        for job_id, (_, slots) in by_job.items():
            for slot in slots:
                out.held.setdefault(slot.name, job_id)
    return out


def _build(nodes: list[NodeState], running: list[Running]) -> tuple[dict[str, _Node], int, int, float]:
    """The schedulable nodes' records with what ``running`` holds taken off (free GPU slots, cores,
    memory; the best-effort and stopping attempts on each), the most GPUs a schedulable node has,
    and the fleet's GPUs and cores (every node's)."""
    state: dict[str, _Node] = {}
    max_gpus = total_gpus = 0
    total_cpus = 0.0
    for node in nodes:
        ids = node.gpu_ids
        total_gpus += len(ids)
        total_cpus += node.cpus
        if node.schedulable:
            state[node.name] = _Node(node.name, len(ids), _sorted_ids(ids), node.cpus, node.memory, node.degraded)
            if len(ids) > max_gpus:
                max_gpus = len(ids)
    used: dict[str, set[str]] = {}  # per node, the GPU ids its attempts hold: its free list filtered once below
    for att in running:
        alloc = att.alloc
        if len(alloc) == 1:  # the common case: one member, one node
            name, ids = alloc[0]
            if (slot := state.get(name)) is not None:
                if ids:
                    free = slot.free
                    if ids == free:  # it holds the whole node (a node's ids are sorted once: often these)
                        slot.free = ()
                    elif free[:len(ids)] == ids:  # the first free slots (as a placement takes them): no set
                        slot.free = free[len(ids):]
                    elif (held := used.get(name)) is None:
                        used[name] = set(ids)
                    else:
                        held.update(ids)
                slot.cpus -= att.cpus
                slot.memory -= att.memory
                if att.stopping:
                    slot.stopping.append(att)
                elif att.priority == "best-effort":
                    slot.best_effort.append(att)
            continue
        on_node: dict[str, int] = {}  # per node, this attempt's members there (a packed gang has several)
        for name, ids in alloc:
            on_node[name] = on_node.get(name, 0) + 1
            if ids:
                used.setdefault(name, set()).update(ids)
        for name, count in on_node.items():
            slot = state.get(name)
            if slot is not None:
                _charge(slot, att, count)
    for name, held in used.items():
        if (slot := state.get(name)) is not None:
            slot.free = () if held.issuperset(slot.free) else tuple(g for g in slot.free if g not in held)
    return state, max_gpus, total_gpus, total_cpus


def nothing_starts(nodes: list[NodeState], running: list[Running], gpuless_queued: bool,
                   preemptor_queued: bool) -> bool:
    """Whether :func:`schedule` places and preempts nothing, whatever the queue holds, knowing of it
    only whether a queued job asks for no GPU (``gpuless_queued``) and whether one is critical or
    normal (``preemptor_queued``): every GPU slot of every schedulable node is held by an attempt,
    no queued job does without a slot, and none could preempt (no best-effort attempt to stop, and
    no stopping one whose slots it could claim). A submit to a full cluster then skips reading and
    placing the whole queue, O(queue) on every submit otherwise. False whenever in doubt: any
    attempt counts, whatever its node (tests/properties/test_scheduler_full.py)."""
    if gpuless_queued:
        return False
    used: dict[str, set[str]] = {}
    for att in running:
        if preemptor_queued and (att.stopping or att.priority == "best-effort"):
            return False
        for name, ids in att.alloc:
            used.setdefault(name, set()).update(ids)
    return all(not node.schedulable or all(g in used.get(node.name, ()) for g in node.gpu_ids) for node in nodes)


def _classes(pending: list[Pending], usage: _Usage | None) -> list[tuple[int, int, Iterator[Pending]]]:
    """The queue by priority class, most urgent first: (rank, the fewest GPUs a job of the class asks,
    its jobs in the order they are tried: fair share's with ``usage``, else submit order). One loop
    over the queue; the sorts are Timsort's on a queue read in submit order (linear), keyed in C when
    no job keeps another's place."""
    key = _job_id if set(map(_order, pending)) <= {None} else _place
    if usage is None:
        classes: dict[int, list[Pending]] = {}
        for p in pending:
            rank = RANK.get(p.priority, 1)
            if (jobs := classes.get(rank)) is None:
                classes[rank] = [p]
            else:
                jobs.append(p)
        out: list[tuple[int, int, Iterator[Pending]]] = []
        for rank in sorted(classes):
            jobs = classes[rank]
            jobs.sort(key=key)
            out.append((rank, min(map(_gpus, jobs)), iter(jobs)))
        return out
    by: dict[tuple[int, str], list[Pending]] = {}
    for p in pending:
        pair = (RANK.get(p.priority, 1), p.project)
        if (jobs := by.get(pair)) is None:
            by[pair] = [p]
        else:
            jobs.append(p)
    ranks: dict[int, dict[str, list[Pending]]] = {}
    for (rank, project), jobs in by.items():
        jobs.sort(key=key)
        ranks.setdefault(rank, {})[project] = jobs
    return [(rank, min(min(map(_gpus, jobs)) for jobs in ranks[rank].values()),
             usage.order(ranks[rank], rank == BEST_EFFORT)) for rank in sorted(ranks)]


_job_id = operator.attrgetter("job_id")
_order = operator.attrgetter("order")
_gpus = operator.attrgetter("gpus")


class _Queue:
    """The queue by class and project (one group per class without fair share), each group in submit order,
    kept between passes (:class:`Scheduler`): a pass compares the queue with the last one's by identity (a
    job handed as the same object is unchanged) and takes the jobs that left out of their groups and files
    the new ones in, instead of grouping and sorting the whole queue again. It groups afresh when it cannot
    keep the groups exactly as :func:`_classes` orders them (a job object twice, two jobs with the same
    place in submit order, fair share turned on or off) and when most of the queue is new objects (a caller
    that builds its views anew each pass: then, after ``MISSES`` such passes in a row, it stops comparing
    and groups afresh, trying again every ``RETRY`` passes)."""

    MISSES: Final = 3
    RETRY: Final = 16

    __slots__ = ("groups", "least", "jobs", "last", "fair", "misses", "skipped")

    def __init__(self) -> None:
        self.groups: dict[tuple[int, str], list[Pending]] = {}  # (rank, project or "") -> jobs in submit order
        self.least: dict[tuple[int, str], int] = {}  # the fewest GPUs a job of the group asks
        self.jobs: dict[int, Pending] | None = None  # id -> each job of the last pass (None: not kept)
        self.last: list[Pending] = []  # the last pass's queue, as handed
        self.fair = False
        self.misses = 0  # passes in a row where most of the queue was new objects
        self.skipped = 0  # passes since it stopped comparing

    def classes(self, pending: list[Pending], usage: _Usage | None) -> list[tuple[int, int, Iterator[Pending]]]:
        """:func:`_classes`'s answer, from the kept groups."""
        fair = usage is not None
        if not self._patch(pending, fair):
            self._group(pending, fair)
        ranks: dict[int, tuple[list[int], dict[str, list[Pending]]]] = {}
        for (rank, project), jobs in self.groups.items():
            if (found := ranks.get(rank)) is None:
                ranks[rank] = ([self.least[rank, project]], {project: jobs})
            else:
                found[0].append(self.least[rank, project])
                found[1][project] = jobs
        out: list[tuple[int, int, Iterator[Pending]]] = []
        for rank in sorted(ranks):
            leasts, groups = ranks[rank]
            if usage is None:
                out.append((rank, leasts[0], iter(groups[""])))
            else:
                out.append((rank, min(leasts), usage.order(groups, rank == BEST_EFFORT)))
        return out

    def _patch(self, pending: list[Pending], fair: bool) -> bool:
        """The groups patched with what changed since the last pass; False: group afresh."""
        prev = self.jobs
        if prev is None or fair != self.fair:
            return False
        last = self.last
        if len(pending) == len(last) and all(map(operator.is_, pending, last)):
            self.misses = self.skipped = 0
            return True  # (the same objects in the same order: nothing changed)
        now = dict(zip(map(id, pending), pending, strict=True))
        if len(now) != len(pending):
            return False  # (one object twice)
        added = now.keys() - prev.keys()
        if 2 * len(added) > len(pending):
            self.misses += 1
            return False  # (mostly new objects: grouping afresh costs less than patching)
        self.misses = self.skipped = 0
        removed = prev.keys() - now.keys()
        self.jobs = None  # (until the groups are whole again)
        groups, least, touched = self.groups, self.least, set()
        if removed:
            gone: dict[tuple[int, str], set[int]] = {}
            for key in removed:
                job = prev[key]
                gone.setdefault((RANK.get(job.priority, 1), job.project if fair else ""), set()).add(key)
            for pair, keys in gone.items():
                groups[pair] = [job for job in groups[pair] if id(job) not in keys]
                touched.add(pair)
        for key in added:
            job = now[key]
            pair = (RANK.get(job.priority, 1), job.project if fair else "")
            jobs = groups.get(pair)
            if jobs is None:
                groups[pair] = [job]
            else:
                place = _place(job)
                at = bisect.bisect_right(jobs, place, key=_place)
                if at and _place(jobs[at - 1]) == place:
                    return False  # (two jobs with one place: submit order alone would not tell them apart)
                jobs.insert(at, job)
            touched.add(pair)
        for pair in touched:
            jobs = groups[pair]
            if jobs:
                least[pair] = min(map(_gpus, jobs))
            else:
                del groups[pair], least[pair]
        self.jobs, self.last = now, list(pending)
        return True

    def _group(self, pending: list[Pending], fair: bool) -> None:
        self.fair = fair
        self.jobs = None  # (until the groups are whole again)
        groups: dict[tuple[int, str], list[Pending]] = {}
        for p in pending:
            pair = (RANK.get(p.priority, 1), p.project if fair else "")
            if (jobs := groups.get(pair)) is None:
                groups[pair] = [p]
            else:
                jobs.append(p)
        key = _job_id if set(map(_order, pending)) <= {None} else _place
        keep = True
        for jobs in groups.values():
            jobs.sort(key=key)
            if keep and len(set(map(key, jobs))) != len(jobs):
                keep = False  # (two jobs with one place: the next pass groups afresh too)
        self.groups = groups
        self.least = {pair: min(map(_gpus, jobs)) for pair, jobs in groups.items()}
        if self.misses >= self.MISSES:  # (a caller that hands new objects: compared again every RETRY passes)
            self.skipped += 1
            keep = keep and self.skipped % self.RETRY == 0
        if keep:
            now = dict(zip(map(id, pending), pending, strict=True))
            if len(now) == len(pending):
                self.jobs, self.last = now, list(pending)


def _place(job: Pending) -> tuple[int, int]:
    """A job's place in submit order: its ``order`` (a resumed trial keeps its paused job's), then its id."""
    return (job.job_id if job.order is None else job.order, job.job_id)


class _Room:
    """What is left of each capped group's room in one pass (groups not in it are not capped)."""

    __slots__ = ("left",)

    def __init__(self, room: Mapping[str, int] | None) -> None:
        self.left = dict(room or {})

    def has(self, job: Pending) -> bool:
        return not job.group or self.left.get(job.group, 1) > 0

    def take(self, job: Pending) -> bool:
        """Count ``job`` against its group; False (nothing counted) when it has no room left."""
        if not self.has(job):
            return False
        if job.group in self.left:
            self.left[job.group] -= 1
        return True


def _members_on(att: Running, name: str) -> int:
    return sum(1 for n, _ in att.alloc if n == name)


def _split(alloc: tuple[str, tuple[str, ...]], members: int) -> list[tuple[str, tuple[str, ...]]]:
    """One node's slots for a packed gang -> one (node, slots) per member, in order."""
    name, ids = alloc
    per = len(ids) // members
    return [(name, ids[i * per:(i + 1) * per]) for i in range(members)]


class _Usage:
    """What each project holds, for fair share and quotas, updated as the pass places jobs."""

    __slots__ = ("fair", "gpus", "cpus", "quota_used", "total_gpus", "total_cpus", "changed", "quotas", "weights",
                 "past", "guaranteed", "victims", "victim_projects", "reclaim_heaps", "bounds")

    def __init__(self, fair: FairShare, total_gpus: int, total_cpus: float,
                 past: Mapping[str, float] | None = None) -> None:
        self.fair = fair
        self.quotas = {name: s.quota for name, s in fair.projects.items() if s.quota is not None}
        self.guaranteed = {name: s.guaranteed for name, s in fair.projects.items() if s.guaranteed > 0}
        # past usage as the fleet's share held on average over the decay (GPU-s over GPUs x mean life)
        span = total_gpus * fair.half_life / _LN2 if total_gpus and fair.half_life > 0 else 0.0
        self.past = {p: v / span for p, v in past.items() if v > 0} if past and span else {}
        self.victims: _Victims | None = None  # per node, what a reclaim may stop (when first asked)
        self.victim_projects: set[str] = set()  # the projects of those
        # per GPUs, the nodes by a reclaim's lower bound there (a Scheduler lends the last pass's)
        self.reclaim_heaps: dict[int, _KeptHeap] = {}
        # per node: (the borrowers, its version, its eligible victims prepared for a bound: None, none) as last asked
        self.bounds: dict[str, tuple[frozenset[str], int, _Bounds | None]] = {}
        self.weights: dict[str, float] = {}
        self.gpus: dict[str, float] = {}
        self.cpus: dict[str, float] = {}
        self.quota_used: dict[str, int] = {}
        self.total_gpus = total_gpus  # the fleet's, cordoned nodes too (a share of the fleet)
        self.total_cpus = total_cpus
        self.changed = False

    def add(self, project: str, priority: str, gpus: int, cpus: float) -> None:
        self.changed = True
        self.gpus[project] = self.gpus.get(project, 0) + gpus
        self.cpus[project] = self.cpus.get(project, 0.0) + cpus
        if priority != "best-effort":
            self.quota_used[project] = self.quota_used.get(project, 0) + gpus

    def add_running(self, running: list[Running]) -> None:
        """:meth:`add` for each of ``running`` (the pass's start: one loop, no call per attempt)."""
        self.changed = True
        gpus, cpus, quota_used = self.gpus, self.cpus, self.quota_used
        for att in running:
            alloc = att.alloc
            g = len(alloc[0][1]) if len(alloc) == 1 else sum(len(ids) for _, ids in alloc)
            project = att.project
            gpus[project] = gpus.get(project, 0) + g
            cpus[project] = cpus.get(project, 0.0) + att.cpus * len(alloc)
            if att.priority != "best-effort":
                quota_used[project] = quota_used.get(project, 0) + g

    def admits(self, job: Pending) -> bool:
        if job.priority == "best-effort":
            return True  # backfill: over quota is fine, it is the first preempted
        if not self.quotas:
            return True
        quota = self.quotas.get(job.project)
        return quota is None or self.quota_used.get(job.project, 0) + job.gpus * job.nodes <= quota

    def key(self, project: str) -> float:
        """The project's dominant share over its weight: who is furthest below its fair share."""
        g = self.gpus.get(project, 0) / self.total_gpus if self.total_gpus else 0.0
        c = self.cpus.get(project, 0.0) / self.total_cpus if self.total_cpus else 0.0
        weight = self.weights.get(project)
        if weight is None:
            weight = self.weights[project] = self.fair.share(project).weight
        return (max(g, c) + self.past.get(project, 0.0) if self.past else max(g, c)) / weight

    def reclaims(self, job: Pending) -> bool:
        """Whether ``job`` stays within its project's guarantee: it may then preempt borrowers."""
        return (job.priority != "best-effort" and job.gpus > 0
                and self.quota_used.get(job.project, 0) + job.gpus * job.nodes <= self.guaranteed.get(job.project, 0))


    def order(self, groups: dict[str, list[Pending]], exempt: bool) -> Iterator[Pending]:
        """One class's jobs, per project in submit order: the project with the smallest :meth:`key`
        next (keys move as the caller :meth:`add`s placements between two yields), then submit order.
        A project that holds its whole quota is dropped when its job was not placed (its usage only
        grows in a pass), unless the class is ``exempt`` (best-effort) or asks for no GPU."""
        heap: list[tuple[float, tuple[int, int], str, Pending, Iterator[Pending]]] = []
        for project, jobs in groups.items():
            it = iter(jobs)
            first = next(it)
            heap.append((self.key(project), _place(first), project, first, it))
        heapq.heapify(heap)
        quotas, used = self.quotas, self.quota_used
        while heap:
            key, _, project, job, it = heap[0]
            self.changed = False
            yield job
            if _SHORTCUTS and not self.changed and not exempt and project in quotas and used.get(project, 0) >= quotas[project] \
                    and job.gpus > 0:
                # at its quota: of its jobs, only those asking for no GPU could still be admitted
                rest = [p for p in it if p.gpus == 0]
                if not rest:
                    heapq.heappop(heap)
                    continue
                it = iter(rest)
            nxt = next(it, None)
            if nxt is None:
                heapq.heappop(heap)
            else:  # its key moves only when the caller placed the job
                heapq.heapreplace(heap, (self.key(project) if self.changed else key, _place(nxt), project, nxt, it))


def _slot_key(gpu_id: str) -> tuple[int, str]:
    return (int(gpu_id), "") if gpu_id.isdigit() else (1 << 30, gpu_id)


@functools.lru_cache(maxsize=256)
def _sorted_ids(gpu_ids: tuple[str, ...]) -> tuple[str, ...]:
    """A node's GPU ids in slot order (a fleet's nodes share a handful of id tuples: sorted once each)."""
    return tuple(sorted(gpu_ids, key=_slot_key))


_Option = tuple[float, int, str]  # (GPU-seconds lost, victims, node): a node's price for a preemption


class _Hold:
    """What a node keeps in one pass for the job its victims were stopped for (:meth:`_Index.keep`)."""

    __slots__ = ("slot", "free", "stopping", "cpus", "memory")

    def __init__(self, slot: _Node, free: tuple[str, ...], stopping: list[Running], cpus: float,
                 memory: int) -> None:
        self.slot, self.free, self.stopping, self.cpus, self.memory = slot, free, stopping, cpus, memory


class _Index:
    """Free capacity by shape: per health tier, the unreserved nodes by free GPU count (a placement
    looks only at nodes that fit, best fit first: O(candidates), not O(nodes)), and per GPU count
    asked, a heap of the preemptible nodes by what a preemption there costs (lazily rebuilt entries:
    a node's version changes with it; a node's price only rises in a pass, so the top, once fresh, is
    the cheapest)."""

    __slots__ = ("state", "buckets", "max_gpus", "preemptible", "heaps", "now", "victims_left", "touched", "held",
                 "priced", "preemptible_names")

    def __init__(self, nodes: Iterable[_Node], max_gpus: int, preemptible: list[_Node], now: float) -> None:
        self.now = now
        self.state = {slot.name: slot for slot in nodes}
        self.max_gpus = max_gpus
        self.buckets: tuple[list[dict[str, _Node]], ...] = tuple([{} for _ in range(max_gpus + 1)] for _ in range(2))
        for slot in self.state.values():
            self.buckets[slot.tier][len(slot.free)][slot.name] = slot
        self.preemptible = preemptible
        # best-effort and stopping attempts not yet claimed: none left, no preemption can succeed
        self.victims_left = sum(len(slot.best_effort) + len(slot.stopping) for slot in preemptible)
        self.heaps: dict[int, _KeptHeap] = {}
        self.touched: dict[str, _Node] = {}  # the nodes the pass changed (Scheduler puts them back)
        self.priced: list[_Node] = []  # the nodes whose victims the pass priced (Scheduler forgets the prices)
        self.preemptible_names: set[str] | None = None  # (when first asked)
        self.held: set[str] = set()  # nodes where something is held for a job (not reserved for another)

    def most_free(self) -> int:
        """The most free GPUs on an unreserved node (-1: every node is held)."""
        for k in range(self.max_gpus, -1, -1):
            if self.buckets[0][k] or self.buckets[1][k]:
                return k
        return -1

    def moved(self, slot: _Node, old_free: int) -> None:
        """``slot`` changed (its free GPUs were ``old_free``): rebucket it, mark index entries stale."""
        slot.ver = next(_VERSIONS)
        self.touched[slot.name] = slot
        self.buckets[slot.tier][old_free].pop(slot.name, None)
        if slot.reserved_for is None:
            self.buckets[slot.tier][len(slot.free)][slot.name] = slot

    def fit(self, job: Pending) -> list[_Node] | None:
        """Best fit; degraded nodes and the nodes the job failed on (infra) only when nothing else fits
        (among them best fit too)."""
        chosen: list[_Node] = []
        last: list[list[_Node]] = [[] for _ in range(self.max_gpus + 1)]
        healthy, degraded = self.buckets
        for k in range(job.gpus, self.max_gpus + 1):
            for slot in healthy[k].values():
                if slot.cpus + 1e-9 >= job.cpus and (slot.memory >= job.memory or job.memory == 0):
                    if slot.name in job.avoid:
                        last[k].append(slot)
                        continue
                    chosen.append(slot)
                    if len(chosen) == job.nodes:
                        return chosen
        for k in range(job.gpus, self.max_gpus + 1):
            for slot in [*degraded[k].values(), *last[k]]:
                if slot.cpus + 1e-9 >= job.cpus and (slot.memory >= job.memory or job.memory == 0):
                    chosen.append(slot)
                    if len(chosen) == job.nodes:
                        return chosen
        return None

    def reserve(self, job: Pending, out: Decisions) -> bool:
        """Hold the node closest to fitting a job that has waited too long; False when none is left.

        Without runtime estimates any running attempt may end first, so "closest" is the
        node with the most free GPUs among those big enough.
        """
        for k in range(self.max_gpus, -1, -1):
            for tier in self.buckets:
                for slot in tier[k].values():
                    if slot.total >= job.gpus and slot.name not in self.held:
                        self.hold(slot, job.job_id, out)
                        return True
        return False

    def hold(self, slot: _Node, job_id: int, out: Decisions) -> None:
        self.buckets[slot.tier][len(slot.free)].pop(slot.name, None)
        self.touched[slot.name] = slot
        slot.reserved_for = job_id
        slot.ver = next(_VERSIONS)
        out.reserved[slot.name] = job_id

    def keep(self, slot: _Node, job_id: int, member: _Member) -> _Hold | None:
        """Hold on ``slot`` what one ``member`` of ``job_id`` needs there: the attempts stopping there
        first (its victims), then free slots, and its cores and memory, out of every other job's reach
        (the rest of the node stays open). None: the node was reserved in the pass, nothing is held."""
        if slot.reserved_for is not None:
            return None
        gpus, cpus, memory = member
        g = 0
        claimed: list[Running] = []
        for att in slot.stopping:
            if g >= gpus:
                break
            g += sum(len(ids) for n, ids in att.alloc if n == slot.name)
            claimed.append(att)
        use = min(len(slot.free), max(0, gpus - g))
        got_c = sum(att.cpus * _members_on(att, slot.name) for att in claimed)
        got_m = sum(att.memory * _members_on(att, slot.name) for att in claimed)
        hold = _Hold(slot, slot.free[:use], claimed, max(0.0, cpus - got_c), max(0, memory - got_m))
        old_free = len(slot.free)
        slot.free = slot.free[use:]
        slot.stopping = [att for att in slot.stopping if att not in claimed]
        slot.cpus -= hold.cpus
        slot.memory -= hold.memory
        self.victims_left -= len(claimed)
        self.held.add(slot.name)
        self.moved(slot, old_free)
        return hold

    def release(self, hold: _Hold) -> None:
        """What ``hold`` kept, back on its node (its job's turn), the node priced again for preemption."""
        slot = hold.slot
        old_free = len(slot.free)
        slot.free = hold.free + slot.free
        slot.stopping = hold.stopping + slot.stopping
        slot.cpus += hold.cpus
        slot.memory += hold.memory
        self.victims_left += len(hold.stopping)
        self.held.discard(slot.name)
        self.moved(slot, old_free)
        # priced again at the top (it may be cheaper now, and a heap may have dropped it while its stopping
        # attempts were held), if the pass started with it preemptible, as a heap built afresh holds it
        if self.heaps:
            if self.preemptible_names is None:
                self.preemptible_names = {node.name for node in self.preemptible}
            if slot.name in self.preemptible_names:
                for heap in self.heaps.values():
                    heap.again((slot.name,))

    def cheapest(self, job: Pending) -> list[tuple[_Option, _Plan]]:
        """The ``job.nodes`` nodes where preempting for ``job`` costs least, cheapest first (fewer: none)."""
        kept = self.heaps.get(job.gpus)
        if kept is None:  # the preemptible nodes by their price for the GPUs alone (a lower bound of the price)
            kept = self.heaps[job.gpus] = _KeptHeap(frozenset(), _NO_PRICE)
            for node in self.preemptible:
                plan = _plan(node, self.victims(node), job.gpus, 0.0, 0)
                if plan is not None:
                    kept.add(plan[0], node.name, node.ver)
                    if len(node.best_effort) > EXACT_VICTIMS:
                        kept.greedy.add(node.name)
            heapq.heapify(kept.heap)
        heap, tag, state = kept.heap, kept.tag, self.state
        found: list[tuple[_Option, _Plan]] = []
        if job.nodes > 1:  # a gang: the nodes that hold a member as they are cost nothing (fewer than it needs:
            # with as many, it would have been placed)
            for node in self.free_nodes(job):
                found.append(((0.0, 0, node.name), ((0.0, 0, node.name), [], [])))
            found.sort(key=lambda f: f[0])
        free = {f[0][2] for f in found}
        popped: list[tuple[Any, str, int]] = []
        while (top := kept.peek()) is not None:
            bound, name, cur = top
            slot = state.get(name)
            if slot is None or slot.reserved_for is not None:
                kept.drop(slot)
                continue
            if name in free:
                popped.append(heapq.heappop(heap))
                continue
            if cur[1] != slot.ver or cur[2] != tag:  # it changed since (or time went on): its price, again
                kept.drop(slot)
                plan = _plan(slot, self.victims(slot), job.gpus, 0.0, 0)
                if plan is not None:
                    kept.push(plan[0], name, slot.ver)
                    if len(slot.best_effort) > EXACT_VICTIMS:
                        kept.greedy.add(name)
                continue
            if len(found) >= job.nodes and found[job.nodes - 1][0] <= bound:
                break  # no node left in the heap costs less (its GPUs-only price is a lower bound)
            popped.append(heapq.heappop(heap))
            plan = _plan(slot, self.victims(slot), job.gpus, job.cpus, job.memory)
            if plan is not None:
                bisect.insort(found, (plan[0], plan), key=lambda f: f[0])
        for entry in popped:
            heapq.heappush(heap, entry)
        return found[: job.nodes] if len(found) >= job.nodes else []

    def free_nodes(self, job: Pending) -> Iterator[_Node]:
        """Up to ``job.nodes - 1`` nodes that hold a member of ``job`` as they are (any tier)."""
        count = 0
        for k in range(job.gpus, self.max_gpus + 1):
            for tier in self.buckets:
                for slot in tier[k].values():
                    if count == job.nodes - 1:
                        return
                    if slot.cpus + 1e-9 >= job.cpus and (slot.memory >= job.memory or job.memory == 0):
                        count += 1
                        yield slot

    def victims(self, slot: _Node) -> list[_Victim]:
        """``slot``'s best-effort attempts, priced (once a pass, when a preemption first looks at it)."""
        if slot.priced is None:
            self.priced.append(slot)
            slot.priced = sorted((_Victim(att, slot.name, self.now) for att in slot.best_effort), key=lambda v: v.rank)
        return slot.priced


_LN2 = 0.6931471805599453


def _claimable(att: Running) -> bool:
    """Whether a reclaim may stop ``att``: normal, every member holding GPUs, not stopping already (a gang
    whole: for a job of one member, what it holds on the node where it is chosen makes the room there)."""
    return att.priority == "normal" and not att.stopping and bool(att.alloc) and all(ids for _, ids in att.alloc)


class _Victims:
    """Per node, the attempts a reclaim may stop there, priced as preemption prices them (work since their
    last checkpoint, or start), least lost first: a node's list made when a reclaim first asks for it in the
    pass (a pass prices the few nodes it looks at, not every running attempt). ``on``: per node, its
    attempts (a list in the pass's order, or a Scheduler's kept dict by id); ``order`` (for the dicts) the
    pass's order, which breaks a tie of rank as the pass's own order does."""

    __slots__ = ("on", "now", "built", "order", "_pos")

    def __init__(self, on: Mapping[str, Any], now: float, order: list[Running] | None = None) -> None:
        self.on, self.now, self.order = on, now, order
        self.built: dict[str, list[_Victim]] = {}
        self._pos: dict[int, int] | None = None

    def __iter__(self) -> Iterator[str]:
        """The nodes that may have some (those with an attempt)."""
        return iter(self.on)

    def __getitem__(self, name: str) -> list[_Victim]:
        found = self.built.get(name)
        if found is None:
            atts = self.on.get(name)
            if self.order is None:
                found = [_Victim(att, name, self.now) for att in atts] if atts else []
                found.sort(key=_victim_rank)
            else:
                found = [_Victim(att, name, self.now) for att in atts.values() if _claimable(att)] if atts else []
                found.sort(key=_victim_rank)
                if any(a.rank == b.rank for a, b in zip(found, found[1:], strict=False)):
                    if self._pos is None:
                        self._pos = {id(att): i for i, att in enumerate(self.order)}
                    pos = self._pos
                    found.sort(key=lambda v: (v.rank, pos[id(v.att)]))
            self.built[name] = found
        return found


def _reclaimable(usage: _Usage, running: list[Running], now: float) -> _Victims:
    """Per node, the attempts a reclaim may stop there (normal, not stopping; a gang on each of its nodes),
    priced when asked."""
    if usage.victims is None:
        on: dict[str, list[Running]] = {}
        for att in running:
            if _claimable(att):
                alloc = att.alloc
                for name in (alloc[0][0],) if len(alloc) == 1 else dict.fromkeys(n for n, _ in alloc):
                    on.setdefault(name, []).append(att)
                usage.victim_projects.add(att.project)
        usage.victims = _Victims(on, now)
    return usage.victims


class _KeptHeap:
    """Per GPU count, the nodes by a lower bound of what a preemption (its price for the GPUs alone) or a
    reclaim there costs, kept from job to job (and, by a Scheduler, from pass to pass). A heap of (bound,
    node, sequence); ``live`` has each node's one current entry (sequence, the node's version and the tag
    it was priced under): any other entry of the node is dropped when it comes to the top. An entry priced
    under another tag (an earlier ``now``; for a reclaim, more borrowers) or before its node changed is
    still a lower bound (a node's bound only rises as the work its victims would lose grows with time, as
    the pass takes its room, as borrowers stop borrowing), and is priced again when it comes to the top:
    the same tops as a heap built afresh. A node that may have gained room gets an entry at ``bottom``
    (:meth:`again`), and so does, at a later ``now``, a node whose price is not the least of every set
    (``greedy``: more than ``EXACT_VICTIMS`` victims, whose price need not rise with time)."""

    __slots__ = ("epoch", "heap", "live", "tag", "seq", "bottom", "greedy", "saved")

    def __init__(self, epoch: frozenset[str], bottom: Any) -> None:
        self.epoch = epoch
        self.heap: list[tuple[Any, str, int]] = []
        self.live: dict[str, tuple[int, int, int]] = {}
        self.tag = next(_TAGS)
        self.seq = 0
        self.bottom = bottom
        self.greedy: set[str] = set()
        # per node, its last entry dropped that was priced as the running attempts leave it (bound, version, tag):
        # a Scheduler puts the node back so after the pass, and the entry holds again (Scheduler._lend)
        self.saved: dict[str, tuple[Any, int, int]] = {}

    def add(self, low: Any, name: str, ver: int) -> None:
        """An entry priced under the current tag, not yet in heap order (then ``heapq.heapify``)."""
        self.seq += 1
        self.live[name] = (self.seq, ver, self.tag)
        self.heap.append((low, name, self.seq))

    def peek(self) -> tuple[Any, str, tuple[int, int, int]] | None:
        """The top entry that is its node's current one (the others above it dropped): (bound, node, its
        sequence, version and tag); None when the heap is empty."""
        heap, live = self.heap, self.live
        while heap:
            low, name, seq = heap[0]
            cur = live.get(name)
            if cur is not None and cur[0] == seq:
                return low, name, cur
            heapq.heappop(heap)
        return None

    def drop(self, slot: _Node | None) -> None:
        """Take the top entry off for good (its node, ``slot``, out of the heap until it is pushed again)."""
        low, name, _ = heapq.heappop(self.heap)
        cur = self.live.pop(name)
        if slot is not None and cur[1] == slot.base_ver:
            self.saved[name] = (low, cur[1], cur[2])

    def push(self, low: Any, name: str, ver: int, tag: int | None = None) -> None:
        self.seq += 1
        self.live[name] = (self.seq, ver, self.tag if tag is None else tag)
        heapq.heappush(self.heap, (low, name, self.seq))

    def again(self, names: Collection[str]) -> None:
        """``names`` priced again when next asked (they may be cheaper now), the dropped entries cleared out."""
        heap, live = self.heap, self.live
        few = 8 * len(names) < len(heap)
        for name in names:
            self.seq += 1
            live[name] = (self.seq, -1, -1)
            if few:
                heapq.heappush(heap, (self.bottom, name, self.seq))
            else:
                heap.append((self.bottom, name, self.seq))
        if len(heap) > 2 * len(live) + 64:
            self.heap = [e for e in heap if live.get(e[1], (0,))[0] == e[2]]
            heapq.heapify(self.heap)
        elif not few:
            heapq.heapify(heap)


_TAGS = itertools.count(1)
_NO_BOUND = float("-inf")
_NO_PRICE = (_NO_BOUND,)  # (below every preemption price: (GPU-seconds lost, victims, node))


_victim_rank = operator.attrgetter("rank")
_Cost = tuple[float, int]  # (GPU-seconds lost, victims)
RECLAIM_STEPS = 4_000  # a reclaim's search over nodes and victim sets, at most this many steps (then its best)
RECLAIM_ROUNDS = 8  # and at most this many nodes priced past the first choice that could be beaten


def _reclaim(job: Pending, index: _Index, usage: _Usage, running: list[Running], out: Decisions) -> bool:
    """Take back ``job``'s project's guarantee (Kueue's reclaim within a cohort): stop normal attempts of
    projects that hold more than their guarantee, each only while its project still borrows (critical
    attempts and the job's own project's are spared), so that every member of ``job`` fits on a node of
    its own, at the least cost: GPU-seconds lost (since each victim's last checkpoint, or its start),
    then the fewest victims. Nodes that hold a member as they are cost nothing. Per node every set of
    up to ``EXACT_VICTIMS`` victims is tried (more: the cheapest until it fits, then none superfluous);
    across nodes a branch and bound over the nodes' sets, priced cheapest first with a lower bound for
    the nodes not priced yet. Nothing is stopped when the job cannot fit."""
    victims = _reclaimable(usage, running, index.now)
    used, guaranteed = usage.quota_used, usage.guaranteed

    def spare(project: str) -> int:  # what it borrows: it may lose attempts while it holds more than its guarantee
        return 0 if project == job.project else used.get(project, 0) - guaranteed.get(project, 0)

    need = job.nodes
    free = list(index.free_nodes(job)) if need > 1 else []  # (all the nodes that fit as they are: fewer than need)
    free_names = {slot.name for slot in free}

    # the projects still borrowing, whose attempts a reclaim may stop: the job's own is never one of them (it
    # holds less than its guarantee), so the set is the same for every project's job at one point of the pass
    epoch = frozenset(p for p in usage.victim_projects if spare(p) > 0)

    def eligible(name: str) -> list[_Victim]:
        return [v for v in victims[name] if v.att.project in epoch]

    # per GPU count, the nodes by a lower bound of a reclaim's cost there (_KeptHeap): built again when the
    # set of borrowers grows (a borrower's placement) or a hold gave room back; fewer borrowers: a new tag
    kept = usage.reclaim_heaps.get(job.gpus)
    if kept is None or not epoch <= kept.epoch:
        kept = usage.reclaim_heaps[job.gpus] = _KeptHeap(epoch, _NO_BOUND)
        for name in victims:
            if (e := _reclaim_entry(index, name, eligible, job.gpus, usage, epoch)) is not None:
                kept.add(e[0], name, e[2])
        heapq.heapify(kept.heap)
    elif epoch != kept.epoch:
        kept.epoch, kept.tag = epoch, next(_TAGS)
    heap, tag = kept.heap, kept.tag
    popped: list[tuple[float, str, int]] = []
    state = index.state

    def top() -> tuple[float, str, int] | None:
        """The cheapest fresh entry that is not a node with room as it is (stale ones priced again)."""
        while (entry := kept.peek()) is not None:
            _, name, cur = entry
            slot = state.get(name)
            if slot is None or cur[1] != slot.ver or cur[2] != tag:
                kept.drop(slot)
                if (e := _reclaim_entry(index, name, eligible, job.gpus, usage, epoch)) is not None:
                    kept.push(e[0], name, e[2])
                continue
            if name in free_names:
                popped.append(heapq.heappop(heap))
                continue
            return heap[0]
        return None

    options: list[tuple[_Node, list[tuple[_Cost, list[_Victim]]]]] = [(slot, [((0.0, 0), [])]) for slot in free]
    lows: list[_Cost] = [(0.0, 0)] * len(free)  # each priced node's cheapest set, sorted

    def price(name: str) -> None:
        popped.append(heapq.heappop(heap))
        slot = index.state[name]
        found = eligible(name)
        if need > 1:  # (a gang job takes back from attempts on one node each; the bound counted every one)
            found = [v for v in found if len(v.att.alloc) == 1]
        sets = _reclaim_sets(slot, found, job, spare)
        if sets:
            options.append((slot, sets))
            bisect.insort(lows, sets[0][0])

    rounds = 0
    best: tuple[_Cost, list[tuple[_Node, list[_Victim]]]] | None = None
    try:
        while True:
            while (nxt := top()) is not None and (len(lows) < need or lows[need - 1][0] > nxt[0]):
                price(nxt[1])
            best = _combine(options, need, spare)
            if nxt is None or rounds >= RECLAIM_ROUNDS:
                break
            if best is not None:  # could a node not priced yet do better? (lost and count bounded apart)
                rest = need - 1
                lost = nxt[0] + sum(sorted([c[0] for c in lows] + [nxt[0]] * rest)[:rest])
                count = 1 + sum(sorted([c[1] for c in lows] + [1] * rest)[:rest])
                if best[0] <= (lost, count):
                    break
            rounds += 1
            price(nxt[1])
    finally:
        for back in popped:  # (what was priced stays for the next reclaim: a node that changes is priced again)
            heapq.heappush(heap, back)
    if best is None:
        return False
    for slot, chosen in best[1]:
        old_free = len(slot.free)
        freed = sum(v.gpus for v in chosen)
        slot.free = slot.free[max(0, job.gpus - freed):]
        slot.cpus += sum(v.cpus for v in chosen) - job.cpus
        slot.memory += sum(v.memory for v in chosen) - job.memory
        for v in chosen:
            victims[slot.name].remove(v)
            if len(v.att.alloc) > 1:  # a gang, stopped whole: no victim on its other nodes any longer
                for name in {n for n, _ in v.att.alloc} - {slot.name}:
                    victims[name][:] = [w for w in victims[name] if w.att is not v.att]
            used[v.att.project] -= v.whole
            out.preemptions.append(Preemption(v.att.job_id, v.att.attempt, job.job_id))
        index.moved(slot, old_free)
        out.held.setdefault(slot.name, job.job_id)
    return True


def _reclaim_entry(index: _Index, name: str, eligible: Callable[[str], list[_Victim]], gpus: int,
                   usage: _Usage, epoch: frozenset[str]) -> tuple[float, str, int] | None:
    """``name``'s entry in a reclaim's heap: its lower bound now (None: it cannot make room, or is held)."""
    slot = index.state.get(name)
    if slot is None or slot.reserved_for is not None or slot.total < gpus:
        return None
    cached = usage.bounds.get(name)
    if cached is None or cached[1] != slot.ver or cached[0] != epoch:
        found = eligible(name)
        cached = usage.bounds[name] = (epoch, slot.ver, _Bounds(found) if found else None)
    low = None if cached[2] is None else cached[2].low(gpus - len(slot.free))
    return None if low is None else (low, name, slot.ver)


class _Bounds:
    """A node's victims eligible for a reclaim (least lost first), prepared for :meth:`low` at any GPU count:
    :func:`_reclaim_bound`'s sums, each summed once in the same order (so the same figures, to the last bit)."""

    __slots__ = ("first", "cover", "least", "order", "gpus", "frac")

    def __init__(self, eligible: list[_Victim]) -> None:
        self.first = eligible[0].lost
        self.cover = list(itertools.accumulate(sorted((v.gpus for v in eligible), reverse=True)))
        self.least = list(itertools.accumulate((v.lost for v in eligible), initial=0))
        self.order = sorted(eligible, key=lambda v: v.lost / v.gpus)
        self.gpus = list(itertools.accumulate(v.gpus for v in self.order))
        self.frac = list(itertools.accumulate((v.lost * v.gpus / v.gpus for v in self.order), initial=0.0))

    def low(self, lack: int) -> float | None:
        """:func:`_reclaim_bound` for a node that lacks ``lack`` GPUs."""
        if lack <= 0:
            return self.first
        k = bisect.bisect_left(self.cover, lack)
        if k == len(self.cover):
            return None
        i = bisect.bisect_left(self.gpus, lack)
        v = self.order[i]
        frac = self.frac[i] + v.lost * (lack - (self.gpus[i - 1] if i else 0)) / v.gpus
        return max(self.least[k + 1], frac)


def _reclaim_bound(slot: _Node, eligible: list[_Victim], gpus: int) -> float | None:
    """A lower bound of what making room for ``gpus`` on ``slot`` loses (``eligible`` least lost first):
    the larger of the fractional cover (the least lost per GPU first, the last one in part) and the
    sum of the k least lost, k the fewest victims whose GPUs could cover what the node lacks. None: all
    of them together would not free enough GPUs."""
    lack = gpus - len(slot.free)
    if lack <= 0:
        return eligible[0].lost  # (short of cores or memory: at least one victim)
    sizes = sorted((v.gpus for v in eligible), reverse=True)
    k = got = 0
    for size in sizes:
        k += 1
        got += size
        if got >= lack:
            break
    if got < lack:
        return None
    least = sum(v.lost for v in eligible[:k])
    frac, left = 0.0, lack
    for v in sorted(eligible, key=lambda v: v.lost / v.gpus):
        take = min(left, v.gpus)
        frac += v.lost * take / v.gpus
        left -= take
        if left <= 0:
            break
    return max(least, frac)


def _admissible(chosen: Iterable[_Victim], spare: Callable[[str], int], per: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]] | None:
    """``per`` (each project's GPUs stopped and its largest victim) with ``chosen`` added, or None when some
    project would lose an attempt after it stopped borrowing: stopped in the best order (its largest
    last), each victim goes while its project holds more than its guarantee: stopped less largest < spare."""
    out = per
    for v in chosen:
        p = v.att.project
        total, top = out.get(p, (0, 0))
        total, top = total + v.whole, max(top, v.whole)
        if total - top >= spare(p):
            return None
        if out is per:
            out = dict(per)
        out[p] = (total, top)
    return out


def _reclaim_sets(slot: _Node, eligible: list[_Victim], job: Pending, spare: Callable[[str], int]) -> list[tuple[_Cost, list[_Victim]]]:
    """The sets of ``eligible`` victims on ``slot`` that make room for one member of ``job``, none of them
    superfluous, each admissible on its own, cheapest first (every set up to ``EXACT_VICTIMS`` victims;
    past that one set: the cheapest until it fits, then the dearest not needed dropped)."""
    g0, c0, m0 = len(slot.free), slot.cpus, slot.memory

    def fits(pick: list[_Victim]) -> bool:
        return (g0 + sum(v.gpus for v in pick) >= job.gpus and c0 + sum(v.cpus for v in pick) + 1e-9 >= job.cpus
                and (m0 + sum(v.memory for v in pick) >= job.memory or job.memory == 0))

    if not fits(eligible):
        return []  # (all of them would not do: no subset does)
    n = len(eligible)
    if n <= EXACT_VICTIMS:
        # every subset's GPUs, cores, memory and loss, each summed in the victims' order as sum() over the
        # subset would (a subset's sums are its lower victims' plus its highest one's): fits() in O(1)
        size = 1 << n
        g, m = [0] * size, [0] * size
        c, lost = [0.0] * size, [0.0] * size  # (0.0 + x is x, as sum()'s 0 + x)
        gpus, cpus, memory = job.gpus, job.cpus, job.memory
        ok = [False] * size
        ok[0] = g0 >= gpus and c0 + 1e-9 >= cpus and (m0 >= memory or memory == 0)
        for mask in range(1, size):
            k = mask.bit_length() - 1
            low, v = mask ^ (1 << k), eligible[k]
            g[mask], c[mask], m[mask], lost[mask] = g[low] + v.gpus, c[low] + v.cpus, m[low] + v.memory, \
                lost[low] + v.lost
            ok[mask] = (g0 + g[mask] >= gpus and c0 + c[mask] + 1e-9 >= cpus
                        and (m0 + m[mask] >= memory or memory == 0))
        found: list[tuple[tuple[float, int, tuple[int, ...]], list[_Victim]]] = []
        for mask in range(1, size):
            if not ok[mask]:
                continue
            bits = [k for k in range(n) if mask >> k & 1]
            if any(ok[mask ^ (1 << k)] for k in bits):
                continue  # one of them superfluous
            chosen = [eligible[k] for k in bits]
            if _admissible(chosen, spare, {}) is None:
                continue
            found.append(((lost[mask], len(chosen), tuple(bits)), chosen))
        found.sort(key=lambda f: f[0])
        return [((key[0], key[1]), chosen) for key, chosen in found]
    pick: list[_Victim] = []
    for v in eligible:
        if _admissible([*pick, v], spare, {}) is not None:
            pick.append(v)
            if fits(pick):
                break
    if not fits(pick):
        return []
    for v in reversed(list(pick)):
        rest = [w for w in pick if w is not v]
        if fits(rest):
            pick = rest
    return [((sum(v.lost for v in pick), len(pick)), pick)]


def _combine(options: list[tuple[_Node, list[tuple[_Cost, list[_Victim]]]]], need: int,
             spare: Callable[[str], int]) -> tuple[_Cost, list[tuple[_Node, list[_Victim]]]] | None:
    """The cheapest choice of ``need`` nodes of ``options``, one set of victims on each, admissible together
    (a branch and bound over the nodes cheapest first, at most ``RECLAIM_STEPS`` steps: then the best found)."""
    nodes = sorted(options, key=lambda o: (o[1][0][0], o[0].rank, o[0].name))
    if len(nodes) < need:
        return None
    sums = [0.0]
    for _, sets in nodes:
        sums.append(sums[-1] + sets[0][0][0])
    best: list[Any] = [None]
    steps = [RECLAIM_STEPS]
    picks: list[tuple[_Node, list[_Victim]]] = []

    def walk(i: int, left: int, lost: float, count: int, per: dict[str, tuple[int, int]]) -> None:
        if left == 0:
            if best[0] is None or (lost, count) < best[0][0]:
                best[0] = ((lost, count), list(picks))
            return
        if len(nodes) - i < left or steps[0] <= 0:
            return
        if best[0] is not None and lost + sums[i + left] - sums[i] > best[0][0][0]:
            return  # the cheapest sets of the next nodes already cost more
        steps[0] -= 1
        slot, sets = nodes[i]
        for (cost, count_here), chosen in sets:
            after = _admissible(chosen, spare, per)
            if after is not None:
                picks.append((slot, chosen))
                walk(i + 1, left - 1, lost + cost, count + count_here, after)
                picks.pop()
        walk(i + 1, left, lost, count, per)

    walk(0, need, 0.0, 0, {})
    return best[0]  # type: ignore[no-any-return]


_Plan = tuple[_Option, list[Running], list["_Victim"]]  # (price, stopping attempts claimed, victims)
EXACT_VICTIMS = 6  # up to this many victims on a node, the cheapest set is found by trying every one


def _plan(slot: _Node, victims: list[_Victim], gpus: int, cpus: float, memory: int) -> _Plan | None:
    """What ``slot`` must give up to hold (``gpus``, ``cpus``, ``memory``): the attempts already
    stopping first (free to claim), then the set of victims that loses the least work (GPU-seconds
    since their last checkpoint; then the fewest; so the youngest and the recently saved go first),
    none of them superfluous. None when even all of them would not do."""
    g, c, m = len(slot.free), slot.cpus, slot.memory
    taken: list[Running] = []
    for att in slot.stopping:
        if g >= gpus and c + 1e-9 >= cpus and m >= memory:
            break
        members = _members_on(att, slot.name)
        g += sum(len(ids) for n, ids in att.alloc if n == slot.name)
        c += att.cpus * members
        m += att.memory * members
        taken.append(att)
    if g >= gpus and c + 1e-9 >= cpus and m >= memory:
        return (0.0, 0, slot.name), taken, []
    need_g, need_c, need_m = gpus - g, cpus - c - 1e-9, memory - m
    if (sum(v.gpus for v in victims) < need_g or sum(v.cpus for v in victims) < need_c
            or sum(v.memory for v in victims) < need_m):
        return None
    if len(victims) == 1:
        return (victims[0].lost, 1, slot.name), taken, list(victims)
    if len(victims) <= EXACT_VICTIMS:
        best: tuple[tuple[float, int, tuple[int, ...]], list[_Victim]] | None = None
        for mask in range(1, 1 << len(victims)):
            pick = [v for i, v in enumerate(victims) if mask >> i & 1]
            if (sum(v.gpus for v in pick) >= need_g and sum(v.cpus for v in pick) >= need_c
                    and sum(v.memory for v in pick) >= need_m):
                key = (sum(v.lost for v in pick), len(pick), tuple(victims.index(v) for v in pick))
                if best is None or key < best[0]:
                    best = (key, pick)
        assert best is not None  # all of them do
        return (best[0][0], best[0][1], slot.name), taken, best[1]
    pick = []  # many small victims: the cheapest until it fits, then drop what is not needed, dearest first
    for v in victims:
        pick.append(v)
        if sum(p.gpus for p in pick) >= need_g and sum(p.cpus for p in pick) >= need_c and sum(
                p.memory for p in pick) >= need_m:
            break
    for v in reversed(list(pick)):
        rest = [p for p in pick if p is not v]
        if sum(p.gpus for p in rest) >= need_g and sum(p.cpus for p in rest) >= need_c and sum(
                p.memory for p in rest) >= need_m:
            pick = rest
    return (sum(v.lost for v in pick), len(pick), slot.name), taken, pick


def _preempt(job: Pending, index: _Index, out: Decisions) -> bool:
    """Stop the best-effort attempts that cost least (work lost, then fewest) so that ``job`` fits."""
    options = index.cheapest(job)
    if not options:
        return False
    for (_, _, name), (_, taken_stopping, taken_victims) in options:
        # Claim exactly what the job needs on this node: the free slots it will use and the
        # attempts being stopped for it. What is left stays available to later jobs.
        slot = index.state[name]
        freed = [*taken_stopping, *(v.att for v in taken_victims)]
        use_free = max(0, job.gpus - sum(len(ids) for att in freed for n, ids in att.alloc if n == name))
        old_free = len(slot.free)
        slot.free = slot.free[use_free:]
        slot.cpus += sum(a.cpus * _members_on(a, name) for a in freed) - job.cpus
        slot.memory += sum(a.memory * _members_on(a, name) for a in freed) - job.memory
        index.victims_left -= len(taken_stopping) + len(taken_victims)
        for att in taken_stopping:
            slot.stopping.remove(att)
        for v in taken_victims:
            index.victims(slot).remove(v)
            out.preemptions.append(Preemption(v.att.job_id, v.att.attempt, job.job_id))
        index.moved(slot, old_free)
        out.held.setdefault(name, job.job_id)
    return True
