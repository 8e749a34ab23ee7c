"""How much of its launcher a job sees: the isolation policy (docs/security.md).

Two policies, recorded on the job's row (``jobs.isolation``) when it is submitted,
because any process may launch a queued job later — the server, a CLI call, an
attempt supervisor's on-exit pass — and the launcher's own environment must not
decide what the job gets:

* ``''`` (inherit): single-user use (CLI, stdio MCP, Python API). The job inherits
  the submitting user's environment, like Slurm's ``--export=ALL``.
* a tenant policy (JSON ``{"mode": "tenant", "hide": [...]}``): jobs of a project
  served by a tokened HTTP server. The job gets a clean environment (:data:`ALLOWED_ENV`
  plus its own ``env`` and the per-attempt variables) and, on the local backend, a
  sandbox in which the autoresearch home (but for its own metrics file and checkpoint
  dir) and the ``hide`` paths (the tokens file) do not exist.

A project becomes a tenant project the first time a tokened server acts for it
(:func:`register_tenant`); from then on every job of that project is a tenant job,
whoever submits it (the server, a loop it started, the CLI): fail closed.

Stdlib only: the launch path imports this.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import sqlite3
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autoresearch.store.jobstore import JobStore

TENANT = "tenant"
# What a tenant job keeps of the launching process's environment: where programs are,
# who and where it is, and how to print text. Never tokens, keys or AUTORESEARCH_TOKENS.
ALLOWED_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TERM", "SHELL")
ALLOWED_PREFIXES = ("LC_",)


def tenant_policy(hide: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """The policy of a project served over tokened HTTP; ``hide``: paths its jobs must not see."""
    paths: list[str] = []
    for path in hide:
        for variant in (os.path.abspath(os.path.expanduser(str(path))), os.path.realpath(os.path.expanduser(str(path)))):
            if variant not in paths:
                paths.append(variant)
    return {"mode": TENANT, "hide": paths}


def load(recorded: str | None) -> dict[str, Any] | None:
    """The policy recorded on a job row: None to inherit, else the tenant policy.

    A value we cannot read is treated as a tenant policy (fail closed), never as inherit.
    """
    if not recorded:
        return None
    try:
        policy = json.loads(recorded)
    except ValueError:
        return tenant_policy()
    if not isinstance(policy, dict):
        return tenant_policy()
    hide = policy.get("hide")
    return {"mode": TENANT, "hide": [str(p) for p in hide] if isinstance(hide, list) else []}


def base_env(policy: dict[str, Any] | None, environ: Mapping[str, str], internal: tuple[str, ...]) -> dict[str, str]:
    """The launching process's variables a job starts from, before its own env is laid on top."""
    if policy is None:
        return {k: v for k, v in environ.items() if k not in internal}
    env = {k: v for k, v in environ.items() if k in ALLOWED_ENV or k.startswith(ALLOWED_PREFIXES)}
    env["TMPDIR"] = "/tmp"  # a private tmpfs in the sandbox
    return env


def register_tenant(conn: sqlite3.Connection, project: str, policy: dict[str, Any]) -> None:
    """Record ``project`` as served by a tokened server (inside the caller's transaction)."""
    JobStore.register_tenant(conn, project, policy)


def policy_for(conn: sqlite3.Connection, project: str) -> str:
    """What to record on a new job of ``project``: its tenant policy, or '' to inherit."""
    if not project:
        return ""
    return JobStore.tenant_policy(conn, project)


def job_policy(ledger: Any, project: str, backend: Any) -> str:
    """The policy to record on a new job of ``project``; refuses one the backend cannot isolate."""
    recorded = JobStore(ledger).project_tenant_policy(project) if project else ""
    if recorded:
        check(backend, ledger.home)
    return recorded


def check(backend: Any, home: Any = None) -> None:
    """Fail closed: a tenant job on a backend that cannot sandbox it is refused, never run bare."""
    from autoresearch.errors import BackendError

    if not getattr(backend.capabilities, "sandbox", False):
        raise BackendError(f"the {backend.name} backend cannot sandbox jobs, and this project's jobs must run "
                           "in a sandbox (it is served by a multi-tenant HTTP server)",
                           hint="use the local backend with bubblewrap installed; see docs/security.md")
    if backend.name == "local":
        from autoresearch.backends import Sandbox, _sandbox

        uid, gid = _sandbox.tenant_ids(home)
        _sandbox.programs(Sandbox(uid=uid, gid=gid))


def apply(request: Any, policy: dict[str, Any] | None, ledger: Any, project: str, spec: dict[str, Any]) -> Any:
    """The launch request with its sandbox (tenant jobs), its metrics file made first (private, and
    there to bind); other jobs' is made by their first ``report()``, private too.

    Inside a tenant's sandbox everything is read-only but what is the job's or its
    project's own: its metrics file and checkpoint dir, ``$AUTORESEARCH_PROJECT_DIR``
    (``home/projects/<project>``, shared by the project's jobs), and a workdir that is a
    trial worktree of one of the project's loops. The server's root is shared by every
    project, so a tenant may run code from it but not change it.
    """
    if policy is None:
        return request  # (report() makes the metrics file 0600 itself: one file less to create per launch)
    metrics = request.env.get("AUTORESEARCH_METRICS_FILE")
    if metrics:
        os.close(os.open(metrics, os.O_WRONLY | os.O_CREAT, 0o600))  # before the sandbox binds it
    from autoresearch.backends import Sandbox

    home = Path(os.path.realpath(ledger.home))
    own_dir = Path(os.path.realpath(Path(request.run_dir).parent))  # home/jobs/<id>
    project_dir = home / "projects" / _dirname(project)
    project_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    own = [p for p in (metrics, str(project_dir)) if p]
    checkpoint = request.env.get("AUTORESEARCH_CHECKPOINT_DIR")
    if checkpoint and _under(Path(os.path.realpath(checkpoint)), own_dir):
        own.append(checkpoint)  # a checkpoint path of the job's choosing elsewhere stays read-only
    workdir = Path(os.path.realpath(request.workdir))
    loops = home / "loops"
    if _under(workdir, loops) and workdir != loops:
        name = workdir.relative_to(loops).parts[0]
        if JobStore(ledger).loop_of_project(name, project):
            own.append(str(workdir))  # a trial worktree of this project's loop
    hidden = [str(ledger.home), str(home), *policy["hide"]]
    sources = tuple(os.path.realpath(os.path.expanduser(str(s))) for s in (spec.get("mounts") or {}).values())
    from autoresearch.backends import _sandbox

    uid, gid = _sandbox.tenant_ids(ledger.home, lambda: JobStore(ledger).tenant_number(project))
    if uid is not None:  # a root launcher: the job runs as the tenant uid, which must write its own places
        _give(own, uid, gid, str(workdir) if str(workdir) in own else None)
    gpus = [g for _, ids in (request.alloc or ((request.node, request.gpu_ids),)) for g in ids]
    from autoresearch.backends import profiles

    conf = profiles.sandbox_config(ledger.home)
    folder, no_cgroup = _sandbox.cgroup_state(conf.cgroup)  # a delegated cgroup v2: one of its own per attempt
    cgroup = os.path.join(folder, "autoresearch-" + re.sub(r"[^0-9A-Za-z_.-]", "_", request.key)) if folder else ""
    sandbox = Sandbox(hidden=tuple(dict.fromkeys(hidden)), visible=tuple(dict.fromkeys((*sources, *_runtime_paths()))),
                      own=tuple(own), uid=uid, gid=gid, devices=_sandbox.gpu_devices(gpus), project_dir=str(project_dir),
                      limits=_limits(conf.for_project(project).as_dict(), None if cgroup else request.timeout),
                      cgroup=cgroup, no_cgroup=no_cgroup)
    env = {**request.env, "AUTORESEARCH_PROJECT_DIR": str(project_dir)}
    if "HOME" not in (spec.get("env") or {}):  # the server's HOME is not the job's: its own, the project's
        env["HOME"] = _own_home(project_dir, uid, gid)
    for key, value in env.items():
        if not key or "=" in key or "\0" in key or "\0" in value:
            from autoresearch.errors import SpecError

            raise SpecError(f"environment variable {key[:60]!r} cannot be set: a name must be non-empty without "
                            "'=' and neither name nor value may hold a NUL byte", hint="fix the job's env")
    return dataclasses.replace(request, sandbox=sandbox, env=env)


def _own_home(project_dir: Path, uid: int | None, gid: int | None) -> str:
    """The HOME of a project's tenant jobs: ``.home`` in its project folder (writable, 0700, the tenant
    uid's; shared by the project's jobs, counted in its disk quota), made on its first launch. A link
    a job put there is never followed by us (inside the sandbox it leads only where the job can go)."""
    path = project_dir / ".home"
    try:
        os.mkdir(path, 0o700)
        if uid is not None:
            os.chown(path, uid, -1 if gid is None else gid, follow_symlinks=False)
    except FileExistsError:
        pass
    return str(path)


def limits_line(run_dir: str) -> str | None:
    """The limits an attempt ran under and how they were enforced, in one line (its request.json, as
    the local backend recorded it); None when it had none (not a tenant's) or the file is not there."""
    from autoresearch.backends import limits
    from autoresearch.backends._supervisor import read_json

    recorded = read_json(os.path.join(run_dir, "request.json"))
    return limits.summary(recorded) if recorded is not None else None


def _limits(limits: dict[str, Any], timeout: float | None) -> dict[str, Any]:
    """The job's limits; without a cgroup its ``cpu`` (cores) becomes CPU seconds per process:
    cores x its timeout (none without a timeout)."""
    if limits.get("cpu") and timeout:
        limits["cpu_seconds"] = max(1, int(limits["cpu"] * float(timeout)) + 1)
    return limits


def _give(own: list[str], uid: int, gid: int | None, worktree: str | None) -> None:
    """Make the job's own places writable by the tenant uid: its files and dirs become its own; a
    loop's trial worktree stays the server's (git's ownership check) and its directories (never its
    files, which could be hard links to elsewhere) get the tenant group's write bit."""
    group = -1 if gid is None else gid
    for path in own:
        if path == worktree:
            continue
        try:
            os.chown(path, uid, group, follow_symlinks=False)
        except OSError:
            pass
    if worktree is None or gid is None:
        return
    for folder, _dirs, _files in os.walk(worktree):  # (os.walk follows no links to directories)
        try:  # by descriptor, never following a link a job put there meanwhile
            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if st.st_gid != gid:
                os.fchown(fd, -1, gid)
            if st.st_mode & 0o070 != 0o070:
                os.fchmod(fd, stat.S_IMODE(st.st_mode) | 0o070)
        except OSError:
            pass
        finally:
            os.close(fd)


def check_paths(ledger: Any, project: str, spec: Any, containers: bool) -> None:
    """Refuse, at submit, a tenant job that would make the server write outside the tenant's own
    places: host mounts (links the server makes at launch) outside its project dir or its loops'
    worktrees, an absolute mount target, a checkpoint directory of its choosing elsewhere."""
    from autoresearch.errors import SpecError

    hint = ("a tenant's job writes only in $AUTORESEARCH_PROJECT_DIR, its checkpoint dir (checkpoint: true) and "
            "its loops' worktrees; read shared data at its own path (the sandbox shows it read-only)")
    if spec.mounts and not containers:
        absolute = [t for t in spec.mounts if os.path.isabs(t)]
        if absolute or not writable(ledger, project, spec.workdir):
            where = f"at {absolute[0][:80]!r}" if absolute else f"in the workdir {str(spec.workdir)[:120]!r}"
            raise SpecError(f"mounts would make links {where}, a place this project may not write", hint=hint)
    if isinstance(spec.checkpoint, str) and spec.checkpoint:
        path = spec.checkpoint if os.path.isabs(os.path.expanduser(spec.checkpoint)) else \
            os.path.join(spec.workdir, spec.checkpoint)
        if not writable(ledger, project, path):
            raise SpecError(f"checkpoint {spec.checkpoint[:120]!r} is outside this project's own places", hint=hint)


def writable(ledger: Any, project: str, path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` (resolved) lies in ``project``'s own places: its project dir, or a worktree
    of one of its loops (``home/loops/<loop>/...``)."""
    home = Path(os.path.realpath(ledger.home))
    where = Path(os.path.realpath(os.path.expanduser(str(path))))
    if _under(where, home / "projects" / _dirname(project)):
        return True
    loops = home / "loops"
    if _under(where, loops) and where != loops and len(where.relative_to(loops).parts) > 1:
        return bool(JobStore(ledger).loop_of_project(where.relative_to(loops).parts[0], project))
    return False


@functools.lru_cache(maxsize=1)  # one process, one interpreter and one package: resolved once, not per launch
def _runtime_paths() -> tuple[str, ...]:
    """The interpreter and the package a job's ``report()`` imports: read-only in the sandbox even
    when they live under /tmp (a venv or a clone there), which the sandbox makes private."""
    import sys

    import autoresearch

    package_root = os.path.dirname(os.path.dirname(os.path.realpath(autoresearch.__file__)))
    return tuple(dict.fromkeys(os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, package_root)))


def _dirname(project: str) -> str:
    """A directory name that is ``project`` when that is safe, never ``..`` or a path."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", project).lstrip(".") or "_"
    if safe == project:
        return safe
    import hashlib  # here: a safe name (most) needs none, and it costs a submit ~4 ms to import

    return f"{safe}-{hashlib.sha256(project.encode()).hexdigest()[:8]}"


def _under(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents
