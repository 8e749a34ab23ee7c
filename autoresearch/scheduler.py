"""Scheduling as a pure function (docs/architecture.md, invariant 4): queue + cluster -> decisions.

No I/O, no clock, no randomness: the same inputs always give the same placements,
which is what makes it testable and lets the local and sim backends share it.

Policy (what a Slurm or Kueue user would expect):

* Order: priority class (critical, normal, best-effort), then submit order. With fair share
  on (``fair=``), within a class the project with the smallest dominant share (its GPUs or
  cores in use over the fleet's, the larger of the two, divided by its weight) goes next,
  then submit order inside a project; shares move as jobs are placed in the pass.
* Quotas: a project whose normal and critical attempts hold its ``quota`` GPUs gets nothing
  more (not placed, no preemption, no reservation). Best-effort jobs are exempt: they
  backfill idle capacity ("the weekend") and are the first preempted when others need it.
* Gangs (``nodes > 1``): all members or none, one member per node; with ``pack_gangs``
  (a single-host backend: local) members may share a node, each with its own GPU slots.
* Placement: best fit — the node with the fewest free GPUs that still fits, so big
  holes stay open for big jobs. GPU slots are never shared between attempts. Degraded
  nodes (throttling) and the nodes a job already failed on for the machine's fault
  come last: used only when nothing else fits.
* Backfill: when a job cannot fit yet, later (smaller) jobs that fit still start.
  To keep a big job from starving behind a stream of small ones, a job that has
  waited ``reserve_after_s`` reserves the node closest to fitting it: nothing that
  comes after it in the queue is placed there.
* Group caps: a job of a group (a research loop's trials) starts only while fewer than the
  group's cap of its jobs run, like Slurm's array throttle (``--array=0-99%16``); one that
  waits for its group holds nothing back (no reservation, no preemption).
* Preemption: a critical or normal job that cannot fit may stop best-effort attempts,
  youngest first, choosing the node(s) that need the fewest victims. Victims keep
  their slots until they exit (grace period); meanwhile their slots are claimed by
  the job they were stopped for, so later passes do not pick more victims.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping
from typing import Any, Final, Self

RANK = {"critical": 0, "normal": 1, "best-effort": 2}

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
    __slots__ = ("job_id", "attempt", "priority", "alloc", "started_at", "cpus", "memory", "stopping", "project")

    def __init__(self, job_id: int, attempt: int, priority: str, alloc: tuple[tuple[str, tuple[str, ...]], ...],
                 started_at: float = 0.0, cpus: float = 0.0, memory: int = 0, stopping: bool = False,
                 project: str = "") -> None:
        self.job_id: Final = job_id
        self.attempt: Final = attempt
        self.priority: Final = priority
        self.alloc: Final = alloc  # (node, gpu ids) per node
        self.started_at: Final = started_at
        self.cpus: Final = cpus
        self.memory: Final = memory
        self.stopping: Final = stopping
        self.project: Final = project


class Share(_Record):
    """A project's weight (its share of the fleet, relative to others) and optional GPU quota."""

    __slots__ = ("weight", "quota")

    def __init__(self, weight: float = 1.0, quota: int | None = None) -> None:
        self.weight: Final = weight
        self.quota: Final = quota  # GPUs its normal and critical attempts may hold at once; None: no cap


class FairShare(_Record):
    __slots__ = ("projects", "default_weight")

    def __init__(self, projects: Mapping[str, Share] | None = None, default_weight: float = 1.0) -> None:
        self.projects: Final[Mapping[str, Share]] = {} if projects is None else projects
        self.default_weight: Final = default_weight

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
    __slots__ = ("placements", "preemptions", "reserved")
    __hash__ = None  # type: ignore[assignment]  # (mutable: the pass appends to it)

    def __init__(self, placements: list[Placement] | None = None, preemptions: list[Preemption] | None = None,
                 reserved: dict[str, int] | None = None) -> None:
        self.placements: list[Placement] = [] if placements is None else placements
        self.preemptions: list[Preemption] = [] if preemptions is None else preemptions
        self.reserved: dict[str, int] = {} if reserved is None else reserved  # node -> job it is held for


class _Node:
    __slots__ = ("name", "total", "free", "cpus", "memory", "degraded", "victims", "stopping", "reserved_for")

    def __init__(self, name: str, total: int, free: list[str], cpus: float, memory: int,
                 degraded: bool = False) -> None:
        self.name, self.total, self.free, self.cpus, self.memory = name, total, free, cpus, memory
        self.degraded = degraded
        self.victims: list[Running] = []  # best-effort, youngest first
        self.stopping: list[Running] = []  # already being stopped, unclaimed
        self.reserved_for: int | None = None


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
) -> Decisions:
    """``room``: per capped group, how many more of its jobs may start (a group's running cap less
    its running jobs, like Slurm's ``--array=0-99%16``); a job of a group with none left waits,
    without reserving or preempting anything, and the jobs behind it go on."""
    out = Decisions()
    left = _Room(room)
    state: dict[str, _Node] = {}
    for node in nodes:
        if node.schedulable:
            state[node.name] = _Node(node.name, len(node.gpu_ids), sorted(node.gpu_ids, key=_slot_key), node.cpus,
                                     node.memory, node.degraded)
    usage = _Usage(fair, nodes) if fair is not None else None
    used: dict[str, set[str]] = {}  # per node, the GPU ids its attempts hold: its free list filtered once below
    for att in running:
        if usage is not None:
            usage.add(att.project, att.priority, sum(len(ids) for _, ids in att.alloc), att.cpus * len(att.alloc))
        on_node: dict[str, int] = {}  # per node, this attempt's members there (a packed gang has several)
        for name, ids in att.alloc:
            on_node[name] = on_node.get(name, 0) + 1
            if ids:
                used.setdefault(name, set()).update(ids)
        for name, count in on_node.items():
            slot = state.get(name)
            if slot is None:
                continue
            slot.cpus -= att.cpus * count
            slot.memory -= att.memory * count
            if att.stopping:
                slot.stopping.append(att)
            elif att.priority == "best-effort":
                slot.victims.append(att)
    for name, held in used.items():
        if (slot := state.get(name)) is not None:
            slot.free = [g for g in slot.free if g not in held]
    for slot in state.values():
        slot.victims.sort(key=lambda a: (-a.started_at, -a.job_id))
    max_gpus = max((len(n.gpu_ids) for n in nodes if n.schedulable), default=0)
    buckets: list[dict[str, _Node]] = [{} for _ in range(max_gpus + 1)]
    for slot in state.values():
        buckets[len(slot.free)][slot.name] = slot

    # Free resources only shrink during one pass, so a shape that failed once fails again:
    # remembering the smallest failing GPU count keeps 10,000-job queues linear.
    fail_fit: dict[tuple[int, float, int], int] = {}
    fail_preempt: dict[tuple[int, float, int, int], int] = {}
    preemptible = any(s.victims or s.stopping for s in state.values())
    fail_reserve = 1 << 30

    order = (usage.order(pending) if usage is not None
             else sorted(pending, key=lambda p: (RANK.get(p.priority, 1), *_place(p))))
    for job in order:
        members = job.nodes
        if pack_gangs and members > 1:  # one host: the gang is one request N times the size, split below
            job = job._replace(gpus=job.gpus * members, cpus=job.cpus * members, memory=job.memory * members,
                               nodes=1)
        if usage is not None and not usage.admits(job):
            continue  # its project holds its quota
        if not left.has(job):
            continue  # its group runs its cap
        shape = (job.nodes, job.cpus, job.memory)
        if job.gpus < fail_fit.get(shape, 1 << 30):
            chosen = _fit(job, buckets, max_gpus)
            if chosen is not None:
                alloc: list[tuple[str, tuple[str, ...]]] = []
                for slot in chosen:
                    taken, slot.free = slot.free[: job.gpus], slot.free[job.gpus:]
                    _rebucket(buckets, slot, len(slot.free) + job.gpus)
                    slot.cpus -= job.cpus
                    slot.memory -= job.memory
                    alloc.append((slot.name, tuple(taken)))
                if job.nodes != members:
                    alloc = _split(alloc[0], members)
                out.placements.append(Placement(job.job_id, tuple(alloc)))
                left.take(job)
                if usage is not None:
                    usage.add(job.project, job.priority, job.gpus * job.nodes, _cores(job.cpus) * job.nodes)
                continue
            fail_fit[shape] = job.gpus
        if job.priority != "best-effort" and preemptible:
            key = (*shape, RANK[job.priority])
            if job.gpus < fail_preempt.get(key, 1 << 30):
                if _preempt(job, state, buckets, out):
                    left.take(job)  # the slots it claims are its: a later pass starts it
                    if usage is not None:  # its slots are claimed: they count as its project's from now on
                        usage.add(job.project, job.priority, job.gpus * job.nodes, _cores(job.cpus) * job.nodes)
                    continue
                fail_preempt[key] = job.gpus
        if job.waited_s >= reserve_after_s and job.gpus < fail_reserve:
            if not _reserve(job, state, buckets, out):
                fail_reserve = job.gpus  # held nodes only grow in a pass: no bigger job finds one either
    return out


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

    __slots__ = ("fair", "gpus", "cpus", "quota_used", "total_gpus", "total_cpus", "changed")

    def __init__(self, fair: FairShare, nodes: list[NodeState]) -> None:
        self.fair = fair
        self.gpus: dict[str, float] = {}
        self.cpus: dict[str, float] = {}
        self.quota_used: dict[str, int] = {}
        self.total_gpus = sum(len(n.gpu_ids) for n in nodes) or 0
        self.total_cpus = sum(n.cpus for n in nodes) or 0.0
        self.changed = False

    def add(self, project: str, priority: str, gpus: int, cpus: float) -> None:
        self.changed = True
        self.gpus[project] = self.gpus.get(project, 0) + gpus
        self.cpus[project] = self.cpus.get(project, 0.0) + cpus
        if priority != "best-effort":
            self.quota_used[project] = self.quota_used.get(project, 0) + gpus

    def admits(self, job: Pending) -> bool:
        if job.priority == "best-effort":
            return True  # backfill: over quota is fine, it is the first preempted
        quota = self.fair.share(job.project).quota
        return quota is None or self.quota_used.get(job.project, 0) + job.gpus * job.nodes <= quota

    def key(self, project: str) -> float:
        """The project's dominant share over its weight: who is furthest below its fair share."""
        g = self.gpus.get(project, 0) / self.total_gpus if self.total_gpus else 0.0
        c = self.cpus.get(project, 0.0) / self.total_cpus if self.total_cpus else 0.0
        return max(g, c) / self.fair.share(project).weight

    def order(self, pending: list[Pending]) -> Iterator[Pending]:
        """Class by class; inside one, the project with the smallest :meth:`key` next (keys move
        as the caller :meth:`add`s placements between two yields), then submit order."""
        classes: dict[int, dict[str, list[Pending]]] = {}
        for p in sorted(pending, key=_place, reverse=True):  # each list pops from its end
            classes.setdefault(RANK.get(p.priority, 1), {}).setdefault(p.project, []).append(p)
        for rank in sorted(classes):
            groups = classes[rank]
            heap = [(self.key(project), _place(jobs[-1]), project) for project, jobs in groups.items()]
            heapq.heapify(heap)
            while heap:
                key, _, project = heap[0]
                jobs = groups[project]
                self.changed = False
                yield jobs.pop()
                if jobs:  # its key moves only when the caller placed the job
                    heapq.heapreplace(heap, (self.key(project) if self.changed else key, _place(jobs[-1]), project))
                else:
                    heapq.heappop(heap)


def _slot_key(gpu_id: str) -> tuple[int, str]:
    return (int(gpu_id), "") if gpu_id.isdigit() else (1 << 30, gpu_id)


def _rebucket(buckets: list[dict[str, _Node]], slot: _Node, old_free: int) -> None:
    buckets[old_free].pop(slot.name, None)
    if slot.reserved_for is None:
        buckets[len(slot.free)][slot.name] = slot


def _fit(job: Pending, buckets: list[dict[str, _Node]], max_gpus: int) -> list[_Node] | None:
    """Best fit; degraded nodes and the nodes the job failed on (infra) only when nothing else fits."""
    chosen: list[_Node] = []
    last: list[_Node] = []
    for k in range(job.gpus, max_gpus + 1):
        for slot in buckets[k].values():
            if slot.cpus + 1e-9 >= job.cpus and (slot.memory >= job.memory or job.memory == 0):
                if slot.degraded or slot.name in job.avoid:
                    last.append(slot)
                    continue
                chosen.append(slot)
                if len(chosen) == job.nodes:
                    return chosen
    for slot in last:  # best fit among them too: they were met in the same order
        chosen.append(slot)
        if len(chosen) == job.nodes:
            return chosen
    return None


def _preempt(job: Pending, state: dict[str, _Node], buckets: list[dict[str, _Node]], out: Decisions) -> bool:
    """Plan the fewest best-effort victims (youngest first) that let ``job`` fit."""
    options: list[tuple[int, str, list[Running], list[Running]]] = []
    for slot in state.values():
        if slot.reserved_for is not None:
            continue
        gpus, cpus, memory = len(slot.free), slot.cpus, slot.memory
        taken_stopping: list[Running] = []
        taken_victims: list[Running] = []
        for att in [*slot.stopping, *slot.victims]:
            if gpus >= job.gpus and cpus + 1e-9 >= job.cpus and memory >= job.memory:
                break
            members = _members_on(att, slot.name)
            gpus += sum(len(ids) for n, ids in att.alloc if n == slot.name)
            cpus += att.cpus * members
            memory += att.memory * members
            (taken_stopping if att.stopping else taken_victims).append(att)
        if gpus >= job.gpus and cpus + 1e-9 >= job.cpus and memory >= job.memory:
            options.append((len(taken_victims), slot.name, taken_stopping, taken_victims))
    if len(options) < job.nodes:
        return False
    options.sort(key=lambda o: (o[0], o[1]))
    for _, name, taken_stopping, taken_victims in options[: job.nodes]:
        # Claim exactly what the job needs on this node: the free slots it will use and the
        # attempts being stopped for it. What is left stays available to later jobs.
        slot = state[name]
        freed = [*taken_stopping, *taken_victims]
        use_free = max(0, job.gpus - sum(len(ids) for att in freed for n, ids in att.alloc if n == name))
        old_free = len(slot.free)
        slot.free = slot.free[use_free:]
        _rebucket(buckets, slot, old_free)
        slot.cpus += sum(a.cpus * _members_on(a, name) for a in freed) - job.cpus
        slot.memory += sum(a.memory * _members_on(a, name) for a in freed) - job.memory
        for att in taken_stopping:
            slot.stopping.remove(att)
        for att in taken_victims:
            slot.victims.remove(att)
            out.preemptions.append(Preemption(att.job_id, att.attempt, job.job_id))
    return True


def _reserve(job: Pending, state: dict[str, _Node], buckets: list[dict[str, _Node]], out: Decisions) -> bool:
    """Hold the node closest to fitting a job that has waited too long; False when none is left.

    Without runtime estimates any running attempt may end first, so "closest" is the
    node with the most free GPUs among those big enough.
    """
    best: _Node | None = None
    for slot in state.values():
        if slot.reserved_for is None and slot.total >= job.gpus:
            if best is None or len(slot.free) > len(best.free):
                best = slot
    if best is None:
        return False
    _hold(best, job.job_id, buckets, out)
    return True


def _hold(slot: _Node, job_id: int, buckets: list[dict[str, _Node]], out: Decisions) -> None:
    buckets[len(slot.free)].pop(slot.name, None)
    slot.reserved_for = job_id
    out.reserved[slot.name] = job_id
