"""The controller: propose -> launch -> evaluate -> replan, event driven, resumable.

It keeps ``budget.parallel`` trials in flight and, as soon as one ends, evaluates it
and launches the next (no generation barrier). At parallel 4 or more it keeps
``parallel // 4`` trials proposed ahead (queue ahead, :meth:`Controller.ahead`; docs/loop.md,
"How it runs"), so an ending launches a trial already proposed. Each step is a decision written to
the ledger before it is acted on (see :mod:`autoresearch.loop.store`); everything the
controller knows is rebuilt from the ledger when it starts, so running the same plan
again after Ctrl-C or ``kill -9`` adopts running trials, redoes nothing finished and
duplicates no decision. One controller per loop at a time (a file lock).

Trials are ordinary jobs (``Api.submit``, tags ``autoresearch.loop``/``trial_id``,
experiment = plan name); early stopping is ``Api.cancel`` with the plan's grace.
Infra failures are retried by the runtime; a trial whose job still ends ``infra``
is ``crashed`` and does not count against the trial budget. User failures are
``failed`` and reach the proposer with their log tail.

A loop belongs to a project (``loops.project``; MCP tokens see their own project's
loops) and submits its trials as that project's jobs.

With tracking on, each batch of new trials asks the mirror for its MLflow runs (and the
loop's parent run) through the outbox as soon as they are proposed (the mirror's run maker,
a helper process, answers; a worker thread waits for it). A trial never waits for that
(unless ``AUTORESEARCH_RUN_WAIT_S`` asks it to, at most ``PREPARE_HOLD_S``): it gets
``MLFLOW_RUN_ID`` when its run exists at launch, and otherwise the mirror attaches its
metrics to its run afterwards (:mod:`~autoresearch.loop._mlflow_runs`).

This module holds the event loop; what it knows is a :class:`~autoresearch.loop.state.LoopState`
(rebuilt from the ledger), and its parts live beside it, taking that state or the controller
as a :class:`~autoresearch.loop.state.LoopHost`:
:mod:`~autoresearch.loop._launch` (the propose thread, submitting a trial),
:mod:`~autoresearch.loop.outcomes` (curves, a trial's end, keep-or-discard),
:mod:`~autoresearch.loop._limits` (budgets and when the loop ends),
:mod:`~autoresearch.loop._mlflow_runs` (MLflow runs ahead of launch) and
:mod:`~autoresearch.loop._interrupt` (Ctrl-C, stop requests).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable
from typing import Any

from autoresearch.engine import jobs as job_ops
from autoresearch.errors import AutoresearchError, BackendError, PlanError, StateError
from autoresearch.loop import _limits, outcomes, pause
from autoresearch.loop import ordered as ordered_mode
from autoresearch.loop._interrupt import LoopInterrupted, SigintFlag, wake
from autoresearch.loop._launch import ProposeCall, launch_many, timed
from autoresearch.loop._live_view import LiveView
from autoresearch.loop._mlflow_runs import PREPARE_HOLD_S as PREPARE_HOLD_S
from autoresearch.loop._mlflow_runs import RunPreparer
from autoresearch.loop.outcomes import LOG_TAIL_LINES as LOG_TAIL_LINES
from autoresearch.loop.plan import Plan, plan_json
from autoresearch.loop.proposers import Proposer, ProposerContext, ProposeResult, _warm, make_proposer
from autoresearch.loop.rungsync import RungSync
from autoresearch.loop.state import LoopState
from autoresearch.loop.stopping import Series, Stopper, make_stopper
from autoresearch.loop.store import ENDED_TRIAL, LoopStore
from autoresearch.loop.views import LoopView, blocked_text, incumbents_of, loop_view, reread_loop
from autoresearch.store import outbox
from autoresearch.store.jobstore import JobStore
from autoresearch.util._private import private_dir

SIM_WAIT_S = 600.0  # simulated seconds a wait may skip when no event comes first
BLOCKED_EVERY_S = 2.0  # how often a loop with queued trials asks whether any node can run them
HELD_MONITOR_S = 0.05  # how often curves are read while trials wait at a first-wave rung (stopping.first_wave)


class Controller:
    def __init__(self, plan: Plan, *, runtime: Any = None, home: str | os.PathLike[str] | None = None,
                 resume: bool = False, on_update: Callable[[LoopView], None] | None = None,
                 poll_s: float = 0.01, update_every_s: float = 0.25, monitor_every_s: float = 0.5,
                 project: str | None = None, hard_budgets: bool = False, max_wall: float | None = None,
                 ordered: bool | None = None) -> None:
        """``project``: the project a new loop belongs to (None: ''); an existing loop keeps its own,
        and a loop of another project is refused. ``hard_budgets``/``max_wall``: CI's hard stops
        (:mod:`autoresearch.loop._limits`). ``ordered``: a reproducible sweep (:mod:`autoresearch.loop.ordered`;
        None: for a CI run whose proposer has a seed)."""
        self.plan = plan
        self._ordered = ordered
        self.resume = resume
        self.project = project
        self.state = LoopState(plan, plan.objective.sign(), loop_project=project or "", hard_budgets=hard_budgets,
                               max_wall=max_wall)
        self.on_update = on_update
        self.poll_s, self.update_every_s, self.monitor_every_s = poll_s, update_every_s, monitor_every_s
        if runtime is None:
            from autoresearch.engine.runtime import runtime_for_plan

            runtime = runtime_for_plan(home, plan)
        self.runtime = runtime  # the engine: the loop sits below the facade and never calls it
        self.ledger = runtime.ledger
        self.stopper: Stopper | None = make_stopper(plan.early_stop, plan.objective.sign())
        self.proposer: Proposer
        self.watch_metrics = (self.stopper is not None or on_update is not None
                              or plan.objective.target is not None or plan.budget.steps is not None)
        self.call: ProposeCall | None = None
        self._lock_fd: int | None = None
        self._last_update = self._last_monitor = self._last_persist = self._last_tick = self._last_full = 0.0
        self.safety_poll_s = 1.0  # reconcile at least this often (an attempt killed -9 pokes nobody)
        self.watcher: Any = None
        self._woke = True
        self._retry_tick = False
        self._endings_ready = False  # the runtime loaded what an ending's pass needs (_wait, once)
        self.already_finished = False
        self._external_stop: tuple[str, bool] | None = None
        self._dropped = False  # the stop's queued-ahead trials were cancelled (drop_ahead)
        # MLflow runs created ahead of launch (tracking on): one worker at a time, batches queued.
        self.runs = RunPreparer(self.ledger)
        self.sigint = SigintFlag()  # a Ctrl-C that something swallowed still stops the loop
        self._live: LiveView | None = None  # the live display's view, kept as trials change (made on first use)
        # Inside a wake's batch of endings, a forced update is owed, not drawn: one per wake, not per end.
        self._batching = self._owed = False
        self._blocked_look = -BLOCKED_EVERY_S  # when _check_blocked last read the nodes (monotonic)

    @property
    def tracking(self) -> bool:
        """Whether trials get their MLflow run before they launch (off for good after a failure)."""
        return self.runs.enabled

    @property
    def sign(self) -> float:
        return self.state.sign

    @property
    def series(self) -> dict[int, Series]:
        return self.state.series

    # -- lifecycle --------------------------------------------------------------------------

    def open(self) -> None:
        """Everything that can fail before a trial launches: backend, capacity, lock, proposer, loop row."""
        s = self.state
        try:
            self.runtime.refresh_nodes()
        except AutoresearchError:
            raise
        except Exception as err:  # noqa: BLE001 - any backend failure is "unreachable"
            raise BackendError(f"backend {self.runtime.backend.name!r} is unreachable: {err}",
                               hint="start it (`autoresearch backends` checks each), fix its options, or use "
                                    "--backend local") from None
        self.runtime.backend.check(self.plan.trial)  # refuse the loop, not each of its trials
        if self.plan.trial.gpus:
            job_ops.check_capacity(self.runtime, self.plan.trial.gpus, 1)
        lock_dir = self.ledger.home / "loops" / self.plan.name
        private_dir(lock_dir.parent)
        private_dir(lock_dir)
        fd = os.open(lock_dir / "controller.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StateError(f"loop {self.plan.name!r} is already running in another process",
                             hint="watch it there, or stop that process first (Ctrl-C)") from None
        self._lock_fd = fd
        kept = _warm.new_generation(self.plan, self.ledger, self.project, self.resume)  # warm_start: true
        existing = LoopStore.find(self.ledger, self.plan.name)
        if existing is not None:
            if self.project is not None and existing["project"] != self.project:
                raise StateError(f"the loop name {self.plan.name!r} is taken by another project",
                                 hint="change name: in the plan")
            s.loop_project = existing["project"]
        self.ctx = ProposerContext(self.plan, existing["id"] if existing else 0, self.plan.name, self.ledger.home,
                                   self.runtime, project=s.loop_project)
        from autoresearch.loop.ops import tenant_env

        tenant_env(self.runtime, self.plan, s.loop_project)  # a tenant's plan names no server secret, however run
        self.proposer = make_proposer(self.ctx)  # may raise (missing key): nothing exists yet
        s.ordered = (ordered_mode.eligible(self.plan, s.hard_budgets, self.proposer) if self._ordered is None
                     else self._ordered and not self.proposer.blocking)
        s.ahead = self.ahead()
        s.started = time.monotonic()
        clock = getattr(self.runtime.backend, "clock", None)  # a simulated fleet's (autoresearch/sim/)
        if clock is not None and callable(getattr(clock, "now", None)):
            s.clock, s.clock_started = clock, float(clock.now())
        digest = self.plan.digest()
        if existing is None:
            s.store = LoopStore.create(self.ledger, self.plan.name, plan_json(self.plan), digest, self.plan.name,
                                       project=s.loop_project)
            s.prior_elapsed = 0.0
        else:
            s.store = LoopStore(self.ledger, existing["id"])
            has_trials = bool(s.store.trials())
            if existing["digest"] != digest and has_trials and not self.resume:
                raise PlanError(f"a loop named {self.plan.name!r} already exists with a different plan",
                                hint="pass --resume to continue it under this plan, or change name: to start anew")
            s.prior_elapsed = float(existing["elapsed_s"] or 0.0)
            if existing["state"] == "finished" and existing["digest"] == digest:
                self.already_finished = True  # the same plan again: nothing to redo, no decision to add
                return
            s.store.set_loop(state="running", plan=plan_json(self.plan), digest=digest, ended_at=None)
            self._adopt(changed=existing["digest"] != digest and has_trials)
        self.ctx.loop_id = s.store.loop_id
        self.runtime.jobs.set_group_cap(s.job_group(), self.plan.budget.parallel)  # a resumed plan's parallel too
        _warm.record(s.store, self.plan, self.ctx.warm, kept)  # which loops warmed it (a decision, once)
        s.reload()
        s.judged()  # its verdicts so far (none in a new loop); from here on kept as they are written
        if s.ordered:  # (a resumed loop: what ended before took effect then)
            s.processed = {t for t, r in s.rows.items() if r["state"] in ENDED_TRIAL}
        if self.plan.budget.steps is not None:  # a resumed loop's compute so far: its ended trials' curves
            outcomes.read_series(self, [r for r in s.rows.values() if r["job_id"] is not None
                                        and r["state"] not in ("queued", "running")])
        self.runs.enabled = outbox.tracking_enabled()
        # Warm up (mlflow import, the store) while the first proposal is made; runs for resumed trials.
        self.runs.prepare([r["id"] for r in s.pending()], warm=True)
        s.launch_decided = s.store.launched_trials()
        watch = getattr(self.runtime, "watch", None)
        if watch is not None:
            self.watcher = watch()
            if self.stopper is not None:  # stop at the rung: trials' report() waits for the verdict there
                s.sync = RungSync(self.ledger.home, self.plan.name, self.runtime.backend.name, self.stopper,
                                  self.plan.objective.metric)
        s.incumbent, s.previous_incumbents = incumbents_of(self.ledger, s.store.loop_id)
        pause.promote(self)  # after a restart: a paused trial that is promotable goes first

    def _adopt(self, changed: bool) -> None:
        s = self.state
        rows = s.store.trials()
        if not rows:
            return
        pause.restore(self, rows)  # paused trials and their curves (loop/pause.py)
        running = [r for r in rows if r["state"] in ("queued", "running")]
        pending = [r for r in rows if r["state"] == "proposed"]
        for r in running:
            s.active[r["id"]] = r
            if r["id"] not in s.series and self.stopper is not None:
                series = outcomes.read_series(self, [r])
                self.stopper.adopt(r["id"], series.get(r["id"], []))
        ended = len(rows) - len(running) - len(pending)
        s.store.decide("replan", inputs={"adopted_trials": [r["id"] for r in running],
                                         "pending_trials": [r["id"] for r in pending], "ended_trials": ended,
                                         "plan_changed": changed},
                       rationale=f"resumed: adopting {len(running)} running trial(s), {ended} already ended"
                                 + ("; the plan changed" if changed else ""))

    def _wait(self) -> None:
        """Sleep until an attempt ends (the runtime's watcher), a proposal is due, or the monitor is.

        On a simulated fleet whose clock runs on events, nothing moves unless the loop waits: the
        wait jumps simulated time to the next reported point or ending, at once."""
        if not self._endings_ready and self.state.active:
            self._endings_ready = True  # once: while the first trials run, not between an ending and a launch
            prepare = getattr(self.runtime, "prepare_endings", None)
            if prepare is not None:
                prepare()
        clock = self.state.clock
        if clock is not None and getattr(clock, "mode", "") == "events" and self.state.active and self.call is None:
            clock.wait(SIM_WAIT_S)
            self._woke = True
            return
        if self.watcher is None:
            time.sleep(self.poll_s)
            self._woke = True
            return
        if self.call is not None or self._retry_tick or self.runs.held:
            timeout = self.poll_s
        elif self.watch_metrics and self.state.active:
            timeout = max(self.poll_s, self._monitor_every() - (time.monotonic() - self._last_monitor))
        else:
            timeout = self.safety_poll_s
        if self.on_update is not None:
            timeout = min(timeout, self.update_every_s)
        self._woke = (bool(self.watcher.wait(timeout)) or self._retry_tick
                      or time.monotonic() - self._last_tick >= self.safety_poll_s)

    def _check_blocked(self) -> None:
        """Every BLOCKED_EVERY_S while trials are queued: can any node run them? When every node that
        fits is cordoned or down the loop keeps waiting (a node comes back: an uncordon, a passing
        health check) but says why, once, and again when the reason changes or clears."""
        now = time.monotonic()
        if now - self._blocked_look < BLOCKED_EVERY_S and not self.state.blocked:  # blocked: every wake
            return
        self._blocked_look = now
        s = self.state
        text = blocked_text(self.ledger, list(s.active.values())) if s.active else ""
        if text != s.blocked:
            s.blocked = text
            self.publish(force=True)

    def _monitor_every(self) -> float:
        """How often running trials' curves are read: ``monitor_every_s``, or :data:`HELD_MONITOR_S` while
        trials wait at a first-wave rung for a lead to go past it (its next step is no rung: it does
        not poke the loop, and every look saved is a wait the held trials do not make)."""
        return min(self.monitor_every_s, HELD_MONITOR_S) if self.state.held else self.monitor_every_s

    def close(self) -> None:
        self.runs.close()
        if self.watcher is not None:
            with contextlib.suppress(Exception):
                self.watcher.close()
            self.watcher = None
        with contextlib.suppress(Exception):
            self.proposer.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def elapsed(self) -> float:
        return self.state.elapsed()

    def run(self) -> LoopView:
        try:
            self.open()
        except BaseException:
            self.close()  # release the lock: the user fixes the plan and runs again
            raise
        if self.already_finished:
            self.close()
            view = loop_view(self.ledger, self.plan.name)
            if self.on_update is not None:
                self.on_update(view)
            return view
        s = self.state
        try:
            self.sigint.install()
            while True:
                self.sigint.check()
                if self._external_stop is not None:
                    reason, stop_trials = self._external_stop
                    if not stop_trials:
                        s.store.set_loop(state="interrupted", elapsed_s=self.elapsed())
                        return self.view()
                    s.stop_reason = s.stop_reason or reason
                self._poll()
                if _limits.done(s, self.call):
                    break
                self._fill()
                self._check_blocked()
                self.publish()
                self._wait()
            return self._finish()
        except KeyboardInterrupt:
            s.store.set_loop(state="interrupted", elapsed_s=self.elapsed())
            running = [r["job_id"] for r in s.active.values() if r["job_id"] is not None]
            raise LoopInterrupted(self.view(), running) from None
        except BaseException:
            with contextlib.suppress(Exception):
                s.store.set_loop(state="failed", elapsed_s=self.elapsed())
            raise
        finally:
            self.sigint.restore()
            self.close()

    def _live_points(self) -> dict[int, tuple[int, float]]:
        """The last (step, value) of each active trial, in the objective's own direction."""
        s = self.state
        points = {t: s.series[t][-1] for t in s.active if s.series.get(t)}
        return {t: (step, value * s.sign) for t, (step, value) in points.items()}

    def view(self) -> LoopView:
        """The whole loop, read from the ledger (its end, an interrupt: once per run)."""
        return loop_view(self.ledger, self.plan.name, live=self._live_points(), elapsed_s=self.elapsed())

    def live_view(self) -> LoopView:
        """What a live display shows, kept up to date (:mod:`~autoresearch.loop._live_view`): flat per event."""
        if self._live is None:
            self._live = LiveView(self.state)
        return self._live.view(self.plan.name, self._live_points(), self.elapsed())

    def publish(self, force: bool = False) -> None:
        """Persist the elapsed time (every 5 s) and show the view (every ``update_every_s``, or now:
        once per wake however many trials ended in it)."""
        if force and self._batching:
            self._owed = True
            return
        now = time.monotonic()
        if now - self._last_persist > 5:
            self._last_persist = now
            self.state.store.set_loop(elapsed_s=self.elapsed())
        if self.on_update is not None and (force or now - self._last_update >= self.update_every_s):
            self._last_update = now
            self.on_update(self.live_view())

    # -- evaluate (the rules: autoresearch.loop.outcomes) ----------------------------------

    def _poll(self) -> None:
        s = self.state
        runtime = self.runtime
        if self._woke:  # also for other jobs: while our watcher is open their supervisors poke us too
            # With our watcher open, supervisors poke us instead of running the pass: we run it (one
            # thread: a pass thread beside this one cost more CPU a trial than it saved; DESIGN-NOTES).
            # Their pokes name their attempts: the pass polls those (and the starting ones), not all
            # of our running trials; a whole pass at least every safety_poll_s, and after any poke
            # that named none (a stop request, a report(), one lost to a full pipe) or a skipped pass.
            now = time.monotonic()
            take = getattr(self.watcher, "take", None)  # (a runtime's own watcher may name nothing)
            only = take() if take is not None else None
            if not only or self._retry_tick or now - self._last_full >= self.safety_poll_s:
                only = None
            self._retry_tick = not runtime.tick(wait=False, only=only)
            self._last_tick = time.monotonic()
            if only is None and not self._retry_tick:
                self._last_full = now
            self._woke = False
            ids = [r["job_id"] for r in s.active.values()]
            jobs = {j["id"]: j for j in JobStore(self.ledger).job_ends(ids)}
            started: list[tuple[int, dict[str, Any]]] = []
            self._batching = True
            try:
                for trial_id, row in list(s.active.items()):
                    job = jobs.get(row["job_id"])
                    if job is None:
                        continue
                    if job["state"] in ("succeeded", "failed", "cancelled"):
                        outcomes.ended(self, trial_id, row, job)
                    elif job["state"] in ("starting", "running") and row["state"] == "queued":
                        started.append((trial_id, {"state": "running", "started_at": job["started_at"] or time.time()}))
                for row in s.update_trials(started) if started else ():  # one transaction for the wake's starts
                    s.active[row["id"]] = row
            finally:
                self._batching = False
            if self._owed:
                self._owed = False
                self.publish(force=True)
        now = time.monotonic()
        # a report() at a rung waits: judge it now
        heard = getattr(self.watcher, "points", False)
        if self.watch_metrics and s.active and (heard or now - self._last_monitor >= self._monitor_every()):
            if heard:
                self.watcher.points = False
            self._last_monitor = now
            outcomes.monitor(self)
        stops = _limits.check_limits(s)
        if s.stop_reason and not self._dropped:
            self._dropped = True
            self.drop_ahead()
        for trial_id in stops:
            if trial_id in s.active:  # (not one cancelled while queued ahead)
                self.stop_trial(trial_id, f"stopping the loop: {s.stop_reason}", {"reason": s.stop_reason})

    def drop_ahead(self) -> None:
        """The loop stops: cancel the trials queued ahead of the free slots (the newest beyond
        ``parallel``: a trial within it was launched, its job just not started yet) whose job has
        not started (a pass that starts one first wins: it runs as any other), and leave them
        ``skipped``, as the proposed ones."""
        s = self.state
        excess = len(s.active) - self.plan.budget.parallel
        if excess <= 0:
            return
        queued = sorted(((row["job_id"], trial_id) for trial_id, row in s.active.items()
                         if row["state"] == "queued" and row["job_id"] is not None and trial_id not in s.stopping),
                        reverse=True)[:excess]
        waiting = dict(queued)
        cancelled = self.runtime.jobs.cancel_queued(sorted(waiting))
        for job_id in cancelled:
            del s.active[waiting[job_id]]
        s.update_trials([(waiting[job_id], {"state": "skipped", "failure": f"not launched: {s.stop_reason}",
                                             "ended_at": time.time()}) for job_id in cancelled])

    def stop_trial(self, trial_id: int, rationale: str, inputs: dict[str, Any]) -> None:
        """Decide to stop a running trial (a stop decision), then cancel its job with the plan's grace."""
        s = self.state
        row = s.active[trial_id]
        s.stopping.add(trial_id)
        s.store.decide("stop", trial_id=trial_id, inputs={"job_id": row["job_id"], **inputs},
                       outputs={"action": "cancel", "grace_s": self.plan.trial.grace}, rationale=rationale)
        job_ops.cancel(self.runtime, [row["job_id"]], reason="stopped")

    # -- the end ----------------------------------------------------------------------------

    def _finish(self) -> LoopView:
        s = self.state
        ordered_mode.drain(self, outcomes.take_effect, final=True)
        pause.finish(self)
        for row in s.pending():
            s.update_trial(row["id"], state="skipped", failure=f"not launched: {s.stop_reason}")
        view = loop_view(self.ledger, self.plan.name, live=self._live_points(), elapsed_s=self.elapsed(),
                         rows=[s.rows[t] for t in sorted(s.rows)], judged=s.judged())  # (what we hold)
        s.store.decide("finish", inputs={"counts": view.counts, "elapsed_s": self.elapsed(), "spent": _limits.spent(s)},
                       outputs={"reason": s.stop_reason, "best_trial": view.best_trial,
                                "best_value": view.best_value, "best_seeds": view.best_seeds,
                                "best_confirmed": view.best_confirmed, "noise_floor": view.noise_floor},
                       rationale=f"loop finished: {s.stop_reason}")
        s.store.set_loop(state="finished", elapsed_s=self.elapsed(), ended_at=time.time())
        view = reread_loop(self.ledger, view, elapsed_s=self.elapsed())  # its trials are as they were
        if self.on_update is not None:
            self.on_update(view)
        return view

    # -- propose and launch ---------------------------------------------------------------

    def ahead(self) -> int:
        """Trials submitted ahead of the free slots (queue ahead): ``parallel // 4`` (none below
        parallel 4: a sequential loop's proposer sees every result before it proposes), or a whole
        ``parallel`` for a proposer whose proposals never depend on results (random, grid: there
        are then enough waiting to cover the loop's own turnover of short trials). They wait
        queued in the loop's job group, whose running cap is ``parallel``
        (:meth:`LoopState.window`), so the pass that records a trial's end starts the next one at
        once: no round trip through the loop, no propose() call first (a model's fit, an LLM's
        answer). Never beyond the trial budget (they count against it); a stop cancels the ones
        still queued and leaves them ``skipped`` ("not launched: <reason>"), never failed."""
        parallel = self.plan.budget.parallel
        if parallel < 4:
            return 0
        return parallel // 4 if getattr(self.proposer, "learns", True) else parallel

    def _want(self) -> int:
        """Trials to propose now: the room in the window (running and queued ahead) that no
        proposed trial will take, within the trial budget (proposed ones count against it)."""
        s = self.state
        pending = len(s.proposed)
        if s.ordered:  # trial k once k - window trials took effect (loop/ordered.py)
            return min(len(s.processed) + s.window() - len(s.rows), self.plan.budget.trials - s.launched() - pending)
        return min(s.window() - len(s.active), self.plan.budget.trials - s.launched()) - pending

    def _refill_at(self) -> int:
        """The fewest trials to propose and submit at once. For a proposer that learns nothing from
        results (random, grid; :meth:`ahead` queues a whole ``parallel`` for it), half the queue
        ahead: trials that end one at a time are then proposed and submitted several at once (each
        batch costs the controller a proposal record, a launch decision, a submit's checks and
        transaction and the trials' rows, whatever its size: ~1 ms of its CPU a trial for 0.2 s
        trials) while the other half still waits queued for the next endings, so no slot waits for
        it. One for a proposer that learns (each proposal sees every result so far), when a slot
        is free (the first wave, trials failing at once), and for the trial budget's last trials."""
        s = self.state
        half = self.ahead() // 2
        if half <= 1 or getattr(self.proposer, "learns", True):
            return 1
        if sum(1 for row in s.active.values() if row["state"] == "running") < self.plan.budget.parallel:
            return 1
        return max(1, min(half, self.plan.budget.trials - s.launched() - len(s.proposed)))

    def _fill(self) -> None:
        """Propose what is wanted, then launch what fits, as one batch (``jobs.submit_many``). A
        proposer that blocks proposes on its thread; its trials launch on a later pass."""
        s = self.state
        if s.stop_reason:
            return
        self.runs.pump()
        if self.call is not None and not self.call.is_alive():
            call, self.call = self.call, None
            if call.error is not None:
                raise call.error
            assert call.result is not None
            self._accept(call.result, call_n=call.n)
        if not self.proposer.blocking and self._want() >= self._refill_at():
            self.propose_now()
        take = max(0, min(s.window() - len(s.active), self.plan.budget.trials - s.launched()))
        # held: its MLflow run is being created; it keeps its slot
        ready = [row for row in s.pending()[:take] if row["id"] not in self.runs.held]
        if ready:
            self.sigint.check()
            launch_many(s, ready, self.proposer, self.runtime)  # one batch submit (jobs.submit_many), capped
        if self.proposer.blocking and self.call is None and not s.exhausted and (n := self._want()) > 0:
            n = min(n, self.plan.proposer.batch or n)
            history = list(s.history())  # the thread's own copy: ours changes as trials end
            self.call = ProposeCall(lambda: timed(self.proposer, history, n), n)
            self.call.start()

    def propose_now(self) -> None:
        """Propose what is wanted now (:meth:`_want`), with a proposer that does not block."""
        s = self.state
        if self.proposer.blocking or s.stop_reason:
            return
        for _ in range(self.plan.budget.parallel + self.ahead() + 1):  # a proposer that gives fewer: ask again
            n = self._want()
            if n <= 0 or s.exhausted:
                break
            before = len(s.proposed)
            n = min(n, self.plan.proposer.batch or n)
            self._accept(timed(self.proposer, s.history(), n), call_n=n)
            if len(s.proposed) == before:
                break

    def _accept(self, result: ProposeResult, call_n: int) -> None:
        s = self.state
        room = self.plan.budget.trials - s.launched() - len(s.pending())
        proposals = result.proposals[: max(0, room)]
        if not result.proposals:
            s.exhausted = True
        seed = 0
        ids = s.store.record_proposals(result, proposals, inputs={"asked": call_n, "history": s.launched()},
                                       seeds=[seed] * len(proposals), now=s.now_ts())
        self.proposed(ids)

    def proposed(self, ids: list[int]) -> None:
        """New trials were recorded: mirror them and start creating their MLflow runs."""
        self.state.reload(ids)
        self.runs.prepare(ids)

    def request_stop(self, reason: str = "stopped by request", stop_trials: bool = True) -> None:
        """Ask a running loop (in another thread, e.g. the MCP server's) to end within ~1 s.

        ``stop_trials``: stop its running trials (recorded as stop decisions) and finish;
        otherwise leave them running and return with the loop ``interrupted`` (resumable)."""
        self._external_stop = (reason, stop_trials)
        if self.watcher is not None:
            wake(self.ledger.home)

    def stop_running(self, reason: str = "stopped by the user") -> list[int]:
        """Stop every running trial of this loop (after an interrupt); returns their job ids."""
        from autoresearch.loop import ops

        return ops.stop_running(self.runtime, self.plan.name, reason)
