"""The backend contract (docs/architecture.md, invariant 3).

A backend is thin and honest: it starts an attempt, reports its state, returns log
bytes from an offset, and stops it with a grace period. It knows nothing of jobs'
retries, trials or plans — the runtime decides what an ending *means*.

Contract every implementation keeps (checked by ``autoresearch.testing.backends.BackendConformance``):

* ``start`` returns quickly with an ``external_id`` that stays valid across processes:
  another process (a later CLI call) can ``poll``/``stop``/``read_log`` with it.
* ``start`` launches at most once per ``LaunchRequest.key``; the attempt must outlive
  the calling process.
* ``poll`` is idempotent and cheap. Once it reports ``exited`` or ``lost`` the result
  never changes.
* ``stop`` is idempotent; it sends SIGTERM (or the engine's equivalent), waits
  ``grace`` seconds, then kills. It does not block for the grace period.
* ``read_log(offset, max_bytes)`` returns stdout+stderr interleaved, as bytes.
* Methods may be called from several threads and processes at once.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Literal

from autoresearch.util._record import NEW, record
from autoresearch.util._regex import lazy

AttemptState = Literal["starting", "running", "exited", "lost"]


@record(frozen=True)
@dataclass(slots=True, init=False, repr=False, eq=False)
class Capabilities:
    """What a backend can do, so callers ask instead of guessing."""

    gpus: bool = False
    preemption: bool = False  # we may stop attempts to make room (needs our scheduler's placement)
    multi_node: bool = False
    containers: bool = False
    logs_follow: bool = False
    places: bool = True  # True: our scheduler picks node + GPU slots; False: the engine schedules
    sandbox: bool = False  # runs tenant jobs in a LaunchRequest.sandbox (docs/security.md); else refuses them
    # False: the attempt's files are not readable here (Ray, Kubernetes): no metrics file; report()
    # prints marked lines and the runtime reads them from read_log (autoresearch/engine/ingest.py)
    shared_fs: bool = True
    # True: the engine resolves a job's secret_env (NAME -> STORE/KEY) from its own secret store
    # (Kubernetes Secrets, Databricks secret scopes); else a job with secret_env is refused at submit
    secrets: bool = False

    def __init__(self, gpus: bool = False, preemption: bool = False, multi_node: bool = False,
                 containers: bool = False, logs_follow: bool = False, places: bool = True, sandbox: bool = False,
                 shared_fs: bool = True, secrets: bool = False) -> None:
        _set = object.__setattr__
        _set(self, "gpus", gpus)
        _set(self, "preemption", preemption)
        _set(self, "multi_node", multi_node)
        _set(self, "containers", containers)
        _set(self, "logs_follow", logs_follow)
        _set(self, "places", places)
        _set(self, "sandbox", sandbox)
        _set(self, "shared_fs", shared_fs)
        _set(self, "secrets", secrets)


@record(frozen=True)
@dataclass(slots=True, init=False, repr=False, eq=False)
class NodeInfo:
    """A node as its engine reports it."""

    name: str
    gpu_ids: tuple[str, ...] = ()
    cpus: float = 0.0
    memory: int = 0  # MB
    labels: dict[str, str] = field(default_factory=dict)
    state: str = ""  # the engine's own word for the node (Slurm: "idle", "drained", ...); "" if it has none
    reason: str = ""  # the engine's reason for that state (Slurm's drain reason)

    def __init__(self, name: str, gpu_ids: tuple[str, ...] = (), cpus: float = 0.0, memory: int = 0,
                 labels: dict[str, str] = NEW, state: str = "", reason: str = "") -> None:
        _set = object.__setattr__
        _set(self, "name", name)
        _set(self, "gpu_ids", gpu_ids)
        _set(self, "cpus", cpus)
        _set(self, "memory", memory)
        _set(self, "labels", {} if labels is NEW else labels)
        _set(self, "state", state)
        _set(self, "reason", reason)


@record(frozen=True)
@dataclass(slots=True, init=False, repr=False, eq=False)
class Sandbox:
    """What a tenant job must not see, and the only paths it may write (docs/security.md).

    Everything else is read-only; temporary directories are private to the attempt.
    """

    hidden: tuple[str, ...] = ()  # empty inside (the autoresearch home, the tokens file)
    visible: tuple[str, ...] = ()  # read-only, unless hidden: mount sources (the workdir always is)
    own: tuple[str, ...] = ()  # the only writable paths, even under a hidden one (its metrics file, ...)
    uid: int | None = None  # the uid/gid the job runs as (a root launcher's tenant ids); None: the launcher's
    gid: int | None = None
    devices: tuple[str, ...] = ()  # device nodes bound into its minimal /dev (its GPUs')
    limits: dict[str, Any] = field(default_factory=dict)  # limits.Limits.as_dict(): what it may use
    project_dir: str = ""  # its project's folder: limits["disk"] bounds its total size too (a check)
    cgroup: str = ""  # its own cgroup v2 folder (a delegated host): memory, pids and cpu bounded there
    no_cgroup: str = ""  # else why there is none (status says it)

    def __init__(self, hidden: tuple[str, ...] = (), visible: tuple[str, ...] = (), own: tuple[str, ...] = (),
                 uid: int | None = None, gid: int | None = None, devices: tuple[str, ...] = (),
                 limits: dict[str, Any] = NEW, project_dir: str = "", cgroup: str = "", no_cgroup: str = "") -> None:
        _set = object.__setattr__
        _set(self, "hidden", hidden)
        _set(self, "visible", visible)
        _set(self, "own", own)
        _set(self, "uid", uid)
        _set(self, "gid", gid)
        _set(self, "devices", devices)
        _set(self, "limits", {} if limits is NEW else limits)
        _set(self, "project_dir", project_dir)
        _set(self, "cgroup", cgroup)
        _set(self, "no_cgroup", no_cgroup)


@record(frozen=True)
@dataclass(slots=True, init=False, repr=False, eq=False)
class LaunchRequest:
    """Everything a backend needs to start one attempt."""

    key: str  # unique per attempt, e.g. "12.1"
    argv: list[str]
    env: dict[str, str]  # complete environment of the attempt
    workdir: str
    log_path: str
    run_dir: str  # a directory the backend may use for this attempt's bookkeeping
    node: str | None = None
    gpu_ids: tuple[str, ...] = ()
    nodes: int = 1
    alloc: tuple[tuple[str, tuple[str, ...]], ...] = ()  # the whole placement: (node, gpu ids) per gang member
    timeout: float | None = None
    grace: float = 10.0
    on_exit: list[str] | None = None  # argv to run once the attempt has ended (best effort)
    # A FIFO a live watcher reads: when someone listens, poking it replaces running on_exit.
    wake_fifo: str | None = None
    sandbox: Sandbox | None = None  # None: run as the launching user sees the machine
    image: str = ""  # container image (only a backend with the containers capability gets one)
    mounts: dict[str, str] = field(default_factory=dict)  # target -> source, for engines that mount
    # What the job asks for, for engines that schedule themselves (places=False: Slurm, Kubernetes, ...).
    gpus: int = 0  # per node
    cpus: float = 0.0  # per node
    memory: int = 0  # MB per node
    priority: str = "normal"  # one of spec.PRIORITIES
    # For engines whose nodes are not this host (backends/_env.py): the names the job's spec set in
    # its env (always sent), and its secret_env (NAME -> STORE/KEY, resolved by the engine).
    job_env: tuple[str, ...] = ()
    secret_env: dict[str, str] = field(default_factory=dict)
    # The id of the ledger that made this attempt: the backend records it with the request, and treats a
    # run dir whose request names another ledger (or another key) as not its own (autoresearch/engine/runfolders.py).
    ledger: str = ""

    def __init__(self, key: str, argv: list[str], env: dict[str, str], workdir: str, log_path: str, run_dir: str,
                 node: str | None = None, gpu_ids: tuple[str, ...] = (), nodes: int = 1,
                 alloc: tuple[tuple[str, tuple[str, ...]], ...] = (), timeout: float | None = None,
                 grace: float = 10.0, on_exit: list[str] | None = None, wake_fifo: str | None = None,
                 sandbox: Sandbox | None = None, image: str = "", mounts: dict[str, str] = NEW, gpus: int = 0,
                 cpus: float = 0.0, memory: int = 0, priority: str = "normal", job_env: tuple[str, ...] = (),
                 secret_env: dict[str, str] = NEW, ledger: str = "") -> None:
        _set = object.__setattr__
        _set(self, "key", key)
        _set(self, "argv", argv)
        _set(self, "env", env)
        _set(self, "workdir", workdir)
        _set(self, "log_path", log_path)
        _set(self, "run_dir", run_dir)
        _set(self, "node", node)
        _set(self, "gpu_ids", gpu_ids)
        _set(self, "nodes", nodes)
        _set(self, "alloc", alloc)
        _set(self, "timeout", timeout)
        _set(self, "grace", grace)
        _set(self, "on_exit", on_exit)
        _set(self, "wake_fifo", wake_fifo)
        _set(self, "sandbox", sandbox)
        _set(self, "image", image)
        _set(self, "mounts", {} if mounts is NEW else mounts)
        _set(self, "gpus", gpus)
        _set(self, "cpus", cpus)
        _set(self, "memory", memory)
        _set(self, "priority", priority)
        _set(self, "job_env", job_env)
        _set(self, "secret_env", {} if secret_env is NEW else secret_env)
        _set(self, "ledger", ledger)


# An attempt's ``detail`` that starts with this (then the full file system's mount point): its run dir's
# disk was full at its end. Recorded as infra but the home's fault, not the node's: never counted
# against the node, and retried only once the disk has room again (runtime.Runtime._ending).
DISK_FULL = "disk full: "
# The detail of an attempt its sandbox stopped for going past one of its limits (backends/limits.py):
# the job's own doing, never retried ("exit", class user), whatever signal ended it.
OVER_LIMIT = "over its limit: "
# ... and one whose log went past sandbox.limits.log (the rest dropped; the job ran on): said after its exit.
LOG_DROPPED = "log past sandbox.limits.log: "


@record(frozen=True)
@dataclass(slots=True, init=False, repr=False, eq=False)
class AttemptStatus:
    """An attempt's state as its backend reports it (poll)."""

    state: AttemptState
    exit_code: int | None = None
    signal: int | None = None
    timed_out: bool = False
    stopped: bool = False  # ended after a stop() we sent
    started_at: float | None = None
    ended_at: float | None = None
    peak_rss_mb: float | None = None
    detail: str = ""
    # Ended by a cancel someone asked the engine for (Slurm's scancel, Ray's stop), not by us: a person's
    # cancel, recorded ``cancelled`` and never retried (runtime.classify; our own stops have a stop_reason).
    cancelled: bool = False
    preempted: bool = False  # the engine took it back (Slurm's requeue): ended, resumes in a next attempt
    # Never started because what the job or its profile asked for cannot be done (a workdir Ray cannot
    # package, a secret reference that is not one): the user's failure, not retried as the machine's.
    refused: bool = False
    # Where an engine that places its own jobs (Slurm) runs it, as the engine says (None: not said);
    # recorded on the attempt. A ``starting`` attempt's ``detail`` of ``engine: STATE, reason`` is the
    # engine's own word for why it has not started (Slurm's PENDING and its reason): status shows it.
    node: str | None = None
    gpu_ids: tuple[str, ...] | None = None
    # A gang's every node and its GPU ids, as the engine says (``node`` is the first): recorded as the
    # attempt's placement (``alloc``), so status shows all of them. None: not said, or one node.
    members: tuple[tuple[str, tuple[str, ...]], ...] | None = None

    @property
    def ended(self) -> bool:
        return self.state in ("exited", "lost")

    def __init__(self, state: AttemptState, exit_code: int | None = None, signal: int | None = None,
                 timed_out: bool = False, stopped: bool = False, started_at: float | None = None,
                 ended_at: float | None = None, peak_rss_mb: float | None = None, detail: str = "",
                 cancelled: bool = False, preempted: bool = False, refused: bool = False, node: str | None = None,
                 gpu_ids: tuple[str, ...] | None = None,
                 members: tuple[tuple[str, tuple[str, ...]], ...] | None = None) -> None:
        _set = object.__setattr__
        _set(self, "state", state)
        _set(self, "exit_code", exit_code)
        _set(self, "signal", signal)
        _set(self, "timed_out", timed_out)
        _set(self, "stopped", stopped)
        _set(self, "started_at", started_at)
        _set(self, "ended_at", ended_at)
        _set(self, "peak_rss_mb", peak_rss_mb)
        _set(self, "detail", detail)
        _set(self, "cancelled", cancelled)
        _set(self, "preempted", preempted)
        _set(self, "refused", refused)
        _set(self, "node", node)
        _set(self, "gpu_ids", gpu_ids)
        _set(self, "members", members)


class Backend(abc.ABC):
    """Base class of every backend; see the module docstring for the contract."""

    name: str = "?"
    capabilities: Capabilities = Capabilities()
    simulated: bool = False  # runs nothing (a test double): never suggested to a user in a hint
    # All its nodes are this one host (local): a gang's members may share a node, each with its
    # own GPU slots (scheduler.schedule(pack_gangs=True)); else one member per node.
    single_host: bool = False

    def check(self, spec: Any) -> None:
        """Refuse, at submit, what this backend cannot run: a :class:`SpecError` whose hint
        names a registered backend that can. Never an attempt that fails and is retried.

        Reads ``gpus``, ``nodes`` and ``priority`` of a JobSpec, or of anything with such
        attributes (a missing one asks for nothing, so a plan's ``trial`` is checked too):

        * ``gpus > 0`` needs ``capabilities.gpus``;
        * ``nodes > 1`` needs ``multi_node`` (gang: all nodes start together);
        * ``priority: best-effort`` needs ``preemption``: a best-effort job is one that
          yields its slots to higher-priority work, a promise a backend that cannot stop
          attempts to make room does not keep (the scheduler only ever preempts those);
        * ``image`` needs ``containers`` (``mounts`` are links on the local backend, volumes
          or bind mounts on engines that run containers);
        * ``sandbox``: tenant jobs are refused by ``isolation.check`` (a project's
          policy, not a spec field).

        Capacity (is there a node with that many GPUs?) is the facade's check, after this.
        """
        from autoresearch.errors import SpecError

        caps, name = self.capabilities, self.name
        gpus, nodes = int(getattr(spec, "gpus", 0) or 0), int(getattr(spec, "nodes", 1) or 1)
        if gpus > 0 and not caps.gpus:
            raise SpecError(f"the {name} backend has no GPUs (the job asks for gpus: {gpus})",
                            hint=_instead("use gpus: 0", "a backend with GPUs", "gpus"))
        if nodes > 1 and not caps.multi_node:
            raise SpecError(f"the {name} backend runs single-node jobs only (the job asks for nodes: {nodes})",
                            hint=_instead("use nodes: 1", "a backend that runs multi-node (gang) jobs", "multi_node"))
        if getattr(spec, "priority", "normal") == "best-effort" and not caps.preemption:
            raise SpecError(f"the {name} backend cannot preempt, so it cannot run a best-effort job "
                            "(one that gives its place up to higher-priority work)",
                            hint=_instead("use priority: normal", "a backend that preempts", "preemption"))
        mounts = getattr(spec, "mounts", None)
        engine = [str(s) for s in (mounts.values() if isinstance(mounts, dict) else ()) if _ENGINE_SOURCE().match(str(s))]
        if engine and not caps.containers:
            raise SpecError(f"the {name} backend mounts host paths only (the job mounts {engine[0][:80]!r})",
                            hint=_instead("mount a host path", "a backend that runs containers", "containers"))
        if mounts and not caps.containers and not caps.places:
            raise SpecError(f"the {name} backend runs jobs on its own nodes: a mount there would be a link made "
                            "on this host, which its nodes do not see",
                            hint="use the data's path itself (on a filesystem the nodes share), or a backend that "
                                 "runs containers (kubernetes, docker) and mounts volumes")
        image = str(getattr(spec, "image", "") or "")
        if image and not caps.containers:
            raise SpecError(f"the {name} backend cannot run containers (the job asks for image: {image[:80]!r})",
                            hint=_instead("leave image out to run in the host's environment",
                                          "a backend that runs containers", "containers"))

    def probe(self) -> None:  # noqa: B027 - optional hook
        """Check the engine answers (``autoresearch backends``, like ``sky check``).

        Raises :class:`~autoresearch.errors.BackendError` that names the address tried and,
        in its hint, how to start the engine (the kit under ``backends/``). Cheap and bounded
        by a timeout: an engine that hangs is an engine that does not answer.
        """

    def cordon(self, node: str, reason: str) -> None:  # noqa: B027 - optional hook
        """The ledger has cordoned ``node``; an engine that schedules itself takes it out too
        (Slurm: ``scontrol update nodename=X state=drain reason=...``)."""

    def uncordon(self, node: str) -> None:  # noqa: B027 - optional hook
        """Undo :meth:`cordon` on the engine (Slurm: ``state=resume``)."""

    @abc.abstractmethod
    def nodes(self) -> list[NodeInfo]:
        """The places attempts can run, with their GPU slot ids."""

    @abc.abstractmethod
    def start(self, request: LaunchRequest) -> str:
        """Launch the attempt; return its external id."""

    @abc.abstractmethod
    def poll(self, external_id: str) -> AttemptStatus:
        """Current state of one attempt."""

    @abc.abstractmethod
    def read_log(self, external_id: str, offset: int = 0, max_bytes: int = 1 << 20) -> bytes:
        """Log bytes from ``offset`` (stdout and stderr interleaved)."""

    @abc.abstractmethod
    def stop(self, external_id: str, grace: float | None = None) -> None:
        """SIGTERM now, SIGKILL after ``grace`` seconds (the request's grace when None)."""

    def release(self, external_id: str) -> None:  # noqa: B027 - optional hook
        """The runtime has recorded this attempt's ending; the backend may let go of it."""

    def log_size(self, external_id: str) -> int:
        """Bytes of log written so far (for paging from the end)."""
        return len(self.read_log(external_id, 0, 1 << 62))

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release clients or connections the backend holds."""


def gang_members(request: LaunchRequest) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(node, gpu ids) per member of the attempt: one for a single-node job."""
    return request.alloc or ((request.node or "", request.gpu_ids),)


def member_env(env: dict[str, str], rank: int, node: str, gpu_ids: tuple[str, ...], places: bool = True
               ) -> dict[str, str]:
    """The environment of gang member ``rank`` (Kubeflow PyTorchJob's convention, one process per
    member): the attempt's (MASTER_ADDR, MASTER_PORT, WORLD_SIZE set by the runtime) with its own
    RANK = NODE_RANK, LOCAL_RANK=0, LOCAL_WORLD_SIZE=1, node and GPU slots. torchrun: ``--nnodes=$WORLD_SIZE
    --node-rank=$NODE_RANK --master-addr=$MASTER_ADDR --master-port=$MASTER_PORT --nproc-per-node=G``."""
    out = dict(env)
    out.update(RANK=str(rank), NODE_RANK=str(rank), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    if node:
        out["AUTORESEARCH_NODE"] = node
    if places:
        out["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_ids)
    return out


_ENGINE_SOURCE = lazy(r"^[a-z][a-z0-9]+:(?!//)")  # spec.ENGINE_SOURCE (spec imports pydantic: not here)


def able(flag: str) -> list[str]:
    """Registered backends whose class declares capability ``flag``, for hints (imports each).

    Simulated backends (the fake) run nothing and are never named; one that fails to
    import, or whose factory is not a :class:`Backend` class, is left out.
    """
    from autoresearch.backends._registry import _factory, backend_names  # only for a hint

    out = []
    for name in backend_names():
        try:
            factory = _factory(name)
        except Exception:  # noqa: BLE001 - a broken plugin must not break an error message
            continue
        if isinstance(factory, type) and issubclass(factory, Backend) and not factory.simulated and getattr(
                factory.capabilities, flag, False):
            out.append(name)
    return out


def _instead(fix: str, what: str, flag: str) -> str:
    """A hint: ``fix``, or the registered backends that have ``flag`` (none: say so)."""
    names = able(flag)
    if names:
        return f"{fix}, or submit to {what}: {', '.join(names)} (--backend NAME, a plan's backend:, or AUTORESEARCH_BACKEND)"
    return f"{fix} (no installed backend is {what})"
