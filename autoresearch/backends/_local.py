"""The local backend: attempts run on this host under a detached supervisor.

GPUs come from NVML when a driver is present, otherwise ``AUTORESEARCH_GPUS=N``
declares N slots (how development and tests get GPUs on a machine without one).
The external id of an attempt is its run dir, so any process can poll or stop it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import time
from functools import lru_cache
from typing import Any

from autoresearch.backends import _supervisor as sup
from autoresearch.backends._base import (
    DISK_FULL,
    AttemptStatus,
    Backend,
    Capabilities,
    LaunchRequest,
    NodeInfo,
    gang_members,
    member_env,
)
from autoresearch.errors import BackendError, SpecError

START_GRACE_S = 15.0  # a run dir with no state.json after this long lost its supervisor


DRIVER_NODES = ("/dev/nvidiactl", "/dev/dxg")  # the NVIDIA driver's control device; WSL2's GPU device


@lru_cache(maxsize=1)
def _nvml_gpus() -> tuple[str, ...]:
    if not any(os.path.exists(node) for node in DRIVER_NODES):
        return ()  # no driver: no GPUs, and no NVML import (~15 ms) on every CLI read's pass
    try:
        import pynvml  # nvidia-ml-py; only imported when AUTORESEARCH_GPUS is unset

        pynvml.nvmlInit()
        try:
            return tuple(str(i) for i in range(pynvml.nvmlDeviceGetCount()))
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no driver, no library: no GPUs
        return ()


def local_gpu_ids() -> tuple[str, ...]:
    declared = os.environ.get("AUTORESEARCH_GPUS")
    if declared is not None and declared.strip() != "":
        try:
            count = int(declared)
        except ValueError:
            raise SpecError(
                f"AUTORESEARCH_GPUS={declared!r} is not a number", hint="set AUTORESEARCH_GPUS=N, e.g. 2"
            ) from None
        if count < 0:
            raise SpecError("AUTORESEARCH_GPUS must be >= 0", hint="set AUTORESEARCH_GPUS=N, e.g. 2")
        return tuple(str(i) for i in range(count))
    return _nvml_gpus()


HOST_SIZE_S = 10.0  # how long this process trusts its read of the host's CPUs and memory
_host: list[Any] = [-HOST_SIZE_S, 1.0, 0]  # [read at (monotonic), cpus, memory MB]


def _host_size() -> tuple[float, int]:
    """This host's CPUs and memory (MB), read again every ``HOST_SIZE_S``: every submit and pass asks
    (os.cpu_count reads /sys each time), and they change only when the machine is resized."""
    now = time.monotonic()
    if now - _host[0] >= HOST_SIZE_S:
        _host[:] = [now, float(os.cpu_count() or 1), _memory_mb()]
    return _host[1], _host[2]


def _memory_mb() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20)
    except (ValueError, OSError):
        return 0


def _make_dir(path: str) -> None:
    """``os.makedirs(path, 0o700, exist_ok=True)`` in one mkdir when its parent exists (a launch's case)."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except FileNotFoundError:
        os.makedirs(path, mode=0o700, exist_ok=True)


class LocalBackend(Backend):
    name = "local"
    # multi_node: a gang runs as one process group per member on this host (single_host: the
    # scheduler packs its members here, each with its own GPU slots; docs/gangs.md).
    capabilities = Capabilities(gpus=True, preemption=True, multi_node=True, logs_follow=True, places=True,
                                sandbox=True)
    single_host = True

    def __init__(self, node_name: str | None = None) -> None:
        # (os.uname().nodename is what socket.gethostname() returns; importing socket costs a read ~3 ms)
        self.node_name = node_name or os.environ.get("AUTORESEARCH_NODE") or os.uname().nodename or "local"
        self._states: dict[str, dict[str, Any]] = {}  # external id -> its state.json
        self._logs: dict[str, str] = {}  # external id -> its log's path (from its request.json)

    def nodes(self) -> list[NodeInfo]:
        return [NodeInfo(self.node_name, local_gpu_ids(), *_host_size())]

    def attempt_pids(self, external_id: str) -> list[int]:
        """The attempt's program process(es) on this machine (its state.json), for a stack dump of a hang."""
        state = sup.read_json(os.path.join(external_id, sup.STATE)) or {}
        pid = state.get("pid")
        return [pid] if type(pid) is int and pid > 1 else []

    def start(self, request: LaunchRequest) -> str:
        members = gang_members(request)
        if request.nodes > 1 and len(members) != request.nodes:
            raise BackendError(f"a gang of {request.nodes} needs a placement per member, got {len(members)}",
                               hint="submit it through the runtime, which places every member")
        argv = request.argv
        if request.sandbox:
            from autoresearch.backends import _sandbox  # tenant jobs only

            argv = _sandbox.wrap(request.argv, request.workdir, request.sandbox)
        _make_dir(request.run_dir)
        if request.sandbox is not None and request.sandbox.cgroup:
            _make_cgroup(request.sandbox.cgroup, request.sandbox.limits)
        if os.path.dirname(request.log_path) != os.path.dirname(request.run_dir):  # the runtime's: beside it
            os.makedirs(os.path.dirname(request.log_path), mode=0o700, exist_ok=True)
        recorded = os.path.join(request.run_dir, "request.json")
        if os.path.exists(recorded):
            if _ours(recorded, request):
                return request.run_dir  # launched already
            raise BackendError(f"the run dir {request.run_dir} holds another attempt (another ledger's, or "
                               "another key's): never adopted", hint="launch it in a run dir of its own")
        _remember(self._logs, request.run_dir, request.log_path)  # its ending's ingest reads no request.json
        sup.launch(
            {
                "argv": argv,
                "key": request.key,  # its poke names it (watcher.Watcher.take)
                "sandbox": request.sandbox is not None,
                # a root launcher's sandbox made by the supervisor's child, not by the programs (backends/_rootbox.py)
                "rootbox": request.sandbox is not None and request.sandbox.uid is not None and _rootbox_on(),
                "log_limit": int(request.sandbox.limits.get("log") or 0) if request.sandbox is not None else None,
                "cgroup": request.sandbox.cgroup if request.sandbox is not None and request.sandbox.cgroup else None,
                # the project folder's total (sandbox.limits.disk), measured by the supervisor as the job runs
                "quota": {"path": request.sandbox.project_dir, "bytes": int(request.sandbox.limits["disk"])}
                if request.sandbox is not None and request.sandbox.project_dir and request.sandbox.limits.get("disk")
                else None,
                "env": request.env,
                # one process group per gang member, all on this host: the master is here
                "members": [member_env({**request.env, "MASTER_ADDR": "127.0.0.1"}, i, node, ids)
                            for i, (node, ids) in enumerate(members)] if request.nodes > 1 else None,
                "workdir": request.workdir,
                "log_path": request.log_path,
                "run_dir": request.run_dir,
                "timeout": request.timeout,
                "grace": request.grace,
                "on_exit": request.on_exit,
                "wake_fifo": request.wake_fifo,
            }
        )
        # Recorded once the supervisor has its request: a file's creation the command no longer waits for.
        # A key is still run at most once: two launchers of one key (only a caller of start() twice: a pass
        # launches the attempts its own transaction began) each hand a supervisor the request, and a
        # supervisor's claim (its O_EXCL creation of the log) lets one of them run it.
        try:
            fd = os.open(recorded, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return request.run_dir
        try:  # (json.dumps is C; json.dump to a text file is not)
            recorded_request: dict[str, Any] = {"key": request.key, "created_at": time.time(),
                                                "log_path": request.log_path, "sandbox": request.sandbox is not None,
                                                "ledger": request.ledger}
            if request.sandbox is not None and request.sandbox.limits:
                from autoresearch.backends import _sandbox

                how = _sandbox.applied(request.sandbox)
                recorded_request["limits"] = {k: [v, how[k]] for k, v in request.sandbox.limits.items() if k in how}
                recorded_request["limits_by"] = _sandbox.mechanism(request.sandbox)
            os.write(fd, json.dumps(recorded_request).encode())
        finally:
            os.close(fd)
        return request.run_dir

    @staticmethod
    def batch() -> contextlib.AbstractContextManager[None]:
        """Launches inside hand their supervisors to the home's zygote without waiting for each answer
        (Runtime.launch_many: a batch); the answers are read, and what it did not take forked, at the end."""
        return sup.batch()

    def poll(self, external_id: str) -> AttemptStatus:
        done = sup.read_json(os.path.join(external_id, sup.EXIT))
        if done is not None:  # (its state stays cached for release(): it nudges the supervisor)
            code, sig = done.get("exit_code"), done.get("signal")
            if isinstance(code, int) and 128 < code <= 128 + 64 and self._sandboxed(external_id):
                sig, code = code - 128, None  # bwrap reports its child's death by signal N as exit 128+N
            return AttemptStatus(
                "exited",
                exit_code=code,
                signal=sig,
                timed_out=bool(done.get("timed_out")),
                stopped=bool(done.get("stopped")),
                started_at=done.get("started_at"),
                ended_at=done.get("ended_at"),
                peak_rss_mb=done.get("peak_rss_mb"),
                detail=f"{DISK_FULL}{str(done['disk_full'])[:300]}" if done.get("disk_full") else str(done.get("limit") or "")[:300],
            )
        state = self._states.get(external_id) or sup.read_json(os.path.join(external_id, sup.STATE))
        if state is not None:
            _remember(self._states, external_id, state)  # written once, never changed: no need to read it again
        else:
            try:  # the file's mtime, not its content: it may be half-written right now
                created = os.path.getmtime(os.path.join(external_id, "request.json"))
            except OSError:  # (its launcher died before it recorded the request: maybe after it sent it)
                try:
                    created = os.path.getmtime(external_id)
                except OSError:
                    created = 0.0
            if created and time.time() - created < START_GRACE_S:
                return AttemptStatus("starting")
            return AttemptStatus("lost", ended_at=time.time(), detail=sup.NEVER_STARTED)
        if sup.is_alive(int(state["supervisor_pid"]), state.get("supervisor_start")):
            return AttemptStatus("running", started_at=state.get("started_at"))
        # The supervisor may have finished between our two reads.
        self._states.pop(external_id, None)
        done = sup.read_json(os.path.join(external_id, sup.EXIT))
        if done is not None:
            return self.poll(external_id)
        return AttemptStatus(
            "lost", started_at=state.get("started_at"), ended_at=time.time(), detail="supervisor died (killed or node restarted)"
        )

    def release(self, external_id: str) -> None:
        # The supervisor waits for this after poking a watcher: no marker, no trust; then the nudge.
        with contextlib.suppress(OSError):  # (os.open: no file object for an empty marker)
            os.close(os.open(os.path.join(external_id, sup.REAPED), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
        sup.nudge(self._states.pop(external_id, None) or sup.read_json(os.path.join(external_id, sup.STATE)))

    def read_log(self, external_id: str, offset: int = 0, max_bytes: int = 1 << 20) -> bytes:
        return sup.read_log_file(self._log_path(external_id), offset, max_bytes) or b""

    def log_size(self, external_id: str) -> int:
        try:
            return os.path.getsize(self._log_path(external_id))
        except OSError:
            return 0

    def stop(self, external_id: str, grace: float | None = None) -> None:
        stop: dict[str, float] = {"requested_at": time.time()}
        if grace is not None:
            stop["grace"] = grace
        os.makedirs(external_id, exist_ok=True)  # a launcher killed before it made the run dir: the stop waits there
        sup.write_json(os.path.join(external_id, sup.STOP), stop)
        state = sup.read_json(os.path.join(external_id, sup.STATE))
        if state is None or os.path.exists(os.path.join(external_id, sup.EXIT)):
            return  # not started yet (it reads stop.json) or already over
        if sup.is_alive(int(state["supervisor_pid"]), state.get("supervisor_start")):
            try:
                os.kill(int(state["supervisor_pid"]), signal.SIGTERM)
            except ProcessLookupError:
                pass
        else:
            # Lost supervisor: nobody enforces the grace period, so end the orphans now.
            for pgid in state.get("pgids") or [state["pgid"]]:  # every member of a gang
                try:
                    os.killpg(int(pgid), signal.SIGKILL)
                except (ProcessLookupError, PermissionError, TypeError, ValueError):
                    pass

    @staticmethod
    def _sandboxed(external_id: str) -> bool:
        return bool((sup.read_json(os.path.join(external_id, "request.json")) or {}).get("sandbox"))

    def _log_path(self, external_id: str) -> str:
        known = self._logs.get(external_id)
        if known is not None:
            return known
        request = sup.read_json(os.path.join(external_id, "request.json"))  # written once, never changed
        path = str((request or {}).get("log_path") or "")
        if not path:  # (its launcher died before it wrote request.json): where the runtime puts it, if there
            beside = external_id.rstrip("/") + ".log"
            path = beside if os.path.exists(beside) else os.path.join(external_id, "missing.log")
        if request is not None:
            _remember(self._logs, external_id, path)
        return path


def _ours(recorded: str, request: LaunchRequest) -> bool:
    """Whether the request.json at ``recorded`` is ``request``'s: its key and its ledger's id."""
    data = sup.read_json(recorded)
    if data is None:  # (being written by the start() that made it: ours only if we are that start, unknowable)
        return True
    return data.get("key") == request.key and str(data.get("ledger") or "") == request.ledger


def _remember(cache: dict[str, Any], key: str, value: Any) -> None:
    """``cache[key] = value``, in a cache of what attempts wrote once: bounded, so the entries of
    endings another process recorded (never released here) do not pile up."""
    if len(cache) > 100_000:
        cache.clear()
    cache[key] = value


def _make_cgroup(path: str, limits: dict[str, Any]) -> None:
    """An attempt's own cgroup v2 with its limits written (backends/limits.py ``cgroup_files``); its
    supervisor moves the sandbox into it before the exec. Fails closed: limits that cannot be set are
    a launch that fails, never a job run without them."""
    from autoresearch.backends import limits as L

    try:
        os.mkdir(path, 0o755)
    except FileExistsError:
        pass
    except OSError as err:
        raise BackendError(f"cannot make the attempt's cgroup {path}: {err}",
                           hint="check sandbox.cgroup is delegated to the server (docs/security.md)") from err
    for name, value in L.cgroup_files(limits).items():
        try:
            with open(os.path.join(path, name), "w") as f:
                f.write(value)
        except OSError as err:
            if name == "memory.swap.max" and err.errno == errno.ENOENT:
                continue  # (a kernel without swap accounting)
            raise BackendError(f"cannot set {name} of the attempt's cgroup {path}: {err}",
                               hint="check sandbox.cgroup enables cpu, memory and pids for its children") from err


def _rootbox_on() -> bool:
    """Whether a root launcher's tenant sandboxes are made by the supervisor's child (backends/_rootbox.py):
    where that works here (checked once per process) and ``AUTORESEARCH_ROOTBOX`` is not ``off``."""
    if os.environ.get("AUTORESEARCH_ROOTBOX", "").lower() in ("off", "0", "no", "false"):
        return False
    from autoresearch.backends import _sandbox

    return _sandbox.rootbox_works()
