"""The controller: propose -> launch -> evaluate -> replan, event driven, resumable.

It keeps ``budget.parallel`` trials in flight and, as soon as one ends, evaluates it
and launches the next (no generation barrier). Each step is a decision written to
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

With tracking on, each batch of new trials gets its MLflow runs (and the loop's parent
run) from :func:`autoresearch.tracking.prepare_runs` before the trials launch (in a helper
process, :mod:`autoresearch.loop._prepare_runs`, driven from a worker thread), so their
attempts get ``MLFLOW_RUN_ID``. A trial waits for that at most ``PREPARE_HOLD_S``; a tracking failure or a slow store only means later trials launch
without the variable (the background syncer still mirrors them).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autoresearch.errors import AutoresearchError, BackendError, PlanError, StateError
from autoresearch.loop import evaluator as E
from autoresearch.loop.plan import Plan, plan_json
from autoresearch.loop.proposers import (
    Proposal,
    ProposerContext,
    ProposeResult,
    ProposerInfo,
    TrialRecord,
    make_proposer,
)
from autoresearch.loop.store import ACTIVE_TRIAL, LoopStore, to_record
from autoresearch.loop.views import LoopView, incumbent_of, loop_view, seed_groups

LOG_TAIL_LINES = 30
PREPARE_HOLD_S = 30.0  # longest a trial waits for its MLflow run before it launches without MLFLOW_RUN_ID


class LoopInterrupted(AutoresearchError):
    """Ctrl-C: the loop stopped proposing; its running trials are left as they are."""

    code = "interrupted"
    exit_code = 130

    def __init__(self, view: LoopView, running_jobs: list[int]) -> None:
        super().__init__(f"loop {view.name} interrupted with {len(running_jobs)} trial(s) still running",
                         hint=_stop_hint(view.name, running_jobs))
        self.view = view
        self.running_jobs = running_jobs


def _stop_hint(name: str, jobs: list[int]) -> str:
    stop = f"stop them with `autoresearch cancel {' '.join(map(str, jobs))}`; " if jobs else ""
    return f"{stop}continue the loop (adopting them) with `autoresearch run <plan.yaml> --resume`"


class _Call(threading.Thread):
    """A propose() call off the main thread (LLMs and agents block)."""

    def __init__(self, fn: Callable[[], ProposeResult], n: int) -> None:
        super().__init__(daemon=True, name="autoresearch-propose")
        self.n = n
        self.fn, self.result, self.error = fn, None, None  # type: Callable[[], ProposeResult], ProposeResult | None, BaseException | None

    def run(self) -> None:
        try:
            self.result = self.fn()
        except BaseException as err:  # noqa: BLE001 - handed to the main thread
            self.error = err


class _RunMaker:
    """The helper process that creates trials' MLflow runs (:mod:`autoresearch.loop._prepare_runs`),
    started on first use; one request at a time (from one :class:`_Prepare` thread)."""

    def __init__(self, home: Any) -> None:
        self.home = home
        self.proc: subprocess.Popen[str] | None = None

    def ask(self, ids: list[int]) -> dict[int, str]:
        if self.proc is None:  # its messages (mlflow's too) go where the syncer's go, not over the live table
            with open(Path(self.home) / "tracking.log", "ab") as log:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "autoresearch.loop._prepare_runs", str(self.home)],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(ids) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise OSError(f"the helper exited with code {self.proc.wait()}")
        return {int(k): str(v) for k, v in json.loads(line).items()}

    def close(self, wait_s: float = 5.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError):
            assert proc.stdin is not None
            proc.stdin.close()  # it exits at the end of its input
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


class _Prepare(threading.Thread):
    """One batch of trials' MLflow runs, asked of the helper off the event loop.
    An empty batch only warms the helper up: the mlflow import, the store, the binding."""

    def __init__(self, maker: _RunMaker, ids: list[int]) -> None:
        super().__init__(daemon=True, name="autoresearch-prepare-runs")
        self.maker, self.ids = maker, ids
        self.failed = False

    def run(self) -> None:
        prepared: dict[int, str] = {}
        try:
            prepared = self.maker.ask(self.ids)
        except Exception as err:  # noqa: BLE001 - tracking never stops the loop
            print(f"autoresearch: tracking: cannot create the trials' MLflow runs ({type(err).__name__}: {err}); "
                  "trials run without MLFLOW_RUN_ID, the background sync mirrors them later", file=sys.stderr)
            self.failed = True
        self.failed = self.failed or len(prepared) < len(self.ids)


class Controller:
    def __init__(self, plan: Plan, *, api: Any = None, home: str | os.PathLike[str] | None = None,
                 resume: bool = False, on_update: Callable[[LoopView], None] | None = None,
                 poll_s: float = 0.01, update_every_s: float = 0.25, monitor_every_s: float = 0.5,
                 project: str | None = None) -> None:
        """``project``: the project a new loop belongs to (None: ''); an existing loop keeps its own,
        and a loop of another project is refused."""
        self.plan = plan
        self.resume = resume
        self.project = project
        self.loop_project = project or ""
        self.on_update = on_update
        self.poll_s, self.update_every_s, self.monitor_every_s = poll_s, update_every_s, monitor_every_s
        if api is None:
            from autoresearch.api import Api
            from autoresearch.backends import get_backend

            backend = get_backend(plan.backend.kind, **plan.backend.options)
            api = Api(home, backend=backend)
        self.api = api
        self.ledger = api.ledger
        self.sign = plan.objective.sign()
        self.stopper = E.make_stopper(plan.early_stop)
        self.watch_metrics = self.stopper is not None or on_update is not None
        self.series: dict[int, list[tuple[int, float]]] = {}  # trial -> signed objective series
        self.active: dict[int, Any] = {}  # trial id -> trials row (queued/running with a job)
        self.stopping: set[int] = set()
        self.exhausted = False
        self.stop_reason = ""
        self.call: _Call | None = None
        self._lock_fd: int | None = None
        self._last_update = self._last_monitor = self._last_persist = self._last_tick = 0.0
        self.safety_poll_s = 1.0  # reconcile at least this often (an attempt killed -9 pokes nobody)
        self.watcher: Any = None
        self._woke = True
        self._retry_tick = False
        self.already_finished = False
        self._external_stop: tuple[str, bool] | None = None
        # An in-memory mirror of this loop's trial rows (the ledger stays the truth; this
        # saves O(trials) queries per event, which a 500-trial sweep would feel).
        self.rows: dict[int, dict[str, Any]] = {}
        self.records: dict[int, TrialRecord] = {}
        self.state_counts: Counter[str] = Counter()
        # MLflow runs created ahead of launch (tracking on): one worker at a time, batches queued.
        self.tracking = False
        self._prep: _Prepare | None = None
        self._run_maker: _RunMaker | None = None
        self._prep_queue: list[int] = []
        self._held: dict[int, float] = {}  # trial id -> monotonic deadline: waiting for its MLflow run
        self._prep_hold_s = PREPARE_HOLD_S

    # -- lifecycle --------------------------------------------------------------------------

    def open(self) -> None:
        """Everything that can fail before a trial launches: backend, capacity, lock, proposer, loop row."""
        try:
            self.api.runtime.refresh_nodes()
        except AutoresearchError:
            raise
        except Exception as err:  # noqa: BLE001 - any backend failure is "unreachable"
            raise BackendError(f"backend {self.plan.backend.kind!r} is unreachable: {err}",
                               hint="start it, fix backend.options, or use backend: {kind: local}") from None
        if self.plan.trial.gpus:
            self.api._check_capacity(self.plan.trial.gpus, 1)
        lock_dir = self.ledger.home / "loops" / self.plan.name
        lock_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_dir / "controller.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StateError(f"loop {self.plan.name!r} is already running in another process",
                             hint="watch it there, or stop that process first (Ctrl-C)") from None
        self._lock_fd = fd
        existing = LoopStore.find(self.ledger, self.plan.name)
        if existing is not None:
            if self.project is not None and existing["project"] != self.project:
                raise StateError(f"the loop name {self.plan.name!r} is taken by another project",
                                 hint="change name: in the plan")
            self.loop_project = existing["project"]
        self.ctx = ProposerContext(self.plan, existing["id"] if existing else 0, self.plan.name, self.ledger.home,
                                   self.api)
        self.proposer = make_proposer(self.ctx)  # may raise (missing key): nothing exists yet
        self.started = time.monotonic()
        digest = self.plan.digest()
        if existing is None:
            self.store = LoopStore.create(self.ledger, self.plan.name, plan_json(self.plan), digest, self.plan.name,
                                          project=self.loop_project)
            self.prior_elapsed = 0.0
        else:
            self.store = LoopStore(self.ledger, existing["id"])
            has_trials = bool(self.store.trials())
            if existing["digest"] != digest and has_trials and not self.resume:
                raise PlanError(f"a loop named {self.plan.name!r} already exists with a different plan",
                                hint="pass --resume to continue it under this plan, or change name: to start anew")
            self.prior_elapsed = float(existing["elapsed_s"] or 0.0)
            if existing["state"] == "finished" and existing["digest"] == digest:
                self.already_finished = True  # the same plan again: nothing to redo, no decision to add
                return
            self.store.set_loop(state="running", plan=plan_json(self.plan), digest=digest, ended_at=None)
            self._adopt(changed=existing["digest"] != digest and has_trials)
        self.ctx.loop_id = self.store.loop_id
        self._reload()
        from autoresearch import tracking

        self.tracking = tracking.tracking_enabled()
        # Warm up (mlflow import, the store) while the first proposal is made; runs for resumed trials.
        self._prepare([r["id"] for r in self._pending()], warm=True)
        self.launch_decided = {r["trial_id"] for r in self.ledger.query(
            "SELECT trial_id FROM decisions WHERE loop_id=? AND kind='launch'", (self.store.loop_id,))}
        watch = getattr(self.api.runtime, "watch", None)
        if watch is not None:
            self.watcher = watch()
        self.incumbent = incumbent_of(self.ledger, self.store.loop_id)

    def _adopt(self, changed: bool) -> None:
        rows = self.store.trials()
        if not rows:
            return
        running = [r for r in rows if r["state"] in ("queued", "running")]
        pending = [r for r in rows if r["state"] == "proposed"]
        for r in running:
            self.active[r["id"]] = r
            if r["id"] not in self.series and self.stopper is not None:
                series = self._read_series([r])
                self.stopper.adopt(r["id"], series.get(r["id"], []))
        ended = len(rows) - len(running) - len(pending)
        self.store.decide("replan", inputs={"adopted_trials": [r["id"] for r in running],
                                            "pending_trials": [r["id"] for r in pending], "ended_trials": ended,
                                            "plan_changed": changed},
                          rationale=f"resumed: adopting {len(running)} running trial(s), {ended} already ended"
                                    + ("; the plan changed" if changed else ""))

    def _reload(self, ids: list[int] | None = None) -> None:
        """Refresh the mirror from the ledger: every trial, or just ``ids``."""
        if ids is None:
            fresh = self.store.trials()
        elif ids:
            fresh = self.ledger.query(f"SELECT * FROM trials WHERE id IN ({','.join('?' * len(ids))})", tuple(ids))
        else:
            return
        for r in fresh:
            row = dict(r)
            old = self.rows.get(row["id"])
            if old is not None:
                self.state_counts[old["state"]] -= 1
            self.rows[row["id"]] = row
            self.state_counts[row["state"]] += 1
            self.records[row["id"]] = to_record(row)

    def _update_trial(self, trial_id: int, **fields: Any) -> dict[str, Any]:
        self.store.update_trial(trial_id, **fields)
        row = dict(self.rows[trial_id])  # the ledger now holds exactly this (plus updated_at)
        row.update(fields, updated_at=time.time())
        self.state_counts[self.rows[trial_id]["state"]] -= 1
        self.state_counts[row["state"]] += 1
        self.rows[trial_id] = row
        self.records[trial_id] = to_record(row)
        return row

    def _pending(self) -> list[dict[str, Any]]:
        return sorted((r for r in self.rows.values() if r["state"] == "proposed"), key=lambda r: r["id"])

    def _wait(self) -> None:
        """Sleep until an attempt ends (the runtime's watcher), a proposal is due, or the monitor is."""
        if self.watcher is None:
            time.sleep(self.poll_s)
            self._woke = True
            return
        if self.call is not None or self._retry_tick or self._held:
            timeout = self.poll_s
        elif self.watch_metrics and self.active:
            timeout = max(self.poll_s, self.monitor_every_s - (time.monotonic() - self._last_monitor))
        else:
            timeout = self.safety_poll_s
        if self.on_update is not None:
            timeout = min(timeout, self.update_every_s)
        self._woke = (bool(self.watcher.wait(timeout)) or self._retry_tick
                      or time.monotonic() - self._last_tick >= self.safety_poll_s)

    def close(self) -> None:
        if self._prep is not None:  # a run being created now: let it finish (bounded; it is a daemon thread)
            self._prep.join(timeout=5)
        if self._run_maker is not None:
            self._run_maker.close(wait_s=0 if self._prep is not None and self._prep.is_alive() else 5)
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
        return self.prior_elapsed + time.monotonic() - self.started

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
        try:
            while True:
                if self._external_stop is not None:
                    reason, stop_trials = self._external_stop
                    if not stop_trials:
                        self.store.set_loop(state="interrupted", elapsed_s=self.elapsed())
                        return self.view()
                    self.stop_reason = self.stop_reason or reason
                self._poll()
                if self._done():
                    break
                self._fill()
                self._update()
                self._wait()
            return self._finish()
        except KeyboardInterrupt:
            self.store.set_loop(state="interrupted", elapsed_s=self.elapsed())
            running = [r["job_id"] for r in self.active.values() if r["job_id"] is not None]
            raise LoopInterrupted(self.view(), running) from None
        except BaseException:
            with contextlib.suppress(Exception):
                self.store.set_loop(state="failed", elapsed_s=self.elapsed())
            raise
        finally:
            self.close()

    def view(self) -> LoopView:
        live = {t: s[-1] for t, s in self.series.items() if s and t in self.active}
        live = {t: (step, value * self.sign) for t, (step, value) in live.items()}
        return loop_view(self.ledger, self.plan.name, live=live, elapsed_s=self.elapsed())

    def _update(self, force: bool = False) -> None:
        now = time.monotonic()
        if now - self._last_persist > 5:
            self._last_persist = now
            self.store.set_loop(elapsed_s=self.elapsed())
        if self.on_update is not None and (force or now - self._last_update >= self.update_every_s):
            self._last_update = now
            self.on_update(self.view())

    # -- evaluate -----------------------------------------------------------------------------

    def _poll(self) -> None:
        runtime = self.api.runtime
        if self._woke:  # also for other jobs: while our watcher is open their supervisors poke us too
            # With a watcher open, supervisors poke us instead of running the pass: we run it.
            self._retry_tick = not runtime.tick(wait=False)
            self._last_tick = time.monotonic()
            self._woke = False
            ids = [r["job_id"] for r in self.active.values()]
            marks = ",".join("?" * len(ids))
            jobs = {j["id"]: j for j in self.ledger.query(
                f"SELECT id, state, end_reason, exit_code, started_at, ended_at FROM jobs WHERE id IN ({marks})",
                tuple(ids))}
            for trial_id, row in list(self.active.items()):
                job = jobs.get(row["job_id"])
                if job is None:
                    continue
                if job["state"] in ("succeeded", "failed", "cancelled"):
                    self._ended(trial_id, row, job)
                elif job["state"] in ("starting", "running") and row["state"] == "queued":
                    self.active[trial_id] = self._update_trial(trial_id, state="running",
                                                               started_at=job["started_at"] or time.time())
        now = time.monotonic()
        if self.watch_metrics and self.active and now - self._last_monitor >= self.monitor_every_s:
            self._last_monitor = now
            self._monitor()
        self._check_limits()

    def _read_series(self, rows: list[Any]) -> dict[int, list[tuple[int, float]]]:
        by_job = {r["job_id"]: r["id"] for r in rows if r["job_id"] is not None}
        if not by_job:
            return {}
        for job_id in by_job:
            self.api.runtime.ingest(job_id)
        marks = ",".join("?" * len(by_job))
        points = self.ledger.query(
            f"SELECT job_id, attempt, step, value, source FROM metrics WHERE name=? AND job_id IN ({marks}) "
            "AND value IS NOT NULL ORDER BY job_id, attempt, step, rowid", (self.plan.objective.metric, *by_job))
        out: dict[int, list[tuple[int, float]]] = {}
        reported = {(p["job_id"], p["attempt"]) for p in points if p["source"] == "report"}
        last_attempt: dict[int, int] = {}
        for p in points:
            last_attempt[p["job_id"]] = max(last_attempt.get(p["job_id"], 0), p["attempt"])
        for p in points:
            if p["attempt"] != last_attempt[p["job_id"]]:
                continue
            if p["source"] == "log" and (p["job_id"], p["attempt"]) in reported:
                continue
            out.setdefault(by_job[p["job_id"]], []).append((int(p["step"]), self.sign * float(p["value"])))
        for trial_id in out:
            out[trial_id].sort(key=lambda sv: sv[0])
        self.series.update(out)
        return out

    def _monitor(self) -> None:
        running = [r for r in self.active.values() if r["state"] == "running"]
        fresh = self._read_series(running)
        if self.stopper is None:
            return
        if not getattr(self, "_history_loaded", False):  # ended trials' curves, once (after a resume)
            self._history_loaded = True
            ended = [r for r in self.rows.values()
                     if r["state"] in ("succeeded", "stopped") and r["id"] not in self.series]
            self._read_series(ended)
        others = {t: s for t, s in self.series.items()}
        for trial_id, series in fresh.items():
            if trial_id in self.stopping or trial_id not in self.active or self.active[trial_id]["role"] == "repeat":
                continue
            verdict = self.stopper.check(trial_id, series, others)
            if verdict is not None:
                self._stop(trial_id, verdict.rationale, {"rule": verdict.rule, "step": verdict.step,
                                                         "value": verdict.value * self.sign,
                                                         "threshold": verdict.threshold * self.sign})

    def _stop(self, trial_id: int, rationale: str, inputs: dict[str, Any]) -> None:
        row = self.active[trial_id]
        self.stopping.add(trial_id)
        self.store.decide("stop", trial_id=trial_id, inputs={"job_id": row["job_id"], **inputs},
                          outputs={"action": "cancel", "grace_s": self.plan.trial.grace}, rationale=rationale)
        self.api.cancel([row["job_id"]])

    def _ended(self, trial_id: int, row: Any, job: Any) -> None:
        del self.active[trial_id]
        summary = self._final_metrics(job["id"])
        value = summary.get(self.plan.objective.metric)
        failure = None
        fields: dict[str, Any] = {"metrics": json.dumps(summary), "ended_at": job["ended_at"] or time.time(),
                                  "started_at": row["started_at"] or job["started_at"]}
        if job["state"] == "succeeded":
            state = "succeeded" if value is not None else "failed"
            if value is None:
                failure = (f"exited 0 but never reported the objective {self.plan.objective.metric!r} "
                           f"(report({self.plan.objective.metric}=...) or print '{self.plan.objective.metric}: "
                           "VALUE')\n" + self._log_tail(job["id"]))
        elif job["state"] == "cancelled":
            stopped = trial_id in self.stopping or self.store.has_decision("stop", trial_id)
            state = "stopped" if stopped else "cancelled"
            series = self.series.get(trial_id)
            if value is None and series:
                value = series[-1][1] * self.sign
        elif job["end_reason"] == "infra":
            state, failure = "crashed", "infrastructure failure after retries\n" + self._log_tail(job["id"])
        else:
            state = "failed"
            why = "timed out" if job["end_reason"] == "timeout" else f"exited {job['exit_code']}"
            failure = f"{why}\n" + self._log_tail(job["id"])
        self.stopping.discard(trial_id)
        fresh = self._update_trial(trial_id, state=state, objective=value, failure=failure, **fields)
        record = to_record(fresh, self.series.get(trial_id))
        if record.intermediate:
            record.intermediate = [(s, v * self.sign) for s, v in record.intermediate]
        self.proposer.observe(record)
        if state == "succeeded" and value is not None:
            self._judge(fresh)
        self._update(force=True)

    def _final_metrics(self, job_id: int) -> dict[str, float | None]:
        """Last value of every metric of an ended job (what Api.metrics reports as ``last``;
        the runtime ingested everything when the attempt ended, so one query suffices)."""
        points = self.ledger.query("SELECT name, value, source FROM metrics WHERE job_id=? "
                                   "ORDER BY attempt, step, rowid", (job_id,))
        reported = {p["name"] for p in points if p["source"] == "report"}
        out: dict[str, float | None] = {}
        for p in points:
            if p["source"] == "log" and p["name"] in reported:
                continue
            out[p["name"]] = p["value"]
        return out

    def _log_tail(self, job_id: int) -> str:
        try:
            return str(self.api.logs(job_id, tail_lines=LOG_TAIL_LINES, max_bytes=4000).text)
        except AutoresearchError:
            return ""

    def _judge(self, row: Any) -> None:
        """Keep or discard: a finished explore trial against the incumbent, beyond the noise floor."""
        trials = list(self.rows.values())
        groups = seed_groups(trials)
        noise = E.noise_floor(list(groups.values()))
        if row["role"] == "repeat":
            return  # repeats only refine the incumbent's mean and the noise floor
        inc_value = None
        if self.incumbent is not None:
            inc = next((t for t in trials if t["id"] == self.incumbent), None)
            if inc is not None and inc["objective"] is not None:
                values = groups.get(self.incumbent, [inc["objective"]])
                inc_value = self.sign * sum(values) / len(values)
        verdict = E.judge(self.sign * row["objective"], inc_value, noise)
        self.store.decide("promote", trial_id=row["id"], rationale=verdict.rationale,
                          inputs={"candidate": row["objective"], "incumbent_trial": self.incumbent,
                                  "incumbent_value": None if inc_value is None else inc_value * self.sign,
                                  "noise_floor": noise},
                          outputs={"promoted": verdict.promote, "trial_id": row["id"],
                                   "margin": None if verdict.margin == float("inf") else verdict.margin})
        if not verdict.promote:
            return
        self.incumbent = row["id"]
        target = self.plan.objective.target
        if target is not None and self.sign * row["objective"] <= self.sign * target:
            self.stop_reason = self.stop_reason or f"target {target:g} reached by trial {row['id']}"
        if self.plan.repeats is not None:
            seeds = list(range(1, self.plan.repeats.seeds))
            params = json.loads(row["params"])
            proposals = [Proposal(params, rationale=f"seed {s} of new incumbent #{row['id']} (noise floor)",
                                  patch=row["patch"], parent_trial=row["id"]) for s in seeds]
            info = ProposerInfo(kind="noise-floor")
            ids = self.store.record_proposals(
                ProposeResult(proposals, info, rationale=f"re-run incumbent #{row['id']} with seeds {seeds} to "
                                                         "measure the noise floor"),
                proposals, inputs={"incumbent": row["id"]}, role="repeat", seeds=seeds)
            self._reload(ids)
            self._prepare(ids)

    # -- budgets and the end ----------------------------------------------------------------

    def _launched(self) -> int:
        return sum(n for s, n in self.state_counts.items() if s not in ("proposed", "crashed", "skipped"))

    def _check_limits(self) -> None:
        b = self.plan.budget
        reason = self.stop_reason
        if not reason and b.wall is not None and self.elapsed() >= b.wall:
            reason = f"wall budget {b.wall:g}s used"
        if not reason and b.gpu_hours is not None and self._gpu_hours() >= b.gpu_hours:
            reason = f"gpu_hours budget {b.gpu_hours:g} used"
        if not reason and b.llm_usd is not None and self.store.llm_cost() >= b.llm_usd:
            reason = f"llm_usd budget ${b.llm_usd:g} used"
        if not reason and self.state_counts["crashed"] >= b.trials:
            reason = "every trial crashed on infrastructure failures; check `autoresearch nodes`"
        if not reason:  # the MCP tool stop_loop (autoresearch/loop/proposers/agent.py) records this decision
            stop = self.ledger.one("SELECT rationale FROM decisions WHERE loop_id=? AND kind='stop_loop' AND "
                                   "created_at>=? LIMIT 1", (self.store.loop_id, time.time() - self.elapsed()
                                                             + self.prior_elapsed))
            reason = f"stopped by stop_loop: {stop['rationale']}" if stop is not None else ""
        if reason and not self.stop_reason:
            self.stop_reason = reason
        hard = self.stop_reason and not self.stop_reason.startswith(("llm_usd", "gpu_hours"))
        if hard:
            for trial_id in list(self.active):
                if trial_id not in self.stopping and self.active[trial_id]["job_id"] is not None:
                    self._stop(trial_id, f"stopping the loop: {self.stop_reason}", {"reason": self.stop_reason})

    def _gpu_hours(self) -> float:
        if not self.plan.trial.gpus:
            return 0.0
        row = self.ledger.one(
            "SELECT COALESCE(SUM(COALESCE(j.ended_at, ?) - j.started_at), 0) AS s FROM trials t JOIN jobs j "
            "ON j.id=t.job_id WHERE t.loop_id=? AND j.started_at IS NOT NULL", (time.time(), self.store.loop_id))
        return float(row["s"] if row else 0.0) * self.plan.trial.gpus / 3600

    def _done(self) -> bool:
        if self.active:
            return False
        if self.stop_reason:  # _fill no longer collects a call that ends after the stop: do not wait for it
            return self.call is None or not self.call.is_alive()
        if self.call is not None:
            return False
        pending = self._pending()
        if self._launched() >= self.plan.budget.trials:
            self.stop_reason = f"trial budget {self.plan.budget.trials} used"
            return True
        if self.exhausted and not pending:
            self.stop_reason = "the proposer has nothing more to propose (space exhausted)"
            return True
        return False

    def _finish(self) -> LoopView:
        for row in self._pending():
            self._update_trial(row["id"], state="skipped", failure=f"not launched: {self.stop_reason}")
        view = self.view()
        self.store.decide("finish", inputs={"counts": view.counts, "elapsed_s": self.elapsed()},
                          outputs={"reason": self.stop_reason, "best_trial": view.best_trial,
                                   "best_value": view.best_value, "noise_floor": view.noise_floor},
                          rationale=f"loop finished: {self.stop_reason}")
        self.store.set_loop(state="finished", elapsed_s=self.elapsed(), ended_at=time.time())
        view = self.view()
        if self.on_update is not None:
            self.on_update(view)
        return view

    # -- propose and launch ---------------------------------------------------------------

    def _fill(self) -> None:
        if self.stop_reason:
            return
        self._pump_prep()
        budget_left = self.plan.budget.trials - self._launched()
        slots = self.plan.budget.parallel - len(self.active)
        for row in self._pending():
            if slots <= 0 or budget_left <= 0:
                return
            if row["id"] not in self._held:  # held: its MLflow run is being created; it keeps its slot
                self._launch(row)
            slots, budget_left = slots - 1, budget_left - 1
        if self.call is not None:
            if self.call.is_alive():
                return
            call, self.call = self.call, None
            if call.error is not None:
                raise call.error
            assert call.result is not None
            self._accept(call.result, call_n=call.n)
            return self._fill()
        n = min(slots, budget_left, self.plan.proposer.batch or slots)
        if n <= 0 or self.exhausted:
            return
        history = [self.records[t] for t in sorted(self.records)]
        if self.proposer.blocking:
            self.call = _Call(lambda: self._timed(history, n), n)
            self.call.start()
            return
        self._accept(self._timed(history, n), call_n=n)
        if self._pending():
            self._fill()

    def _timed(self, history: list[Any], n: int) -> ProposeResult:
        t0 = time.perf_counter()
        result = self.proposer.propose(history, n)
        if not result.latency_s:
            result.latency_s = time.perf_counter() - t0
        return result

    def _accept(self, result: ProposeResult, call_n: int) -> None:
        room = self.plan.budget.trials - self._launched() - len(self._pending())
        proposals = result.proposals[: max(0, room)]
        if not result.proposals:
            self.exhausted = True
        seed = 0
        ids = self.store.record_proposals(result, proposals, inputs={"asked": call_n, "history": self._launched()},
                                          seeds=[seed] * len(proposals))
        self._reload(ids)
        self._prepare(ids)

    def _prepare(self, ids: list[int], warm: bool = False) -> None:
        """Have the MLflow runs of new trials created (one worker thread, batches queued) and
        hold their launch until then, at most ``PREPARE_HOLD_S``. ``warm``: start the worker
        even with no trial, to pay the mlflow import and open the store early."""
        if not self.tracking or not (ids or warm):
            return
        if ids and self._prep_hold_s > 0:
            self._held.update(dict.fromkeys(ids, time.monotonic() + self._prep_hold_s))
        self._prep_queue.extend(ids)
        self._pump_prep(start=warm)

    def _pump_prep(self, start: bool = False) -> None:
        """Collect a finished worker, start the next batch, release trials held too long."""
        if self._prep is not None and not self._prep.is_alive():
            done, self._prep = self._prep, None
            for trial_id in done.ids:
                self._held.pop(trial_id, None)
            if done.failed:  # the store is unusable: stop trying in this run; the syncer catches up later
                self.tracking = False
                self._prep_queue.clear()
                self._held.clear()
        if self._prep is None and self.tracking and (self._prep_queue or start):
            ids, self._prep_queue = self._prep_queue, []
            if self._run_maker is None:
                self._run_maker = _RunMaker(self.ledger.home)
            self._prep = _Prepare(self._run_maker, ids)
            self._prep.start()
        if self._held:
            now = time.monotonic()
            late = [t for t, deadline in self._held.items() if deadline <= now]
            for trial_id in late:
                del self._held[trial_id]
            if late:  # a slow store: these launch without MLFLOW_RUN_ID, and no later trial waits
                self._prep_hold_s = 0.0

    def _launch(self, row: Any) -> None:
        trial_id = row["id"]
        params = json.loads(row["params"])
        job_id = self.store.job_of_trial(trial_id) if trial_id in self.launch_decided else None
        if job_id is None:
            workdir = self.proposer.workdir_for(trial_id, Proposal(params, row["rationale"], row["patch"],
                                                                   row["parent_trial"])) or self.plan.trial.workdir
            command = self.plan.render_command(params, int(row["seed"] or 0), trial_id)
            spec = self._spec(row, params, command, workdir)
            if trial_id not in self.launch_decided:
                self.launch_decided.add(trial_id)
                self.store.decide("launch", trial_id=trial_id, rationale=row["rationale"],
                                  inputs={"params": params, "seed": row["seed"], "role": row["role"],
                                          "workdir": workdir, "command": command})
            try:
                view = self.api.submit(spec, project=self.loop_project)
            except AutoresearchError as err:
                self._update_trial(trial_id, state="failed", failure=f"could not submit: {err.render()}",
                                   ended_at=time.time(), workdir=workdir)
                self.proposer.observe(self.records[trial_id])
                return
            job_id = view.id
            row = self._update_trial(trial_id, job_id=job_id, state="queued", workdir=workdir)
        else:
            row = self._update_trial(trial_id, job_id=job_id, state="queued")
        self.active[trial_id] = row

    def _spec(self, row: Any, params: dict[str, Any], command: list[str] | str, workdir: str) -> dict[str, Any]:
        t = self.plan.trial
        env = {**t.env, "AUTORESEARCH_LOOP": self.plan.name, "AUTORESEARCH_TRIAL_ID": str(row["id"]),
               "AUTORESEARCH_SEED": str(row["seed"] or 0), "AUTORESEARCH_PARAMS": json.dumps(params)}
        tags = {**self.plan.tags, "autoresearch.loop": self.plan.name, "autoresearch.loop_id": str(self.store.loop_id),
                "autoresearch.trial_id": str(row["id"]), "autoresearch.decision_id": str(row["decision_id"]),
                "autoresearch.role": row["role"]}
        return {"name": f"{self.plan.name}-t{row['id']}", "command": command, "shell": t.shell, "workdir": workdir,
                "env": env, "gpus": t.gpus, "cpus": t.cpus, "memory": t.memory, "priority": t.priority,
                "max_retries": t.max_retries, "timeout": t.timeout, "grace": t.grace, "checkpoint": t.checkpoint,
                "experiment": self.plan.name, "tags": tags}

    def request_stop(self, reason: str = "stopped by request", stop_trials: bool = True) -> None:
        """Ask a running loop (in another thread, e.g. the MCP server's) to end within ~1 s.

        ``stop_trials``: stop its running trials (recorded as stop decisions) and finish;
        otherwise leave them running and return with the loop ``interrupted`` (resumable)."""
        self._external_stop = (reason, stop_trials)
        if self.watcher is not None:
            with contextlib.suppress(OSError):
                from autoresearch import runtime

                fifo = self.ledger.home / getattr(runtime, "WAKE_FIFO", "wake.fifo")
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
                os.write(fd, b"x")
                os.close(fd)

    def stop_running(self, reason: str = "stopped by the user") -> list[int]:
        """Stop every running trial of this loop (after an interrupt); returns their job ids."""
        jobs = []
        for row in self.store.trials(ACTIVE_TRIAL):
            if row["job_id"] is None:
                continue
            self.store.decide("stop", trial_id=row["id"], inputs={"job_id": row["job_id"], "reason": reason},
                              outputs={"action": "cancel"}, rationale=reason)
            jobs.append(row["job_id"])
        if jobs:
            self.api.cancel(jobs)
        return jobs
