"""The local backend's sandbox: bubblewrap (``bwrap``) with every namespace but the network's.

Inside, the host's file system is read-only but for the paths the runtime names as
the job's own (``Sandbox.own``); ``/tmp`` and ``/dev/shm`` are private and empty;
``/dev`` is a minimal one plus the device nodes of the attempt's GPUs; ``/proc`` shows the
job's own processes only (so no other process's environ); and the hidden paths (the
autoresearch home, the tokens file) are empty or ``/dev/null``. See docs/security.md.

Nothing of the job reaches a program that runs before its sandbox exists: ``bwrap`` (and
``setpriv``) start with :data:`LAUNCHER_ENV`, and the job's environment is read by the last
``bwrap`` from a descriptor (``--args FD``: ``--clearenv`` then ``--setenv`` pairs, never on a
command line) and applied to the job's command alone.

No privilege inside. A launcher that is not root runs one ``bwrap`` in a user namespace of its
own uid. A root launcher cannot: its user namespace would map the job to uid 0 outside, the
owner of every root file. So it runs two: the first, as root, builds the mounts and the pid,
ipc, uts and cgroup namespaces and keeps only CAP_SETUID/SETGID/SETPCAP; ``setpriv`` then drops
to the tenant uid and gid (``Sandbox.uid``: unprivileged, config.yaml ``sandbox.uid``), clears the
groups, the bounding set and sets no_new_privs; the second ``bwrap``, as that uid, makes the user
namespace (no further ones: ``--disable-userns``) and applies the job's environment. The first
runs its command as pid 1 (``--as-pid-1``): a stop's SIGTERM reaches the job's process group but
not the second ``bwrap`` (the kernel drops signals to a namespace's init that it does not handle),
which lives until the job ends, as the first one's reaper did.

The supervisor learns the sandboxed child's pid from ``--info-fd`` and signals that
child's session (``--new-session``): bwrap itself dies on SIGTERM without passing it
on, which would cut the job's grace period short.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable
from functools import lru_cache

from autoresearch.backends._base import Sandbox
from autoresearch.backends._supervisor import ARGS_FD, INFO_FD, LAUNCHER_ENV, env_fd
from autoresearch.errors import BackendError

INSTALL_HINT = ("install bubblewrap (Debian/Ubuntu: apt-get install -y bubblewrap; Fedora: dnf install bubblewrap) "
                "and make sure unprivileged user namespaces are allowed, then resubmit")
ROOT_HINT = ("as root the sandbox also needs setpriv (util-linux) and an unprivileged uid/gid for tenant jobs "
             "(config.yaml: sandbox: {uid: 65534, gid: 65534}); or run the server as an unprivileged user")
GPU_CONTROL = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
ROOT_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP")  # what setpriv needs to drop to the tenant uid


@lru_cache(maxsize=2)
def _probe(root: bool) -> tuple[tuple[str, str] | None, str]:
    """Whether bwrap (and setpriv, for a root launcher) build the sandbox here: once per process and
    kind (the tenant uid does not change what works: one probe as nobody stands for every project's)."""
    import shutil
    import subprocess  # only when a tenant job is submitted or launched

    path = shutil.which("bwrap")
    if path is None:
        return None, "bubblewrap (bwrap) is not installed (not found on PATH)"
    if shutil.which("prlimit") is None:
        return None, "prlimit (util-linux) is not installed, and it sets a tenant job's limits"
    setpriv = ""
    uid = gid = 65534 if root else None
    if root:
        setpriv = shutil.which("setpriv") or ""
        if not setpriv:
            return None, "setpriv (util-linux) is not installed, and a root server needs it to drop to the tenant uid"
    argv = _argv((path, setpriv), ["true"], "/", Sandbox(uid=uid, gid=gid, limits={"processes": 4096, "tmp": 1 << 20}))
    fd = env_fd({})
    try:
        argv[argv.index(ARGS_FD)] = str(fd)
        at = argv.index(INFO_FD)
        del argv[at - 1:at + 1]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=20, env=LAUNCHER_ENV, pass_fds=(fd,))
    except (OSError, subprocess.TimeoutExpired) as err:
        return None, f"bubblewrap ({path}) cannot run: {err}"
    finally:
        os.close(fd)
    if done.returncode != 0:
        return None, f"bubblewrap ({path}) cannot create a sandbox here: {done.stderr.strip()[-300:]}"
    return (path, setpriv), ""


def programs(sandbox: Sandbox | None = None) -> tuple[str, str]:
    """bwrap (and setpriv for a root launcher), checked once per process and identity; refuses (fail
    closed) when they cannot build the sandbox."""
    uid = sandbox.uid if sandbox is not None else tenant_ids()[0]
    found, why = _probe(uid is not None)
    if found is None:
        _probe.cache_clear()  # installing it must not need a restart
        raise BackendError(f"this job must run in a sandbox but {why}",
                           hint=INSTALL_HINT if uid is None else f"{INSTALL_HINT}; {ROOT_HINT}")
    return found


_ROOTBOX: tuple[bool, float] | None = None  # (the answer, until when it holds)
ROOTBOX_RETRY_S = 60.0


def rootbox_works() -> bool:
    """Whether a root launcher's supervisors make its tenants' sandboxes themselves (backends/_rootbox.py,
    the same plan as the programs' chain, without their four execs); False (the programs run) when it
    fails here, and for a launcher that is not root (its one ``bwrap`` runs). A definite answer holds
    for the process; a check that could not finish (it timed out under load, or could not start) is
    tried again a minute later, the programs running meanwhile."""
    global _ROOTBOX
    if _ROOTBOX is None or time.monotonic() >= _ROOTBOX[1]:
        why, definite = rootbox_check()
        _ROOTBOX = (why is None, float("inf") if definite else time.monotonic() + ROOTBOX_RETRY_S)
    return _ROOTBOX[0]


def rootbox_check() -> tuple[str | None, bool]:
    """Run ``true`` in such a sandbox from a small interpreter: (None, True) when it works, else why
    not and whether that answer is definite (not a timeout or a failure to start the interpreter)."""
    if os.geteuid() != 0:
        return "the launcher is not root", True
    import subprocess
    import sys

    found = programs(Sandbox(uid=65534, gid=65534))
    argv = _argv(found, ["true"], "/", Sandbox(uid=65534, gid=65534, limits={"processes": 4096, "tmp": 1 << 20}))
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_rootbox.py")
    try:
        done = subprocess.run([sys.executable, "-S", "-E", script, *argv], capture_output=True, timeout=20,
                              env=LAUNCHER_ENV, cwd="/")
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"the check did not finish: {err}", False
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip()[-500:]
        return f"the check exited {done.returncode}: {said or '(nothing on stderr)'}", True
    return None, True


def bwrap() -> str:
    return programs()[0]


def tenant_ids(home: str | os.PathLike[str] | None = None,
               number: Callable[[], int] | None = None) -> tuple[int | None, int | None]:
    """The uid and gid tenant jobs run as: None (the launcher's own) unless the launcher is root,
    then config.yaml's ``sandbox.uid``/``sandbox.gid`` (default 65534, nobody/nogroup), or with
    ``sandbox.uid_base`` the project's own, ``uid_base + number()`` (its tenant number)."""
    if os.geteuid() != 0:
        return None, None
    from autoresearch.backends import profiles

    conf = profiles.sandbox_config(home)
    if conf.uid_base is not None and number is not None:
        own = conf.uid_base + min(max(int(number()), 0), (1 << 20) - 1)
        return own, own
    return conf.uid, conf.gid


def wrap(argv: list[str], workdir: str, sandbox: Sandbox) -> list[str]:
    """``argv`` inside a fresh sandbox: the supervisor inserts ``--info-fd N`` after ``argv[0]`` and
    replaces :data:`ARGS_FD` with the descriptor of the job's environment (:func:`env_fd`)."""
    return _argv(programs(sandbox), argv, workdir, sandbox)


def _argv(found: tuple[str, str], argv: list[str], workdir: str, sandbox: Sandbox) -> list[str]:
    bwrap_path, setpriv = found
    root = sandbox.uid is not None
    out = [*rlimits(sandbox), bwrap_path, "--info-fd", INFO_FD, "--new-session", "--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
           "--unshare-cgroup-try"]
    out += ["--as-pid-1"] if root else ["--unshare-user", "--disable-userns"]
    out += ["--ro-bind", "/", "/", "--dev", "/dev"]
    for node in sandbox.devices:
        out += ["--dev-bind-try", node, node]
    size = ["--size", str(int(sandbox.limits["tmp"]))] if sandbox.limits.get("tmp") else []
    out += ["--perms", "1777", *size, "--tmpfs", "/dev/shm", "--proc", "/proc", "--perms", "1777", *size, "--tmpfs", "/tmp"]
    tmpfs = ["/tmp", "/dev/shm"]
    made: set[str] = set()

    def bind(kind: str, path: str) -> None:
        for parent in _parents(path):  # dirs bwrap would make in a tmpfs of ours: traversable
            if parent not in made and any(_under(parent, t) and parent != t for t in tmpfs):
                made.add(parent)
                out.extend(["--perms", "0755", "--dir", parent])
        out.extend([kind, path, path])

    visible = [p for p in (workdir, *sandbox.visible) if p != "/" and os.path.exists(p)]  # (/ is already)
    own = [p for p in sandbox.own if os.path.exists(p)]
    if root:  # the tenant uid must be able to walk to what it is shown: a blocked ancestor becomes a tmpfs
        for blocked in _blocked(sandbox.uid, sandbox.gid, [*visible, *own], tmpfs):
            out += ["--perms", "0755", "--tmpfs", blocked]
            tmpfs.append(blocked)
    for path in visible:  # read-only, and there even under the private /tmp
        bind("--ro-bind", path)
    for path in sandbox.hidden:
        # A directory becomes an empty tmpfs, a file /dev/null: the job sees no content.
        if os.path.isdir(path):
            out += ["--perms", "0755", "--tmpfs", path]
            tmpfs.append(path)
            made.difference_update([m for m in made if _under(m, path)])  # gone under it: made again
        elif os.path.lexists(path):
            out += ["--ro-bind", "/dev/null", path]
    for path in own:  # what the job may write, bound on top of the hidden paths
        bind("--bind", path)
    if not root:
        return [*out, "--cap-drop", "ALL", "--args", ARGS_FD, "--chdir", workdir, "--", *argv]
    for cap in ("ALL", *ROOT_CAPS):
        out += ["--cap-drop" if cap == "ALL" else "--cap-add", cap]
    out += ["--", setpriv, f"--reuid={sandbox.uid}", f"--regid={sandbox.gid}", "--clear-groups", "--no-new-privs",
            "--bounding-set=-all", "--inh-caps=-all", "--pdeathsig=SIGKILL", "--",
            bwrap_path, "--unshare-user", "--disable-userns", "--cap-drop", "ALL", "--die-with-parent",
            "--dev-bind", "/", "/", "--args", ARGS_FD, "--chdir", workdir, "--", *argv]
    return out


def rlimits(sandbox: Sandbox) -> list[str]:
    """``prlimit`` and the resource limits of ``sandbox.limits`` it sets on the first ``bwrap`` (they
    are inherited by everything after it, the job included; root itself ignores the process count,
    the tenant uid does not). Memory is an address-space limit, and only for a job without GPUs:
    CUDA reserves far more address space than it uses."""
    limits = sandbox.limits
    out = []
    if limits.get("processes") and not sandbox.cgroup:  # (a cgroup bounds these: pids.max, memory.max, cpu.max)
        out.append(f"--nproc={int(limits['processes'])}")
    if limits.get("memory") and not sandbox.devices and not sandbox.cgroup:
        out.append(f"--as={int(limits['memory'])}")
    if limits.get("disk"):
        out.append(f"--fsize={int(limits['disk'])}")
    if limits.get("cpu_seconds") and not sandbox.cgroup:
        out.append(f"--cpu={int(limits['cpu_seconds'])}:{int(limits['cpu_seconds']) + 10}")  # SIGXCPU, then SIGKILL
    if not out:
        return []
    import shutil

    return [shutil.which("prlimit") or "prlimit", *out, "--"]


@lru_cache(maxsize=4)
def cgroup_state(configured: str | None = None) -> tuple[str | None, str]:
    """(the cgroup v2 folder tenant attempts get theirs under, "") on a host that delegates one to us,
    else (None, why not): backends/limits.py ``cgroup_decision``; once per process and setting."""
    from autoresearch.backends import limits

    return limits.cgroup_here(configured)


def mechanism(sandbox: Sandbox) -> str:
    """How ``sandbox``'s limits are enforced, in words (request.json's ``limits_by``; ``status`` shows it)."""
    if sandbox.cgroup:
        return f"cgroup v2 ({os.path.dirname(sandbox.cgroup)}) and rlimits"
    return f"rlimits ({sandbox.no_cgroup or 'no cgroup v2 delegated to the server'})"


def applied(sandbox: Sandbox) -> dict[str, str]:
    """How each configured limit of ``sandbox`` is enforced (recorded with the attempt: request.json)."""
    how = {"processes": "RLIMIT_NPROC of the job's uid", "memory": "RLIMIT_AS (address space)",
           "disk": "RLIMIT_FSIZE (bytes per file written) and the project folder's total (measured every second)", "tmp": "size of the tmpfs /tmp and /dev/shm",
           "cpu": "not enforced: no cgroup, and the job has no timeout",
           "cpu_seconds": "RLIMIT_CPU: cpu x timeout seconds of CPU per process (no cgroup)", "log": "bytes copied to the log, then one marker line",
           "metric_points": "at ingest: points past it dropped"}
    if sandbox.cgroup:
        how.update(processes="pids.max of its cgroup", memory="memory.max of its cgroup (resident memory, no swap)",
                   cpu="cpu.max of its cgroup (cores)")
        how.pop("cpu_seconds")
    out = {k: how[k] for k in sandbox.limits if k in how}
    if "cpu_seconds" in out:
        out["cpu"] = out.pop("cpu_seconds")
    if "memory" in out and sandbox.devices and not sandbox.cgroup:
        out["memory"] = "not enforced: a GPU job (CUDA reserves more address space than it uses)"
    return out


def gpu_devices(gpu_ids: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """The device nodes of the GPUs an attempt holds (and the driver's control nodes), where they exist."""
    nodes = [f"/dev/nvidia{g}" for g in gpu_ids if str(g).isdigit()]
    if not nodes:
        return ()
    return tuple(n for n in (*nodes, *GPU_CONTROL) if os.path.exists(n))


def _parents(path: str) -> list[str]:
    """The ancestors of ``path`` (absolute, normalised), outermost first, without ``/`` and ``path``."""
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _blocked(uid: int | None, gid: int | None, paths: list[str], tmpfs: list[str]) -> list[str]:
    """The outermost ancestors of ``paths`` that ``uid``/``gid`` cannot walk through (not already in
    one of ``tmpfs``): a root-only home or /root, a 0700 temporary directory."""
    found: list[str] = []
    for path in paths:
        for parent in _parents(path):
            if any(_under(parent, t) for t in (*tmpfs, *found)):
                break
            try:
                st = os.stat(parent)
            except OSError:
                break
            if st.st_uid == uid:
                bit = stat.S_IXUSR
            elif st.st_gid == gid:
                bit = stat.S_IXGRP
            else:
                bit = stat.S_IXOTH
            if not st.st_mode & bit:
                found.append(parent)
                break
    return found
