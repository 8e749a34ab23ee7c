"""A fast in-process discrete-event driver for whole-fleet studies (bench/bench_sim_week.py).

The same models as the ``sim`` backend (:mod:`~autoresearch.sim.fleet`, the seeded fault
schedule, :func:`~autoresearch.sim.timeline.live` for each attempt), the pure scheduler
(:func:`autoresearch.engine.scheduler.schedule`: placement, backfill, preemption of best-effort
work, with the runtime's inputs: fair share, group caps, each node's and job's cores and memory) and the pure health policy (:func:`autoresearch.health.policy.node_state` and
``failure_class``) for cordons, without a ledger or processes: a week of 512 GPUs in seconds.

What a pass of the real runtime does, it does every ``pass_s`` of simulated time when
something changed: endings (classified as the runtime does: a fault of the machine is
``infra``, retried up to ``max_retries``; a preemption requeues without using a retry),
then, with ``cordon=True``, the health checks (a GPU's Xid or an NCCL timeout seen in the
log, throttling seen by NVML, infra failures of ``cordon_after`` jobs within the window;
a preflight before each placement; a health cordon lifts once the node is fixed and passes
preflight), then placement. With ``cordon=False`` nothing is cordoned or marked degraded:
a node with a failed GPU keeps taking work until someone notices (``unattended_repair``).
"""

from __future__ import annotations

import bisect
import heapq
import math
from dataclasses import dataclass, field

from autoresearch.engine import scheduler as S
from autoresearch.health import policy as P
from autoresearch.health.config import HealthConfig
from autoresearch.health.findings import Finding, blocking, check_sample
from autoresearch.sim.faults import Schedule
from autoresearch.sim.fleet import Fleet
from autoresearch.sim.timeline import Ending, Life, Record, live
from autoresearch.util.decay import Decayed

# What misbehaving jobs print (``Job.behaviour``): a benign line that mentions a fault, and an NCCL
# failure line in PyTorch's format (the job's word: infra-suspect at most).
SPOOF_LINE = "checking dmesg for Xid 79 ... none found"
NCCL_LINE = ("RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, unhandled "
             "system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.19.3")

FAULT_CAUSES = ("node_loss", "xid", "nccl_hang")
SHAPE_CAP = 32
RESERVE_AFTER_S = 300.0  # a queued job that waited this long reserves a node (the runtime's default)
QUIET_AHEAD_S = 6 * 3600.0  # how far ahead the monitor looks for a clean node's next fault (0: it does not)


@dataclass(slots=True)
class Job:
    id: int
    priority: str  # critical | normal | best-effort
    gpus: int  # per node
    nodes: int
    seconds: tuple[float, ...]  # per step at speed 1
    submit_t: float
    checkpoint_steps: int = 0
    kind: str = ""  # gang | sweep | soak: for the tables
    max_retries: int = 2
    project: str = ""
    cpus: float = 0.0  # per member, as a spec's cpus (0: none asked)
    memory: int = 0  # MB per member
    group: str = ""  # a capped group (a research loop's trials): at most ``group_caps[group]`` run at once
    behaviour: str = ""  # "" | spoof (prints SPOOF_LINE, succeeds) | nccl_fail (prints NCCL_LINE, exits 1) | selfkill
    # state
    state: str = "pending"  # pending (not submitted yet) | queued | running | succeeded | failed
    queued_since: float = 0.0
    first_start: float | None = None
    done_steps: int = 0  # kept by the last checkpoint
    retries: int = 0
    attempts: int = 0
    avoid: set[str] = field(default_factory=set)
    # the scheduler's view of it, and what it was made for: (queued_since, nodes avoided, waited past
    # reserve_after_s): the pass only compares waited_s with that, so the view lasts until one changes
    view: S.Pending | None = None
    view_key: tuple[float, int, bool] = (0.0, 0, False)


@dataclass(slots=True)
class _Attempt:
    job: Job
    n: int
    rec: Record
    life: Life
    alloc: tuple[tuple[str, tuple[str, ...]], ...]
    stopping: bool = False
    view: S.Running | None = None  # what the last pass handed the scheduler
    view_for: tuple[float, float] = (0.0, -1.0)  # the times it holds for: from its last checkpoint to the next
    due: float = math.inf  # the end of view_for last put on the driver's heap of views to make again


@dataclass(slots=True)
class Stats:
    capacity_gpu_s: float = 0.0
    busy_gpu_s: float = 0.0
    useful_gpu_s: float = 0.0
    lost_fault_gpu_s: float = 0.0
    lost_preempt_gpu_s: float = 0.0
    attempts: int = 0
    faults_hit: dict[str, int] = field(default_factory=dict)  # attempt endings by fault
    jobs_done: int = 0
    jobs_failed: int = 0
    cordons: int = 0
    false_cordons: int = 0  # of a node that had no fault at the time
    false_cordon_gpu_s: float = 0.0  # GPU-seconds healthy nodes stood cordoned
    faults_caught: int = 0  # cordons of a node with a fault
    catch_s: list[float] = field(default_factory=list)  # per caught fault: its Xid to its cordon (s)
    passes: int = 0
    waits: dict[str, list[float]] = field(default_factory=dict)  # priority -> submit-to-first-start (s)
    project_gpu_s: dict[str, float] = field(default_factory=dict)  # GPU-seconds each project's attempts held

    @property
    def goodput(self) -> float:
        return self.useful_gpu_s / self.capacity_gpu_s if self.capacity_gpu_s else 0.0


def _throttle(f: Finding) -> bool:
    return f.cls == "throttle" and f.severity != "hard" and f.source not in ("ending", "verdict")


def _latest_throttle(found: list[Finding]) -> list[Finding]:
    """``found`` less the throttling findings older than the latest one's: the health policy asks of them
    only whether one lies within ``degraded_for`` and which is the latest (the first of the latest, in
    order), so its answer is the same; a node that throttled for hours kept ~16 findings a poll to read."""
    top = max((f.ts for f in found if _throttle(f)), default=None)
    if top is None:
        return found
    return [f for f in found if f.ts == top or not _throttle(f)]


def _inert(f: Finding, cleared_at: float, since: float) -> bool:
    """Whether ``f`` weighs in no answer of the health policy (:func:`~autoresearch.health.policy.node_state`,
    the fleet's differential) at ``since + cordon_window`` or later: not throttling (nor an NVML error), not
    a hard fault of the machine since the node's last clearing, not an ending or a verdict within the
    window (``since`` on: the windows only move on)."""
    if f.cls == "throttle" or (f.signature == "nvml_error" and f.machine_fault):
        return False
    if f.severity == "hard" and f.machine_fault and f.ts > cleared_at:
        return False
    return not (f.source in ("ending", "verdict") and f.ts >= since)


class Driver:
    # the monitor's shortcuts (a node that reads clean left alone until its next fault, a steady throttling
    # read noted by its time): the same decisions as reading every node each round (False: tests compare)
    shortcuts = True

    def __init__(self, fleet: Fleet, jobs: list[Job], horizon_s: float, cordon: bool = True,
                 health: HealthConfig | None = None, pass_s: float = 30.0, grace_s: float = 30.0,
                 policy: str = "owner", fair: S.FairShare | None = None,
                 group_caps: dict[str, int] | None = None, max_starts: int | None = S.MAX_STARTS) -> None:
        self.fleet = fleet
        self.max_starts = max_starts  # jobs one pass starts before the next (the scheduler's, as the runtime's)
        self.schedule_ = Schedule(fleet)
        self.scheduler = S.Scheduler()  # the runtime's scheduler, its node records kept between passes
        self.jobs = {j.id: j for j in jobs}
        self.horizon = horizon_s
        self.cordon = cordon
        self.fair = fair  # fair share between projects (the runtime's scheduler: section), None: off
        # a project has a guarantee: a pass may reclaim it from borrowers' normal attempts (their checkpoints weigh)
        self._reclaims = fair is not None and any(share.guaranteed > 0 for share in fair.projects.values())
        # past usage decayed with the fair share's half-life (the ledger's accumulator in the runtime)
        self.past = Decayed(fair.half_life) if fair is not None else None
        self.group_caps = dict(group_caps or {})  # per group, how many of its jobs may run at once
        self.group_running: dict[str, int] = {}
        self.policy = policy  # owner: evidence has an owner (today's code) | trusting: job output decides (as before)
        self.successes: list[tuple[float, tuple[str, ...], int, str]] = []  # (t, nodes, job, project)
        self.false_since: dict[str, float] = {}
        self.health = health or HealthConfig(uncordon="preflight")
        self.pass_s = pass_s
        self.grace = grace_s
        self.types = dict(fleet.nodes())
        self._rank = {name: i for i, name in enumerate(self.types)}  # the fleet's order of its nodes
        self.gpu_ids = {name: tuple(str(g) for g in range(kind.gpus)) for name, kind in self.types.items()}
        self.status = {name: P.NodeStatus("healthy") for name in self.types}
        self._unhealthy: set[str] = set()  # the nodes whose status is not healthy (kept by _set_status)
        # per job, the nodes its endings' verdicts were filed on (the only nodes with its "ending" findings)
        self._verdict_nodes: dict[int, set[str]] = {}
        self._busy: dict[str, int] = {}  # per node, the live attempts with a member there
        self._node_states = {name: self._node_state(name) for name in self.types}
        self._abnormal: set[str] = set()  # nodes last seen down, cordoned or degraded
        self.findings: dict[str, list[Finding]] = {name: [] for name in self.types}
        # the monitor's shortcuts (_monitor): per node, the time before which it reads clean (no Xid, no
        # throttling), and (status, the poll's findings unstamped, the latest poll's time) of a node
        # that throttles steadily under load, whose findings are stamped when read (_found)
        self._quiet: dict[str, float] = {}
        self._steady: dict[str, tuple[P.NodeStatus, tuple[Finding, ...], float]] = {}
        # (status, the time of its throttling findings) of a degraded node that reads clean, whose review can
        # change nothing until those findings leave degraded_for (_fade)
        self._fading: dict[str, tuple[P.NodeStatus, float]] = {}
        # (node, failed GPU, throttling, busy) -> check_sample's findings of that sample, stamped 0 (_nvml)
        self._checked: dict[tuple[str, int | None, bool, bool], tuple[Finding, ...]] = {}
        self.cordon_log: list[tuple[str, float]] = []  # what the backend's cordon hook records
        self.running: dict[int, _Attempt] = {}  # job id -> its live attempt
        self.queues: dict[tuple[str, int, int, str, float, int, str], list[int]] = {}  # per shape, the queued jobs' ids in order
        # The scheduler's inputs, kept between passes (docs/scheduling.md, "The simulated fleet's driver"):
        # the views of the queued jobs it sees (the first SHAPE_CAP of each shape) and of the live attempts,
        # changed on submit, start, end and stop; ``_stale`` (job ids) and the heaps say which to make again
        # at the next pass: a queued job whose wait reaches RESERVE_AFTER_S (by the time it was queued), an
        # attempt whose next checkpoint has passed (by that time).
        self._visible: list[int] = []  # the ids of the queued jobs it sees, in order
        self._queue_list: list[S.Pending | None] = []  # their views, in the same order (None: to make at the next pass)
        self._unmade: set[int] = set()  # the ids of those whose view is None
        self._running_list: list[S.Running] | None = []  # the same of the attempts' views
        self._waits: list[tuple[float, int]] = []  # (queued since, job id) of each enqueue
        self._views: dict[int, S.Running | None] = {}  # job id -> its live attempt's view, in self.running's order
        self._marks: list[tuple[float, int, int]] = []  # (an attempt's next checkpoint, job id, attempt n)
        self._stale: set[int] = set()  # job ids of attempts whose view to make again (stopping now)
        self.events: list[tuple[float, int, int, int]] = []  # (t, seq, job id, attempt n): an ending
        self.seq = 0
        self.stats = Stats(capacity_gpu_s=fleet.total_gpus * horizon_s)
        self.arrivals = sorted(jobs, key=lambda j: (j.submit_t, j.id))

    # -- the loop ---------------------------------------------------------------------------

    def run(self) -> Stats:
        t = 0.0
        arrival = 0
        dirty = True
        last_poll = -1e18
        while t <= self.horizon:
            while arrival < len(self.arrivals) and self.arrivals[arrival].submit_t <= t:
                job = self.arrivals[arrival]
                self.enqueue(job, job.submit_t)
                arrival += 1
                dirty = True
            while self.events and self.events[0][0] <= t:
                _, _, job_id, n = heapq.heappop(self.events)
                att = self.running.get(job_id)
                if att is not None and att.n == n:
                    self._end(att)
                    dirty = True
            if self.cordon and t - last_poll >= self.health.poll_interval_s:
                dirty |= self._monitor(t)
                last_poll = t
            if dirty:
                self._pass(t)
                dirty = False
            nxt = [self.horizon + 1]
            if self.events:
                nxt.append(self.events[0][0])
            if arrival < len(self.arrivals):
                nxt.append(self.arrivals[arrival].submit_t)
            if self.cordon:
                nxt.append(last_poll + self.health.poll_interval_s)
            # passes come at most every pass_s, as the runtime's do when endings pile up
            t = max(min(nxt), t + self.pass_s) if min(nxt) > t else t + self.pass_s
        for node in list(self._steady):  # the findings as the polls left them
            self._found(node)
        for att in list(self.running.values()):  # still running at the horizon: its work so far counts
            used = self.horizon - att.rec.t0
            gpus = att.rec.gpus
            self.stats.busy_gpu_s += gpus * used
            self._held(att.job.project, gpus * used)
            self.stats.useful_gpu_s += gpus * used
        for job in self.jobs.values():
            if job.state in ("queued", "running") and job.first_start is None and job.submit_t <= self.horizon:
                self.stats.waits.setdefault(job.priority, []).append(self.horizon - job.submit_t)  # still waiting
        return self.stats

    # -- a pass -----------------------------------------------------------------------------

    def _pass(self, t: float, rounds: int = 3, more: int = 64) -> None:
        """A pass of the runtime's (:meth:`Runtime.schedule`): one that stopped at ``max_starts`` is followed by
        another at once (up to ``more``), one whose placements preflight turned away by another (``rounds``)."""
        self.stats.passes += 1
        if not self._visible:
            return
        nodes = self._nodes(t)
        pending = self._queue_views(t)
        running = self._running_views(t)
        past = None if self.past is None else self.past.now(t)
        decisions = self.scheduler.schedule(pending, nodes, running, now=t, fair=self.fair, reserve_after_s=RESERVE_AFTER_S,
                               room=self._room() if self.group_caps else None, past=past,
                               max_starts=self.max_starts)
        for pre in decisions.preemptions:
            att = self.running.get(pre.job_id)
            if att is not None and not att.stopping:
                att.stopping = True
                att.life = live(att.rec, self.schedule_, self.cordon_log, (t, self.grace), output=False)
                self._due(att)
                self._stale.add(att.job.id)
        blocked = False
        for placement in decisions.placements:
            if self.cordon and self._preflight(placement, t):
                blocked = True  # the job stays queued; its node is cordoned now
                continue
            self._launch(self.jobs[placement.job_id], placement.alloc, t)
        if decisions.capped and more > 0:
            self._pass(t, rounds - 1 if blocked else rounds, more - 1)  # the rest of the queue, now
        elif blocked and rounds > 1:
            self._pass(t, rounds - 1)  # place what preflight turned away on other nodes, as the runtime does

    def _nodes(self, t: float) -> list[S.NodeState]:
        """The fleet as the scheduler sees it at ``t``. Only nodes that are or were lately not plain healthy
        (a node loss in reach, a health state, last pass's answer) are worked out again: O(such nodes); a
        node's record is a new object only when it changed."""
        f = self.fleet.faults
        look = self.schedule_.touched(t - f.repair - 1.0, t, "node_loss") | self._abnormal | self._unhealthy
        for name in look:
            down = self.schedule_.down(name, t) is not None
            state = self.status[name].state
            schedulable, degraded = not down and state not in ("cordoned", "down"), state == "degraded"
            node = self._node_states[name]
            if node.schedulable != schedulable or node.degraded != degraded:  # (else the same object: the
                # scheduler then sees at once that the node did not change)
                node = self._node_states[name] = self._node_state(name, schedulable, degraded)
            if node.schedulable and not node.degraded:
                self._abnormal.discard(name)
            else:
                self._abnormal.add(name)
        return list(self._node_states.values())

    def _node_state(self, name: str, schedulable: bool = True, degraded: bool = False) -> S.NodeState:
        kind = self.types[name]
        return S.NodeState(name, self.gpu_ids[name], kind.cpus, kind.memory, schedulable, degraded)

    def _room(self) -> dict[str, int]:
        """Per capped group, how many more of its jobs may start (the runtime's ``jobs.group_room``)."""
        return {g: cap - self.group_running.get(g, 0) for g, cap in self.group_caps.items()}

    @staticmethod
    def _pending(job: Job, t: float) -> S.Pending:
        """The scheduler's view of a queued job at ``t`` (made again only when it was queued again, it has
        a node more to avoid, or it has now waited ``RESERVE_AFTER_S``: its ``waited_s`` is only compared
        with that, so the view's may be older than ``t``)."""
        waited = t - job.queued_since
        key = (job.queued_since, len(job.avoid), waited >= RESERVE_AFTER_S)
        if job.view is None or job.view_key != key:
            job.view = S.Pending(job.id, job.priority, job.gpus, job.nodes, job.cpus, job.memory, waited_s=waited,
                                 avoid=frozenset(job.avoid), project=job.project, group=job.group)
            job.view_key = key
        return job.view

    def _view(self, att: _Attempt, t: float) -> S.Running:
        """The scheduler's view of an attempt at ``t``, with its last checkpoint by then (made again only
        when that or its stopping changed; the checkpoint looked up only when ``t`` is past the next one).
        The checkpoint weighs only in the price of stopping an attempt that a pass may stop: a best-effort
        one (preemption), and a normal one when some project has a guarantee (a reclaim stops borrowers'
        normal attempts, priced by the work they lose). The view of any other attempt, or of one stopping
        already, leaves it out (None), so that it does not change with every checkpoint (a changed view is
        a changed node for the scheduler's kept records); tests/properties/test_scheduler_saved_at.py
        holds the scheduler to that."""
        view = att.view
        if view is not None and att.view_for[0] <= t < att.view_for[1] and view.stopping == att.stopping:
            return view
        if att.stopping or not (att.job.priority == "best-effort"
                                or (att.job.priority == "normal" and self._reclaims)):
            att.view_for = (-math.inf, math.inf)
            if view is None or view.saved_at is not None or view.stopping != att.stopping:
                att.view = view = S.Running(att.job.id, att.n, att.job.priority, att.alloc, att.rec.t0, att.job.cpus,
                                            att.job.memory, stopping=att.stopping, project=att.job.project)
            return view
        marks = att.life.checkpoints
        i = bisect.bisect_right(marks, (t, 1 << 62))
        saved = marks[i - 1][0] if i else None
        att.view_for = (marks[i - 1][0] if i else -math.inf, marks[i][0] if i < len(marks) else math.inf)
        if view is None or view.saved_at != saved or view.stopping != att.stopping:
            att.view = view = S.Running(att.job.id, att.n, att.job.priority, att.alloc, att.rec.t0, att.job.cpus,
                                        att.job.memory, stopping=att.stopping, project=att.job.project,
                                        saved_at=saved)
        return view

    def _held(self, project: str, gpu_s: float) -> None:
        self.stats.project_gpu_s[project] = self.stats.project_gpu_s.get(project, 0.0) + gpu_s

    def enqueue(self, job: Job, t: float) -> None:
        """``job`` waits for a pass from ``t`` on (submitted, preempted or retried)."""
        job.state, job.queued_since = "queued", t
        ids = self.queues.setdefault(self._shape(job), [])
        i = bisect.bisect_left(ids, job.id)
        ids.insert(i, job.id)
        if i < SHAPE_CAP:  # the scheduler sees it now; the one it pushes past SHAPE_CAP, no more
            self._show(job.id)
            if len(ids) > SHAPE_CAP:
                self._hide(ids[SHAPE_CAP])
        heapq.heappush(self._waits, (t, job.id))

    def _unqueue(self, job: Job) -> None:
        """``job`` leaves its queue (it starts): the next of its shape comes into the scheduler's view."""
        ids = self.queues.get(self._shape(job), [])
        i = bisect.bisect_left(ids, job.id)
        if i < len(ids) and ids[i] == job.id:
            del ids[i]
            if i < SHAPE_CAP:
                self._hide(job.id)
                if len(ids) >= SHAPE_CAP:
                    self._show(ids[SHAPE_CAP - 1])

    def _show(self, job_id: int) -> None:
        i = bisect.bisect_left(self._visible, job_id)
        self._visible.insert(i, job_id)
        self._queue_list.insert(i, None)
        self._unmade.add(job_id)

    def _hide(self, job_id: int) -> None:
        i = bisect.bisect_left(self._visible, job_id)
        del self._visible[i], self._queue_list[i]
        self._unmade.discard(job_id)

    def _shape(self, job: Job) -> tuple[str, int, int, str, float, int, str]:
        return (job.priority, job.gpus, job.nodes, job.project if self.fair is not None else "", job.cpus, job.memory,
                job.group)

    def _queue_views(self, t: float) -> list[S.Pending]:
        """The queue as the scheduler sees it: at most ``SHAPE_CAP`` jobs of one class and shape (and project,
        with fair share on), the first in submit order (the rest have the same shape, so the same answer this
        pass; they move up as those start), in id order. Kept between passes: O(views made again)."""
        visible, views, waits = self._visible, self._queue_list, self._waits
        while waits and t - waits[0][0] >= RESERVE_AFTER_S:  # (the test _pending makes: the same floats)
            since, job_id = heapq.heappop(waits)
            i = bisect.bisect_left(visible, job_id)
            if i < len(visible) and visible[i] == job_id and self.jobs[job_id].queued_since == since:
                views[i] = None  # its view says it waited past RESERVE_AFTER_S now
                self._unmade.add(job_id)
        for job_id in self._unmade:
            i = bisect.bisect_left(visible, job_id)
            views[i] = self._pending(self.jobs[job_id], t)
        self._unmade.clear()
        return list(views)  # type: ignore[arg-type]  # (every None made above)

    def _running_views(self, t: float) -> list[S.Running]:
        """The live attempts as the scheduler sees them at ``t``, in the order they started; a view is made
        again only when the attempt started, was stopped, or passed its next checkpoint (the heap)."""
        views, marks = self._views, self._marks
        while marks and marks[0][0] <= t:
            _, job_id, n = heapq.heappop(marks)
            att = self.running.get(job_id)
            if att is not None and att.n == n:
                self._stale.add(job_id)
        for job_id in self._stale:
            att = self.running.get(job_id)
            if att is not None:
                view = self._view(att, t)
                if views[job_id] is not view:
                    views[job_id] = view
                    self._running_list = None
                if att.view_for[1] != att.due and att.view_for[1] < math.inf:
                    att.due = att.view_for[1]
                    heapq.heappush(marks, (att.due, job_id, att.n))
        self._stale.clear()
        if self._running_list is None:
            self._running_list = list(views.values())  # type: ignore[arg-type]  # (every None made above)
        return self._running_list

    def _launch(self, job: Job, alloc: tuple[tuple[str, tuple[str, ...]], ...], t: float) -> None:
        self._unqueue(job)
        job.attempts += 1
        job.state = "running"
        if job.first_start is None:
            job.first_start = t
            self.stats.waits.setdefault(job.priority, []).append(t - job.submit_t)
        members = tuple(n for n, _ in alloc)
        rec = Record(f"{job.id}.{job.attempts}", t, members, job.gpus * job.nodes,
                     min(self.types[n].speed for n in members), None, self.grace, job.done_steps, job.seconds,
                     (), "loss", job.checkpoint_steps)
        life = live(rec, self.schedule_, self.cordon_log, output=False)
        if job.behaviour in ("nccl_fail", "selfkill") and life.ending is not None:
            at = t + 0.3 * sum(job.seconds[job.done_steps:]) / rec.speed
            if at < life.ending.t and life.ending.cause == "done":
                life.ending = (Ending(at, exit_code=1, detail="exited 1", cause="nccl_fail") if job.behaviour == "nccl_fail"
                               else Ending(at, signal=9, detail="killed by SIGKILL that autoresearch did not send",
                                           cause="selfkill"))
        att = _Attempt(job, job.attempts, rec, life, alloc)
        if job.behaviour == "spoof" and self.cordon:
            self._log_lines(att, [SPOOF_LINE], t)
        self.running[job.id] = att
        self._views[job.id] = None
        self._running_list = None
        self._stale.add(job.id)
        if self.past is not None:
            self.past.started(job.project, att.rec.gpus, att.rec.t0)
        for node in members:
            self._busy[node] = self._busy.get(node, 0) + 1
        if job.group:
            self.group_running[job.group] = self.group_running.get(job.group, 0) + 1
        self.stats.attempts += 1
        self._due(att)

    def _due(self, att: _Attempt) -> None:
        assert att.life.ending is not None  # a trial's life always ends
        self.seq += 1
        heapq.heappush(self.events, (att.life.ending.t, self.seq, att.job.id, att.n))

    def _end(self, att: _Attempt) -> None:
        job, end = att.job, att.life.ending
        assert end is not None
        del self.running[job.id]
        del self._views[job.id]
        self._stale.discard(job.id)
        self._running_list = None
        for node in att.rec.nodes:
            if self._busy[node] == 1:
                del self._busy[node]
            else:
                self._busy[node] -= 1
        if job.group:
            self.group_running[job.group] -= 1
        gpus = att.rec.gpus
        used = end.t - att.rec.t0
        self.stats.busy_gpu_s += gpus * used
        self._held(job.project, gpus * used)
        if self.past is not None:
            self.past.ended(job.project, gpus, att.rec.t0, end.t)
        kept = att.life.checkpoint_at(end.t, att.rec.resume) if end.cause != "done" else len(job.seconds)
        useful = sum(job.seconds[att.rec.resume:kept]) / att.rec.speed if kept > att.rec.resume else 0.0
        useful = min(useful, used)
        self.stats.useful_gpu_s += gpus * useful
        job.done_steps = kept
        if end.cause == "done":
            job.state = "succeeded"
            self.stats.jobs_done += 1
            self.successes.append((end.t, att.rec.nodes, job.id, job.project))
            return
        if end.cause == "stop":
            self.stats.lost_preempt_gpu_s += gpus * (used - useful)
            self.enqueue(job, end.t)
            return
        self.stats.lost_fault_gpu_s += gpus * (used - useful)
        self.stats.faults_hit[end.cause] = self.stats.faults_hit.get(end.cause, 0) + 1
        found = self._ending_findings(att, end.cause, end.t)
        if end.cause == "nccl_fail":
            found += self._log_lines(att, [NCCL_LINE], end.t)
        reason = "infra" if end.state == "lost" or end.signal == 9 else "exit"
        classified = P.failure_class(reason, end.exit_code, end.detail, found, end.signal)
        if self.policy == "trusting" and classified is not None and end.cause in ("nccl_fail", "selfkill"):
            classified = P.Classified("infra", end.detail)  # before: NCCL text and outside signals were the machine's
        blamed: tuple[str, ...] = ()
        if self.cordon and classified is not None:  # the runtime's attribution (Health.on_ending's)
            settled = P.attribute(classified, att.rec.nodes, found, lambda node: self._recheck((node,), end.t))
            classified, blamed = settled.classified, settled.blamed
        if classified is not None and classified.retried:
            job.avoid.update(att.rec.nodes)
            if job.retries < job.max_retries:
                job.retries += 1
                self.enqueue(job, end.t)
            else:
                job.state = "failed"
                self.stats.jobs_failed += 1
        else:
            job.state = "failed"
            self.stats.jobs_failed += 1
        if classified is not None:
            for node in blamed:  # the node the machine's evidence names (member k's of a gang)
                self._verdict_nodes.setdefault(job.id, set()).add(node)
                self._found(node).append(P.verdict(node, classified, f"job {job.id}: {end.cause}", end.t, job.id,
                                                     att.n))
                self._review(node, end.t)

    def _log_lines(self, att: _Attempt, lines: list[str], t: float) -> list[Finding]:
        """What the log signatures (the runtime's own :func:`scan`) make of lines the attempt printed: job-owned
        findings, which decide nothing about a node. ``trusting``: as before, the job's word was the machine's."""
        from autoresearch.health.signatures import scan

        out: list[Finding] = []
        for node in att.rec.nodes[:1]:
            for h in scan(lines, self.health):
                out.append(Finding(node, h.signature, h.cls, h.severity, "log", None, h.line, t, att.job.id, att.n))
            if self.policy == "trusting":  # the old signatures: any "Xid" line was a hard fault of the node
                out += [Finding(node, "xid_79", "infra", "hard", "kernel", None, line, t, att.job.id, att.n)
                        for line in lines if "Xid" in line]
        for f in out:
            self._found(f.node).append(f)
        if any(f.severity == "hard" for f in out):
            self._review(out[0].node, t)
        return out

    def _ending_findings(self, att: _Attempt, cause: str, t: float) -> list[Finding]:
        """What the health checks saw of this attempt: its log's signatures (the lines the backend writes)."""
        out: list[Finding] = []
        for node in att.rec.nodes:  # the ending's last look at every member's node (Health.on_ending)
            if cause == "xid" and self.schedule_.sick(node, t, self.cordon_log) is not None:
                out += self._nvml(node, t, att.job.id, att.n)
        if cause == "nccl_hang":  # the log is the attempt's, recorded with its first member's node
            out.append(Finding(att.rec.nodes[0], "collective_timeout", P.SUSPECT, "soft", "log", None,
                               "Watchdog caught collective operation timeout", t, att.job.id, att.n))
        if self.cordon:
            for f in out:
                self._found(f.node).append(f)
        return out

    # -- health (cordon=True) ---------------------------------------------------------------

    def _nvml(self, node: str, t: float, job_id: int | None = None, n: int | None = None,
              busy: bool = True) -> list[Finding]:
        """What the runtime's own checks (:func:`check_sample`) make of the simulated NVML state of ``node``
        (an idle node does not throttle: no load). A node with no fault reads clean: it is not sampled.
        A node's sample is one of a few (which GPU failed, whether it throttles): the checks' findings of
        each are worked out once and stamped with ``t`` (``check_sample`` reads the time for nothing else)."""
        sick = self.schedule_.sick(node, t, self.cordon_log)
        if sick is None and not busy:
            return []
        hot = self.schedule_.throttling(node, t)
        if sick is None and not hot:
            return []
        key = (node, None if sick is None else sick.gpu, hot, busy)
        made = self._checked.get(key)
        if made is None:
            found = check_sample(node, self.schedule_.sample(node, t, self.cordon_log), self.gpu_ids[node],
                                 self.health, 0.0)
            made = self._checked[key] = tuple(found if busy else [f for f in found if f.cls != "throttle"])
        return [Finding(f.node, f.signature, f.cls, f.severity, f.source, f.gpu, f.excerpt, t, job_id, n)
                for f in made]

    def _recheck(self, nodes: tuple[str, ...], t: float) -> list[Finding]:
        """An infra-suspect ending's re-check of every member's node, uncached: the machine's blocking faults."""
        out: list[Finding] = []
        for node in dict.fromkeys(nodes):
            found = self._nvml(node, t)
            if found:
                self._found(node).extend(found)
                self._review(node, t)
            out += blocking(found)
        return out

    def _review(self, node: str, t: float) -> bool:
        before = self.status[node]
        found = self._found(node)
        if len(found) > 1:  # of throttling (a poll's findings per GPU), the latest poll's are all that count
            found = self.findings[node] = _latest_throttle(found)
        if len(found) > 64:  # what no window counts any more: hard faults always count, endings and verdicts
            # (and the fleet's differential) for cordon_window, the rest (throttling) for degraded_for
            ending, other = t - self.health.cordon_window_s, t - self.health.degraded_for_s
            self.findings[node] = found = [f for f in found if f.severity == "hard" or f.ts >= other or (
                f.ts >= ending and f.source in ("ending", "verdict"))]
        after = P.node_state(before, found, self.health, t, diff=self._differential(node, found, t))
        if after == before:
            return False
        self._set_status(node, after)
        if after.state == "cordoned" and before.state != "cordoned":
            self.stats.cordons += 1
            sick = self.schedule_.sick(node, t, self.cordon_log)
            if sick is None:
                self.stats.false_cordons += 1
                self.false_since[node] = t
            else:
                self.stats.faults_caught += 1
                self.stats.catch_s.append(max(0.0, t - sick.t))
                self.cordon_log.append((node, t))  # the backend's cordon hook: an operator will fix it
        return True

    def _set_status(self, node: str, status: P.NodeStatus) -> None:
        self.status[node] = status
        if status.state == "healthy":
            self._unhealthy.discard(node)
        else:
            self._unhealthy.add(node)

    def _found(self, node: str) -> list[Finding]:
        """``node``'s findings, to read or add to: a node the monitor holds as steadily throttling gets the
        latest poll's findings first (:meth:`_hold`)."""
        self._fading.pop(node, None)
        held = self._steady.pop(node, None)
        if held is not None:
            _, made, t = held
            mine = self.findings[node]
            self.findings[node] = mine[:len(mine) - len(made)] + [
                Finding(f.node, f.signature, f.cls, f.severity, f.source, f.gpu, f.excerpt, t) for f in made]
        return self.findings[node]

    def _hold(self, node: str, found: list[Finding], t: float) -> None:
        """After a poll of a busy node that throttles (no failed GPU): when its findings are that poll's and
        findings that weigh in no answer of the health policy from now on (:func:`_inert`), and it is
        degraded, the next polls that read the same can change nothing but the findings' time (the policy's
        answer on them is the state it is in: degraded, with the first finding's line; a review would drop
        nothing: at most 64 findings, none of them throttling but the poll's), so they note only that time,
        and :meth:`_found` stamps the poll's findings when someone reads or adds to them."""
        mine = self.findings[node]
        status = self.status[node]
        made = self._checked.get((node, None, True, True))  # (what this poll's findings were stamped from)
        k = len(found)
        if (status.state != "degraded" or made is None or k != len(made) or not k <= len(mine) <= 64
                or self.health.cordon_after < 1):
            return
        if any(a is not b for a, b in zip(mine[len(mine) - k:], found, strict=True)):
            return
        since = t - self.health.cordon_window_s
        if all(_inert(f, status.cleared_at, since) for f in mine[:len(mine) - k]):
            self._steady[node] = (status, made, t)

    def _fade(self, node: str, t: float) -> None:
        """After the review of a degraded node that read clean: when its findings are one poll's throttling
        (all of one time) and findings that weigh in no later answer (:func:`_inert`), the policy's answer
        stays the state it is in (degraded, the first of those findings' line) while they lie within
        ``degraded_for``, so the rounds until then need not review it (as long as it reads clean, nothing
        is added to its findings and its state stays)."""
        status = self.status[node]
        mine = self.findings[node]
        if status.state != "degraded" or len(mine) > 64 or self.health.cordon_after < 1:
            return
        since = t - self.health.cordon_window_s
        at = None
        for f in mine:
            if _throttle(f):
                if at is not None and f.ts != at:
                    return
                at = f.ts
            elif not _inert(f, status.cleared_at, since):
                return
        if at is not None:
            self._fading[node] = (status, at)

    def _differential(self, node: str, found: list[Finding], t: float) -> P.Differential | None:
        """The fleet's word on this node's infra-suspect endings (what HealthStore.differential reads)."""
        since = t - self.health.cordon_window_s
        jobs = {f.job_id for f in found if f.source == "ending" and f.job_id is not None and f.ts >= since}
        if not jobs:
            return None
        # the nodes up for work besides this one: the healthy (all but _unhealthy) and the degraded (counted
        # among the few unhealthy), not the whole fleet walked
        status = self.status
        up = len(status) - len(self._unhealthy) + sum(1 for n in self._unhealthy if status[n].state == "degraded")
        others = up - (status[node].state in ("healthy", "degraded"))
        self.successes = [s for s in self.successes if s[0] >= t - 2 * self.health.cordon_window_s]
        projects = {j: self.jobs[j].project for j in jobs}
        wanted = set(projects.values())
        ok_jobs, ok_projects = set(), set()
        for ts, nodes, job_id, project in self.successes:
            if ts >= since and node not in nodes and (job_id in jobs or project in wanted):
                ok_jobs.add(job_id)
                ok_projects.add(project)
        # the same jobs' endings on other nodes: read on the nodes their verdicts went to, not every node's
        elsewhere = {f.job_id for n in sorted({n for j in jobs for n in self._verdict_nodes.get(j, ())})
                     if n != node for f in self.findings[n]
                     if f.source == "ending" and f.job_id in jobs and f.ts >= since}
        return P.Differential(others, frozenset(ok_jobs), frozenset(ok_projects), tuple(sorted(projects.items())),
                              frozenset(j for j in elsewhere if j is not None))

    def _preflight(self, placement: S.Placement, t: float) -> bool:
        """Whether a member's GPUs fail the preflight (a failed GPU reads as an Xid): it is cordoned."""
        blocked = False
        for node, _ in placement.alloc:
            found = blocking(self._nvml(node, t, busy=False))
            if found:
                self._found(node).extend(found)
                self._review(node, t)
                blocked = True
        return blocked

    def _monitor(self, t: float) -> bool:
        """The monitor's round (Health.monitor): every node that is up, busy or idle, read through the
        runtime's checks (a GPU's Xid, throttling under load), and health cordons that can lift (fixed nodes).

        What cannot change is not read again: a healthy node that read clean (no failed GPU, no throttling)
        reads clean until its next Xid or thermal fault (``Schedule.next_of``, looked up ``QUIET_AHEAD_S``
        ahead), so the rounds before it leave it alone; a degraded node whose findings are the last poll's of
        its throttling under load (and findings that weigh in no later answer: :func:`_inert`) reads the same
        at the next poll while it stays busy, hot and without a failed GPU, and the policy's answer on that
        read is the state it is in, so the poll notes only its time (``_hold``); a degraded node that reads
        clean is not reviewed while its throttling still counts and nothing else can weigh (``_fade``)."""
        changed = False
        busy = self._busy
        # Only a node with a fault in reach (lost, a failed GPU not fixed yet, throttling) or a state of its
        # own (cordoned, degraded) can read anything but clean: the rest are not looked at one by one. Each
        # kind's reach is its own (a GPU's Xid until fixed, throttling thermal_for, a loss repair; an NCCL
        # hang reads clean), so a day-long reach of Xids does not bring in every node that throttled that day.
        f, faults = self.fleet.faults, self.schedule_
        look = (faults.touched(t - max(f.unattended_repair, f.repair) - 1.0, t, "xid")
                | faults.touched(t - f.thermal_for - 1.0, t, "thermal") | faults.touched(t - f.repair - 1.0, t, "node_loss")
                | self._unhealthy)
        quiet, steady = self._quiet, self._steady
        for node in sorted(look, key=self._rank.__getitem__):
            status = self.status[node]
            if status.state == "healthy" and self.shortcuts and quiet.get(node, -math.inf) > t:
                continue  # it read clean, and nothing can change that before its next Xid or throttling
            if status.state == "cordoned" and status.by_health:
                fixed = t >= status.since + self.fleet.faults.repair and self.schedule_.sick(
                    node, t, self.cordon_log) is None
                false = node in self.false_since  # nothing to repair: it passes its re-check after the cool-down
                if false:
                    fixed = self.schedule_.sick(node, t, self.cordon_log) is None
                if fixed:
                    after = P.node_state(status, [], self.health, t, preflight_passed_at=t)
                    if after.state == "cordoned" and t >= status.since + self.fleet.faults.repair:
                        after = P.NodeStatus("healthy", "", t, t)  # a person looked (a hard cause waits for one)
                    if after.state == "cordoned":
                        continue
                    self._set_status(node, after)
                    if false:
                        self.stats.false_cordon_gpu_s += len(self.gpu_ids[node]) * (t - self.false_since.pop(node))
                    self._steady.pop(node, None)
                    self.findings[node] = []
                    changed = True
                continue
            if status.state == "cordoned" or self.schedule_.down(node, t) is not None:
                continue
            sick = self.schedule_.sick(node, t, self.cordon_log)
            hot = self.schedule_.throttling(node, t)
            if sick is None and not hot:  # it reads clean, busy or not
                if status.state == "healthy":  # and will until its next Xid or throttling
                    ahead = t + QUIET_AHEAD_S
                    due = self.schedule_.next_of(node, t, ahead, ("xid", "thermal"))
                    quiet[node] = ahead if due is None else due
                    continue
                fading = self._fading.get(node)
                if (self.shortcuts and fading is not None and fading[0] is status
                        and fading[1] >= t - self.health.degraded_for_s):
                    continue  # its throttling still counts: the review would leave it as it is
                changed |= self._review(node, t)
                if self.shortcuts:
                    self._fade(node, t)
                continue
            if sick is None and node in busy and self.shortcuts:
                held = steady.get(node)
                if held is not None and held[0] is status:  # the same throttling read again: only its time moves
                    steady[node] = (status, held[1], t)
                    continue
            found = self._nvml(node, t, busy=node in busy)
            if found:
                self._found(node).extend(found)
                changed |= self._review(node, t)
                if sick is None and node in busy and self.shortcuts:
                    self._hold(node, found, t)
            elif status.state == "degraded":
                changed |= self._review(node, t)
        return changed
