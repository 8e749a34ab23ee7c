"""The local attempt supervisor: a detached process that owns one attempt at a time.

Forked (not spawned: a fresh interpreter costs ~70 ms here, a fork ~1 ms) by the home's
zygote (backends/_zygote.py: a small image, cheap to fork and to exit) or, when none answers,
by the process that starts the attempt, it starts its own session so it outlives the
CLI or server, runs the command in its own process group, enforces
the timeout and the stop grace period, and records what happened in files under
the attempt's run dir::

    state.json   {"supervisor_pid", "supervisor_start", "pid", "pgid", "pgids", "started_at"}
    stop.json    written by stop(): {"grace", "requested_at"}; then SIGTERM to us
    exit.json    {"exit_code", "signal", "timed_out", "stopped", "ended_at", "peak_rss_mb"}
                 (+ "disk_full": the mount point, when its disk had less than FULL_BELOW free at the end)
                 (+ "members", "failed_member" for a gang: one process group per member)

After the command ends it pokes ``wake_fifo`` when a live process listens there (the
home's pass daemon, a loop controller or a server that runs the pass itself, and
acknowledges with a ``reaped`` file; we wait for it while the listener lives, up to
``ACK_MAX_S``), and otherwise execs ``on_exit``
(the runtime's reconcile pass, ~150 ms of CPU), so a finishing attempt starts the
next queued one with nobody watching.

One forked by the zygote runs the zygote's next request once its attempt is over and recorded
(:func:`attempt` returns; see backends/_zygote.py); any other ends with its attempt.

Stdlib only, and nothing here imports anything after the fork (but the metrics line parser and the
trial side's rung poke, for a job whose printed lines are watched for rungs: :class:`_Rungs`).
"""

from __future__ import annotations

import _signal  # signal's C functions: signal.pthread_sigmask converts every mask to enums (~1 ms a launch)
import _thread
import contextlib
import errno
import gc
import json
import os
import select
import signal
import stat
import time
from collections.abc import Iterator
from typing import Any, NoReturn

STATE, STOP, EXIT, REAPED = "state.json", "stop.json", "exit.json", "reaped"
# Set aside before the command starts as the blocks of exit.json's own temporary file (write_json's
# O_TRUNC frees them for its write: no file made or removed for it): room for the ending on a disk the
# command (or anyone) filled meanwhile. An end with less than FULL_BELOW free is "disk full".
RESERVE_BYTES, FULL_BELOW = 16 << 10, 1 << 20
# A supervisor claims its attempt by creating the attempt's log (O_EXCL), before anything else: a
# second supervisor of the same attempt (a launcher that forked one itself after its zygote forked one
# but died before answering, or two calls of start() with one key) finds it made and exits. (The claim
# was a file of its own, "supervisor.claim": one more file made before the command could start.)
# The ending of an attempt whose launcher died before its supervisor wrote state.json: retried as
# infra, but the launcher's loss, not the node's (the health monitor does not count it against it).
NEVER_STARTED = "supervisor never started"
ACK_WAIT_S = 3.0  # how long a poked watcher has to record the ending (the docker waiter's bound)
ACK_MAX_S = 30.0  # a local supervisor waits as long as somebody listens (a busy pass daemon), up to this
LISTEN_CHECK_S = 0.5  # how often it checks that somebody still listens; nobody: it runs the pass itself
# A pass daemon started this recently may still be importing (autoresearch.engine.passd.SPAWN_GRACE_S, the
# same figure): an ending nobody hears yet waits for it to listen, rather than start an interpreter
# for its own pass (~130 ms of CPU; the first wave of a big batch of short jobs, dozens at once).
DAEMON_GRACE_S = 2.0
DAEMON_START_MAX_S = 30.0  # past the grace, a daemon still alive (still importing) is waited for up to this
DAEMON_LOOK_S = 0.02  # how often it looks for the starting daemon's listener
# The listener's pass nudges a supervisor waiting for its ``reaped`` with this signal (release():
# nudge), so the wait sleeps instead of polling the file 50 times a second. Ignored by default:
# a nudge that reaches another process (a reused pid) does nothing.
ACK_SIGNAL = signal.SIGWINCH


def temp_path(path: str) -> str:
    """Where an atomic write of ``path`` puts its bytes first: this thread's own file, so two threads of
    one process writing the same file (a loop's controller and a ``stop_loop`` call both stopping a
    trial) never move each other's away."""
    return f"{path}.{os.getpid()}.{_thread.get_ident()}.tmp"


def write_json(path: str, data: dict[str, Any]) -> None:
    """Atomic write: readers see the old file or the new one, never half of it."""
    tmp = temp_path(path)
    blob = memoryview(json.dumps(data).encode())  # (json.dumps is C; json.dump to a text file is not)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        while blob:
            blob = blob[os.write(fd, blob):]
    finally:
        os.close(fd)
    os.replace(tmp, path)


def read_json(path: str) -> dict[str, Any] | None:
    # A job can replace the files of its run dir: no following links, no blocking on a FIFO.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return None
            data = json.loads(f.read(1 << 20))
        return data if isinstance(data, dict) else None
    except (OSError, ValueError, RecursionError):
        return None


def read_log_file(path: str, offset: int = 0, max_bytes: int = 1 << 20) -> bytes | None:
    """Bytes of a log file from ``offset``; None when it cannot be opened as a regular file. The
    job can replace its log: never follow a link, never block on a FIFO."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        f.seek(max(0, offset))
        return f.read(max_bytes)


def _proc_stat(pid: int) -> tuple[int, bytes] | None:
    """(start time in clock ticks since boot, state letter) of ``pid``, from one read."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)  # no file object: a supervisor's page faults
        try:
            stat = os.read(fd, 4096)
        finally:
            os.close(fd)
        fields = stat[stat.rindex(b")") + 2:].split()
        return int(fields[19]), fields[0]
    except (OSError, ValueError, IndexError):
        return None


def proc_start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot, to tell a reused pid apart."""
    stat = _proc_stat(pid)
    return stat[0] if stat else None


def is_alive(pid: int, start: int | None) -> bool:
    stat = _proc_stat(pid)
    if stat is None or (start is not None and stat[0] != start):
        return False
    return stat[1] != b"Z"


# Supervisors this process forked and has not reaped yet. A supervisor is our direct
# child (one fork, no intermediate to wait for: that wait cost ~3 ms a launch); it calls
# setsid() so it outlives us, and we reap the ones that ended whenever we launch again.
# When we exit first, init adopts and reaps them.
_children: set[int] = set()


def reap() -> None:
    for pid in list(_children):
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done = pid  # somebody else reaped it
        if done:
            _children.discard(pid)


def launch(request: dict[str, Any]) -> None:
    """Start a detached supervisor for ``request`` (its run dir exists) and return at once: forked by
    the home's zygote (backends/_zygote.py) when one answers, else by us (and a zygote is started for
    the next launches). Inside :func:`batch` the zygote's answers are read when the batch ends."""
    reap()
    home = os.path.dirname(request["wake_fifo"]) if request.get("wake_fifo") else None  # (the home's FIFO)
    if home:
        from autoresearch.backends import _zygote

        if _zygote.enabled():
            if _zygote.send(home, request):
                if not _batching.get(_thread.get_ident()):
                    settle()
                return
            argv = _zygote.start(home)  # (the zygote imports nothing of ours: we start it)
            if argv:
                with contextlib.suppress(OSError):
                    spawn_detached(argv, os.path.join(home, _zygote.LOG))
    _fork(request)


_batching: dict[int, int] = {}  # thread -> how deep in batch() it is


@contextlib.contextmanager
def batch() -> Iterator[None]:
    """Launches inside (in this thread) are sent to the zygote without waiting for its answers, read
    at the end (and the requests it did not take are forked here then)."""
    me = _thread.get_ident()
    _batching[me] = _batching.get(me, 0) + 1
    try:
        yield
    finally:
        _batching[me] -= 1
        if not _batching[me]:
            del _batching[me]
            settle()


def settle() -> None:
    """Read the zygote's answers; fork here the supervisors it did not fork (a supervisor claims its
    attempt: a zygote that forked one but died before its answer never runs an attempt twice)."""
    from autoresearch.backends import _zygote

    for request in _zygote.settle():
        _fork(request)


def _fork(request: dict[str, Any]) -> None:
    # A Ctrl-C that lands in the fork's after-fork callbacks (logging's) is "ignored" by Python
    # and lost: hold SIGINT until the fork is done; the parent then gets it right here.
    mask = _signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGINT,))
    pid = os.fork()
    if pid:
        _children.add(pid)
        _signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        return
    try:
        gc.disable()  # first: see _supervise
        os.setsid()
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # drops a Ctrl-C meant for our caller, pending since the fork
        _signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        _supervise(request)
    except BaseException:  # noqa: BLE001 - a forked child must never return into the caller
        pass
    os._exit(70)


def spawn_detached(argv: list[str], log_path: str | os.PathLike[str], cwd: str | None = "/",
                   wait: bool = True, nice: int = 0) -> int:
    """Start ``argv`` as nobody's child: double fork, new session, stdin and stdout on /dev/null,
    stderr appended to ``log_path``, in ``cwd`` (None: ours), then exec. Returns once the
    intermediate child is reaped (the program outlives its caller and is never its zombie), or with
    ``wait=False`` at once, a thread reaping it: on a loaded machine the child may wait a scheduler's
    turn before it can exit, and a command about to return (the loop's report helper) need not.
    ``nice``: the program's niceness above ours (background work that must not slow its caller's end).
    The home's long-lived helpers start this way: the pass daemon, the MLflow syncer. Its answer: the
    intermediate child's pid."""
    pid = os.fork()
    if pid:
        if wait:
            os.waitpid(pid, 0)
        else:
            import threading

            threading.Thread(target=_reap, args=(pid,), daemon=True, name="autoresearch-reap-detached").start()
        return pid
    try:
        os.setsid()
        if os.fork():
            os._exit(0)
        devnull = os.open(os.devnull, os.O_RDWR)
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        os.dup2(log, 2)
        if cwd is not None:
            os.chdir(cwd)
        if nice > 0:
            os.nice(nice)
        os.execv(argv[0], argv)
    except BaseException:  # noqa: BLE001 - a forked child never returns into the caller
        os._exit(1)
    os._exit(0)  # pragma: no cover - execv does not return
    return 0  # pragma: no cover


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):  # (someone else's wait() may have reaped it)
        os.waitpid(pid, 0)


_DEFAULT_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD, signal.SIGPIPE, signal.SIGXFSZ)

# The scheduling policy a command (and the on_exit hook) gets; None: ours, inherited. The zygote runs
# itself and the supervisors it forks as SCHED_BATCH and sets this to the policy it was started with
# (backends/_zygote.py: _yield_on_wake), so a job never runs under a policy its launcher did not have.
COMMAND_POLICY: int | None = None


def _command_policy() -> None:
    """In a child about to exec what is not ours: the scheduling policy of :data:`COMMAND_POLICY`."""
    if COMMAND_POLICY is not None:
        with contextlib.suppress(OSError):
            os.sched_setscheduler(0, COMMAND_POLICY, os.sched_param(0))


def _which(name: str, path: str) -> str | None:
    """The program execvpe would run, searched in the *attempt's* PATH (as execvpe does)."""
    if "/" in name:
        return name
    for folder in path.split(os.pathsep):
        candidate = os.path.join(folder or ".", name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def _spawn(argv: list[str], env: dict[str, str], workdir: str, log_fd: int, cgroup: str | None = None) -> int:
    """Start the command in its own process group, stdout+stderr to the log.

    posix_spawn (vfork underneath) costs the same whatever our size, where a fork of a
    copy of a large parent (a loop controller) costs milliseconds. It has no cwd in
    Python 3.11, so we move to the workdir first (every path we use is absolute).
    When it cannot start the program we fork after all, so the error lands in the log
    and the attempt ends with 127/126 like a shell's. With ``cgroup`` (a sandboxed attempt's own
    cgroup v2) it forks: the child moves itself into it before its exec, so all it starts is there.
    """
    try:
        if cgroup:
            raise OSError(errno.EPERM, "a cgroup to join first: fork")
        os.chdir(workdir)
        program = _which(argv[0], env.get("PATH", os.defpath))
        if program is not None:
            policy: dict[str, Any] = {} if COMMAND_POLICY is None else {"scheduler": (COMMAND_POLICY, os.sched_param(0))}
            return os.posix_spawn(program, argv, env, setpgroup=0, setsigdef=_DEFAULT_SIGNALS,
                                  file_actions=[(os.POSIX_SPAWN_DUP2, log_fd, 1), (os.POSIX_SPAWN_DUP2, log_fd, 2)],
                                  **policy)
    except OSError:
        pass
    pid = os.fork()
    if pid == 0:
        try:
            _command_policy()
            os.setpgid(0, 0)
            os.dup2(log_fd, 1)
            os.dup2(log_fd, 2)
            os.chdir(workdir)
            for sig in _DEFAULT_SIGNALS:
                signal.signal(sig, signal.SIG_DFL)
            if cgroup:  # fails closed: a job never runs outside the cgroup that bounds it
                fd = os.open(os.path.join(cgroup, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)
                os.write(fd, str(os.getpid()).encode())
                os.close(fd)
            os.execvpe(argv[0], argv, env)
        except OSError as err:
            os.write(2, f"autoresearch: cannot run {argv[0]!r}: {err.strerror}\n".encode())
            os._exit(127 if err.errno == errno.ENOENT else 126)
        os._exit(127)
    try:
        os.setpgid(pid, pid)
    except OSError:
        pass  # the child already did it, or already exec'd
    return pid


def _supervise(req: dict[str, Any]) -> NoReturn:
    # A collection would write to every object header and un-share the parent's pages
    # we were forked with; this process allocates almost nothing, so none is needed.
    gc.disable()
    attempt(req)
    os._exit(0)


def attempt(req: dict[str, Any], keep: tuple[int, ...] = (), previous: tuple[str, ...] = ()) -> None:
    """Run the attempt of ``req`` to its end and record it. It returns once a listener recorded the
    ending (or nobody listens and there is no hook), and this process may run another attempt (the
    home's zygote hands a supervisor that finished the next request: backends/_zygote.py); it execs
    the ``on_exit`` hook when nobody recorded it, and raises when it could not record the exit.

    ``keep``: descriptors of ours to leave open (the zygote's control socket); ``previous``: the run dirs
    of the attempts this process ran before (a stop meant for one, sent as it ended, is not for this one).
    Every descriptor it opens it closes; when it returns the stop signals are ignored until the next."""
    run_dir: str = req["run_dir"]
    devnull = os.open(os.devnull, os.O_RDWR)  # first: 0-2 taken, the log's descriptor is above them
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    if devnull > 2:
        os.close(devnull)
    try:  # our claim of the attempt, before anything runs: a second supervisor of it finds the log made
        log_fd = os.open(req["log_path"], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
    except FileExistsError:
        return  # another supervisor has this attempt
    _close_all_but({0, 1, 2, log_fd, *keep})
    _reserve(run_dir)  # room to record the ending in, on a disk that fills while the command runs

    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    flags = {"stop": False}

    def on_term(signum: int, frame: object) -> None:
        flags["stop"] = True

    signal.set_wakeup_fd(wake_w)
    # _signal's C function: signal.signal converts through enums (page faults: see _close_all_but)
    for sig in (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP):
        _signal.signal(sig, on_term)
    _signal.signal(_signal.SIGCHLD, _wake)  # wake select when the child ends
    _signal.signal(_signal.SIGPIPE, _signal.SIG_IGN)

    started = time.time()
    # A gang on one host (LaunchRequest.alloc): one process group per member, each with its own
    # environment (rank, GPU slots). A member that fails ends the attempt: the others get SIGTERM,
    # then SIGKILL after the grace period, and the attempt's exit is the failing member's.
    envs: list[dict[str, str]] = req.get("members") or [req["env"]]
    children: list[int] = []
    groups: list[int] = []
    # A bound on the log's bytes (a tenant's sandbox.limits.log): the members write into pipes we copy
    # from, up to the bound, then one marker line; the rest is read and dropped (the job never blocks).
    limit = req.get("log_limit")
    # Stop at the rung for printed metrics too (a loop whose stopper decides at fixed steps: the
    # job's AUTORESEARCH_STOP_* env): its output comes through a pipe we scan, and a line that
    # reports the objective at a rung holds the job (SIGSTOP) until the loop's verdict (_Rungs).
    rungs = _Rungs.from_env(envs[0])
    cap = int(limit) if isinstance(limit, int) and limit > 0 else None
    log = _LogCap(log_fd, cap, rungs) if cap is not None or rungs is not None else None
    for env in envs:
        out = log.pipe() if log is not None else log_fd
        child, group = _start_member(req, env, out)
        if out != log_fd:
            os.close(out)
        children.append(child)
        groups.append(group)
    quota = _Quota.of(req.get("quota"))
    me = os.getpid()
    write_json(
        os.path.join(run_dir, STATE),
        {"supervisor_pid": me, "supervisor_start": proc_start_time(me), "pid": children[0], "pgid": groups[0],
         "pgids": groups, "started_at": started},
    )
    if os.path.exists(os.path.join(run_dir, STOP)):
        flags["stop"] = True  # stop() raced our start: it found no state.json to signal

    live = set(children)

    def signal_all(sig: int) -> None:
        for child, group in zip(children, groups, strict=True):
            if child in live:
                _signal_group(group, sig, group != child)
        if sig != signal.SIGSTOP and rungs is not None and rungs.held is not None:
            rungs.held = None  # held at a rung: the signal lands (a stopped process only takes SIGKILL)
            signal_all(signal.SIGCONT)

    timeout = req.get("timeout")
    grace = float(req.get("grace") or 0)
    deadline = started + float(timeout) if timeout else None
    kill_at: float | None = None
    timed_out = stopped = False
    ends: dict[int, int] = {}  # member index -> wait status
    failed: int | None = None  # the member whose failure ended the gang
    peak = 0.0
    while True:
        for i, child in enumerate(children):
            if child not in live:
                continue
            pid, status, rusage = os.wait4(child, os.WNOHANG)
            if pid != child:
                continue
            live.discard(child)
            ends[i] = status
            peak = max(peak, rusage.ru_maxrss / 1024)
            if failed is None and os.waitstatus_to_exitcode(status) != 0 and not (stopped or timed_out):
                failed = i
                if live:  # a member that fails ends the gang's attempt
                    os.write(log_fd, f"autoresearch: gang member {i} (RANK={i}) ended with "
                                     f"{_how(status)}; stopping the other {len(live)} member(s)\n".encode())
                    kill_at = time.time() + grace
                    signal_all(signal.SIGTERM)
        if not live:
            break
        now = time.time()
        if flags["stop"] and not stopped and not timed_out and _stale_stop(run_dir, previous, now):
            flags["stop"] = False
        if flags["stop"] and not stopped and not timed_out:
            stopped = True
            grace = float((read_json(os.path.join(run_dir, STOP)) or {}).get("grace", grace))
            kill_at = now + grace
            signal_all(signal.SIGTERM)
        if deadline is not None and now >= deadline and not stopped and not timed_out:
            timed_out = True
            kill_at = now + grace
            signal_all(signal.SIGTERM)
        if kill_at is not None and now >= kill_at:
            signal_all(signal.SIGKILL)
            kill_at = None
        if quota is not None and quota.over is None and now >= quota.next_at and quota.check(now):
            os.write(log_fd, f"\nautoresearch: the job went {quota.over}: stopped\n".encode())
            signal_all(signal.SIGKILL)  # (every file it writes is bounded by RLIMIT_FSIZE: the overshoot too)
        if rungs is not None and rungs.held is not None and rungs.verdict(now):
            signal_all(signal.SIGCONT)  # go on (or no verdict in time); a stop comes as the stop above
        waits = [t - now for t in (deadline if not (timed_out or stopped) else None, kill_at,
                                   quota.next_at if quota is not None and quota.over is None else None) if t is not None]
        if rungs is not None and rungs.held is not None:
            waits.append(rungs.look_s)
        try:
            select.select([wake_r, *(log.pipes if log is not None else ())], [], [],
                          max(0.0, min(waits)) if waits else 1.0)
        except InterruptedError:
            pass
        try:
            os.read(wake_r, 512)
        except OSError:
            pass  # nothing to drain: the select timed out
        if log is not None:
            at = log.copy()
            if at is not None and rungs is not None and rungs.held is None and not (stopped or timed_out):
                signal_all(signal.SIGSTOP)
                rungs.hold(at, time.time())
    for child, group in zip(children, groups, strict=True):
        for pgid in {child, group}:
            _signal_group(pgid, signal.SIGKILL)  # leftovers of the group, as Slurm does at job end
    if log is not None:
        log.drain()
    final = ends.get(failed if failed is not None else 0)
    code = os.waitstatus_to_exitcode(final) if final is not None else None
    ended_by = quota.over if quota is not None else None
    cgroup = req.get("cgroup")
    if isinstance(cgroup, str) and cgroup:
        ended_by = ended_by or _cgroup_end(cgroup, code)
    if req.get("sandbox") and code is not None and code - 128 in _LIMIT_SIGNALS and not ended_by:  # (bwrap: 128+N)
        os.write(log_fd, f"autoresearch: the job {_LIMIT_SIGNALS[code - 128]}\n".encode())
        ended_by = _LIMIT_DETAILS[code - 128]
    done: dict[str, Any] = {
        "exit_code": code if code is not None and code >= 0 else None,
        "signal": -code if code is not None and code < 0 else None,
        "timed_out": timed_out,
        "stopped": stopped,
        "started_at": started,
        "ended_at": time.time(),
        "peak_rss_mb": round(peak, 1),
    }
    if ended_by:
        done["limit"] = ended_by
    elif log is not None and log.dropped:  # (not OVER_LIMIT: the job ran on, and its exit code says how it ended)
        done["limit"] = f"log past sandbox.limits.log: {log.dropped} bytes dropped"  # (_base.LOG_DROPPED)
    if len(children) > 1:
        done["members"] = len(children)
        done["failed_member"] = failed
    full = _disk_full(run_dir)
    if full:
        done["disk_full"] = full
    write_json(os.path.join(run_dir, EXIT), done)  # (into the reserved blocks: see _reserve)
    os.close(log_fd)
    fifo = req.get("wake_fifo")
    _signal.signal(ACK_SIGNAL, _wake)  # before the poke: a nudge wakes the select below
    if _poke(fifo, req.get("key")) or _poke_starting(fifo, req.get("key")):
        # A watcher that dies right after our poke would leave the ending unrecorded until
        # somebody's next call: wait for its acknowledgement, else run the pass ourselves. A
        # listener that is still there may be busy (a pass launching dozens): it gets longer.
        reaped = os.path.join(run_dir, REAPED)
        begun = time.time()
        check_at = begun + LISTEN_CHECK_S
        while True:
            if os.path.exists(reaped):
                return _quiet(wake_r, wake_w)
            now = time.time()
            if now - begun >= ACK_MAX_S:
                break
            if now >= check_at:
                if not _listening(fifo):
                    break  # the listener died (or left) before it recorded us
                check_at = now + LISTEN_CHECK_S
            try:  # until a nudge (or any signal), or the next look at the listener
                select.select([wake_r], [], [], max(0.0, min(check_at, begun + ACK_MAX_S) - now))
                os.read(wake_r, 512)
            except OSError:
                pass  # nothing to drain: the select timed out
    hook = req.get("on_exit")
    if hook:
        os.chdir(run_dir)  # not the user's workdir: `python -m` would import from there
        out = os.open(os.path.join(run_dir, "on_exit.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(out, 1)
        os.dup2(out, 2)
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        _command_policy()  # (a pass that may fork supervisors itself: they must not inherit ours)
        try:  # in the launcher's environment (a zygote's request carries it), as if it had forked us
            os.execvpe(hook[0], hook, req.get("environ") or os.environ)
        except OSError:
            pass
        os._exit(0)  # (our descriptors and handlers are the hook's now: not another attempt's)
    return _quiet(wake_r, wake_w)


def _reserve(run_dir: str) -> bool:
    """Set ``RESERVE_BYTES`` aside as exit.json's temporary file (this process's: :func:`write_json` opens
    it again with O_TRUNC, which frees them for its write when the disk has filled meanwhile); False where
    the file system cannot (the write then takes its chances, as before)."""
    try:
        fd = os.open(temp_path(os.path.join(run_dir, EXIT)), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return False
    try:
        os.posix_fallocate(fd, 0, RESERVE_BYTES)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _disk_full(run_dir: str) -> str | None:
    """The mount point of ``run_dir`` when its file system has less than ``FULL_BELOW`` free for us."""
    try:
        vfs = os.statvfs(run_dir)
    except OSError:
        return None
    if vfs.f_bavail * vfs.f_frsize >= FULL_BELOW:
        return None
    path = os.path.realpath(run_dir)
    while not os.path.ismount(path) and path != os.path.dirname(path):
        path = os.path.dirname(path)
    return path


def _quiet(wake_r: int, wake_w: int) -> None:
    """After an attempt: no wakeup fd, its pipe closed, the stop signals ignored until the next
    (a stop of the attempt that just ended must not end the process that waits for another)."""
    signal.set_wakeup_fd(-1)
    for sig in (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP):
        _signal.signal(sig, _signal.SIG_IGN)
    os.close(wake_r)
    os.close(wake_w)


# A stop sent to the process of an attempt that ended a moment ago (stop() read its state.json before
# the exit.json was written) reaches it while it runs a later one. stop() writes the attempt's
# stop.json right before it signals: a SIGTERM while this attempt has no stop.json, and one of the
# attempts this process ran before got one in the last STALE_STOP_S, is that one's. Any other
# SIGTERM (a person's kill, a shutdown) stops the attempt, as it stops a supervisor of one attempt.
STALE_STOP_S = 5.0


def _stale_stop(run_dir: str, previous: tuple[str, ...], now: float) -> bool:
    if not previous or os.path.exists(os.path.join(run_dir, STOP)):
        return False
    for before in previous:
        try:
            if now - os.stat(os.path.join(before, STOP)).st_mtime < STALE_STOP_S:
                return True
        except OSError:
            continue
    return False


# What bwrap and setpriv run with: nothing of the job's, nothing of the launcher's (backends/_sandbox.py).
LAUNCHER_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
ARGS_FD = "{args-fd}"  # in a sandboxed argv: where the descriptor of the job's environment goes
INFO_FD = "{info-fd}"  # and where the descriptor bwrap tells its child's pid on


def env_fd(env: dict[str, str]) -> int:
    """A descriptor (inheritable, at offset 0) holding ``--clearenv`` and one ``--setenv`` per
    variable, for bwrap's ``--args``. A name or value bwrap could not take (a NUL, ``=`` in a
    name) is left out: it could never be set, and a NUL would end an argument early."""
    parts = [b"--clearenv"]
    for key, value in env.items():
        if not key or "=" in key or "\0" in key or "\0" in value:
            continue
        parts += [b"--setenv", key.encode(errors="surrogateescape"), value.encode(errors="surrogateescape")]
    fd = os.memfd_create("autoresearch-env", 0)
    blob = memoryview(b"\0".join(parts) + b"\0")
    while blob:
        blob = blob[os.write(fd, blob):]
    os.lseek(fd, 0, os.SEEK_SET)
    os.set_inheritable(fd, True)
    return fd


def _cgroup_end(path: str, code: int | None) -> str | None:
    """After an attempt with a cgroup of its own: why it ended when a limit there did it (an OOM kill:
    memory.max; a failed job whose forks were refused: pids.max); its leftovers killed, the cgroup removed."""
    def events(name: str) -> dict[str, int]:
        try:
            with open(os.path.join(path, name)) as f:
                pairs = [line.split() for line in f.read(4096).splitlines()]
            return {p[0]: int(p[1]) for p in pairs if len(p) == 2 and p[1].isdigit()}
        except OSError:
            return {}

    why = None
    if events("memory.events").get("oom_kill", 0) > 0:
        why = "over its limit: memory (memory.max of its cgroup: killed when out of memory)"
    elif code not in (0, None) and events("pids.events").get("max", 0) > 0:
        why = "over its limit: processes (pids.max of its cgroup: forks were refused)"
    with contextlib.suppress(OSError):
        with open(os.path.join(path, "cgroup.kill"), "w") as f:
            f.write("1")
    for _ in range(50):  # (empty once the killed tasks are gone)
        try:
            os.rmdir(path)
            break
        except OSError:
            time.sleep(0.02)
    return why


class _Quota:
    """The total size of a tenant's project folder (sandbox.limits.disk), measured every ``EVERY_S``
    (or 20 times the last measurement's time, so it takes at most 5% of a core): over it, the job is
    stopped with :attr:`over` as its detail."""

    EVERY_S = 1.0

    def __init__(self, path: str, limit: int) -> None:
        self.path, self.limit = path, limit
        self.next_at = 0.0
        self.over: str | None = None

    @classmethod
    def of(cls, spec: Any) -> _Quota | None:
        if not isinstance(spec, dict):
            return None
        path, limit = spec.get("path"), spec.get("bytes")
        if not isinstance(path, str) or not path.startswith("/") or not isinstance(limit, int) or limit <= 0:
            return None
        return cls(path, limit)

    def check(self, now: float) -> bool:
        begun = time.monotonic()
        used = folder_usage(self.path)
        took = time.monotonic() - begun
        self.next_at = now + max(self.EVERY_S, 20 * took)
        if used > self.limit:
            self.over = f"over its limit: disk quota (project folder: {_size(used)} of {_size(self.limit)})"
            return True
        return False


def folder_usage(path: str) -> int:
    """Bytes of disk the files under ``path`` use (their blocks: a sparse file counts what it holds),
    each inode once (hard links), never following a link. By descriptors (``os.fwalk``): a path
    longer than PATH_MAX deep down is counted too; what cannot be read counts nothing."""
    seen: set[tuple[int, int]] = set()
    total = 0
    try:
        for _top, dirs, files, top_fd in os.fwalk(path, follow_symlinks=False):
            for name in dirs + files:
                try:
                    st = os.stat(name, dir_fd=top_fd, follow_symlinks=False)
                except OSError:
                    continue
                key = (st.st_dev, st.st_ino)
                if key not in seen:
                    seen.add(key)
                    total += st.st_blocks * 512
    except OSError:
        pass
    return total


def _size(n: int) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return f"{n}B"


class _Rungs:
    """Stop at the rung for a job that prints its metrics (``epoch 3 val_loss: 0.41``).

    A trial's ``report()`` waits for the loop's verdict at a rung itself (autoresearch/report.py,
    autoresearch/loop/rungsync.py); a printed line cannot. So its output comes through a pipe that
    we scan: a complete line that reports the objective (``AUTORESEARCH_STOP_METRIC``) at one of
    ``AUTORESEARCH_STOP_STEPS`` stops the job's process groups (SIGSTOP) right after it is written,
    pokes the loop's FIFO (``r``: judge now) and holds them until the verdict file says the step (go
    on: SIGCONT) or ``<step> stop`` (the loop cancelled the job first: the SIGTERM is sent with a
    SIGCONT), at most ``AUTORESEARCH_STOP_WAIT_S``. A stopped job thus prints no step past its rung.
    The line parser is the runtime's (autoresearch/engine/metrics.py), the poke and the verdict's reading
    are report()'s (autoresearch/report.py), imported here only for such a job."""

    look_s = 0.005  # how often a held job's verdict file is read

    def __init__(self, steps: frozenset[int], metric: str, file: str, fifo: str, wait_s: float) -> None:
        self.steps, self.metric, self.file, self.fifo, self.wait_s = steps, metric, file, fifo, wait_s
        self.needle = metric.encode()
        self.partial = b""
        self.held: int | None = None
        self.until = 0.0
        self.judged = -1  # the last rung held at: a line repeated at it does not hold the job again

    @classmethod
    def from_env(cls, env: dict[str, str]) -> _Rungs | None:
        steps, file, fifo = env.get("AUTORESEARCH_STOP_STEPS"), env.get("AUTORESEARCH_STOP_FILE"), env.get("AUTORESEARCH_STOP_FIFO")
        metric = env.get("AUTORESEARCH_STOP_METRIC", "")
        if not (steps and file and fifo and metric) or len(metric) > 250:
            return None
        try:
            wait_s = min(max(float(env.get("AUTORESEARCH_STOP_WAIT_S", "5")), 0.0), 60.0)
            parsed = frozenset(int(s) for s in steps.split(",")[:64])
        except ValueError:
            return None
        return cls(parsed, metric, file, fifo, wait_s) if wait_s == wait_s and wait_s > 0 else None

    def scan(self, data: bytes) -> int | None:
        """The rung a complete line of ``data`` reports the objective at (the last such line), if any."""
        text = self.partial + data
        if self.needle not in text:
            self.partial = text[text.rfind(b"\n") + 1:][-4096:]
            return None
        lines = text.split(b"\n")
        self.partial = lines.pop()[-4096:]
        found = None
        for line in lines:
            if self.needle in line and len(line) <= 2000:
                step = self._rung(line.decode("utf-8", "replace"))
                if step is not None and step > self.judged:
                    found = step
        return found

    def _rung(self, line: str) -> int | None:
        try:
            STEP_KEYS, _log_pairs = _line_parser()
            pairs = _log_pairs(line)
        except Exception:  # noqa: BLE001 - a job's output never breaks its supervisor
            return None
        if not pairs or not any(n == self.metric and v is not None for n, v in pairs):
            return None
        step = next((v for n, v in pairs if n.lower() in STEP_KEYS and v is not None), None)
        if step is None or step != step or not 0 <= step <= 2**53 or int(step) != step:
            return None
        return int(step) if int(step) in self.steps else None

    def hold(self, step: int, now: float) -> None:
        """The job was just stopped at ``step``: poke the loop to judge it now."""
        self.held, self.judged, self.until = step, step, now + self.wait_s
        try:
            poke, _ = _rung_protocol()
            listening = poke(self.fifo)
        except Exception:  # noqa: BLE001 - never breaks the supervisor: no wait
            listening = False
        if not listening:
            self.until = now  # nobody to wait for: go on at once

    def verdict(self, now: float) -> bool:
        """Whether the held job may go on now: the loop answered this step (without a stop: a stop
        is the loop's cancel, which reaches us as SIGTERM) or the wait is over."""
        if now >= self.until:
            self.held = None
            return True
        try:
            _, answer_of = _rung_protocol()
            answer = answer_of(self.file, self.held or 0)
        except Exception:  # noqa: BLE001 - never breaks the supervisor: no wait
            answer = None
        if answer is None:  # not visible here: no wait
            self.held = None
            return True
        if answer == "stop":
            return False  # its SIGTERM is on its way (signal_all continues it then)
        if answer == "go":
            self.held = None
            return True
        return False


def _rung_protocol() -> tuple[Any, Any]:
    """The trial side's poke of the loop and read of its verdict (autoresearch/report.py: ``_poke``,
    ``_answer``), the same a trial's ``report()`` uses at a rung. Found as :func:`_line_parser` finds
    the package (a job is held only after its line was parsed: both are loaded by then)."""
    _line_parser()
    from autoresearch.report import _answer, _poke

    return _poke, _answer


def _line_parser() -> tuple[Any, Any]:
    """autoresearch.engine.metrics' log line parser (stdlib only). The zygote runs this module on its own
    (``python -S -E`` with this folder as sys.path[0]): then the package is found beside it."""
    import sys

    try:
        from autoresearch.engine.metrics import STEP_KEYS, _log_pairs
    except ImportError:
        sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        from autoresearch.engine.metrics import STEP_KEYS, _log_pairs
    return STEP_KEYS, _log_pairs


class _LogCap:
    """The log of an attempt whose output goes through pipes we copy: bounded (at most ``limit`` bytes
    out), or scanned for rung lines (:class:`_Rungs`), or both."""

    def __init__(self, log_fd: int, limit: int | None, rungs: _Rungs | None = None) -> None:
        self.log_fd, self.limit, self.written, self.dropped = log_fd, limit, 0, 0
        self.rungs = rungs
        self.pipes: list[int] = []

    def pipe(self) -> int:
        """A new pipe to copy from; returns its write end (the member's stdout and stderr)."""
        r, w = os.pipe()
        os.set_blocking(r, False)
        self.pipes.append(r)
        return w

    def copy(self) -> int | None:
        """What the pipes hold now; a pipe whose writers are all gone is closed. Returns the rung a
        line of it reported the objective at (with :class:`_Rungs`), else None."""
        found = None
        for r in list(self.pipes):
            while True:
                try:
                    data = os.read(r, 1 << 16)
                except BlockingIOError:
                    break
                except OSError:
                    data = b""
                if not data:
                    os.close(r)
                    self.pipes.remove(r)
                    break
                self._write(data)
                if self.rungs is not None:
                    try:
                        at = self.rungs.scan(data)
                    except Exception:  # noqa: BLE001 - a job's output never breaks its supervisor
                        at = None
                    found = at if at is not None else found
        return found

    def drain(self, within: float = 2.0) -> None:
        """After the attempt: the rest, until every writer is gone (killed with the group) or ``within``."""
        until = time.time() + within
        while self.pipes and time.time() < until:
            try:
                select.select(self.pipes, [], [], max(0.0, until - time.time()))
            except InterruptedError:
                pass
            self.copy()
        for r in self.pipes:
            os.close(r)
        self.pipes.clear()

    def _write(self, data: bytes) -> None:
        if self.limit is None:
            _write_all(self.log_fd, data)
            return
        room = self.limit - self.written
        if room > 0:
            part = data[:room]
            self.written += len(part)
            _write_all(self.log_fd, part)
            data = data[room:]
        if data:
            if not self.dropped:
                _write_all(self.log_fd, f"\nautoresearch: this attempt's log reached its limit of {self.limit} bytes "
                                        "(sandbox.limits.log); the rest of its output is dropped\n".encode())
            self.dropped += len(data)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except InterruptedError:
            continue
        except OSError:
            return  # a full disk: the log is best effort, the attempt goes on


# A sandboxed job killed by one of these went past a limit of its sandbox (backends/limits.py).
_LIMIT_SIGNALS: dict[int, str] = {int(signal.SIGXFSZ): "wrote a file past its disk limit (sandbox.limits.disk): stopped",
                                 int(signal.SIGXCPU): "used its CPU time limit: stopped"}
# exit.json's "limit" (the attempt's detail) for each: backends/_base.py OVER_LIMIT, then what it went past.
_LIMIT_DETAILS: dict[int, str] = {int(signal.SIGXFSZ): "over its limit: a file past sandbox.limits.disk (SIGXFSZ)",
                                  int(signal.SIGXCPU): "over its limit: its CPU time (sandbox.limits.cpu x timeout, SIGXCPU)"}


def _start_member(req: dict[str, Any], env: dict[str, str], log_fd: int) -> tuple[int, int]:
    """Spawn one member; (its pid, the process group to signal)."""
    argv, info, args, chain = req["argv"], None, None, None
    job_env = env
    if req.get("sandbox"):  # argv[0] is bwrap: it tells us its child's pid, whose session we signal
        info, info_w = os.pipe()
        os.set_inheritable(info_w, True)
        # The job's environment reaches its command only, through bwrap's --args: bwrap (and any
        # helper before the sandbox) runs with the fixed launcher environment, never the job's
        # (an LD_PRELOAD of the job's would load into them, as the launcher's uid, outside).
        args = env_fd(env)
        argv = [str(args) if a == ARGS_FD else str(info_w) if a == INFO_FD else a for a in argv]
        env = LAUNCHER_ENV
    try:
        cgroup = req.get("cgroup")
        chain = _rootbox_plan(argv) if req.get("sandbox") and req.get("rootbox") else None
        if chain is not None:  # a root launcher's chain: its stages run in our child (backends/_rootbox.py)
            child = rootbox().spawn(chain, job_env, log_fd, cgroup if isinstance(cgroup, str) and cgroup else None,
                                   lambda: _child_setup(log_fd, session=True))
        else:
            child = _spawn(argv, env, req["workdir"], log_fd, cgroup if isinstance(cgroup, str) and cgroup else None)
    finally:
        if args is not None:
            os.close(args)
    group = child
    if info is not None:
        os.close(info_w)
        if chain is not None:  # (our child is the sandbox's pid 1 itself: nothing to learn)
            os.close(info)
        else:
            group = _sandbox_child(info) or child
    return child, group


def rootbox() -> Any:
    """backends/_rootbox.py, imported as we were: from the package, or (in the home's zygote and the
    supervisors it forks, ``python -S -E _zygote.py``) from this folder; None where it cannot load."""
    import importlib

    try:
        return importlib.import_module(f"{__package__}._rootbox" if __package__ else "_rootbox")
    except (ImportError, OSError, AttributeError):
        return None


def _rootbox_plan(argv: list[str]) -> Any:
    """The plan of a root sandbox chain that our child can run itself (backends/_rootbox.py), or None
    (the programs run it): not root, an old kernel, an argv it does not know."""
    module = rootbox()
    return module.plan(argv) if module is not None and module.usable() else None


def _child_setup(log_fd: int, session: bool = False) -> None:
    """In a forked child that runs a command: as :func:`_spawn`'s (scheduling policy, process group
    or with ``session`` a session of its own, output to the log, default signals)."""
    _command_policy()
    if session:
        os.setsid()
    else:
        os.setpgid(0, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    signal.set_wakeup_fd(-1)
    for sig in _DEFAULT_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)


def _how(status: int) -> str:
    code = os.waitstatus_to_exitcode(status)
    return f"exit {code}" if code >= 0 else f"signal {-code}"


def _poke(fifo: str | None, key: object = None) -> bool:
    """Wake a listening watcher; False when nobody listens (ENXIO) or there is no FIFO. ``key``: the
    attempt that ended ("JOB.N"), said as ``\\neJOB.N\\n`` (one write of less than PIPE_BUF: whole or
    not at all), so the listener may look at that attempt alone (watcher.Watcher.take); no key: ``x``."""
    if not fifo:
        return False
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        os.write(fd, b"\ne%s\n" % key.encode() if isinstance(key, str) and len(key) < 64 else b"x")
        return True
    except BlockingIOError:
        return True  # the pipe is full of pokes already: the watcher will wake
    except OSError:
        return False
    finally:
        os.close(fd)


def _poke_starting(fifo: str | None, key: object = None) -> bool:
    """:func:`_poke` once a pass daemon started lately listens (its ``passd.<fifo>.started`` stamp,
    which ``passd.ensure`` touches when it starts one and the daemon fills with its pid once it holds
    its lock, before its imports). It waits ``DAEMON_GRACE_S`` from the start, and past that only
    while that daemon is alive, up to ``DAEMON_START_MAX_S`` (a loaded host, where its imports take
    seconds and an interpreter of our own would take as long); False at once when none started lately."""
    if not fifo:
        return False
    stamp = os.path.join(os.path.dirname(fifo), f"passd.{os.path.basename(fifo)}.started")
    try:
        age = time.time() - os.lstat(stamp).st_mtime
    except OSError:
        return False
    if not 0 <= age < DAEMON_START_MAX_S:  # (a stamp from the future, planted or skewed: no wait at all)
        return False
    began = time.time() - age
    while True:
        waited = time.time() - began
        if waited >= DAEMON_START_MAX_S or (waited >= DAEMON_GRACE_S and not _daemon_alive(stamp)):
            return False
        time.sleep(DAEMON_LOOK_S)
        if _poke(fifo, key):
            return True


def _daemon_alive(stamp: str) -> bool:
    """Whether the pid the starting daemon wrote in its stamp is a live process (none written: no)."""
    try:
        with open(stamp, "rb") as f:
            said = f.read(32).strip()
    except OSError:
        return False
    return said.isdigit() and 0 < int(said) < 1 << 22 and is_alive(int(said), None)


def nudge(state: dict[str, Any] | None) -> None:
    """Wake the supervisor of ``state`` (its state.json) that waits for its ``reaped`` file."""
    try:
        pid = int((state or {})["supervisor_pid"])
        if is_alive(pid, state.get("supervisor_start") if state else None):
            os.kill(pid, ACK_SIGNAL)
    except (KeyError, TypeError, ValueError, OSError):
        pass


def _listening(fifo: str | None) -> bool:
    """Whether a process still has ``fifo`` open for reading (opening it to write succeeds)."""
    if not fifo:
        return False
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        return False
    return True


def _sandbox_child(info: int) -> int | None:
    """The sandboxed child's pid from bwrap's ``--info-fd`` JSON (None if bwrap failed first)."""
    data = b""
    deadline = time.time() + 10
    try:
        while time.time() < deadline and select.select([info], [], [], max(0.0, deadline - time.time()))[0]:
            chunk = os.read(info, 4096)
            if not chunk:
                break
            data += chunk
        pid = json.loads(data or b"{}").get("child-pid")
    except (OSError, ValueError, AttributeError):
        pid = None
    finally:
        os.close(info)
    return pid if isinstance(pid, int) and pid > 0 else None


def _signal_group(pgid: int, sig: int, or_pid: bool = False) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        if not or_pid:
            return
        try:  # a sandboxed child that has not made its own session yet
            os.kill(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    except PermissionError:
        pass


def _wake(signum: int, frame: object) -> None:
    """A handler that does nothing: the signal's byte on the wakeup fd ends the select."""


def _close_all_but(keep: set[int]) -> None:
    """Close every descriptor but ``keep`` (the launcher's, the zygote's: locks among them).

    With close_range (Linux >= 5.9) in a few calls. A supervisor's CPU is mostly page faults
    (copy-on-write of the image it was forked from: ~10 us each on a paravirtualized VM), so it
    builds as few Python objects as it can; a listing of /proc/self/fd cost ~40 of them."""
    low = 3
    for fd in sorted(keep):
        if fd >= low:
            os.closerange(low, fd)
            low = fd + 1
    try:
        top = os.sysconf("SC_OPEN_MAX")
    except (ValueError, OSError):
        top = -1
    if not 0 < top <= 1 << 20:
        top = 1 << 16
    os.closerange(low, top)
