"""The attempt's supervisor inside a Slurm batch job (the Slurm backend copies this file to the run dir).

Stdlib only and self-contained: the compute node runs it with whatever Python it has, and
need not have autoresearch installed. It is the batch script's only command::

    python3 <run_dir>/wrap.py <run_dir>

It runs the attempt's argv (``request.json``) in its own process group with the attempt's
environment (``env.json``, plus the job's ``SLURM_*`` variables and the GPUs Slurm gave it),
its output going to the job's ``--output`` file (the attempt's log), and records in the run
dir what the local supervisor records (``state.json``, ``exit.json``), so ``poll`` reads an
ending from the shared filesystem without asking slurmctld. It enforces the attempt's timeout
to the second (Slurm's ``-t`` is minutes and is only the backstop) and the stop grace period:
a ``stop.json`` in the run dir or a SIGTERM (``scancel --signal=TERM``, Slurm's preemption)
sends SIGTERM to the program and SIGKILL ``grace`` seconds later.

A copy that Slurm requeued (``SLURM_RESTART_COUNT > 0``) runs nothing: when Slurm takes an
allocation back, autoresearch ends that attempt as preempted and launches the next one itself,
so the program never runs twice under one attempt.
"""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import sys
import time

GPU_VARS = ("CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "ROCR_VISIBLE_DEVICES", "SLURMD_NODENAME")
STOP_POLL_S = 0.5


def _read(path: str) -> dict:
    try:
        with open(path) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write(path: str, data: dict) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def _env(run_dir: str) -> dict[str, str]:
    env = {k: v for k, v in _read(os.path.join(run_dir, "env.json")).items()
           if isinstance(v, str) and not k.startswith("SLURM")}
    for key, value in os.environ.items():  # the allocation's own facts win over the submitter's
        if key.startswith("SLURM") or key in GPU_VARS:
            env[key] = value
    env.pop("SLURM_EXPORT_ENV", None)  # an srun in the program must pass the program's env on
    return env


def _spawn(argv: list[str], env: dict[str, str], workdir: str) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            os.setpgid(0, 0)
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD, signal.SIGPIPE):
                signal.signal(sig, signal.SIG_DFL)
            os.chdir(workdir)
            os.execvpe(argv[0], argv, env)
        except OSError as err:
            os.write(2, f"autoresearch: cannot run {argv[0]!r}: {err.strerror}\n".encode())
            os._exit(127 if err.errno == 2 else 126)
        os._exit(127)
    try:
        os.setpgid(pid, pid)
    except OSError:
        pass
    return pid


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def run(run_dir: str) -> int:
    exit_path = os.path.join(run_dir, "exit.json")
    if int(os.environ.get("SLURM_RESTART_COUNT") or 0) > 0 or os.path.exists(exit_path):
        return 0  # a requeued copy: that attempt is over (see the module docstring)
    req = _read(os.path.join(run_dir, "request.json"))
    if not isinstance(req.get("argv"), list) or not req["argv"]:
        # Not "true" by default: a run dir this node cannot read (no shared filesystem) must fail loudly.
        print(f"autoresearch: cannot read {run_dir}/request.json on {os.uname().nodename}: is the run dir "
              "on a filesystem this node shares?", file=sys.stderr)
        return 2
    stop_path = os.path.join(run_dir, "stop.json")
    started = time.time()
    if os.path.exists(stop_path):  # stopped while it waited in the queue: never start the program
        _write(exit_path, {"exit_code": None, "signal": signal.SIGTERM, "timed_out": False, "stopped": True,
                           "term_outside": False, "started_at": started, "ended_at": time.time()})
        return 0
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    flags = {"term": False}

    def on_term(signum: int, frame: object) -> None:
        flags["term"] = True

    signal.set_wakeup_fd(wake_w)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
        signal.signal(sig, on_term)
    signal.signal(signal.SIGCHLD, lambda s, f: None)
    child = _spawn([str(a) for a in req["argv"]], _env(run_dir), str(req.get("workdir") or "."))
    _write(os.path.join(run_dir, "state.json"), {"pid": child, "node": os.environ.get("SLURMD_NODENAME", ""),
                                                 "slurm_job_id": os.environ.get("SLURM_JOB_ID", ""),
                                                 "started_at": started})
    timeout = req.get("timeout")
    grace = float(req.get("grace") or 0)
    deadline = started + float(timeout) if timeout else None
    kill_at = None
    timed_out = stopped = term_outside = False
    status = None
    while True:
        pid, status = os.waitpid(child, os.WNOHANG)
        if pid == child:
            break
        now = time.time()
        if not (stopped or timed_out or term_outside):
            asked = os.path.exists(stop_path)
            if asked or flags["term"]:
                stopped, term_outside = asked, not asked
                if asked:
                    grace = float(_read(stop_path).get("grace", grace))
            elif deadline is not None and now >= deadline:
                timed_out = True
            if stopped or timed_out or term_outside:
                kill_at = now + grace
                _killpg(child, signal.SIGTERM)
        if kill_at is not None and now >= kill_at:
            _killpg(child, signal.SIGKILL)
            kill_at = None
        waits = [t - now for t in (None if (stopped or timed_out) else deadline, kill_at) if t is not None]
        try:
            select.select([wake_r], [], [], max(0.0, min([STOP_POLL_S, *waits])))
        except InterruptedError:
            pass
        try:
            os.read(wake_r, 512)
        except OSError:
            pass
    _killpg(child, signal.SIGKILL)  # leftovers of the group
    code = os.waitstatus_to_exitcode(status) if status is not None else None
    _write(exit_path, {
        "exit_code": code if code is not None and code >= 0 else None,
        "signal": -code if code is not None and code < 0 else None,
        "timed_out": timed_out, "stopped": stopped, "term_outside": term_outside,
        "started_at": started, "ended_at": time.time(),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1),
    })
    _after(run_dir, req)
    return 0


def _after(run_dir: str, req: dict) -> None:
    """Wake a watching loop or server (its FIFO, when it is on this host); else run the pass if asked."""
    fifo = req.get("wake_fifo")
    if fifo:
        try:
            fd = os.open(str(fifo), os.O_WRONLY | os.O_NONBLOCK)
            try:
                os.write(fd, b"x")
            finally:
                os.close(fd)
            return
        except OSError:
            pass  # nobody listens (ENXIO), or not on this host
    hook = req.get("on_exit")
    if hook and os.path.exists(str(hook[0])):
        os.chdir(run_dir)
        out = os.open(os.path.join(run_dir, "on_exit.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(out, 1)
        os.dup2(out, 2)
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        try:
            os.execv(str(hook[0]), [str(a) for a in hook])
        except OSError:
            pass


if __name__ == "__main__":
    sys.exit(run(sys.argv[1]))
