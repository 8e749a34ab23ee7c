"""A root launcher's tenant sandbox, made by the supervisor's own forked child (no program exec'd).

For a root server the sandbox is a chain (backends/_sandbox.py): ``prlimit`` -> ``bwrap`` as root
(mounts, namespaces) -> ``setpriv`` (down to the tenant uid) -> ``bwrap`` as that uid (the user
namespace, the job's environment) -> the command. The chain cost a tenant's launch ~15 ms of CPU
over the command: four programs to exec and link, and the root ``bwrap`` reads
``/proc/self/mountinfo`` again for every one of its ~15 binds (docs/security.md). This module makes
the same sandbox in the supervisor's forked child instead, with the chain's argv as its plan: it
reads the ``prlimit``, ``bwrap`` and ``setpriv`` options and the last ``bwrap``'s that
:func:`_sandbox._argv` writes (and no other: anything it does not know, it leaves to the programs:
:func:`plan` returns None) and carries them out with system calls.

What it does, in order (bwrap's own order; docs/security.md):

1. the supervisor makes a new pid namespace for its next child only and forks G, pid 1 there (then
   takes its own pid namespace back for its later children); G starts a session of its own (the
   supervisor signals it: the kernel drops the signals an init does not handle, so a stop's
   SIGTERM reaches the job, as with the last ``bwrap`` as init before), sets its parent-death
   signal (SIGKILL), joins the attempt's cgroup when it has one, and overwrites its command line
   (it was its launcher's);
2. G makes new mount, ipc, uts and cgroup namespaces, makes ``/`` a slave (nothing it mounts
   reaches the host), clones every bind's source as the host shows it (``open_tree``: before
   anything covers it), makes the whole tree read-only, nosuid and nodev (``mount_setattr``,
   recursive: one call where ``bwrap`` re-reads the mount table for each mount), then the tmpfs,
   ``/dev``, ``/proc`` and binds of the plan (``move_mount``);
3. G sets the rlimits (RLIMIT_AS only for the job: see :func:`_start`), drops every capability from its bounding set, clears its groups, takes the
   tenant gid and uid (which clears its other capabilities), sets no_new_privs and its parent-death
   signal again (a change of uid clears it); then a user namespace that maps that uid and gid to
   themselves and one more inside it after which none can be made (``--disable-userns``), with no
   capability in it; it starts the job (pid 2, its own environment, found on its own ``PATH``,
   ``posix_spawn``) and reaps until the job ends, exiting with its status (128+N for a death by
   signal N, as ``bwrap``). Nothing of the job's environment reaches anything but the job.

G is a fork of the supervisor (its memory holds the launcher's environment): it is not dumpable
but while it writes its own uid/gid maps, before the job exists, so no job reads or traces it.

Every step fails closed: an error ends G with exit status 1 and a line in the attempt's log; the
job never runs with a step missing. A launcher takes this way only where :func:`main` ran ``true``
so once (``_sandbox.rootbox_works``); a kernel without ``open_tree``/``mount_setattr`` (Linux <
5.12), a launcher that is not root or ``AUTORESEARCH_ROOTBOX=off`` takes the programs' chain.

Stdlib only (``ctypes``: imported once per process that launches, by the home's zygote before it
forks supervisors: importing it costs more than the launch it saves).
"""

from __future__ import annotations

import ctypes
import errno
import os
import resource
import signal
import stat
from typing import Any

# syscall numbers: the same on every architecture for these (added after the tables were unified)
_OPEN_TREE, _MOVE_MOUNT, _MOUNT_SETATTR = 428, 429, 442
_AT_FDCWD, _AT_RECURSIVE, _AT_EMPTY_PATH = -100, 0x8000, 0x1000
_OPEN_TREE_CLONE, _OPEN_TREE_CLOEXEC = 1, os.O_CLOEXEC
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
_ATTR_RDONLY, _ATTR_NOSUID, _ATTR_NODEV, _ATTR_NOEXEC = 0x1, 0x2, 0x4, 0x8
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_BIND, _MS_REC, _MS_SLAVE = 4096, 16384, 1 << 19
_NEWNS, _NEWCGROUP, _NEWUTS, _NEWIPC, _NEWPID = 0x20000, 0x02000000, 0x04000000, 0x08000000, 0x20000000
_NEWUSER = 0x10000000
_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE, _PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS, _PR_CAP_AMBIENT = 1, 4, 24, 38, 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty")  # bwrap --dev's
_PROC_COVERS = ("sys", "sysrq-trigger", "irq", "bus")  # bwrap --proc's: read-only over themselves (when writable)
_DEFAULT_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD, signal.SIGPIPE, signal.SIGXFSZ)
_LIMITS = {"--nproc": resource.RLIMIT_NPROC, "--as": resource.RLIMIT_AS, "--fsize": resource.RLIMIT_FSIZE,
           "--cpu": resource.RLIMIT_CPU}
_BWRAP_FLAGS = {"--new-session", "--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
                "--unshare-cgroup-try", "--as-pid-1"}
_REQUIRED = {"--new-session", "--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--as-pid-1"}
_LAST = ["--unshare-user", "--disable-userns", "--cap-drop", "ALL", "--die-with-parent", "--dev-bind", "/", "/"]
_SETPRIV = {"--clear-groups", "--no-new-privs", "--bounding-set=-all", "--inh-caps=-all", "--pdeathsig=SIGKILL"}

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64),
                ("userns_fd", ctypes.c_uint64)]


class Plan:
    """The chain's argv read as what to do: rlimits, bwrap's operations in order, the uid/gid, the rest."""

    def __init__(self) -> None:
        self.rlimits: list[tuple[int, int, int]] = []  # (resource, soft, hard)
        self.info_fd = -1
        self.cgroup_ns = False
        self.ops: list[tuple[Any, ...]] = []  # ("ro-bind"|"bind"|"dev-bind-try", src, dst, mode) ...
        self.uid = self.gid = -1
        self.args_fd = -1  # the last bwrap's --args (the job's environment for it: not the job's to keep)
        self.workdir = "/"  # the last bwrap's --chdir
        self.command: list[str] = []  # and its command


def plan(argv: list[str]) -> Plan | None:
    """The plan of a root chain as :func:`_sandbox._argv` writes it; None for anything else (an option
    this module does not know: the programs run it)."""
    try:
        return _parse(argv)
    except (IndexError, ValueError):
        return None


def _parse(argv: list[str]) -> Plan | None:
    out, i = Plan(), 0
    if os.path.basename(argv[0]) == "prlimit":
        i = 1
        while argv[i] != "--":
            name, _, value = argv[i].partition("=")
            soft, _, hard = value.partition(":")
            if name not in _LIMITS:
                return None
            out.rlimits.append((_LIMITS[name], int(soft), int(hard or soft)))
            i += 1
        i += 1
    if os.path.basename(argv[i]) != "bwrap":
        return None
    i += 1
    seen: set[str] = set()
    perms: int | None = None
    size: int | None = None
    while argv[i] != "--":
        opt = argv[i]
        if opt in _BWRAP_FLAGS:
            seen.add(opt)
            out.cgroup_ns = out.cgroup_ns or opt == "--unshare-cgroup-try"
            i += 1
            continue
        if opt == "--info-fd":
            out.info_fd = int(argv[i + 1])
        elif opt == "--perms":
            perms = int(argv[i + 1], 8)
        elif opt == "--size":
            size = int(argv[i + 1])
        elif opt in ("--dev", "--proc"):
            out.ops.append((opt[2:], argv[i + 1]))
        elif opt in ("--tmpfs", "--dir"):
            out.ops.append((opt[2:], argv[i + 1], 0o755 if perms is None else perms, size))
            perms = size = None
        elif opt in ("--ro-bind", "--bind", "--dev-bind-try"):
            out.ops.append((opt[2:], argv[i + 1], argv[i + 2]))
            i += 3
            continue
        elif opt in ("--cap-drop", "--cap-add"):
            pass  # the caps bwrap would keep for setpriv: we drop them all ourselves before the exec
        else:
            return None
        i += 2
    if not _REQUIRED <= seen or out.info_fd < 0 or perms is not None or size is not None:
        return None
    if not out.ops or out.ops[0] != ("ro-bind", "/", "/"):
        return None  # the read-only root first: everything else is made on top of it
    i += 1
    if os.path.basename(argv[i]) != "setpriv":
        return None
    i += 1
    flags: set[str] = set()
    while argv[i] != "--":
        opt = argv[i]
        if opt.startswith("--reuid="):
            out.uid = int(opt.split("=", 1)[1])
        elif opt.startswith("--regid="):
            out.gid = int(opt.split("=", 1)[1])
        elif opt in _SETPRIV:
            flags.add(opt)
        else:
            return None
        i += 1
    if flags != _SETPRIV or out.uid <= 0 or out.gid < 0:  # (never root: the point of the drop)
        return None
    last = argv[i + 1:]  # the last bwrap's: exactly what _sandbox._argv writes, then the command
    if len(last) < 15 or os.path.basename(last[0]) != "bwrap" or last[1:9] != _LAST or last[9] != "--args" \
            or last[11] != "--chdir" or last[13] != "--":
        return None
    out.args_fd, out.workdir, out.command = int(last[10]), last[12], last[14:]
    return out


_USABLE: bool | None = None


def usable() -> bool:
    """Whether this process can make the stage itself: root, on a kernel with open_tree and
    mount_setattr (probed once: an invalid call says ENOSYS or not)."""
    global _USABLE
    if _USABLE is None:
        _USABLE = os.geteuid() == 0 and all(
            _errno_of(_libc.syscall(nr, -1, None, 0, None, 0)) != errno.ENOSYS for nr in (_OPEN_TREE, _MOUNT_SETATTR))
    return _USABLE


def _errno_of(result: int) -> int:
    return ctypes.get_errno() if result < 0 else 0


def spawn(chain: Plan, env: dict[str, str], log_fd: int, cgroup: str | None, prepare: Any) -> int:
    """Fork G, pid 1 of a new pid namespace (see the module's doc); its pid, whose exit status is the
    job's as ``bwrap`` gives it (128+N for a death by signal N). ``prepare()`` runs first in G (the
    supervisor's child set-up: a session of its own (bwrap's --new-session: the supervisor signals
    it), the log as its output, default signals)."""
    _check(_libc.unshare(_NEWPID), "unshare(pid)")  # (for our next child only: undone below)
    try:
        pid = os.fork()
    except OSError:
        _own_pid_namespace()
        raise
    if pid:
        _own_pid_namespace()
        return pid
    try:
        os.close(chain.info_fd)  # (nothing to say on it: the supervisor's child is G itself)
        if chain.args_fd > 2:
            try:  # (the job gets its environment as such, not this descriptor too)
                os.close(chain.args_fd)
            except OSError:
                pass
        prepare()
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, "prctl(PDEATHSIG)")  # (bwrap's --die-with-parent)
        if cgroup:  # fails closed: the sandbox never runs outside the cgroup that bounds it
            fd = os.open(os.path.join(cgroup, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)
            os.write(fd, b"0")  # (0: the writer; our pid here is 1, not the host's)
            os.close(fd)
        _inner(chain, env)
    except BaseException as err:  # noqa: BLE001 - fails closed: the job never runs
        _say(f"cannot build the sandbox: {err}")
    os._exit(1)


def _own_pid_namespace() -> None:
    """Our later children in our own pid namespace again (unshare(CLONE_NEWPID) changed it for them)."""
    fd = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    try:
        _check(_libc.setns(fd, _NEWPID), "setns(pid)")
    finally:
        os.close(fd)


def _say(text: str) -> None:
    try:
        os.write(2, f"autoresearch: sandbox: {text}\n".encode(errors="replace"))
    except OSError:
        pass


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def _prctl(option: int, arg: int, what: str) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(arg), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)), what)


def _inner(chain: Plan, env: dict[str, str]) -> None:
    """G: builds the mounts, drops to the tenant uid in a user namespace of its own, starts the job
    (pid 2) and reaps until it ends."""
    _retitle()
    _check(_libc.unshare(_NEWNS | _NEWIPC | _NEWUTS), "unshare(mount, ipc, uts)")
    if chain.cgroup_ns:
        _libc.unshare(_NEWCGROUP)  # (try, as bwrap's --unshare-cgroup-try)
    _check(_libc.mount(b"none", b"/", None, _MS_REC | _MS_SLAVE, None), "make / a slave")
    # Every bind's source as the host shows it, before anything covers it: a copy of its tree per
    # operation (a path bound twice is two mounts, as with bwrap), by the operation's index.
    sources: dict[tuple[int, str], int] = {}
    for at, op in enumerate(chain.ops):
        if op[0] in ("ro-bind", "bind", "dev-bind-try") and op[1] != "/":
            fd = _open_tree(op[1], missing_ok=op[0] == "dev-bind-try")
            if fd >= 0:
                sources[at, op[1]] = fd
        elif op[0] == "dev":
            for node in _DEV_NODES:
                fd = _open_tree(os.path.join(op[1], node), missing_ok=True)
                if fd >= 0:
                    sources[at, os.path.join(op[1], node)] = fd
    for at, op in enumerate(chain.ops):
        _apply(op, {path: fd for (index, path), fd in sources.items() if index == at})
    for fd in sources.values():
        os.close(fd)
    space = None  # the address-space limit is the job's alone: ours (a fork of a Python process) is past it
    for which, soft, hard in chain.rlimits:
        if which == resource.RLIMIT_AS:
            space = (soft, hard)
        else:
            resource.setrlimit(which, (soft, hard))
    _drop_bounding()  # (needs root's CAP_SETPCAP: before the uid drop, which clears the other sets)
    os.setgroups([])
    os.setresgid(chain.gid, chain.gid, chain.gid)
    os.setresuid(chain.uid, chain.uid, chain.uid)  # (from root: clears the permitted and effective sets)
    if os.getresuid() != (chain.uid,) * 3 or os.getresgid() != (chain.gid,) * 3 or os.getgroups():
        raise OSError(errno.EPERM, "the uid drop did not hold")
    _prctl(_PR_SET_NO_NEW_PRIVS, 1, "prctl(NO_NEW_PRIVS)")
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, "prctl(PDEATHSIG)")  # (a change of uid cleared it)
    _user_namespace(chain.uid, chain.gid)
    os.chdir(chain.workdir)  # (as the tenant uid, as bwrap's --chdir)
    job = _start(chain.command, env, space)
    while True:  # pid 1: reap what is orphaned to us until the job ends (then the namespace ends)
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(1)
        except InterruptedError:
            continue
        if pid == job:
            code = os.waitstatus_to_exitcode(status)
            os._exit(code if code >= 0 else 128 - code)


_TITLE = b"autoresearch-sandbox"


def _retitle() -> None:
    """Our command line (``/proc/1/cmdline``, which any process may read) made :data:`_TITLE` and NULs:
    as a fork of the supervisor it was its launcher's (a server's, or a CLI's that launched another
    project's queued job: arguments no job may read). The kernel reads it from our memory between
    arg_start and arg_end (``/proc/self/stat``), our own copy since the fork: overwritten in place."""
    with open("/proc/self/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    start, end = int(fields[45]), int(fields[46])  # (fields 48 and 49; [0] here is field 3)
    if not 0 < start < end or end - start > 1 << 21:
        raise OSError(errno.EINVAL, f"our command line is not where /proc/self/stat says ({start}, {end})")
    ctypes.memset(start, 0, end - start)
    ctypes.memmove(start, _TITLE, min(len(_TITLE), end - start - 1))


def _user_namespace(uid: int, gid: int) -> None:
    """Into a user namespace that maps the tenant uid and gid to themselves, and one more nested in it
    after which none can be made (bwrap's --disable-userns: the outer one may hold one), with no
    capability in it. Our /proc/self is ours only while we are dumpable: only for the maps' writes
    (this process holds a copy of its supervisor's memory, which no job may read: /proc/1/mem)."""
    _prctl(_PR_SET_DUMPABLE, 1, "prctl(DUMPABLE)")
    try:
        for depth in range(2):
            _check(_libc.unshare(_NEWUSER), "unshare(user)")
            _write("/proc/self/setgroups", "deny")
            _write("/proc/self/uid_map", f"{uid} {uid} 1\n")
            _write("/proc/self/gid_map", f"{gid} {gid} 1\n")
            if depth == 0:
                _write("/proc/sys/user/max_user_namespaces", "1")
    finally:
        _prctl(_PR_SET_DUMPABLE, 0, "prctl(DUMPABLE)")
    _drop_capabilities()


def _start(command: list[str], env: dict[str, str], space: tuple[int, int] | None) -> int:
    """The job's command, with its own environment, found on its own PATH (as bwrap's execvp); with
    ``space``, the RLIMIT_AS it gets in a forked child before its exec, else through posix_spawn."""
    env = {k: v for k, v in env.items() if k and "=" not in k and "\0" not in k and "\0" not in v}
    program = command[0]
    if "/" not in program:
        for folder in env.get("PATH", os.defpath).split(os.pathsep):
            candidate = os.path.join(folder or ".", program)
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                program = candidate
                break
    if space is not None:
        pid = os.fork()
        if pid:
            return pid
        try:
            resource.setrlimit(resource.RLIMIT_AS, space)
            os.execve(program, command, env)
        except OSError as err:
            _say(f"cannot run {command[0]!r}: {err.strerror}")
            os._exit(127 if err.errno == errno.ENOENT else 126)
        except BaseException as err:  # noqa: BLE001 - a forked child never returns into G
            _say(f"cannot run {command[0]!r}: {err}")
        os._exit(126)
    try:  # (vfork underneath: no copy of our pages for it)
        return os.posix_spawn(program, command, env, setsigdef=_DEFAULT_SIGNALS)
    except OSError as err:
        _say(f"cannot run {command[0]!r}: {err.strerror}")
        os._exit(127 if err.errno == errno.ENOENT else 126)


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _drop_capabilities() -> None:
    """Every capability gone: the bounding set, the ambient set, and the effective, permitted and
    inheritable sets (a new user namespace gave them all back within it)."""
    _drop_bounding()
    header, data = _CapHeader(0x20080522, 0), (_CapData * 2)()  # _LINUX_CAPABILITY_VERSION_3: zeros
    _check(_libc.capset(ctypes.byref(header), data), "capset")


def _drop_bounding() -> None:
    """The bounding set (all of it: no exec can gain one back) and the ambient set emptied."""
    cap = 0
    while _libc.prctl(_PR_CAPBSET_DROP, ctypes.c_ulong(cap), ctypes.c_ulong(0), ctypes.c_ulong(0),
                      ctypes.c_ulong(0)) == 0:
        cap += 1
    if ctypes.get_errno() != errno.EINVAL or cap < 32:
        raise OSError(ctypes.get_errno(), f"cannot drop capability {cap} from the bounding set")
    _prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, "clear ambient capabilities")


def _open_tree(path: str, missing_ok: bool = False) -> int:
    fd = _libc.syscall(_OPEN_TREE, _AT_FDCWD, os.fsencode(path), _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC | _AT_RECURSIVE)
    if fd < 0:
        err = ctypes.get_errno()
        if missing_ok and err == errno.ENOENT:
            return -1
        raise OSError(err, f"open_tree({path}): {os.strerror(err)}")
    return int(fd)


def _setattr(path: str, set_: int, clear: int = 0) -> None:
    attr = _MountAttr(set_, clear, 0, 0)
    _check(_libc.syscall(_MOUNT_SETATTR, _AT_FDCWD, os.fsencode(path), _AT_RECURSIVE, ctypes.byref(attr),
                         ctypes.sizeof(attr)), f"mount_setattr({path})")


def _attach(fd: int, dst: str, is_dir: bool, set_: int) -> None:
    """The cloned tree ``fd`` at ``dst`` with the flags ``set_`` added to its own (bwrap's bind_mount:
    a writable bind keeps its source's read-only submounts read-only)."""
    _ensure(dst, is_dir)
    _check(_libc.syscall(_MOVE_MOUNT, fd, b"", _AT_FDCWD, os.fsencode(dst), _MOVE_MOUNT_F_EMPTY_PATH),
           f"move_mount({dst})")
    _setattr(dst, set_)


def _ensure(path: str, is_dir: bool) -> None:
    """A mount point at ``path`` (made in a tmpfs of ours: bwrap's ensure_dir/ensure_file)."""
    if os.path.lexists(path):
        return
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        os.makedirs(parent, 0o755)
    if is_dir:
        os.mkdir(path, 0o755)
    else:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o444))


def _tmpfs(path: str, mode: int, size: int | None, flags: int = _MS_NOSUID | _MS_NODEV) -> None:
    _ensure(path, True)
    data = f"mode={mode:o}" + (f",size={size}" if size else "")
    _check(_libc.mount(b"tmpfs", os.fsencode(path), b"tmpfs", flags, data.encode()), f"tmpfs on {path}")


def _apply(op: tuple[Any, ...], sources: dict[str, int]) -> None:
    kind = op[0]
    if kind == "ro-bind" and op[1] == "/" and op[2] == "/":
        _setattr("/", _ATTR_RDONLY | _ATTR_NOSUID | _ATTR_NODEV)  # the whole tree, in one call
    elif kind in ("ro-bind", "bind", "dev-bind-try"):
        fd = sources.get(op[1], -1)
        if fd < 0:
            if kind == "dev-bind-try":
                return
            raise OSError(errno.ENOENT, f"{op[1]}: no such file or directory")
        ro = _ATTR_RDONLY if kind == "ro-bind" else 0
        nodev = 0 if kind == "dev-bind-try" else _ATTR_NODEV
        _attach(fd, op[2], stat.S_ISDIR(os.fstat(fd).st_mode), ro | _ATTR_NOSUID | nodev)
    elif kind == "tmpfs":
        _tmpfs(op[1], op[2], op[3])
    elif kind == "dir":
        _ensure(op[1], True)
        os.chmod(op[1], op[2])
    elif kind == "dev":
        dev = op[1]
        _tmpfs(dev, 0o755, None)
        for node in _DEV_NODES:
            fd = sources.get(os.path.join(dev, node), -1)
            if fd >= 0:
                _attach(fd, os.path.join(dev, node), False, _ATTR_NOSUID)
        for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                             ("stderr", "/proc/self/fd/2"), ("core", "/proc/kcore")):
            os.symlink(target, os.path.join(dev, name))
        for name in ("shm", "pts"):
            os.mkdir(os.path.join(dev, name), 0o755)
        _check(_libc.mount(b"devpts", os.fsencode(os.path.join(dev, "pts")), b"devpts", _MS_NOSUID | _MS_NOEXEC,
                           b"newinstance,ptmxmode=0666,mode=620"), "devpts")
        os.symlink("pts/ptmx", os.path.join(dev, "ptmx"))
    elif kind == "proc":
        proc = op[1]
        _check(_libc.mount(b"proc", os.fsencode(proc), b"proc", _MS_NOSUID | _MS_NOEXEC | _MS_NODEV, None), "proc")
        for name in _PROC_COVERS:
            path = os.path.join(proc, name)
            if os.access(path, os.W_OK):  # (as bwrap: what is read-only or absent already is left)
                _check(_libc.mount(os.fsencode(path), os.fsencode(path), None, _MS_BIND | _MS_REC, None), f"bind {path}")
                _setattr(path, _ATTR_RDONLY | _ATTR_NOSUID | _ATTR_NODEV)
    else:  # (plan() admits no other)
        raise OSError(errno.EINVAL, f"unknown sandbox operation {kind}")


def main(argv: list[str]) -> int:
    """``python -S -E _rootbox.py ARGV...``: run a root chain's argv (``{info-fd}`` and ``{args-fd}``
    in it, as :func:`_sandbox._argv` writes them) this way, with an empty environment; its exit
    status, 2 when it cannot (the launcher's check that this way works here: _sandbox.rootbox_works)."""
    info_r, info_w = os.pipe()
    argv = [str(info_w) if a == "{info-fd}" else "0" if a == "{args-fd}" else a for a in argv]
    chain = plan(argv) if usable() else None
    if chain is None:
        return 2
    pid = spawn(chain, {"PATH": "/usr/local/bin:/usr/bin:/bin"}, 2, None, os.setsid)
    os.close(info_w)
    os.close(info_r)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
