"""The engine: one reconcile + scheduling pass over the ledger and a backend.

Nobody has to keep a terminal open (see docs/DESIGN-NOTES.md): a pass runs

* at the end of every submit and cancel (CLI, MCP, Python API), and on every read
  that can see stale state (``status``, ``list``, ``nodes``) when no other pass is
  running — reads never wait for the lock;
* when an attempt ends: its supervisor execs ``python -m autoresearch.runtime``,
  which reconciles that ending and starts whatever can start now.

A pass holds an exclusive file lock, so two processes never place the same job,
and every action is written to the ledger before it is taken (write-ahead).
"""

from __future__ import annotations

import json
import os
import signal as _signal
import sys
import time
from pathlib import Path
from typing import Any

from autoresearch import scheduler as S
from autoresearch.backends import AttemptStatus, Backend, LaunchRequest, get_backend
from autoresearch.errors import AutoresearchError, LedgerError, SpecError
from autoresearch.guard import surviving
from autoresearch.ingest import ingest_attempt
from autoresearch.jobstore import JobStore, attempt_paths
from autoresearch.ledger import Ledger
from autoresearch.watcher import WAKE_FIFO, Watcher

ACTIVE = ("starting", "running")
FINAL = ("succeeded", "failed", "cancelled")
# Per-attempt variables never inherited from the launching process (a trial that submits
# a job of its own must not hand it its own ids, checkpoint dir, GPUs or MLflow run).
_INTERNAL_ENV = ("AUTORESEARCH_JOB_ID", "AUTORESEARCH_ATTEMPT", "AUTORESEARCH_METRICS_FILE", "AUTORESEARCH_METRICS_STDOUT",
                 "AUTORESEARCH_CHECKPOINT_DIR", "AUTORESEARCH_NODE", "CUDA_VISIBLE_DEVICES",
                 "AUTORESEARCH_TRIAL_ID", "AUTORESEARCH_LOOP", "AUTORESEARCH_SEED", "AUTORESEARCH_PARAMS",
                 "MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID")

# Signals a program raises on itself when it crashes (they dump core): its own fault, not
# the node's. SIGKILL (the OOM killer, a node going away) and SIGTERM/SIGINT/SIGHUP
# (someone else) stay infrastructure.
CRASH_SIGNALS = frozenset({_signal.SIGSEGV, _signal.SIGABRT, _signal.SIGBUS, _signal.SIGFPE, _signal.SIGILL,
                           _signal.SIGTRAP, _signal.SIGSYS})


class Runtime:
    def __init__(self, home: str | os.PathLike[str] | None = None, backend: Backend | str | None = None) -> None:
        self.ledger = Ledger(home)
        self.jobs = JobStore(self.ledger)
        if backend is None or isinstance(backend, str):
            backend = get_backend(backend or os.environ.get("AUTORESEARCH_BACKEND") or "local")
        self.backend = backend

    # -- the pass -----------------------------------------------------------------------

    def tick(self, wait: bool = True) -> bool:
        """Reconcile, refresh nodes, schedule. False if skipped (another pass is running)."""
        with self.ledger.pass_lock(wait=wait) as locked:
            if not locked:
                return False
            self.reconcile()
            self.refresh_nodes()
            self.schedule()
            return True

    def reconcile(self) -> None:
        for att in self.jobs.active_attempts():
            with surviving(self.ledger, self.backend, "reconcile", att["job_id"], att["n"]):
                self._reconcile_attempt(att)

    def _reconcile_attempt(self, att: Any) -> None:
        status = self.backend.poll(att["external_id"])
        if status.ended:
            if status.state == "lost":
                try:
                    self.backend.stop(att["external_id"], 0)  # end orphans nobody supervises
                except OSError:
                    pass  # its run dir was never made (a launch that failed early): nothing to stop
            self.finalize(att, status)
        elif status.state == "running" and att["state"] == "starting":
            self.jobs.mark_running(att["job_id"], att["n"], status.started_at or time.time())

    def refresh_nodes(self) -> None:
        now = time.time()
        seen = self.backend.nodes()
        known = {r["name"]: (r["gpu_ids"], r["cpus"], r["memory"], r["state"])
                 for r in self.jobs.nodes(self.backend.name)}
        current = {n.name: (json.dumps(n.gpu_ids), n.cpus, n.memory) for n in seen}
        if set(known) == set(current) and all(
                known[k][:3] == v and known[k][3] != "down" for k, v in current.items()):
            return  # nothing changed: no write on the read path
        self.jobs.save_nodes(self.backend.name, seen, now)

    def schedule(self) -> S.Decisions:
        now = time.time()
        if not self.jobs.any_queued(self.backend.name):
            return S.Decisions()  # most passes (an attempt ended) have nothing to place
        nodes = [
            S.NodeState(r["name"], tuple(json.loads(r["gpu_ids"])), r["cpus"], r["memory"],
                        r["state"] in ("healthy", "degraded"))
            for r in self.jobs.nodes(self.backend.name)
        ]
        pending = [
            S.Pending(r["id"], r["priority"], r["gpus"], r["nodes"], r["cpus"], r["memory"], now - r["updated_at"])
            for r in self.jobs.queued(self.backend.name)
        ]
        if not pending:
            return S.Decisions()
        running = [
            S.Running(r["job_id"], r["n"], r["priority"], ((r["node"], tuple(json.loads(r["gpu_ids"]))),),
                      r["started_at"] or r["created_at"], r["cpus"], r["memory"], r["stop_reason"] is not None)
            for r in self.jobs.placed(self.backend.name)
        ]
        if not self.backend.capabilities.places:
            # The engine schedules (Slurm, Ray): hand it, in priority order, what its nodes hold now.
            decisions = S.admit(pending, nodes, [(r["gpus"], r["cpus"]) for r in self.jobs.placed(self.backend.name)],
                                preempts=self.backend.capabilities.preemption)
        else:
            decisions = S.schedule(pending, nodes, running)
        for pre in decisions.preemptions:
            with surviving(self.ledger, self.backend, "preempt", pre.job_id, pre.attempt):
                self.request_stop(pre.job_id, pre.attempt, "preempted", for_job=pre.for_job)
        for placement in decisions.placements:
            with surviving(self.ledger, self.backend, "launch", placement.job_id):
                self.launch(placement)
        return decisions

    # -- actions ------------------------------------------------------------------------

    def launch(self, placement: S.Placement) -> None:
        job_id = placement.job_id
        job_dir = self.ledger.job_dir(job_id)
        node, gpu_ids = placement.alloc[0] if placement.alloc else (None, ())
        begun = self.jobs.begin_attempt(job_id, node, gpu_ids, job_dir)
        if begun is None:
            return
        job, n = begun
        run_dir, log_path, metrics_path = attempt_paths(job_dir, n)
        try:  # from here on, whatever fails ends this attempt (retried as infra), not the pass
            spec: dict[str, Any] = json.loads(job["spec"])
            from autoresearch import isolation  # only a launch needs it: reads stay light

            policy = isolation.load(job["isolation"])  # recorded at submit: never the launching process's say
            _prepare_checkpoint(self.ledger.home, job_id, spec)
            env = self._attempt_env(job_id, n, spec, node, gpu_ids, metrics_path, policy)
            job_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            request = LaunchRequest(
                key=f"{job_id}.{n}", argv=_argv(spec), env=env, workdir=spec["workdir"], log_path=log_path,
                run_dir=run_dir, node=node, gpu_ids=tuple(gpu_ids), nodes=int(spec.get("nodes", 1)),
                timeout=spec.get("timeout"), grace=float(spec.get("grace", 10.0)),
                on_exit=[sys.executable, "-m", "autoresearch.runtime", "--home", str(self.ledger.home),
                         "--backend", self.backend.name],
                wake_fifo=str(self.ledger.home / WAKE_FIFO),
                image=str(spec.get("image") or ""), mounts=dict(spec.get("mounts") or {}),
                gpus=int(spec.get("gpus") or 0), cpus=float(spec.get("cpus") or 0), memory=int(spec.get("memory") or 0),
            )
            _prepare_mounts(spec)
            external_id = self.backend.start(isolation.apply(request, policy, self.ledger, job["project"], spec))
        except LedgerError:
            raise
        except Exception as err:
            row = self.jobs.attempt_with_job(job_id, n)
            assert row is not None
            detail = err.render().replace("\n", "; ") if isinstance(err, AutoresearchError) else str(err) or type(err).__name__
            self.finalize(row, AttemptStatus("lost", ended_at=time.time(), detail=f"could not start: {detail}"))
            return
        if external_id != run_dir:
            self.jobs.set_external_id(job_id, n, external_id)

    def _attempt_env(self, job_id: int, n: int, spec: dict[str, Any], node: str | None, gpu_ids: tuple[str, ...],
                     metrics_path: str, policy: dict[str, Any] | None = None) -> dict[str, str]:
        from autoresearch import isolation

        env = isolation.base_env(policy, os.environ, _INTERNAL_ENV)
        from autoresearch import outbox  # here, not above: a status read does not need it

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
        self.backend.stop(att["external_id"])

    def finalize(self, att: Any, status: AttemptStatus) -> None:
        """Record how an attempt ended and what that means for its job."""
        job_id, n = att["job_id"], att["n"]
        self.ingest_attempt(att, final=True)
        spec = json.loads(att["spec"])
        reason, detail = classify(att, status)

        def next_state(job: Any) -> tuple[str, int]:
            retries = job["retries_used"]
            retryable = reason == "infra" or (
                reason == "exit" and exit_status(status) in (spec.get("retry_on_exit_codes") or []))
            if reason == "exit" and status.exit_code == 0:
                return "succeeded", retries
            if job["cancel_requested"] or reason == "cancelled":
                return "cancelled", retries
            if reason == "preempted":
                return "queued", retries
            if retryable and retries < int(spec.get("max_retries", 2)):
                return "queued", retries + 1
            return "failed", retries

        if self.jobs.end_attempt(job_id, n, status, reason, detail, next_state) is None:
            return  # another pass got here first
        self.backend.release(att["external_id"])
        from autoresearch import outbox

        outbox.kick(self.ledger.home)  # mirror the ending to MLflow in the background (whichever process saw it)

    def watch(self) -> Watcher:
        """Open a :class:`Watcher` on this runtime's home."""
        return Watcher(self.ledger.home)

    # -- metrics --------------------------------------------------------------------------

    def ingest(self, job_id: int) -> None:
        for att in self.jobs.unended_attempts(job_id):
            self.ingest_attempt(att)

    def ingest_attempt(self, att: Any, final: bool = False) -> None:
        """Move new metric points of one attempt into the ledger; never raises but for the ledger."""
        ingest_attempt(self.ledger, self.backend, att, final)


def classify(att: Any, status: AttemptStatus) -> tuple[str, str]:
    """End reason (exit, timeout, cancelled, preempted, infra) and a one-line detail."""
    # Why we stopped it wins — but only if our stop reached it: an attempt that ended on
    # its own just before the SIGTERM keeps its own ending (a success stays a success).
    stop_reason = att["stop_reason"] if (status.stopped or status.state == "lost") else None
    if stop_reason == "cancelled" or (att["cancel_requested"] and status.stopped):
        return "cancelled", "cancelled by request"
    if stop_reason == "preempted":
        return "preempted", "stopped to make room for a higher-priority job"
    if status.state == "lost":
        return "infra", status.detail or "attempt lost"
    if status.timed_out:
        return "timeout", "ran past its timeout"
    if status.signal is not None:
        try:
            name = _signal.Signals(status.signal).name
        except ValueError:
            name = f"signal {status.signal}"
        if status.signal in CRASH_SIGNALS:  # the program's own fault (a segfault, abort()): the user's error
            return "exit", f"crashed with {name} (signal {status.signal})"
        hint = " (out of memory?)" if status.signal == _signal.SIGKILL else ""
        return "infra", f"killed by {name} that autoresearch did not send{hint}"
    if status.exit_code == 0:
        return "exit", "exited 0"
    return "exit", f"exited {status.exit_code}"


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
    """No containers locally: a mount is a symlink at its target, made once."""
    for target, source in (spec.get("mounts") or {}).items():
        path = Path(target) if Path(target).is_absolute() else Path(spec["workdir"]) / target
        src = Path(source).expanduser().resolve()
        if path.is_symlink() and path.resolve() == src:
            continue
        if path.exists():
            if path.resolve() == src:
                continue
            raise OSError(f"mount target {path} exists and is not a link to {src}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(src)


def main(argv: list[str] | None = None) -> int:
    """The on-exit hook of attempt supervisors: one pass, then exit."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m autoresearch.runtime")
    parser.add_argument("--home")
    parser.add_argument("--backend", default="local")
    args = parser.parse_args(argv)
    try:
        Runtime(args.home, args.backend).tick()
    except AutoresearchError as err:
        print(f"autoresearch pass failed: {err.render()}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
