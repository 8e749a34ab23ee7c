"""The Slurm backend: one batch job per attempt; Slurm schedules (``places=False``).

The external id of an attempt is its run dir (on the filesystem the cluster shares), as on
the local backend: it exists in the ledger before ``sbatch`` runs, so a submitter killed at
any line leaves nothing the next pass cannot find. In the run dir:

    request.json env.json wrap.py job.sbatch   what to run (written before sbatch)
    run.sh [nodeaddrs]                         the program's start from sh (the fast start, _slurm_wrap.py)
    slurm_job_id                               Slurm's id, once sbatch has answered
    state.json exit.json                       written on the node by wrap.py (_slurm_wrap.py)
    stop.json                                  written by stop(); wrap.py honours it even with slurmctld down
    ending.json                                how the attempt ended, once decided (poll never changes its mind)

**At most once.** The job name carries the attempt key (``ar-<key>-<hash of the run dir>``);
``start`` and ``poll`` look a job up by that name before anything else, so a submitter that died
between ``sbatch`` and writing ``slurm_job_id`` is adopted, never submitted again.

**Preemption.** Best-effort work goes to a preemptable partition (``priority_partitions``).
When Slurm preempts and requeues it, this attempt ends ``preempted`` (not counted against the
job's retries) and our runtime launches the next attempt, which resumes from
``AUTORESEARCH_CHECKPOINT_DIR``; Slurm's requeued copy is cancelled and, should it run anyway,
``wrap.py`` runs nothing (``SLURM_RESTART_COUNT > 0``). One Slurm job per attempt keeps each
attempt's log, metrics and environment its own.

**slurmctld down.** Every command has a timeout; no answer means "unknown, ask again": running
attempts stay running (their endings are read from ``exit.json``), nothing is declared lost.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import re
import shlex
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

from autoresearch.backends._base import AttemptStatus, Backend, Capabilities, LaunchRequest, NodeInfo
from autoresearch.backends._slurm_cli import KIT_HINT, Rejected, SlurmCli, Unreachable, placed_on
from autoresearch.backends._slurm_files import (
    GANG_MASTER,
    from_exit,
    locked,
    read_file,
    read_id,
    run_sh,
    status_of,
    write_file,
    write_text,
)
from autoresearch.backends._slurm_wrap import member_argv
from autoresearch.backends._supervisor import read_log_file
from autoresearch.errors import BackendError, CapacityError, SpecError
from autoresearch.util._lockfile import held

SUBMIT_GRACE_S = 60.0  # an attempt with no Slurm job this long after its request was written never got one
STOP_BACKSTOP_S = 30.0
NODES_TTL_S = 5.0  # a stop not honoured this long after its grace: scancel hard
CONTAINERS = ("none", "pyxis", "apptainer")
_RUNNING = ("RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "RESIZING")


def _clean(value: str, what: str) -> str:
    """A profile value that goes into an #SBATCH line: one line, no shell tricks needed."""
    value = str(value)
    if any(c in value for c in "\n\r\0") or len(value) > 200:
        raise SpecError(f"slurm backend: {what} {value[:60]!r} must be one short line", hint=f"fix {what} in the profile")
    return value


def _number(value: Any) -> float:
    """A time in Slurm's JSON: a number (22.05) or ``{"set": .., "number": ..}`` (later); 0 when neither."""
    if isinstance(value, dict):
        value = value.get("number") if value.get("set", True) else None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else 0.0


class SlurmBackend(Backend):
    name = "slurm"
    capabilities = Capabilities(gpus=True, preemption=True, multi_node=True, containers=False, logs_follow=True,
                                places=False)

    def __init__(self, partition: str = "", account: str = "", qos: str = "",
                 priority_partitions: dict[str, str] | None = None, priority_qos: dict[str, str] | None = None,
                 containers: str = "none", conf: str = "", gres: str = "gpu", sbatch_args: list[str] | None = None,
                 command_timeout: float = 20.0, python: str = "", pass_on_exit: bool = False) -> None:
        if containers not in CONTAINERS:
            raise SpecError(f"slurm backend: unknown containers {containers!r}",
                            hint=f"use one of {', '.join(CONTAINERS)} (pyxis: srun --container-image; "
                                 "apptainer: apptainer exec --nv)")
        if not isinstance(command_timeout, (int, float)) or not 1 <= command_timeout <= 600:
            raise SpecError("slurm backend: command_timeout must be 1..600 seconds", hint="e.g. command_timeout: 20")
        self.partition, self.account, self.qos = (_clean(partition, "partition"), _clean(account, "account"),
                                                  _clean(qos, "qos"))
        # The kit's low partition is preemptable; a real cluster names its own (see backends/slurm/README.md).
        self.priority_partitions = {str(k): _clean(v, "priority_partitions")
                                    for k, v in ({"best-effort": "low"} if priority_partitions is None
                                                 else priority_partitions).items()}
        self.priority_qos = {str(k): _clean(v, "priority_qos") for k, v in (priority_qos or {}).items()}
        self.containers, self.gres = containers, _clean(gres, "gres")
        self.sbatch_args = [_clean(a, "sbatch_args") for a in sbatch_args or []]
        self.python, self.pass_on_exit = python, bool(pass_on_exit)
        self.cli = SlurmCli(conf, float(command_timeout))
        if containers != "none":
            self.capabilities = dataclasses.replace(self.capabilities, containers=True)
        self._jobs: dict[int, dict[str, Any]] = {}
        self._jobs_at = 0.0
        self._nodes: list[NodeInfo] | None = None
        self._addrs: dict[str, str] = {}  # node -> NodeAddr, as sinfo said last (a gang's MASTER_ADDR)
        self._nodes_at = 0.0
        self._parts: dict[str, dict[str, Any]] | None = None
        self._parts_at = 0.0
        self._lock = threading.Lock()

    # -- submit-time checks ---------------------------------------------------------------

    def partition_for(self, priority: str) -> str:
        return self.priority_partitions.get(priority) or self.partition

    def check(self, spec: Any) -> None:
        super().check(spec)
        priority = str(getattr(spec, "priority", "normal") or "normal")
        gpus, nodes = int(getattr(spec, "gpus", 0) or 0), int(getattr(spec, "nodes", 1) or 1)
        cpus, memory = float(getattr(spec, "cpus", 0) or 0), int(getattr(spec, "memory", 0) or 0)
        parts = self._partitions()
        wanted = self.partition_for(priority)
        name = wanted or next((n for n, p in parts.items() if p["default"]), "")
        part = parts.get(name)
        if part is None:
            where = f"partition {wanted!r}" if wanted else "a default partition"
            raise SpecError(f"Slurm has no {where} (for priority {priority}); it has: {', '.join(parts) or 'none'}",
                            hint="set the profile's `partition` or `priority_partitions` to one of those")
        too_big = [f"{what} {asked} (its largest node has {has})"
                   for what, asked, has in (("gpus", gpus, part["gpus"]), ("cpus", math.ceil(cpus), part["cpus"]),
                                            ("memory MB", memory, part["memory"])) if asked > has]
        if nodes > len(part["nodes"]):
            too_big.append(f"nodes {nodes} (it has {len(part['nodes'])})")
        if too_big:
            raise CapacityError(f"Slurm partition {name!r} cannot hold this job: it asks for {'; '.join(too_big)}",
                                hint="ask for less, or map this priority to a bigger partition (`priority_partitions`)")

    def _partitions(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            if self._parts is not None and time.monotonic() - self._parts_at < 300:
                return self._parts
        try:
            self.cli.ping()  # answers at once either way, where sinfo retries for ~9 s against a down slurmctld
            parts, nodes = self.cli.facts()
        except Unreachable:
            if self._parts is not None:
                return self._parts  # a loop mid-sweep while slurmctld restarts: what it said last still holds
            raise  # a first submit to an engine that does not answer is refused, with the address and a hint
        with self._lock:
            self._parts, self._parts_at = parts, time.monotonic()
            self._nodes, self._nodes_at = _node_infos(nodes), self._parts_at  # the pass that follows needs them
            self._addrs = _addrs(nodes)
        return parts

    def probe(self) -> None:
        self.cli.ping()

    # -- nodes ------------------------------------------------------------------------------

    def nodes(self) -> list[NodeInfo]:
        with self._lock:
            cached = self._nodes if time.monotonic() - self._nodes_at < NODES_TTL_S else None
        if cached is not None:  # every pass asks; Slurm's nodes change rarely
            if time.monotonic() - self.cli.ok_at > 2.0:
                self.cli.ping()  # but a pass must not launch into a slurmctld that is down (instant either way)
            return cached
        parts, facts = self.cli.facts()
        nodes = _node_infos(facts)
        with self._lock:
            self._addrs = _addrs(facts)
            self._nodes, self._nodes_at = nodes, time.monotonic()
            self._parts, self._parts_at = parts, self._nodes_at
        return nodes

    def cordon(self, node: str, reason: str) -> None:
        why = " ".join(str(reason or "cordoned by autoresearch").split())[:200]
        self._update_node(node, "drain", f"reason={why}")

    def uncordon(self, node: str) -> None:
        self._update_node(node, "resume")

    def _update_node(self, node: str, state: str, *more: str) -> None:
        with self._lock:
            self._nodes = None  # the next pass reads the change back
        try:
            self.cli.run(["scontrol", "update", f"nodename={_clean(node, 'node')}", f"state={state}", *more])
        except Rejected as err:
            raise BackendError(f"Slurm refused to {state} node {node!r}: {err.message}",
                               hint="draining and resuming nodes takes a Slurm operator or admin "
                                    "(SlurmUser, root, or AdminLevel=Operator); check the name with `sinfo -N`"
                               ) from None

    # -- start --------------------------------------------------------------------------------

    @staticmethod
    def job_name(request_key: str, run_dir: str) -> str:
        tag = hashlib.sha1(os.path.realpath(run_dir).encode()).hexdigest()[:8]
        return f"ar-{request_key}-{tag}"[:120]

    def start(self, request: LaunchRequest) -> str:
        run_dir = request.run_dir
        os.makedirs(run_dir, mode=0o700, exist_ok=True)
        os.makedirs(os.path.dirname(request.log_path), mode=0o700, exist_ok=True)
        name = self.job_name(request.key, run_dir)
        with locked(os.path.join(run_dir, "submit.lock")):
            if read_id(run_dir) is not None:
                return run_dir  # started before (the same key twice)
            # A job of this name exists only if this key started in this run dir before: that start
            # wrote request.json first. No request.json, no lookup (one Slurm call less per launch).
            found = self.cli.find(name) if os.path.exists(os.path.join(run_dir, "request.json")) else []
            if found:
                write_text(os.path.join(run_dir, "slurm_job_id"), str(found[0]))
                return run_dir  # a submitter died after sbatch: adopt its job
            argv = self._prepare(request, name)
            try:
                out = self.cli.run(argv, fast_fail=False, bare=True)
            except Unreachable as err:
                if "connect failure" in err.message or "did not answer a moment ago" in err.message:
                    raise  # never reached slurmctld: nothing was submitted
                # It may have been submitted: poll finds it by name once slurmctld answers.
                write_text(os.path.join(run_dir, "submit_unknown"), err.message)
                return run_dir
            except Rejected as err:
                raise BackendError(f"sbatch refused the job: {err.message}",
                                   hint=f"the script is {argv[-1]}; check the profile's partition/qos/account "
                                        "and the job's resources against `sinfo` and `scontrol show partition`"
                                   ) from None
            job_id = out.strip().split(";")[0]
            self._submitted(run_dir, job_id)
            if not job_id.isdigit():
                raise BackendError(f"sbatch answered {out.strip()[:120]!r}, not a job id", hint=KIT_HINT)
            write_text(os.path.join(run_dir, "slurm_job_id"), job_id)
        return run_dir

    def _submitted(self, run_dir: str, job_id: str) -> None:
        """Called between sbatch's answer and our record of it (tests kill the process here)."""

    def _prepare(self, request: LaunchRequest, name: str) -> list[str]:
        """Write the run dir's request, environment, wrapper and batch script; return sbatch's argv."""
        run_dir = request.run_dir
        argv = list(request.argv)
        if request.image:
            argv = self._container(argv, request)
        gang, srun = None, []
        if request.nodes > 1:  # one member per node (srun), each with its ranks (its prologue)
            wrapped = not (request.image and self.containers == "pyxis")  # pyxis: srun is in argv already
            srun = ["srun", f"--nodes={request.nodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1"] if wrapped else []
            gang = {"members": int(request.nodes), "srun": srun}
        on_exit = request.on_exit if self.pass_on_exit else None
        write_file(os.path.join(run_dir, "request.json"), {
            "key": request.key, "name": name, "argv": argv, "workdir": request.workdir, "log_path": request.log_path,
            "timeout": request.timeout, "grace": request.grace, "wake_fifo": request.wake_fifo, "on_exit": on_exit,
            "created_at": time.time(), "ledger": request.ledger, "gang": gang})
        write_file(os.path.join(run_dir, "env.json"), dict(request.env))
        shutil.copyfile(Path(__file__).with_name("_slurm_wrap.py"), os.path.join(run_dir, "wrap.py"))
        started = [*srun, *member_argv(run_dir, argv)] if srun else argv
        fast = run_sh(request.env, request.workdir, started, int(request.nodes))
        if fast is not None:  # the program starts from sh, Python's start beside it (see _slurm_wrap.py)
            write_text(os.path.join(run_dir, "run.sh"), fast)
            if gang:  # where each node is reached (sinfo's NodeAddr): the script's MASTER_ADDR without scontrol
                with self._lock:
                    addrs = dict(self._addrs)
                write_text(os.path.join(run_dir, "nodeaddrs"), "".join(f"{n} {a}\n" for n, a in sorted(addrs.items())))
        script, flags = os.path.join(run_dir, "job.sbatch"), self.flags(request, name)
        write_text(script, self.script(request, flags, fast=fast is not None))
        return ["sbatch", "--parsable", *flags, script]

    def flags(self, request: LaunchRequest, name: str) -> list[str]:
        """sbatch's flags for ``request`` under this profile (given on its command line: no quoting games)."""
        key = "".join(c if c.isalnum() or c in "._-" else "_" for c in request.key)
        # --export=ALL of sbatch's bare environment: NONE and NIL make slurmd load the user's login
        # environment (`su -`), seconds per job; wrap.py sets the attempt's own from env.json.
        flags = [f"--job-name={name}", f"--comment=autoresearch-attempt-{key}",
                 f"--output={request.log_path}", "--open-mode=append", f"--chdir={request.workdir}",
                 "--export=ALL", "--requeue", f"--nodes={request.nodes}", "--ntasks-per-node=1"]
        partition, qos = self.partition_for(request.priority), self.priority_qos.get(request.priority) or self.qos
        flags += [f"--partition={partition}"] if partition else []
        flags += [f"--qos={qos}"] if qos else []
        flags += [f"--account={self.account}"] if self.account else []
        flags += [f"--gres={self.gres}:{request.gpus}"] if request.gpus > 0 else []
        flags += [f"--cpus-per-task={math.ceil(request.cpus)}"] if request.cpus > 0 else []
        flags += [f"--mem={request.memory}M"] if request.memory > 0 else []
        if request.timeout:  # wrap.py enforces the timeout itself; Slurm's limit (minutes) is the backstop
            flags.append(f"--time={math.ceil((request.timeout + request.grace) / 60) + 1}")
        flags.append(f"--signal=B:TERM@{max(1, math.ceil(request.grace))}")
        return flags + self.sbatch_args

    def script(self, request: LaunchRequest, flags: list[str], fast: bool = False) -> str:
        """The batch script: it runs wrap.py (the flags are written down in it for whoever reads it).

        ``fast``: it first starts the program itself from ``run.sh`` (in the background, its own
        session) and then hands it to wrap.py (``--child``), so the program does not wait for
        Python's start; it falls back to wrap.py alone where that cannot be done (no run.sh on this
        node, no ``setsid``) and leaves the requeued copy and a stopped or ended attempt to wrap.py."""
        python = self.python or sys.executable
        lines = ["#!/bin/sh", f"# autoresearch attempt {request.key}, submitted as:",
                 f"#   sbatch {shlex.join(flags)} {shlex.quote(os.path.join(request.run_dir, 'job.sbatch'))}",
                 f"PY={shlex.quote(python)}", '[ -x "$PY" ] || PY=python3', f"R={shlex.quote(request.run_dir)}"]
        if fast and request.nodes > 1:
            lines += GANG_MASTER
        if fast:
            master = ' "$_ar_addr" "$_ar_port"' if request.nodes > 1 else ""
            lines += ['if [ -r "$R/run.sh" ] && [ "${SLURM_RESTART_COUNT:-0}" = 0 ] && [ ! -e "$R/exit.json" ] \\',
                      '    && [ ! -e "$R/stop.json" ] && _ar_setsid=$(command -v setsid)'
                      + (' && [ -n "$_ar_port" ]' if master else "") + "; then",
                      '  ( . "$R/run.sh" ) &',
                      "  trap '' TERM INT HUP USR1  # until wrap.py's handlers are in (the program has its own)",
                      f'  exec "$PY" -I -S "$R/wrap.py" --child "$!" "$R"{master}',
                      "fi"]
        # -I -S: wrap.py is stdlib only: no site-packages scan (~60 ms of CPU a start here), no PYTHON* variables
        lines.append('exec "$PY" -I -S "$R/wrap.py" "$R"')
        return "\n".join(lines).replace("\r", " ") + "\n"

    def _container(self, argv: list[str], request: LaunchRequest) -> list[str]:
        mounts = [f"{src}:{dst}" for dst, src in request.mounts.items()]
        if self.containers == "pyxis":
            out = ["srun", f"--nodes={request.nodes}", "--ntasks-per-node=1", f"--container-image={request.image}",
                   f"--container-workdir={request.workdir}"]
            if request.nodes > 1:  # each task sets its own ranks in the image, from sh (no wrap.py there)
                argv = member_argv(request.run_dir, argv)
            return out + ([f"--container-mounts={','.join(mounts)}"] if mounts else []) + argv
        binds = [a for m in mounts for a in ("--bind", m)]
        return ["apptainer", "exec", "--nv", "--pwd", request.workdir, *binds, request.image, *argv]

    # -- state ----------------------------------------------------------------------------------

    def _job(self, job_id: int) -> dict[str, Any] | None:
        """Slurm's record of a job (None: Slurm does not know it); Unreachable when it does not answer.

        One ``squeue --json`` a second answers every poll of a pass; a job newer than that
        snapshot is "unknown for a moment", not a reason to ask again."""
        with self._lock:
            fresh = time.monotonic() - self._jobs_at < 1.0
            jobs = self._jobs
        if not fresh:
            try:
                jobs = self.cli.jobs()
            except Rejected:  # no JSON support in this Slurm: ask for the one job
                return self.cli.show_job(job_id)
            with self._lock:
                self._jobs, self._jobs_at = jobs, time.monotonic()
        if job_id in jobs:
            return jobs[job_id]
        if fresh and job_id > max(jobs, default=0):
            raise Unreachable(f"job {job_id} is newer than the last squeue")  # the next pass sees it
        return self.cli.show_job(job_id)  # gone from squeue's view: ask once whether Slurm still knows it

    def poll(self, external_id: str) -> AttemptStatus:
        run_dir = external_id
        ending = read_file(os.path.join(run_dir, "ending.json"))
        if ending is not None:
            return status_of(ending)
        done = read_file(os.path.join(run_dir, "exit.json"))
        # A SIGTERM we did not send reaches the command before wrap.py hears its own (a user's scancel
        # signals the whole step): Slurm says whether the job was cancelled (a person's cancel, not infra).
        unasked_term = (done is not None and done.get("signal") == 15
                        and not os.path.exists(os.path.join(run_dir, "stop.json")))
        if done is not None and not done.get("term_outside") and not unasked_term:
            return self._end(run_dir, from_exit(done))  # ended on its own or by our stop: no need to ask Slurm
        started = (read_file(os.path.join(run_dir, "state.json")) or {}).get("started_at")
        unknown = AttemptStatus("running" if started else "starting", started_at=started)
        job_id = read_id(run_dir)
        try:
            if job_id is None:
                job_id = self._adopt(run_dir)
                if job_id is None:
                    return self._unsubmitted(run_dir, unknown)
            job = self._job(job_id)
        except Unreachable:
            return unknown  # slurmctld does not answer: unknown, never lost
        return self._judge(run_dir, job_id, job, done, unknown)

    def _adopt(self, run_dir: str) -> int | None:
        """The Slurm job of an attempt whose submitter died before recording it (found by name)."""
        if held(os.path.join(run_dir, "submit.lock")):
            raise Unreachable("a submit of this attempt is in progress")
        name = (read_file(os.path.join(run_dir, "request.json")) or {}).get("name")
        found = self.cli.find(str(name)) if name else []
        if not found:
            return None
        write_text(os.path.join(run_dir, "slurm_job_id"), str(found[0]))
        return found[0]

    def _unsubmitted(self, run_dir: str, unknown: AttemptStatus) -> AttemptStatus:
        try:
            written = os.path.getmtime(os.path.join(run_dir, "request.json"))
        except OSError:
            written = 0.0
        if written and time.time() - written < SUBMIT_GRACE_S:
            return unknown
        return self._end(run_dir, AttemptStatus("lost", ended_at=time.time(),
                                                detail="Slurm has no job for this attempt (sbatch never ran or failed)"))

    def _judge(self, run_dir: str, job_id: int, job: dict[str, Any] | None, done: dict[str, Any] | None,
               unknown: AttemptStatus) -> AttemptStatus:
        state = str((job or {}).get("job_state") or "").upper()
        requeued = int((job or {}).get("restart_cnt") or 0) > 0
        if requeued or state == "PREEMPTED":
            base = from_exit(done) if done else AttemptStatus("exited", signal=9, ended_at=time.time())
            return self._end(run_dir, dataclasses.replace(base, preempted=True,
                                                          detail=f"preempted by Slurm (job {job_id} requeued)"))
        if state in _RUNNING or state in ("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"):
            self._backstop(run_dir, job_id)
            if state == "PENDING" and unknown.state == "starting":  # Slurm holds it: say why, in its words
                return dataclasses.replace(unknown, detail=held_detail(job))
            out = unknown if done is None or state == "PENDING" else AttemptStatus("running", started_at=unknown.started_at)
            return dataclasses.replace(out, **placed_on(job)) if state in _RUNNING else out
        if done is None:  # Slurm has ended it and wrap.py left no record: read it again (it may just have landed)
            done = read_file(os.path.join(run_dir, "exit.json"))
        if done is not None:
            status = from_exit(done)
            if state == "TIMEOUT":
                status = dataclasses.replace(status, timed_out=True)
            elif state == "CANCELLED":
                ours = os.path.exists(os.path.join(run_dir, "stop.json"))  # (our stop, or its hard backstop)
                status = dataclasses.replace(status, cancelled=not ours, detail=_cancelled_by(job, job_id, ours))
            return self._end(run_dir, status)
        stopped = os.path.exists(os.path.join(run_dir, "stop.json"))
        now = time.time()
        if (state == "CANCELLED" and stopped and (job or {}).get("batch_host")
                and now < _number((job or {}).get("end_time")) + STOP_BACKSTOP_S):
            # Our stop cancelled a job that ran: wrap.py, signalled too, writes the program's ending as it
            # ends: wait for it (Slurm's KillWait after its end at the most), not read a kill into it.
            return AttemptStatus("running", started_at=unknown.started_at, **placed_on(job))
        if job is None:
            return self._end(run_dir, AttemptStatus("lost", ended_at=now,
                                                    detail=f"Slurm no longer knows job {job_id} and it left no exit record"))
        if state == "TIMEOUT":
            return self._end(run_dir, AttemptStatus("exited", signal=9, timed_out=True, ended_at=now))
        if state == "CANCELLED":
            return self._end(run_dir, AttemptStatus("exited", signal=15 if not stopped else 9, stopped=stopped,
                                                    ended_at=now, cancelled=not stopped,
                                                    detail=_cancelled_by(job, job_id, stopped)))
        if state == "OUT_OF_MEMORY":
            return self._end(run_dir, AttemptStatus("exited", signal=9, ended_at=now,
                                                    detail="killed by Slurm: out of memory"))
        return self._end(run_dir, AttemptStatus("lost", ended_at=now, detail=f"Slurm job {job_id} ended {state or '?'} "
                                                "before the attempt started (see its log)"))

    def _backstop(self, run_dir: str, job_id: int) -> None:
        """A stop wrap.py has not honoured long after its grace (a hung node): scancel outright."""
        asked = read_file(os.path.join(run_dir, "stop.json"))  # in the job's reach: numbers are checked
        when, grace = (asked or {}).get("requested_at"), (asked or {}).get("grace")
        if grace is None:  # the request's own grace period, as wrap.py uses it
            grace = (read_file(os.path.join(run_dir, "request.json")) or {}).get("grace") or 0
        if not (isinstance(when, (int, float)) and isinstance(grace, (int, float))):
            return
        if time.time() - when > min(grace, 86400) + STOP_BACKSTOP_S:
            try:
                self.cli.run(["scancel", str(job_id)])
            except (Rejected, Unreachable):
                pass

    def _end(self, run_dir: str, status: AttemptStatus) -> AttemptStatus:
        data = dataclasses.asdict(status)
        try:
            write_file(os.path.join(run_dir, "ending.json"), data, exclusive=True)
        except FileExistsError:
            return status_of(read_file(os.path.join(run_dir, "ending.json")) or data)
        except OSError:
            pass
        return status

    # -- stop, logs ---------------------------------------------------------------------------

    def stop(self, external_id: str, grace: float | None = None) -> None:
        run_dir = external_id
        os.makedirs(run_dir, exist_ok=True)
        if os.path.exists(os.path.join(run_dir, "exit.json")):
            return
        stop: dict[str, float] = {"requested_at": time.time()}
        if grace is not None:
            stop["grace"] = grace
        if not os.path.exists(os.path.join(run_dir, "stop.json")):
            write_file(os.path.join(run_dir, "stop.json"), stop)  # wrap.py reads it, with or without slurmctld
        job_id = read_id(run_dir)
        name = (read_file(os.path.join(run_dir, "request.json")) or {}).get("name")
        started = os.path.exists(os.path.join(run_dir, "state.json"))
        if job_id is None and not name:
            return
        target = [str(job_id)] if job_id is not None else ["--name", str(name)]
        if grace == 0:  # no grace asked: nothing to be graceful with
            calls = [["scancel", *target]]
        elif started:
            calls = [["scancel", "--full", "--signal=TERM", *target]]
        else:  # queued, or running ahead of wrap.py (the fast start runs the program before wrap.py writes
            # state.json): slurmctld tells which, at each call (a job that starts between them is signalled)
            calls = [["scancel", "--state=PENDING", *target],
                     ["scancel", "--full", "--signal=TERM", "--state=RUNNING", *target]]
        for argv in calls:
            try:
                self.cli.run(argv)
            except (Rejected, Unreachable):
                pass  # gone already, or slurmctld down: wrap.py honours stop.json on its own

    def release(self, external_id: str) -> None:
        ending = read_file(os.path.join(external_id, "ending.json")) or {}
        job_id = read_id(external_id)
        if ending.get("preempted") and job_id is not None:
            try:  # Slurm's requeued copy: the next attempt is ours to launch
                self.cli.run(["scancel", str(job_id)])
            except (Rejected, Unreachable):
                pass  # wrap.py runs nothing in a requeued copy anyway

    def read_log(self, external_id: str, offset: int = 0, max_bytes: int = 1 << 20) -> bytes:
        return read_log_file(self._log_path(external_id), offset, max_bytes) or b""

    def log_size(self, external_id: str) -> int:
        try:
            return os.path.getsize(self._log_path(external_id))
        except OSError:
            return 0

    @staticmethod
    def _log_path(external_id: str) -> str:
        request = read_file(os.path.join(external_id, "request.json")) or {}
        return str(request.get("log_path") or os.path.join(external_id, "missing.log"))


def _addrs(facts: list[dict[str, Any]]) -> dict[str, str]:
    """Node -> NodeAddr, of the names and addresses a shell word can carry as they are."""
    ok = re.compile(r"[A-Za-z0-9._:-]{1,200}")
    return {n["name"]: n["addr"] for n in facts if ok.fullmatch(n["name"]) and ok.fullmatch(str(n.get("addr") or ""))}


def _node_infos(facts: list[dict[str, Any]]) -> list[NodeInfo]:
    return [NodeInfo(n["name"], tuple(str(i) for i in range(n["gpus"])), float(n["cpus"]), n["memory"],
                     state=n["state"], reason=n["reason"]) for n in facts]


def held_detail(job: dict[str, Any] | None) -> str:
    """``engine: PENDING, <Slurm's reason>`` (Resources, Priority, QOSMaxGRESPerUser, ...)."""
    reason = str((job or {}).get("state_reason") or "").strip()
    reason = "".join(c for c in reason if c.isprintable())[:120]
    return f"engine: PENDING, {reason}" if reason and reason.lower() != "none" else "engine: PENDING"


def _cancelled_by(job: dict[str, Any] | None, job_id: int, ours: bool) -> str:
    """The detail of a job Slurm ended CANCELLED: ours (a stop), or a person's scancel (with the uid
    when Slurm's record names it: sacct's ``CANCELLED by <uid>``)."""
    if ours:
        return "cancelled in Slurm (autoresearch's stop)"
    who = ""
    for key in ("cancelled_by", "state_reason", "state_description"):
        text = str((job or {}).get(key) or "")
        if text and text.lower() not in ("none", "[]"):
            who = f" ({text[:80]})"
            break
    return f"cancelled in Slurm by a user's scancel of job {job_id}{who}, not by autoresearch: not retried"
