"""The engine: one reconcile + scheduling pass over the ledger and a backend.

Nobody has to keep a terminal open (see docs/DESIGN-NOTES.md): a pass runs

* at the end of every submit and cancel (CLI, MCP, Python API), and on every read
  that can see stale state (``status``, ``list``, ``nodes``) when no other pass is
  running — reads never wait for the lock;
* when an attempt ends: its supervisor pokes the home's pass daemon (autoresearch/engine/passd.py,
  started by submits) or a loop or server that listens, and when nobody listens execs
  ``python -m autoresearch.engine.runtime``, which reconciles that ending and starts whatever can
  start now.

A pass re-places the queue only when something changed since the last placement (see
``_placement_due``): a read with thousands of jobs queued does not re-place them all.

A pass holds an exclusive file lock, so two processes never place the same job,
and every action is written to the ledger before it is taken (write-ahead).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal as _signal
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoresearch.backends import AttemptStatus, Backend, LaunchRequest, NodeInfo, open_backend
from autoresearch.backends._base import DISK_FULL, LOG_DROPPED, OVER_LIMIT
from autoresearch.engine.guard import surviving
from autoresearch.engine.ingest import ingest_attempt, ingest_final_many
from autoresearch.engine.runfolders import leftovers, live_supervisor, recorded_ledger, set_aside
from autoresearch.engine.watcher import Watcher, fifo_name
from autoresearch.errors import AutoresearchError, BackendError, LedgerError, SpecError
from autoresearch.store.jobstore import JobStore, attempt_paths
from autoresearch.store.ledger import Ledger
from autoresearch.util._environ import environ

if TYPE_CHECKING:  # at run time the scheduler is imported in schedule(), once something is queued: an idle read never loads it
    from collections.abc import Collection

    from autoresearch.engine import scheduler as S

ACTIVE = ("starting", "running")
FINAL = ("succeeded", "failed", "cancelled")
PLACED_WIDTH = 96  # the placed.<fifo> record (a change mark and a time: under 60 characters), space-padded
# Per-attempt variables never inherited from the launching process (a trial that submits
# a job of its own must not hand it its own ids, checkpoint dir, GPUs or MLflow run).
_INTERNAL_ENV = ("AUTORESEARCH_JOB_ID", "AUTORESEARCH_ATTEMPT", "AUTORESEARCH_METRICS_FILE", "AUTORESEARCH_METRICS_STDOUT",
                 "AUTORESEARCH_CHECKPOINT_DIR", "AUTORESEARCH_NODE", "CUDA_VISIBLE_DEVICES",
                 "AUTORESEARCH_TRIAL_ID", "AUTORESEARCH_LOOP", "AUTORESEARCH_SEED", "AUTORESEARCH_PARAMS",
                 "AUTORESEARCH_ARRAY_INDEX", "AUTORESEARCH_ARRAY_COUNT",
                 "MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID",
                 "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "NODE_RANK", "LOCAL_RANK",
                 "LOCAL_WORLD_SIZE")  # a gang member's

# Signals a program raises on itself when it crashes (they dump core): its own fault, not
# the node's. SIGKILL (the OOM killer, a node going away) and SIGTERM/SIGINT/SIGHUP
# (someone else) stay infrastructure.
CRASH_SIGNALS = frozenset({_signal.SIGSEGV, _signal.SIGABRT, _signal.SIGBUS, _signal.SIGFPE, _signal.SIGILL,
                           _signal.SIGTRAP, _signal.SIGSYS})


class Runtime:
    """The engine on one backend of a home. A home may hold jobs of several backends (profiles):
    a pass reconciles and places only its own backend's jobs; reads and stops of another's
    job go through that backend (:meth:`for_backend`)."""

    def __init__(self, home: str | os.PathLike[str] | None = None, backend: Backend | str | None = None,
                 options: dict[str, Any] | None = None) -> None:
        """``backend``: an instance, or a profile or kind name (None: AUTORESEARCH_BACKEND, then
        config.yaml's ``default:``, then local) opened with ``options``."""
        self.ledger = Ledger(home)
        self.jobs = JobStore(self.ledger)
        if backend is None or isinstance(backend, str):
            from autoresearch.backends import profiles

            backend = open_backend(backend or profiles.default_name(self.ledger.home), self.ledger.home,
                                   **(options or {}))
        self.backend = backend
        fleet_now = getattr(backend, "now", None)
        if backend.simulated and callable(fleet_now):
            # A simulated fleet's waits (reservations, cool-downs, a stop sent again) run on its clock, and so
            # does every stamp this runtime writes (the waits are measured from them): see docs/sim.md.
            self.ledger.clock = fleet_now
        self._health: Any = None
        self.node_clash: dict[str, str] = {}  # node name -> the other backend that reports it (refresh_nodes)
        self._others: dict[str, Runtime] = {backend.name: self}
        self._running_seen: dict[tuple[Any, ...], S.Running] = {}  # running_view's
        self._weights: dict[str, Any] = {}  # past_usage's, per running attempt
        # the scheduler with its node records kept between this process's passes (the sim driver's too),
        # and the nodes' views as last read (the same row, the same object: the scheduler sees no change)
        self._scheduler: S.Scheduler | None = None
        self._node_views: dict[tuple[Any, ...], S.NodeState] = {}

    def for_backend(self, name: str) -> Runtime:
        """The engine on backend ``name`` (a job's ``backend`` column) sharing this home's ledger."""
        other = self._others.get(name)
        if other is None:
            other = Runtime.__new__(Runtime)
            other.ledger, other.jobs, other._others = self.ledger, self.jobs, self._others
            other.node_clash, other._health, other._running_seen, other._weights = {}, None, {}, {}
            other.backend = open_backend(name, self.ledger.home)  # SpecError when the profile is gone
            self._others[name] = other
        return other

    def tick_all(self, wait: bool = False) -> None:
        """A pass on this backend, then on every other backend with unfinished jobs in this home
        (a read sees them move too). Another backend's failure (gone from config.yaml, engine
        down) never breaks the read; its jobs wait for a pass that can reach it."""
        self.tick(wait=wait)
        for name in self.jobs.busy_backends():
            if name == self.backend.name:
                continue
            try:
                self.for_backend(name).tick(wait=wait)
            except LedgerError:
                raise
            except Exception:  # noqa: BLE001, S112 - a read shows the ledger's rows regardless
                continue

    # -- the pass -----------------------------------------------------------------------

    # A pass told which attempts ended (``only``: a listener's pokes; ``()``: a submit's) polls those and the
    # starting ones, not every running attempt (~60-90 us each on local: 64 running made a submit ~5 ms
    # slower, and the pass daemon paid that per ending). What no poke announces (a supervisor killed
    # -9, an engine's ending nobody hears) is found by a pass that polls them all: the first of each
    # process, then at least every FULL_RECONCILE_S of its passes, and every read's.
    FULL_RECONCILE_S = 1.0
    _full_at = float("-inf")  # (monotonic) this process's last pass that polled every active attempt

    def tick(self, wait: bool = True, nodes: bool | list[Any] = True, only: Collection[tuple[int, int]] | None = None,
             due: bool = False) -> bool:
        """Reconcile, refresh nodes, schedule. False if skipped (another pass is running). ``nodes=False``:
        the caller refreshed the nodes a moment ago (a submit's capacity check): not again; or their rows
        as it read them (:meth:`refresh_nodes`), which the placement then uses unless this pass recorded an
        ending or ran a health check (either may cordon a node). ``only``: the attempts (job id, n) heard
        ending (their supervisors' pokes: a loop's controller, the pass daemon, a server), or ``()`` (a
        submit): the reconcile polls those and the starting ones, not every running attempt (see
        FULL_RECONCILE_S). ``due``: the caller just changed what placement depends on (a submit): place,
        without asking whether anything changed since the last placement (its mark: a file and two reads)."""
        with self.ledger.pass_lock(wait=wait) as locked:
            if not locked:
                return False
            if only is not None and time.monotonic() - self._full_at >= self.FULL_RECONCILE_S:
                only = None  # (see FULL_RECONCILE_S)
            try:
                ended, active = self.reconcile(only)
            except LedgerError:
                if not self.ledger.take_freed():
                    raise
                ended, active = self.reconcile(only)  # the disk was full: once more, in the ledger's reserve
            rows = nodes if isinstance(nodes, list) and not ended else None  # (the caller's, unless stale)
            try:
                if nodes is True:
                    rows = self.refresh_nodes()
            except BackendError:
                return True  # the engine does not answer (slurmctld down): nothing can start; queued jobs wait
            if self.monitor(None if ended else active, rows):
                rows = None  # its checks may have cordoned a node: read them again
            # (an ending recorded changed what placement depends on: no need to ask the mark)
            if due or ended or (self.jobs.any_queued(self.backend.name) and self._placement_due()):
                self.schedule(node_rows=rows, submitted=due)
                self._placement_done()
            return True

    # A pass places queued jobs only when something changed since the last placement (a submit,
    # an ending, a cancel, a node's state: every one writes an event or a node row), or at least
    # every PLACE_EVERY_S (the scheduler's time-based rules: reservations of jobs waiting long):
    # a read with thousands of jobs queued and nothing new does not re-place them all.
    PLACE_EVERY_S = 10.0

    def _placed_file(self) -> Path:
        return self.ledger.home / f"placed.{fifo_name(self.backend.name)}"

    def _placement_due(self) -> bool:
        try:
            text = self._placed_file().read_text()
        except OSError:
            return True
        key, _, at = text.strip().partition("@")
        try:
            fresh = 0 <= self.ledger.clock() - float(at) < self.PLACE_EVERY_S
        except ValueError:
            return True
        return not fresh or key != self.jobs.change_mark(self.backend.name)

    def _placement_done(self) -> None:
        """Remember what this placement saw (we hold the pass lock: no other writer); nothing to
        remember when it placed the whole queue (the next submit changes the mark anyway)."""
        if not self.jobs.any_queued(self.backend.name):
            return
        # Overwritten in place, padded to a fixed width, never truncated: on ext4 a truncate and
        # rewrite costs ~0.4 ms (its data is flushed at close), a write in place ~5 us, and a
        # loop's controller writes it at every pass while trials are queued ahead.
        record = f"{self.jobs.change_mark(self.backend.name)}@{self.ledger.clock()!r}".ljust(PLACED_WIDTH).encode()
        try:
            fd = os.open(self._placed_file(), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                os.pwrite(fd, record, 0)
                if os.fstat(fd).st_size > len(record):  # something longer was there: cut it once
                    os.ftruncate(fd, len(record))
            finally:
                os.close(fd)
        except OSError:
            pass  # the next pass places again

    def reconcile(self, only: Collection[tuple[int, int]] | None = None) -> tuple[bool, list[Any] | None]:
        """Poll every active attempt; record the ones that began running in one transaction and the
        ones that ended in another (a pass after a wake finds dozens: one transaction, not dozens).
        ``only``: read and poll these attempts and the starting ones alone (:meth:`tick`). Whether any
        ended, and every active attempt as read (None after ``only``: it read some)."""
        running: list[tuple[int, int, float]] = []
        ended: list[tuple[Any, AttemptStatus]] = []
        stopping: list[Any] = []  # told to stop (or their job cancelled): sent again if never heard
        noted: list[tuple[int, int, str | None, str | None, str, str | None]] = []  # what the engine says of active ones
        if only is None:
            self._full_at = time.monotonic()
            active = self.jobs.active_attempts(self.backend.name)
        else:  # (not every running attempt with its job's spec: ~0.6 ms at 64 running)
            active = self.jobs.attempts_to_poll(self.backend.name, only)
        for att in active:
            if att["stop_reason"] is not None or att["cancel_requested"]:
                stopping.append(att)
            with surviving(self.ledger, self.backend, "reconcile", att["job_id"], att["n"]):
                status = self._poll_attempt(att)
                if status.ended:
                    ended.append((att, status))
                else:
                    if status.state == "running" and att["state"] == "starting":
                        running.append((att["job_id"], att["n"], status.started_at or self.ledger.clock()))
                    note = engine_note(att, status)
                    if note is not None:
                        noted.append(note)
        if running:
            self.jobs.mark_running_many(running)
        if noted:
            self.jobs.note_engine_many(noted)
        self.finalize_many(ended)
        gone = {(a["job_id"], a["n"]) for a, _ in ended}
        for att in stopping:
            if (att["job_id"], att["n"]) not in gone:
                with surviving(self.ledger, self.backend, "stop", att["job_id"], att["n"]):
                    self._stop_again_if_unheard(att)
        return bool(ended), active if only is None else None

    # A stop is recorded before it is sent (write-ahead). A process killed between the two (a
    # controller's kill -9, an interrupted `cancel`, a pass that preempts) leaves an attempt that
    # was never told: a pass sends the stop again once the attempt outlived its grace by this much.
    STOP_AGAIN_AFTER_S = 30.0

    def _stop_again_if_unheard(self, att: Any) -> None:
        since = self.jobs.last_stop_request(att["job_id"])
        if since is None:
            return
        try:
            grace = float(json.loads(att["spec"]).get("grace") or 0.0)
        except (TypeError, ValueError, AttributeError):
            grace = 0.0
        if self.ledger.clock() - since < grace + self.STOP_AGAIN_AFTER_S:
            return
        self.request_stop(att["job_id"], att["n"], att["stop_reason"] or "cancelled", again=True)

    def _poll_attempt(self, att: Any) -> AttemptStatus:
        status = self.backend.poll(att["external_id"])
        if status.state == "lost":
            try:
                self.backend.stop(att["external_id"], 0)  # end orphans nobody supervises
            except OSError:
                pass  # its run dir was never made (a launch that failed early): nothing to stop
        return status

    @property
    def health(self) -> Any:
        """The health checks (autoresearch/health/), loaded by the first pass that needs them."""
        if self._health is None:
            from autoresearch.health.monitor import Health

            self._health = Health(self.ledger, self.backend)
        return self._health

    def prepare_endings(self) -> None:
        """Load now what recording an attempt's ending needs: the health checks, their log signatures and
        the metric lines' patterns compiled (~35-40 ms of imports and compiles on a 2-core VM), which the
        first ending's pass would otherwise pay between that ending and the next launch. For a long-lived
        caller (a loop's controller, the pass daemon) while its first attempts run. Never raises: the pass
        that needs them then loads them itself, and says what failed."""
        try:
            from autoresearch.engine import metrics
            from autoresearch.health.monitor import warm

            metrics.warm()  # the patterns of its log's metric lines
            warm(self.ledger)
            self.health  # noqa: B018 - loaded for the first ending's classification
        except Exception:  # noqa: BLE001, S110 - a broken health config is reported where it is used
            pass

    def monitor(self, active: list[Any] | None = None, node_rows: list[Any] | None = None) -> bool:
        """The runtime monitor's round (rate-limited per node; most passes find nothing due, and
        then do not even load the health checks: a fresh on-exit process stays light). ``active``: every
        active attempt as this pass read them (None: not read; then only whether one runs on a node that
        is due is asked); ``node_rows``: the backend's nodes as this pass read them (else read here).
        Whether it ran the checks."""
        waiting = self.jobs.any_health_cordon()  # a passing check may lift it (uncordon: preflight)
        idle = self._watches_idle()  # idle nodes are polled too: one that goes bad idle takes no job
        if active is not None and not active and not waiting and not idle:
            return False
        now = self.ledger.clock()
        rows = node_rows if node_rows is not None else self.jobs.nodes(self.backend.name)
        due = {r["name"] for r in rows if (r["poll_due_at"] or 0) <= now}
        idle_due = idle and any(r["name"] in due and r["state"] in ("healthy", "degraded")
                                and r["gpu_ids"] not in (None, "", "[]") for r in rows)
        busy = idle_due or bool(due) and (any(m in due for a in active for m in _member_nodes(a))
                                          if active is not None else self.jobs.any_active_on(self.backend.name, due))
        if waiting or busy:
            self.health.monitor(self.jobs.active_attempts(self.backend.name))  # as they are now
            return True
        return False

    def _watches_idle(self) -> bool:
        """Whether this process reads the backend's nodes' GPUs itself (health.monitor.watches_idle, without
        importing the health checks on a pass that has nothing due)."""
        return (self.backend.name == "local" or getattr(self.backend, "gpu_reader", None) is not None
                or bool(os.environ.get("AUTORESEARCH_NVML_FAKE")))

    def refresh_nodes(self) -> list[Any]:
        """Record the nodes the backend reports now; their rows as recorded (what a pass places onto)."""
        now = self.ledger.clock()
        seen = self.backend.nodes()
        rows, owners = self.jobs.nodes_and_owners(self.backend.name, [n.name for n in seen])
        # Nodes are named once per home: a name another backend reports stays that backend's (no
        # tug of war on every pass); a submit to this one is refused naming the clash (jobs.check_capacity).
        self.node_clash = {node: owner for node, owner in owners.items()
                           if _still_exists(owner, self.ledger.home)}  # a removed profile's node is taken over
        if self.node_clash:
            seen = [n for n in seen if n.name not in self.node_clash]
        known = {r["name"]: (r["gpu_ids"], r["cpus"], r["memory"], r["state"], r["reason"]) for r in rows}
        current = {n.name: (json.dumps(n.gpu_ids), n.cpus, n.memory) for n in seen}
        # An engine that schedules itself (Slurm) owns its nodes' state: a drain there is a cordon here.
        # One we place onto says only what it knows (the sim: a node its faults took down), and our
        # health checks own the rest (a cordon stays ours).
        states = ({n.name: engine_node_state(n) for n in seen} if not self.backend.capabilities.places
                  else {n.name: engine_node_state(n) for n in seen if n.state} or None)

        def same(name: str, sizes: tuple[Any, ...]) -> bool:
            if known[name][:3] != sizes:
                return False
            return known[name][3:] == states[name] if states is not None and name in states else known[name][3] != "down"

        if set(known) == set(current) and all(same(k, v) for k, v in current.items()):
            return rows  # nothing changed: no write on the read path
        self.jobs.save_nodes(self.backend.name, seen, now, states)
        return self.jobs.nodes(self.backend.name)

    def schedule(self, rounds: int = 3, node_rows: list[Any] | None = None,
                 submitted: bool = False, more: int = 64) -> S.Decisions | None:
        """Place what is queued and start it; None when nothing is queued (most passes: an attempt
        ended, a read), which then imports no scheduler. ``node_rows``: the nodes' rows as this pass
        read them (else read here); ``submitted``: the caller just queued a job (a submit): no need to ask.
        A pass that stopped at the scheduler's ``max_starts`` (``capped``) is followed by another at once,
        up to ``more`` of them (each started ``max_starts`` jobs or stopped new victims for them)."""
        now = self.ledger.clock()
        if not submitted and not self.jobs.any_queued(self.backend.name):
            return None
        from autoresearch.engine import scheduler as S

        rows = {r["name"]: r for r in (node_rows if node_rows is not None else self.jobs.nodes(self.backend.name))}
        nodes = self._nodes_view(rows.values())
        running: list[S.Running] | None = None
        fair = _fair_share(self.ledger.home) if self.backend.capabilities.places else None
        # (a GPU-less job might start anywhere: then no need to look at the cluster; a guarantee may
        # preempt normal work: the full cluster's shortcut knows only best-effort victims)
        if self.backend.capabilities.places and not self.jobs.any_gpuless_queued(self.backend.name) \
                and not (fair is not None and any(s.guaranteed for s in fair.projects.values())):
            running = self.running_view()
            if S.nothing_starts(nodes, running, False, self.jobs.any_preemptor_queued(self.backend.name)):
                return S.Decisions()  # a full cluster that no queued job can start on or preempt: not O(queue)
        queued = self.jobs.queued(self.backend.name)
        avoid = self.jobs.infra_failed_nodes([r["id"] for r in queued if r["attempts"]])
        pending = [
            S.Pending(r["id"], r["priority"], r["gpus"], r["nodes"], r["cpus"], r["memory"], now - r["updated_at"],
                      frozenset(avoid.get(r["id"], ())), r["project"], r["job_group"] or "", r["queue_order"])
            for r in queued
        ]
        room = self.jobs.group_room(p.group for p in pending if p.group)  # running caps (a loop's ahead trials)
        if not pending or all(room.get(p.group, 1) <= 0 for p in pending):
            return S.Decisions()  # (every queued job waits for its group: a loop's trials queued ahead)
        if not self.backend.capabilities.places:
            # The engine schedules (Slurm, Ray): hand it, in priority order, what its nodes hold now.
            decisions = S.admit(pending, nodes, [(r["gpus"], r["cpus"]) for r in self.jobs.placed(self.backend.name)],
                                preempts=self.backend.capabilities.preemption, room=room)
        else:
            running = self.running_view() if running is None else running
            if self._scheduler is None:
                self._scheduler = S.Scheduler()
            decisions = self._scheduler.schedule(
                pending, nodes, running, fair=fair, pack_gangs=self.backend.single_host, room=room,
                past=None if fair is None else self.past_usage(fair, running, now), max_starts=S.MAX_STARTS)
        for pre in decisions.preemptions:
            with surviving(self.ledger, self.backend, "preempt", pre.job_id, pre.attempt):
                self.request_stop(pre.job_id, pre.attempt, "preempted", for_job=pre.for_job)
        blocked = False
        cleared = []
        for placement in decisions.placements:
            with surviving(self.ledger, self.backend, "launch", placement.job_id):
                if self.preflight(placement, rows):
                    blocked = True  # the job stays queued, its retries untouched; the node is marked
                    continue
                cleared.append(placement)
        self.launch_many(cleared)
        if decisions.capped and more > 0:  # the rest of the queue: a pass more, now
            return self.schedule(rounds - 1 if blocked else rounds, more=more - 1)
        if blocked and rounds > 1:
            return self.schedule(rounds - 1)  # place what preflight turned away on the other nodes
        return decisions

    def _nodes_view(self, rows: Iterable[Any]) -> list[S.NodeState]:
        """The scheduler's view of the nodes' rows, a node's the same object while its row is the same."""
        from autoresearch.engine import scheduler as S

        seen = self._node_views
        out: list[S.NodeState] = []
        for r in rows:
            key = (r["name"], r["gpu_ids"], r["cpus"], r["memory"], r["state"])
            node = seen.get(key)
            if node is None:
                node = seen[key] = S.NodeState(r["name"], tuple(json.loads(r["gpu_ids"])), r["cpus"], r["memory"],
                                               r["state"] in ("healthy", "degraded"), r["state"] == "degraded")
            out.append(node)
        if len(seen) > 2 * len(out) + 64:  # (states left behind: forget them)
            live = {id(node) for node in out}
            self._node_views = {k: v for k, v in seen.items() if id(v) in live}
        return out

    def past_usage(self, fair: S.FairShare, running: list[S.Running], now: float,
                   fold: bool = True) -> dict[str, float]:
        """Fair share's past usage on this backend: per project, the GPU-seconds of its ended attempts
        (the ledger's decayed accumulator) and of ``running`` so far, decayed with ``fair.half_life`` to
        ``now``. A running attempt's part is g * tau * (1 - 2^((start - now) / h)): its weight
        g * 2^((start - ref) / h) is worked out once per attempt (kept with the attempt's view), so a
        pass adds numbers, one look-up per attempt, no power. ``fold=False``: a read, writing nothing
        (JobStore.share_usage); only the pass folds endings into the ledger's accumulator."""
        half_life = fair.half_life
        past = self.jobs.share_usage(self.backend.name, half_life, now, fold=fold)
        if not running:
            return past
        cache = self._weights
        if cache.get("half_life") != half_life or now - cache["ref"] > 200.0 * half_life:
            cache.clear()  # (a new half-life, or far enough on that the weights would grow too big)
            cache.update(half_life=half_life, ref=now, seen={})
        ref, seen = cache["ref"], cache["seen"]
        gpus: dict[str, float] = {}
        weighed: dict[str, float] = {}
        for att in running:
            got = seen.get(id(att))
            if got is None or got[0] is not att:
                g = sum(len(ids) for _, ids in att.alloc)
                w = g * 2.0 ** max(-1000.0, (att.started_at - ref) / half_life) if att.started_at else 0.0
                got = seen[id(att)] = (att, g if att.started_at else 0, w)  # (holds att: its id stays its own)
            project = att.project
            gpus[project] = gpus.get(project, 0.0) + got[1]
            weighed[project] = weighed.get(project, 0.0) + got[2]
        if len(seen) > 2 * len(running) + 64:  # attempts that ended: forget them
            live = {id(att) for att in running}
            cache["seen"] = {k: v for k, v in seen.items() if k in live}
        tau = half_life / math.log(2)
        factor = 2.0 ** (-(now - ref) / half_life)
        for project, held in gpus.items():
            got_s = tau * (held - factor * weighed[project])
            if got_s > 0:
                past[project] = past.get(project, 0.0) + got_s
        return past

    def running_view(self) -> list[S.Running]:
        """The scheduler's view of this backend's active attempts. Once launched, an attempt's
        placement and its job's size, priority and project do not change; its start time and a stop
        request do. Those are read for every attempt (five numbers a row), the rest only for the
        attempts this process has not seen as they are now (a placement's cost per running attempt
        was a whole row with its job's, and its allocation parsed, every pass). Kept by job id,
        attempt, creation and start time and stop request (the creation time: a home removed and made
        again under a long-lived process numbers its jobs from 1 again)."""
        seen = self._running_seen
        view: list[S.Running] = []
        missing: list[int] = []
        for mark in self.jobs.placed_marks(self.backend.name):
            att = seen.get(mark)
            if att is not None:
                view.append(att)
            else:
                missing.append(mark[0])
        if missing:
            rows = self.jobs.placed(self.backend.name, None if len(missing) > 500 else missing)
            if len(missing) > 500:  # (most of them new: one read of them all, not chunks of ids)
                wanted = set(missing)
                rows = [r for r in rows if r["job_id"] in wanted]
            for row, att in zip(rows, _running(rows), strict=True):
                seen[(row["job_id"], row["n"], row["created_at"], row["started_at"], row["stop_reason"] is not None)] = att
                view.append(att)
        if len(seen) > 2 * len(view) + 256:  # ended attempts (or seen in an earlier state): forget them
            keep = {id(a) for a in view}
            self._running_seen = {k: a for k, a in seen.items() if id(a) in keep}
        return view

    def preflight(self, placement: S.Placement, rows: dict[str, Any]) -> bool:
        """Whether preflight keeps ``placement`` from starting (its GPUs missing or faulty)."""
        if not self.backend.capabilities.places:
            return False
        for node, gpu_ids in placement.alloc:
            if not (gpu_ids and node):
                continue  # nothing to check (Health.preflight's own rule): no config read, no health import
            why = self.health.preflight(node, gpu_ids, rows.get(node))
            if why:
                self.jobs.warn("preflight", placement.job_id, None, f"not started on {node}: {'; '.join(why)}")
                return True
        return False

    # -- actions ------------------------------------------------------------------------

    def launch(self, placement: S.Placement) -> None:
        self.launch_many([placement])

    def launch_many(self, placements: list[S.Placement]) -> None:
        """Record the attempts of ``placements`` in one transaction (write-ahead), then start each."""
        if not placements:
            return
        launches: list[tuple[int, str | None, Any, str, Any, dict[str, Any]]] = []
        ports: list[int | None] = []
        for placement in placements:
            node, gpu_ids = placement.alloc[0] if placement.alloc else (None, ())
            gang = len(placement.alloc) > 1
            # A gang's rendezvous port: free on this host now (member 0's, on local), recorded with the launch.
            ports.append(_free_port() if gang else None)
            launches.append((placement.job_id, node, gpu_ids, self.ledger.job_path(placement.job_id),
                             [[m, list(ids)] for m, ids in placement.alloc] if gang else None,
                             {"members": placement.alloc, "master_port": ports[-1]} if gang else {}))
        batch = getattr(self.backend, "batch", None)  # the local backend's: its zygote's answers read at the end
        with batch() if batch is not None else contextlib.nullcontext():
            for placement, port, begun in zip(placements, ports, self.jobs.begin_attempts(launches), strict=True):
                if begun is not None:
                    with surviving(self.ledger, self.backend, "launch", placement.job_id):
                        self._start(placement, begun[0], begun[1], port)

    def _start(self, placement: S.Placement, job: Any, n: int, port: int | None) -> None:
        """Start attempt ``n`` of ``job`` (its row as it was queued), recorded as ``starting``."""
        job_id = placement.job_id
        job_dir = self.ledger.job_path(job_id)
        node, gpu_ids = placement.alloc[0] if placement.alloc else (None, ())
        gang = len(placement.alloc) > 1
        run_dir, log_path, metrics_path = attempt_paths(job_dir, n)
        in_backend = False  # a SpecError from the backend's start is the job's (refused), not the machine's
        try:  # from here on, whatever fails ends this attempt (retried as infra), not the pass
            spec: dict[str, Any] = json.loads(job["spec"])
            from autoresearch.engine import isolation  # only a launch needs it: reads stay light

            policy = isolation.load(job["isolation"])  # recorded at submit: never the launching process's say
            _prepare_checkpoint(self.ledger.home, job_id, spec)
            env = self._attempt_env(job_id, n, spec, node, gpu_ids, metrics_path, policy, len(placement.alloc), port)
            os.makedirs(job_dir, 0o700, exist_ok=True)
            found = leftovers(run_dir, log_path, metrics_path)  # none on a clean launch (two lstat calls)
            if found:
                self._set_aside(job_id, n, job_dir, run_dir, found)
            request = LaunchRequest(
                key=f"{job_id}.{n}", argv=_argv(spec), env=env, workdir=spec["workdir"], log_path=log_path,
                run_dir=run_dir, node=node, gpu_ids=tuple(gpu_ids), nodes=int(spec.get("nodes", 1)),
                alloc=placement.alloc if gang else (),
                timeout=spec.get("timeout"), grace=float(spec.get("grace", 10.0)),
                on_exit=[sys.executable, "-m", "autoresearch.engine.runtime", "--home", str(self.ledger.home),
                         "--backend", self.backend.name],
                wake_fifo=os.path.join(self.ledger.home, fifo_name(self.backend.name)),
                image=str(spec.get("image") or ""), mounts=dict(spec.get("mounts") or {}),
                gpus=int(spec.get("gpus") or 0), cpus=float(spec.get("cpus") or 0), memory=int(spec.get("memory") or 0),
                priority=str(spec.get("priority") or "normal"), ledger=self.ledger.identity,
                job_env=tuple(spec.get("env") or ()), secret_env=dict(spec.get("secret_env") or {}),
            )
            if not self.backend.capabilities.containers:  # a container backend mounts volumes itself
                _prepare_mounts(spec)
            request = isolation.apply(request, policy, self.ledger, job["project"], spec)
            in_backend = True
            external_id = self.backend.start(request)
        except LedgerError:
            raise
        except Exception as err:
            row = self.jobs.attempt_with_job(job_id, n)
            assert row is not None
            detail = err.render().replace("\n", "; ") if isinstance(err, AutoresearchError) else str(err) or type(err).__name__
            # A backend's SpecError is what the job or its profile asked for (a workdir Ray cannot package):
            # the user's to fix, never the machine's fault; anything else may be the engine's or the disk's moment.
            refused = in_backend and isinstance(err, SpecError)
            self.finalize(row, AttemptStatus("exited" if refused else "lost", ended_at=self.ledger.clock(),
                                             detail=f"could not start: {detail}", refused=refused))
            return
        if external_id != run_dir:
            self.jobs.set_external_id(job_id, n, external_id)

    def _set_aside(self, job_id: int, n: int, job_dir: str, run_dir: str, found: list[str]) -> None:
        """Move the files someone else left where attempt ``n`` of ``job_id`` is to run (another ledger's
        run folder, copied in or left by a ledger that is gone) aside, never adopting them; one a live
        supervisor still runs is left alone and this launch fails (BackendError: retried as another attempt)."""
        owner = recorded_ledger(run_dir)
        whose = ("an unrecorded ledger" if owner is None else "a ledger made before ledger ids" if owner == ""
                 else "an attempt this ledger has no record of (restored from a backup?)"
                 if owner == self.ledger.identity else f"ledger {owner}")
        pid = live_supervisor(run_dir)
        if pid is not None:
            raise BackendError(f"its run folder {run_dir} holds a running attempt of {whose} (supervisor pid {pid})",
                               hint="run folders from another home must not be copied into this one's jobs/")
        target = set_aside(job_dir, found)
        self.jobs.warn("foreign_run_folder", job_id, n,
                       f"{len(found)} file(s) of {whose} were where this attempt runs; moved to {target}")

    def _attempt_env(self, job_id: int, n: int, spec: dict[str, Any], node: str | None, gpu_ids: tuple[str, ...],
                     metrics_path: str, policy: dict[str, Any] | None = None, members: int = 1,
                     port: int | None = None) -> dict[str, str]:
        """The attempt's environment; for a gang (``members`` > 1) member 0's, with the rendezvous
        (MASTER_ADDR: member 0's node, MASTER_PORT, WORLD_SIZE): the backend gives each member its
        own RANK, NODE_RANK, LOCAL_RANK and GPU slots (backends._base.member_env)."""
        from autoresearch.engine import isolation

        env = isolation.base_env(policy, environ(), _INTERNAL_ENV)
        from autoresearch.store import outbox  # here, not above: a status read does not need it

        env.update(outbox.attempt_env(self.ledger, job_id, spec))  # MLFLOW_* from the ledger's run mapping
        env.update(spec.get("env") or {})
        env.update(
            AUTORESEARCH_HOME=str(self.ledger.home), AUTORESEARCH_JOB_ID=str(job_id), AUTORESEARCH_ATTEMPT=str(n),
            AUTORESEARCH_METRICS_FILE=metrics_path, PYTHONUNBUFFERED="1",
        )
        if not self.backend.capabilities.shared_fs:  # we cannot read its files: report() prints to the log
            del env["AUTORESEARCH_METRICS_FILE"]
            env["AUTORESEARCH_METRICS_STDOUT"] = "1"
        if node:
            env["AUTORESEARCH_NODE"] = node
        if self.backend.capabilities.places:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_ids)
        if members > 1:
            env.update(MASTER_ADDR=node or "127.0.0.1", MASTER_PORT=str(port or 29500), WORLD_SIZE=str(members),
                       RANK="0", NODE_RANK="0", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
        checkpoint = checkpoint_dir(self.ledger.home, job_id, spec)
        if checkpoint:
            Path(checkpoint).mkdir(parents=True, exist_ok=True)
            env["AUTORESEARCH_CHECKPOINT_DIR"] = checkpoint
        return env

    def request_stop(self, job_id: int, n: int, reason: str, **data: object) -> None:
        """Record why an attempt is being stopped, then stop it (write-ahead)."""
        att = self.jobs.mark_stop(job_id, n, reason, **data)
        if att is None:
            return
        self.for_backend(att["backend"]).backend.stop(att["external_id"])

    def finalize(self, att: Any, status: AttemptStatus) -> None:
        """Record how an attempt ended and what that means for its job."""
        self._record_endings([(att, self._ending(att, status))])

    def finalize_many(self, ended: list[tuple[Any, AttemptStatus]]) -> None:
        """:meth:`finalize` for every ending a pass found, recorded in one transaction; one ending
        that cannot be prepared or recorded never keeps the others unrecorded (invariant 8)."""
        ingested: set[tuple[int, int]] = set()
        if len(ended) > 1:  # their last points in one transaction, not one each
            try:
                ingested = ingest_final_many(self.ledger, self.backend, [att for att, _ in ended])
            except LedgerError:
                raise
            except Exception:  # noqa: BLE001 - each is ingested on its own below, which says what failed
                ingested = set()
        endings = []
        for att, status in ended:
            with surviving(self.ledger, self.backend, "reconcile", att["job_id"], att["n"]):
                endings.append((att, self._ending(att, status, (att["job_id"], att["n"]) in ingested)))
        if not endings:
            return
        try:
            self._record_endings(endings)
        except LedgerError:
            raise
        except Exception:  # noqa: BLE001 - one of them: each in its own transaction, guarded
            for att, ending in endings:
                with surviving(self.ledger, self.backend, "reconcile", att["job_id"], att["n"]):
                    self._record_endings([(att, ending)])

    def _ending(self, att: Any, status: AttemptStatus, ingested: bool = False) -> tuple[Any, ...]:
        """Ingest an ended attempt's last points (unless ``ingested`` already), classify its ending: the
        arguments of its :meth:`JobStore.end_attempts` entry."""
        job_id, n = att["job_id"], att["n"]
        if not ingested:
            self.ingest_attempt(att, final=True)
        spec = json.loads(att["spec"])
        reason, detail = classify(att, status)
        failed = not (reason in ("cancelled", "preempted") or (reason == "exit" and status.exit_code == 0))
        full = disk_full_hint(detail, self.ledger.home) if reason == "infra" else None
        # infra, infra-suspect, unknown (all retried) or user; a full disk is the home's, not the node's:
        # the health policy never sees it
        failure = (self.health.on_ending(att, reason, status.exit_code, detail, signal=status.signal)
                   if failed and full is None else None)

        def next_state(job: Any) -> tuple[str, int]:
            retries = job["retries_used"]
            retryable = (failure.retried if failure is not None else reason == "infra") or (
                reason == "exit" and exit_status(status) in (spec.get("retry_on_exit_codes") or []))
            if full is not None:
                retryable = full[1]  # rerun only once the disk has room again, never blindly
            if reason == "exit" and status.exit_code == 0:
                return "succeeded", retries
            if job["cancel_requested"] or reason == "cancelled":
                return "cancelled", retries
            if reason == "preempted":
                return "queued", retries
            if retryable and retries < int(spec.get("max_retries", 2)):
                return "queued", retries + 1
            return "failed", retries

        return (job_id, n, status, reason, detail, next_state,
                (failure.cls, f"{failure.why}\nhint: {failure.hint}") if failure is not None
                else ("infra", full[0]) if full is not None else None)

    def _record_endings(self, endings: list[tuple[Any, tuple[Any, ...]]]) -> None:
        states = self.jobs.end_attempts([ending for _, ending in endings])  # type: ignore[misc]
        recorded = [att for (att, _), state in zip(endings, states, strict=True) if state is not None]
        for att in recorded:  # (the others: another pass got there first)
            self.backend.release(att["external_id"])
        for (att, _), state in zip(endings, states, strict=True):
            if state == "succeeded" and att["n"] > 1:  # a retry that succeeded: differential evidence
                with surviving(self.ledger, self.backend, "reconcile", att["job_id"], att["n"]):
                    self.health.on_success(att)
        if recorded:
            from autoresearch.store import outbox

            outbox.kick(self.ledger.home)  # mirror the endings to MLflow in the background (whichever process saw them)

    def watch(self) -> Watcher:
        """Open a :class:`Watcher` on this runtime's home and backend."""
        return Watcher(self.ledger.home, self.backend.name)

    # -- metrics --------------------------------------------------------------------------

    def ingest(self, job_id: int) -> None:
        job = self.jobs.job(job_id)
        runtime = self.for_backend(job["backend"]) if job is not None else self
        for att in self.jobs.unended_attempts(job_id):
            runtime.ingest_attempt(att)
        for att in self.jobs.unread_attempts(job_id):  # ended before all its output was read: read on
            runtime.ingest_attempt(att, final=True)

    def read_unread(self, limit: int = 1) -> bool:
        """Read on in the output of up to ``limit`` ended attempts whose ending came before all of it was
        read (one read's cap each); whether any is left (the pass daemon calls it while so)."""
        for att in self.jobs.unread_attempts(limit=limit):
            with surviving(self.ledger, self.backend, "ingest", att["job_id"], att["n"]):
                self.for_backend(att["backend"]).ingest_attempt(att, final=True)
        return bool(self.jobs.unread_attempts(limit=1))

    def ingest_attempt(self, att: Any, final: bool = False) -> None:
        """Move new metric points of one attempt into the ledger; never raises but for the ledger."""
        ingest_attempt(self.ledger, self.backend, att, final)


def _running(placed: list[Any]) -> list[S.Running]:
    """The scheduler's view of the active attempts (``JobStore.placed`` rows)."""
    from autoresearch.engine import scheduler as S

    return [S.Running(r["job_id"], r["n"], r["priority"], _alloc(r), r["started_at"] or r["created_at"], r["cpus"],
                      r["memory"], r["stop_reason"] is not None, r["project"]) for r in placed]


def _member_nodes(row: Any) -> list[str]:
    """The nodes of every member of an active attempt (a gang's), else its one node."""
    try:
        return [m for m, _ in _alloc(row)]
    except (TypeError, ValueError, KeyError, IndexError):
        return [row["node"]]


def _alloc(row: Any) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """An active attempt's placement: every member of a gang, else its one node."""
    if row["alloc"]:
        return tuple((str(m), tuple(ids)) for m, ids in json.loads(row["alloc"]))
    return ((row["node"], tuple(json.loads(row["gpu_ids"]))),)


def _fair_share(home: Path) -> S.FairShare | None:
    """config.yaml's fair share; a file broken since this process read it turns it off for the pass
    (submits refuse the file with its error, so somebody sees it)."""
    from autoresearch.backends import profiles

    try:
        return profiles.fair_share(home)
    except AutoresearchError:
        return None


def _free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _still_exists(backend: str, home: Path) -> bool:
    from autoresearch.backends import profiles

    try:
        profiles.resolve(backend, home)
    except AutoresearchError:
        return False
    return True


def runtime_for_plan(home: str | os.PathLike[str] | None, plan: Any, backend: str | None = None) -> Runtime:
    """The engine a loop runs on: ``backend`` (``--backend``), else the plan's ``backend:``, else the
    home's default. The plan's options go with the plan's own backend only."""
    name, options = plan.backend_choice()
    if name is None and options:
        name = "local"  # backend: {options: ...} without a kind has always meant local
    if backend is not None and backend != name:
        name, options = backend, {}
    return Runtime(home, name, options)


def engine_node_state(node: NodeInfo) -> tuple[str, str]:
    """Our state and reason for a node in an engine's own words (Slurm's ``drained``, ``down*`` ...)."""
    word = node.state.strip().lower().rstrip("*~#!%$@^-+")
    if not word or word in ("idle", "mixed", "allocated", "alloc", "mix", "completing", "comp", "planned", "ready",
                            "alive", "up", "running"):  # Ray's nodes are ALIVE
        return "healthy", ""
    said = f"the engine says {node.state}" + (f": {node.reason}" if node.reason else "")
    if "drain" in word or "cordon" in word or word in ("maint", "reserved", "resv", "schedulingdisabled"):
        return "cordoned", said[:300]
    return "down", said[:300]


DISK_ROOM_BYTES = 64 << 20  # a full disk's job is run again only once its file system has this much free


def disk_full_hint(detail: str, home: Path) -> tuple[str, bool] | None:
    """For an ending whose disk was full (its detail starts with ``DISK_FULL``): the failure's why and
    hint (what to free) and whether the disk has room again now; None for any other ending."""
    if not detail.startswith(DISK_FULL):
        return None
    path = detail[len(DISK_FULL):] or str(home)
    try:
        vfs = os.statvfs(path)
        free = vfs.f_bavail * vfs.f_frsize
    except OSError:
        free = 0
    room = free >= DISK_ROOM_BYTES
    then = ("It has room again: the job is retried." if room else
            f"The job is not run again until it has {DISK_ROOM_BYTES >> 20} MiB free: resubmit it then.")
    return (f"the disk of {path} was full at its end (its output may be cut short; not the node's fault)\n"
            f"hint: free space on {path} ({free >> 20} MiB free now): finished jobs' run folders under "
            f"{home / 'jobs'}, old checkpoints, {home / 'aside-*'}; or set AUTORESEARCH_HOME to a larger disk. "
            f"{then}", room)


def engine_note(att: Any, status: AttemptStatus) -> tuple[int, int, str | None, str | None, str, str | None] | None:
    """(job id, n, node, gpu ids as JSON, detail, alloc as JSON) for an active attempt whose engine says
    something new: where it placed it (an engine that places its own jobs; a gang's every node in
    ``alloc``) or why it holds it (``engine: PENDING, ...``, kept while it starts, cleared once it runs).
    None when nothing changed (the usual pass writes nothing)."""
    held = status.detail if status.state == "starting" and status.detail.startswith("engine: ") else ""
    node = status.node if status.node and status.node != att["node"] else None
    ids = json.dumps(list(status.gpu_ids)) if status.gpu_ids is not None and status.node else None
    if ids is not None and ids == att["gpu_ids"] and node is None:
        ids = None
    alloc = json.dumps([[m, list(g)] for m, g in status.members]) if status.members and status.node else None
    if alloc is not None and alloc == att["alloc"]:
        alloc = None
    current = att["detail"] or ""
    if node is None and ids is None and alloc is None and held == (current if current.startswith("engine: ") else ""):
        return None
    return att["job_id"], att["n"], node, ids, held, alloc


def classify(att: Any, status: AttemptStatus) -> tuple[str, str]:
    """End reason (exit, timeout, cancelled, stopped, preempted, infra) and a one-line detail."""
    # Why we stopped it wins — but only if our stop reached it: an attempt that ended on
    # its own just before the SIGTERM keeps its own ending (a success stays a success).
    stop_reason = att["stop_reason"] if (status.stopped or status.state == "lost") else None
    if stop_reason == "stopped" and status.stopped:
        return "stopped", "stopped by its research loop (early stopping, its end or stop_loop)"
    if stop_reason == "cancelled" or (att["cancel_requested"] and status.stopped):
        return "cancelled", "cancelled by request"
    if status.cancelled and not stop_reason and not status.timed_out:
        return "cancelled", status.detail or "cancelled through the engine, not by autoresearch"
    if stop_reason == "preempted":
        return "preempted", "stopped to make room for a higher-priority job"
    if stop_reason == "hang":  # health.on_hang: kill (the health checks class it: infra-suspect, re-checked)
        return "infra", "stopped after it hung: no new log line or metric for health.hang_after (on_hang: kill)"
    if status.preempted and not stop_reason:
        return "preempted", status.detail or "preempted by the engine"
    if status.detail.startswith(DISK_FULL):  # (the home's disk: runtime.disk_full_hint)
        return "infra", status.detail
    if status.refused:
        return "exit", status.detail or "refused at start: the job's or its profile's settings"
    if status.state == "lost":
        return "infra", status.detail or "attempt lost"
    if status.timed_out:
        return "timeout", "ran past its timeout"
    if status.detail.startswith(OVER_LIMIT):  # its sandbox's limit stopped it: the job's doing, not retried
        return "exit", status.detail
    if status.signal is not None:
        try:
            name = _signal.Signals(status.signal).name
        except ValueError:
            name = f"signal {status.signal}"
        if status.signal in CRASH_SIGNALS:  # the program's own fault (a segfault, abort()): the user's error
            return "exit", f"crashed with {name} (signal {status.signal})"
        hint = " (out of memory?)" if status.signal == _signal.SIGKILL else ""
        return "infra", f"killed by {name} that autoresearch did not send{hint}"
    dropped = f"; {status.detail}" if status.detail.startswith(LOG_DROPPED) else ""
    if status.exit_code == 0:
        return "exit", f"exited 0{dropped}"
    return "exit", f"exited {status.exit_code}{dropped}"


def exit_status(status: AttemptStatus) -> int | None:
    """The exit code, or 128+N for a program killed by signal N (as a shell reports it)."""
    if status.exit_code is None and status.signal is not None:
        return 128 + status.signal
    return status.exit_code


def checkpoint_dir(home: Path, job_id: int, spec: dict[str, Any]) -> str | None:
    checkpoint = spec.get("checkpoint")
    if not checkpoint:
        return None
    if checkpoint is True:
        return str(home / "jobs" / str(job_id) / "checkpoint")
    path = Path(str(checkpoint)).expanduser()
    return str(path if path.is_absolute() else Path(spec["workdir"]) / path)


def checkpoint_problem(path: str) -> str | None:
    """Why ``path`` can never be a checkpoint directory here (a file on the way, no write access), if so."""
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} is not a directory"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{probe} is not writable"
    return None


def _prepare_checkpoint(home: Path, job_id: int, spec: dict[str, Any]) -> None:
    checkpoint = checkpoint_dir(home, job_id, spec)
    if not checkpoint:
        return
    try:
        Path(checkpoint).mkdir(parents=True, exist_ok=True)
    except OSError as err:
        why = checkpoint_problem(checkpoint) or err.strerror or str(err)
        raise SpecError(f"cannot create the checkpoint directory {checkpoint}: {why}",
                        hint="pass --checkpoint a writable directory (or --checkpoint alone for a per-job one)"
                        ) from None


def _argv(spec: dict[str, Any]) -> list[str]:
    command = spec["command"]
    return ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)


def _prepare_mounts(spec: dict[str, Any]) -> None:
    """No containers locally: a mount is a symlink at its target, made once. A relative target is
    made beneath the workdir without following any link on the way (a workdir holding a link to
    elsewhere cannot make us write there); an absolute one (single-user jobs only) where it says."""
    from autoresearch.util._private import open_beneath

    workdir = spec["workdir"]
    for target, source in (spec.get("mounts") or {}).items():
        src = os.path.realpath(os.path.expanduser(source))
        if os.path.isabs(target):
            path = Path(target)
            if path.is_symlink() and path.resolve() == Path(src):
                continue
            if path.exists():
                if path.resolve() == Path(src):
                    continue
                raise OSError(f"mount target {path} exists and is not a link to {src}")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.symlink_to(src)
            continue
        try:
            fd, name = open_beneath(workdir, target, create_dirs=True)
        except ValueError as err:
            raise OSError(f"mount target {target!r}: {err}") from None
        except OSError as err:
            raise OSError(f"mount target {target!r} leads through a link or a file beneath {workdir} "
                          f"({err.strerror}): it is made beneath the workdir only") from None
        try:
            try:
                current = os.readlink(name, dir_fd=fd)
            except FileNotFoundError:
                os.symlink(src, name, dir_fd=fd)
                continue
            except OSError:  # there, and no link: fine only when it is the source itself
                current = None
            where = os.path.join(workdir, os.path.dirname(target))
            if os.path.realpath(os.path.join(where, current if current is not None else name)) != src:
                raise OSError(f"mount target {os.path.join(workdir, target)} exists and is not a link to {src}")
        finally:
            os.close(fd)


def main(argv: list[str] | None = None) -> int:
    """The on-exit hook of attempt supervisors: one pass, then exit.

    A supervisor runs it when nobody heard its ending (no loop or server listening and no pass
    daemon: one was killed, or the listener died). While attempts of the backend still start or run,
    it then starts a pass daemon (``watcher.ensure_daemon``: not when one runs or starts, somebody listens, or
    ``AUTORESEARCH_PASSD=off``), so that their endings are heard again instead of each starting an
    interpreter like this one (~110-130 ms of CPU on a 2-core VM)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m autoresearch.engine.runtime")
    parser.add_argument("--home")
    parser.add_argument("--backend", default="local")
    args = parser.parse_args(argv)
    try:
        runtime = Runtime(args.home, args.backend)
        runtime.tick()
        if runtime.jobs.any_unfinished(runtime.backend.name):
            from autoresearch.engine.watcher import ensure_daemon

            ensure_daemon(runtime)
    except AutoresearchError as err:
        print(f"autoresearch pass failed: {err.render()}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
