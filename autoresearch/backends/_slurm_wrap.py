"""The attempt's supervisor inside a Slurm batch job (the Slurm backend copies this file to the run dir).

Stdlib only and self-contained: the compute node runs it with whatever Python it has, and
need not have autoresearch installed. The batch script (``job.sbatch``) starts it one of two ways::

    python3 -I -S <run_dir>/wrap.py --child PID <run_dir>   # the fast start: the script started the program
    python3 -I -S <run_dir>/wrap.py <run_dir>               # gangs, and where the fast start cannot be used

**The fast start.** Python's start is most of what a wrapper adds to a job's start (0.1 s on an
idle node, several times that on a busy one), so the batch script starts the program itself, with
``sh``: ``run.sh`` (written at submit, 0600 beside ``env.json``) clears the job's environment to the
allocation's ``SLURM_*`` and GPU variables, exports the attempt's, changes to its workdir and
``exec``s ``setsid argv`` (its own session, so its own process group) in a background subshell;
the script then ``exec``s this file with ``--child <pid>``. The program is this process's child
either way (``exec`` keeps the pid), so what follows is the same: the wait, the stop, the timeout,
``exit.json``. ``started_at`` is the program's own start, from ``/proc``; ``ended_at`` is when this
file saw it end: for a program that ended before this file's Python had started, late by at most that
start (the scheduler's per-CPU clocks in ``/proc/PID/sched`` drift apart on a VM (62 s between this one's two CPUs),
so a zombie's last time on a CPU is not a clock to read). A gang starts the same
way: the script finds ``MASTER_ADDR`` (``scontrol``) and a ``MASTER_PORT`` free on this node (from
``/proc/net/tcp``) itself, ``run.sh`` ``exec``s ``srun`` with the members' prologue, and this file
gets ``--child <pid> <run_dir> <addr> <port>``.

It runs the attempt's argv (``request.json``) in its own process group with the attempt's
environment (``env.json``, plus the job's ``SLURM_*`` variables and the GPUs Slurm gave it),
its output going to the job's ``--output`` file (the attempt's log), and records in the run
dir what the local supervisor records (``state.json``, ``exit.json``), so ``poll`` reads an
ending from the shared filesystem without asking slurmctld. It enforces the attempt's timeout
to the second (Slurm's ``-t`` is minutes and is only the backstop) and the stop grace period:
a ``stop.json`` in the run dir or a SIGTERM (``scancel --signal=TERM``, Slurm's preemption)
sends SIGTERM to the program and SIGKILL ``grace`` seconds later.

**Gangs** (``request.json``'s ``gang``: the member count): this wrapper runs on the allocation's
first node, sets ``MASTER_ADDR`` (the first host of the allocation, at the address Slurm reaches it
by), ``MASTER_PORT`` (free on that host, the first of a sequence derived from the Slurm job id) and
``WORLD_SIZE``, and starts one task per node with ``srun``. Each task is a ``sh`` prologue
(``MEMBER``, no Python: it works inside a pyxis image too) that sets the member's torchrun contract
from Slurm's own facts (``RANK`` = ``SLURM_PROCID``, ``NODE_RANK`` = ``SLURM_NODEID``,
``LOCAL_RANK`` = ``SLURM_LOCALID``, ``WORLD_SIZE`` = ``SLURM_STEP_NUM_TASKS``,
``LOCAL_WORLD_SIZE``), runs the program and records its ending in ``members/<rank>.json``.
``srun --kill-on-bad-exit`` ends the others when one fails; the attempt keeps the code of the
member that failed first, not the SIGTERM of the ones srun stopped.

A copy that Slurm requeued (``SLURM_RESTART_COUNT > 0``) runs nothing: when Slurm takes an
allocation back, autoresearch ends that attempt as preempted and launches the next one itself,
so the program never runs twice under one attempt.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time

# (hashlib, socket, subprocess and resource are imported where used: the fast start's supervisor needs
# none of them until the end, and every module is CPU the program's own start competes with)

GPU_VARS = ("CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "ROCR_VISIBLE_DEVICES", "SLURMD_NODENAME")
STOP_POLL_S = 0.5
PORT_BASE, PORT_SPAN, PORT_TRIES = 20000, 20000, 64  # MASTER_PORT: 20000..39999, below Linux's ephemeral range


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


def first_host(nodelist: str) -> str:
    """The first host of a Slurm hostlist (``gpu[07-09,12],cpu1`` -> ``gpu07``), without asking Slurm."""
    head = ""
    depth = 0
    for ch in nodelist.strip():
        if ch == "," and depth == 0:
            break
        depth += (ch == "[") - (ch == "]")
        head += ch
    if "[" not in head:
        return head
    prefix, rest = head.split("[", 1)
    first = rest.split("]", 1)[0].split(",")[0].split("-")[0]
    return prefix + first + (rest.split("]", 1)[1] if "]" in rest else "")


def master_port(job_id: str, free: object = None) -> int:
    """A port free on this host (the gang's first node), the first free one of a sequence derived
    from the Slurm job id: the same job asks for the same ports, two jobs rarely for the same one."""
    import hashlib

    is_free = free if callable(free) else _port_free
    start = int(hashlib.sha1(str(job_id).encode()).hexdigest(), 16) % PORT_SPAN
    for i in range(PORT_TRIES):
        port = PORT_BASE + (start + i * 7) % PORT_SPAN
        if is_free(port):
            return port
    return PORT_BASE + start


def _port_free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        try:
            s.bind(("", port))
            return True
        except OSError:
            return False


def _node_addr(node: str) -> str:
    """The address Slurm reaches ``node`` by (its NodeAddr; the name itself when Slurm does not say)."""
    import subprocess

    try:
        out = subprocess.run(["scontrol", "-o", "show", "node", node], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return node
    for word in out.split():
        if word.startswith("NodeAddr=") and len(word) > len("NodeAddr="):
            return word.split("=", 1)[1]
    return node


def gang_env(env: dict[str, str], members: int) -> dict[str, str]:
    """The rendezvous every member shares: MASTER_ADDR (the allocation's first host), MASTER_PORT, WORLD_SIZE."""
    out = dict(env)
    first = first_host(os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST") or "")
    first = first or os.environ.get("SLURMD_NODENAME") or os.uname().nodename
    out.update(MASTER_ADDR=_node_addr(first), MASTER_PORT=str(master_port(os.environ.get("SLURM_JOB_ID", ""))),
               WORLD_SIZE=str(members), LOCAL_WORLD_SIZE="1")
    return out


# One gang task (``sh -c MEMBER autoresearch-member RUN_DIR argv...``): its ranks from what srun set
# for it, the program, then its ending in RUN_DIR/members/<rank>.json (a signal N shows as 128+N in
# ``$?``: recorded as the signal). The record is best effort: inside an image the run dir may be absent.
MEMBER = r"""R=$1; shift
export RANK="${SLURM_PROCID:-0}" NODE_RANK="${SLURM_NODEID:-0}" LOCAL_RANK="${SLURM_LOCALID:-0}"
export WORLD_SIZE="${SLURM_STEP_NUM_TASKS:-${SLURM_NTASKS:-${WORLD_SIZE:-1}}}" LOCAL_WORLD_SIZE="${LOCAL_WORLD_SIZE:-1}"
[ -z "${SLURMD_NODENAME:-}" ] || export AUTORESEARCH_NODE="$SLURMD_NODENAME"
"$@"
c=$?
if [ "$c" -gt 128 ]; then e=null; g=$((c - 128)); else e=$c; g=null; fi
n=$(printf %s "${SLURMD_NODENAME:-}" | tr -cd 'A-Za-z0-9._-')
mkdir -p "$R/members" 2>/dev/null && printf '{"rank": %d, "node": "%s", "ended_at": %s, "exit_code": %s, "signal": %s}\n' \
  "$RANK" "$n" "$(date +%s.%N)" "$e" "$g" > "$R/members/.$RANK.tmp" 2>/dev/null && mv -f "$R/members/.$RANK.tmp" "$R/members/$RANK.json"
exit $c
"""


def member_argv(run_dir: str, argv: list[str]) -> list[str]:
    """A gang task's command: the ``sh`` prologue around ``argv`` (see ``MEMBER``)."""
    return ["sh", "-c", MEMBER, "autoresearch-member", run_dir, *argv]


def first_failure(run_dir: str) -> dict | None:
    """The member that failed first (the others srun then stopped), from ``members/*.json``."""
    folder = os.path.join(run_dir, "members")
    try:
        names = os.listdir(folder)
    except OSError:
        return None
    failed = []
    for name in names:
        rec = _read(os.path.join(folder, name))
        code, sig, when = rec.get("exit_code"), rec.get("signal"), rec.get("ended_at")
        if not isinstance(when, (int, float)) or isinstance(when, bool):
            continue
        if (isinstance(code, int) and code != 0) or (isinstance(sig, int) and sig > 0):
            failed.append((when, rec))
    return min(failed, key=lambda item: item[0])[1] if failed else None


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


def started_at(pid: int) -> float | None:
    """When process ``pid`` started (wall clock), from /proc; None where /proc does not say."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # since boot (/proc/stat's btime is whole seconds)
        since_boot = time.clock_gettime(getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC))
        return time.time() - (since_boot - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def run(run_dir: str, child: int | None = None, master: tuple[str, str] | None = None) -> int:
    """Supervise the attempt: start its program, or (``child``) adopt the one the batch script started
    (a gang's ``srun``, with the ``master`` address and port the script gave its members)."""
    exit_path = os.path.join(run_dir, "exit.json")
    if child is None and (int(os.environ.get("SLURM_RESTART_COUNT") or 0) > 0 or os.path.exists(exit_path)):
        return 0  # a requeued copy: that attempt is over (see the module docstring)
    req = _read(os.path.join(run_dir, "request.json"))
    if child is None and (not isinstance(req.get("argv"), list) or not req["argv"]):
        # Not "true" by default: a run dir this node cannot read (no shared filesystem) must fail loudly.
        print(f"autoresearch: cannot read {run_dir}/request.json on {os.uname().nodename}: is the run dir "
              "on a filesystem this node shares?", file=sys.stderr)
        return 2
    stop_path = os.path.join(run_dir, "stop.json")
    started = time.time()
    if child is not None:  # (the script checked the requeue, exit.json and stop.json before it started it)
        begun = started_at(child)
        started = begun if begun is not None and started - 60 < begun <= started else started
    elif os.path.exists(stop_path):  # stopped while it waited in the queue: never start the program
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
    argv, env = [str(a) for a in req.get("argv") or []], _env(run_dir)
    gang = req.get("gang")
    state = {"node": os.environ.get("SLURMD_NODENAME", ""), "slurm_job_id": os.environ.get("SLURM_JOB_ID", ""),
             "started_at": started}
    if isinstance(gang, dict) and child is not None and master is not None and master[1].isdigit():
        state.update(members=gang.get("members"), master_addr=master[0][:200], master_port=int(master[1]))
    elif child is None and isinstance(gang, dict) and isinstance(gang.get("members"), int) and gang["members"] > 1:
        env = gang_env(env, gang["members"])
        srun = [str(a) for a in gang.get("srun") or []]
        if srun:  # (pyxis: srun --container-image is argv itself; its tasks read SLURM_PROCID for RANK)
            argv = [*srun, *member_argv(run_dir, argv)]
        state.update(members=gang["members"], master_addr=env["MASTER_ADDR"], master_port=int(env["MASTER_PORT"]))
    if child is None:
        child = _spawn(argv, env, str(req.get("workdir") or "."))
    _write(os.path.join(run_dir, "state.json"), {"pid": child, **state})
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
    import resource

    code = os.waitstatus_to_exitcode(status) if status is not None else None
    if not (stopped or timed_out or term_outside) and os.path.exists(stop_path):
        # Our stop reached the program before this loop saw it: ``scancel --full``'s SIGTERM goes to the
        # program as well as to us, and a program that handles it may exit (0 too) before this loop looks,
        # or before this file has even started (the fast start). stop.json is written before the signal is
        # sent and ``stop`` writes nothing once exit.json exists, so an ending seen with it present came after
        # our stop was asked: it is our stop's (a cancel, its exit code kept), as on the local backend.
        stopped = True
    ending: dict[str, object] = {
        "exit_code": code if code is not None and code >= 0 else None,
        "signal": -code if code is not None and code < 0 else None,
        "timed_out": timed_out, "stopped": stopped, "term_outside": term_outside,
        "started_at": started, "ended_at": time.time(),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1),
    }
    failed = first_failure(run_dir) if gang and code != 0 and not (stopped or timed_out or term_outside) else None
    if failed is not None:  # srun's own code is the SIGTERM it sent the others: keep the failing member's
        failed_signal = failed.get("signal")
        detail = (f"gang member {failed.get('rank')} on {str(failed.get('node') or '?')[:100]} "
                  + (f"was killed by signal {failed_signal}" if failed_signal else f"exited {failed.get('exit_code')}")
                  + "; srun stopped the others")
        ending.update(exit_code=failed.get("exit_code"), signal=failed_signal, member=failed.get("rank"),
                      detail=detail)
        print(f"autoresearch: {detail}", file=sys.stderr, flush=True)
    _write(exit_path, ending)
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
    if len(sys.argv) in (4, 6) and sys.argv[1] == "--child" and sys.argv[2].isdigit():
        sys.exit(run(sys.argv[3], int(sys.argv[2]), (sys.argv[4], sys.argv[5]) if len(sys.argv) == 6 else None))
    sys.exit(run(sys.argv[1]))
