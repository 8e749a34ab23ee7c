"""The home's pre-forked launcher ("zygote"): supervisors forked from a small image.

Forking a supervisor from the process that launches it (a pass daemon, a CLI, a loop controller:
20+ MB interpreters) costs that process a fork of its whole image on every launch (~2 ms of the
pass daemon's CPU a trial on a 2-core VM, where the daemon's one thread bounds the throughput),
and the supervisor copy-on-write faults in a big image. The zygote is a long-lived ``python -S -E`` that imports only what backends/_supervisor.py needs
(never sqlite, pydantic or the runtime) and listens on ``$AUTORESEARCH_HOME/zygote.sock`` (0600;
the home is 0700; a peer of another uid is refused). A launcher sends it the supervisor's request
(length-prefixed JSON) and it forks the supervisor from its own small image and answers with the
supervisor's pid; a batch launch sends every request first and reads the answers at the end.

Nothing depends on it (invariant 1):

* no zygote answers (none yet, it exited when idle, it died, it refused the request): the
  launcher forks the supervisor itself, as before, and starts a zygote for the next launches
  (``spawn_detached``, as the pass daemon starts);
* a zygote that dies or stalls after it forked a supervisor but before its answer arrived: the
  launcher forks another, and the second finds the attempt claimed (its log, which a supervisor
  creates with O_EXCL before anything runs: _supervisor.attempt) and exits; the attempt runs once;
* a launcher that dies before it heard the answer: the zygote has the request or not; an
  attempt it never got ends as "supervisor never started" and is retried, not counted against
  the node (already so for a launcher killed mid-batch).

A supervisor it forked takes further requests once its attempt is over and recorded (it says so on
a control socket to us): the next request goes to such a free supervisor before a new one is forked.
Each attempt still has a supervisor of its own, which outlives the zygote; the fork and the
copy-on-write faults of a fresh process are paid once per supervisor, not once per attempt
(docs/DESIGN-NOTES.md: supervisors that take another request).

A request carries everything its supervisor needs: the command's environment, and the
launcher's own environment and umask, which the supervisor's ``on_exit`` hook is exec'd with
(the zygote's may differ: it was started by another process of the home).

It exits after ``IDLE_S`` without a request, when its socket or home is gone, or when another
zygote took the socket. ``AUTORESEARCH_ZYGOTE=off`` turns it off (supervisors are forked by the
launcher). Its stderr goes to ``$AUTORESEARCH_HOME/zygote.log``; its lock file holds its pid.
"""

from __future__ import annotations

import _socket  # the C module: socket.py's enums cost a launching process ~4 ms to import
import _thread
import fcntl
import gc
import json
import os
import select
import struct
import sys
import time
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import socket

SOCK, LOCK, LOG = "zygote.sock", "zygote.lock", "zygote.log"
IDLE_S = 10.0  # exit after this long without a request
WAKE_S = 1.0  # look at the idle clock and at our socket at least this often
ACK_S = 10.0  # how long a launcher waits for an answer before it forks the supervisor itself
RESPAWN_S = 2.0  # a launcher starts at most one zygote per home in this long (it takes ~30 ms to listen)
MAX_FRAME = 16 << 20
_HEAD = struct.Struct("!I16s")  # the payload's length; the code's version (a zygote runs the code it started with)
_ACK = struct.Struct("!i")
_LEN = struct.Struct("!I")  # a request handed to a supervisor we forked: its length
MAX_IDLE = 64  # supervisors that finished their attempt kept waiting for a request (the rest leave)
MAX_USES = 1000  # attempts one supervisor runs before it leaves
RECENT = 8  # a supervisor's last attempts whose late stop it recognizes (_supervisor._stale_stop)
LEAVE_S = 1.0  # how long a leaving zygote waits for its free supervisors to leave too
SEND_S = 2.0  # how long handing a request to a waiting supervisor may block (it reads at once)
_OFF = ("0", "off", "false", "no")


def _version() -> bytes:
    """This code's version: a request from a launcher with other code (an upgrade since the zygote
    started) is refused (the launcher forks that supervisor itself), and does not keep it alive."""
    here = os.path.dirname(os.path.abspath(__file__))
    stamp = [os.stat(os.path.join(here, name)) for name in ("_zygote.py", "_supervisor.py", "_rootbox.py")]
    folded = 0xCBF29CE484222325  # FNV-1a of every file's stamp (the last 16 characters were the last file's)
    for byte in ";".join(f"{st.st_mtime_ns:x}.{st.st_size:x}" for st in stamp).encode():
        folded = ((folded ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{folded:016x}".encode()


VERSION = _version()


def enabled() -> bool:
    return os.environ.get("AUTORESEARCH_ZYGOTE", "").strip().lower() not in _OFF


def _address(home: str) -> tuple[str, int]:
    """The socket's address, and a descriptor to close after connect/bind (-1: none). A path
    longer than sun_path's 108 bytes goes through /proc/self/fd of the opened home."""
    path = os.path.join(home, SOCK)
    if len(path.encode()) < 100:
        return path, -1
    fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    return f"/proc/self/fd/{fd}/{SOCK}", fd


def running_pid(home: str | os.PathLike[str]) -> int | None:
    """The pid of the zygote of ``home``, when one runs."""
    from autoresearch.util._lockfile import lock_holder

    return lock_holder(os.path.join(home, LOCK))


# -- the launcher's side ------------------------------------------------------------------------

# Per thread (two threads' frames must not interleave on one connection) and per process (a forked
# child of a launcher must not speak on its parent's connections: _mine).
_conns: dict[tuple[str, int], _socket.socket] = {}  # (home, thread) -> our connection to its zygote
_pending: dict[int, list[tuple[_socket.socket, dict[str, Any]]]] = {}  # thread -> sent, not answered (in order)
_owner = [os.getpid()]
_spawned: dict[str, float] = {}  # home -> when we last started a zygote for it
stats = {"sent": 0, "taken": 0, "refused": 0}  # requests sent, answered with a pid, not taken


def _mine() -> int:
    """This thread's id, after forgetting the connections a parent process made (we are a fork of it)."""
    if os.getpid() != _owner[0]:
        _conns.clear()  # (closes our copies only: the parent's connections live on)
        _pending.clear()
        _owner[0] = os.getpid()
    return _thread.get_ident()


def _connect(home: str) -> _socket.socket | None:
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    fd = -1
    try:
        address, fd = _address(home)
        sock.settimeout(ACK_S)
        sock.connect(address)
    except OSError:
        sock.close()
        return None
    finally:
        if fd >= 0:
            os.close(fd)
    _conns[home, _thread.get_ident()] = sock
    return sock


def _drop(sock: _socket.socket) -> None:
    for key, conn in list(_conns.items()):
        if conn is sock:
            del _conns[key]
    sock.close()


def _umask() -> int:
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def send(home: str, request: dict[str, Any]) -> bool:
    """Hand ``request`` to the zygote of ``home`` (its answer is read by :func:`settle`); False when
    none listens (the caller forks the supervisor itself)."""
    from autoresearch.util._environ import environ as current

    env, environ = request.get("env") or {}, current()
    frame = json.dumps({**request, "umask": _umask(),  # our environment, as a difference from the command's
                        "environ": {k: v for k, v in environ.items() if env.get(k) != v},
                        "environ_drop": [k for k in env if k not in environ]}).encode()
    frame = _HEAD.pack(len(frame), VERSION) + frame
    me = _mine()
    for fresh in (False, True):  # our connection may be to a zygote that exited since: one new try
        sock = _conns.get((home, me)) if not fresh else _connect(home)
        if sock is None:
            if fresh:
                return False
            continue
        try:
            sock.sendall(frame)
        except OSError:
            _drop(sock)
            continue
        _pending.setdefault(me, []).append((sock, request))
        stats["sent"] += 1
        return True
    return False


def _recv_exact(sock: _socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the zygote closed the connection")
        data += chunk
    return data


def settle() -> list[dict[str, Any]]:
    """Read the answers of every request sent; the requests no zygote took (refused, or its
    connection broke first), which the caller launches itself."""
    failed: list[dict[str, Any]] = []
    broken: set[int] = set()
    for sock, request in _pending.pop(_mine(), []):
        if id(sock) not in broken:
            try:
                pid = _ACK.unpack(_recv_exact(sock, _ACK.size))[0]
            except (OSError, ValueError, struct.error):
                broken.add(id(sock))
                _drop(sock)
            else:
                if pid > 0:
                    stats["taken"] += 1
                    continue
        stats["refused"] += 1
        failed.append(request)
    return failed


def start(home: str) -> list[str] | None:
    """The command that starts the zygote of ``home`` (the launcher spawns it detached, its stderr to
    ``LOG``: backends/_supervisor.py, launch), or None: one runs, we started one a moment ago, or
    this is the home's first launch in ``IDLE_S`` (a lone CLI submit: a zygote would only go idle).
    Never raises. (This module never imports the supervisor's: the zygote runs it as a script.)"""
    now = time.monotonic()
    if now - _spawned.get(home, -RESPAWN_S) < RESPAWN_S:
        return None
    path = os.path.join(home, LOCK)
    try:
        try:
            recent = time.time() - os.stat(path).st_mtime < IDLE_S  # the last launch without a zygote
        except FileNotFoundError:
            recent = False
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.utime(fd)
        except BlockingIOError:
            return None  # one runs (or is starting): it will answer the next launch
        finally:
            os.close(fd)
        if not recent:
            return None
        _spawned[home] = now
        return [sys.executable, "-S", "-E", os.path.abspath(__file__), home]
    except OSError:
        return None


# -- the zygote's side --------------------------------------------------------------------------

def _strs(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _env(value: object) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


def _number(value: object) -> bool:
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < 1e12)


def valid(req: object) -> bool:
    """Whether ``req`` is a request a supervisor can run: anything else is refused unrun."""
    if not isinstance(req, dict):
        return False
    paths = [req.get(k) for k in ("run_dir", "log_path", "workdir")]
    if not all(isinstance(p, str) and p.startswith("/") and "\0" not in p for p in paths):
        return False
    members = req.get("members")
    return (_strs(req.get("argv")) and bool(req["argv"]) and _env(req.get("env")) and _env(req.get("environ"))
            and _strs(req.get("environ_drop"))
            and (members is None or (isinstance(members, list) and bool(members) and all(map(_env, members))))
            and _number(req.get("timeout")) and _number(req.get("grace")) and _number(req.get("log_limit"))
            and (req.get("on_exit") is None or (_strs(req["on_exit"]) and bool(req["on_exit"])))
            and (req.get("wake_fifo") is None or isinstance(req["wake_fifo"], str))
            and isinstance(req.get("umask"), int) and 0 <= req["umask"] <= 0o777
            and os.path.isdir(str(req["run_dir"])))


class _Pool:
    """The supervisors we forked that can take another request: each has a control socket to us, on
    which it says ``R`` when its attempt is over and recorded, and reads its next request."""

    def __init__(self, poller: select.poll) -> None:
        self.poller = poller
        self.socks: dict[int, tuple[_socket.socket, int]] = {}  # fd -> (our end, the supervisor's pid)
        self.idle: list[int] = []  # fds of the supervisors waiting for a request, the last one readiest

    def add(self, sock: _socket.socket, pid: int) -> None:
        self.socks[sock.fileno()] = (sock, pid)
        self.poller.register(sock.fileno(), select.POLLIN)

    def drop(self, fd: int) -> None:
        sock, _ = self.socks.pop(fd)
        self.poller.unregister(fd)
        if fd in self.idle:
            self.idle.remove(fd)
        sock.close()  # an idle supervisor reads the end of its socket and leaves

    def event(self, fd: int) -> None:
        try:
            data = self.socks[fd][0].recv(64)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data != b"R" or len(self.idle) >= MAX_IDLE:
            self.drop(fd)  # it left (its end closed: exited, or exec'd the hook), said nonsense, or is spare
        elif fd not in self.idle:
            self.idle.append(fd)

    def hand(self, payload: bytes) -> int:
        """Give ``payload`` to a supervisor that waits for one: its pid, or 0 when none waits."""
        while self.idle:
            fd = self.idle.pop()
            sock, pid = self.socks[fd]
            try:
                sock.sendall(_LEN.pack(len(payload)) + payload)
            except OSError:
                self.drop(fd)
                continue
            return pid
        return 0

    def close(self) -> None:
        """Close every control socket; the supervisors that waited for a request leave at once, and are
        reaped here (within ``LEAVE_S``: their CPU counts as ours); the others when their attempt ends."""
        idle = [self.socks[fd][1] for fd in self.idle]
        for fd in list(self.socks):
            self.drop(fd)
        deadline = time.monotonic() + LEAVE_S
        while idle and time.monotonic() < deadline:
            for pid in list(idle):
                try:
                    if os.waitpid(pid, os.WNOHANG)[0]:
                        idle.remove(pid)
                except ChildProcessError:
                    idle.remove(pid)
            if idle:
                time.sleep(0.005)


def _fork(payload: bytes, sup: ModuleType, pool: _Pool | None = None) -> int:
    """Fork the supervisor of one request: its pid (-1 when the fork failed). The child parses and
    checks the request, not us: each fork makes every page we write afterwards a copy-on-write
    fault, so the zygote touches as little as it can between forks (a refused request: the child
    runs nothing, and its attempt ends as never started, retried). With a ``pool`` the child keeps a
    control socket to us and takes further requests when its attempt is over (:func:`_supervise`)."""
    ours = theirs = None
    if pool is not None:
        try:
            ours, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)
        except OSError:
            pass
    try:
        pid = os.fork()
    except OSError:
        pid = -1
    if pid:
        if theirs is not None:
            theirs.close()
        if ours is not None:
            if pid > 0:
                ours.settimeout(SEND_S)
                pool.add(ours, pid)  # type: ignore[union-attr]
            else:
                ours.close()
        return pid
    try:
        gc.disable()
        os.setsid()
        ctl = theirs.detach() if theirs is not None else -1
        # Not one of our descriptors stays open in it: the listener, a launcher's connection (it would
        # see no end when we close it) and the other supervisors' control sockets (nor would they).
        sup._close_all_but({0, 1, 2, ctl} if ctl >= 0 else {0, 1, 2})
        _supervise(payload, ctl, sup)
    except BaseException:  # noqa: BLE001 - a forked child never returns into the zygote
        pass
    os._exit(70)


def _preload_rootbox(sup: ModuleType) -> None:
    """Import backends/_rootbox.py (ctypes: ~5-30 ms) here, once, before we fork the supervisors of a
    root launcher's tenant jobs: each then has it, where each would import it on its first launch."""
    sup.rootbox()


def _request(payload: bytes) -> dict[str, Any] | None:
    """The request a launcher sent, checked, in the launcher's umask; None when it is not one."""
    try:
        req = json.loads(payload)
    except (ValueError, RecursionError):
        return None
    if not valid(req):
        return None
    os.umask(req["umask"])
    environ = {**req["env"], **req.pop("environ")}  # the launcher's: on_exit runs in it
    for name in req.pop("environ_drop"):
        environ.pop(name, None)
    req["environ"] = environ
    return req


def _supervise(payload: bytes, ctl: int, sup: ModuleType) -> None:
    """A forked supervisor: run the attempt of ``payload``; then, while we have a control socket to the
    zygote (``ctl``), tell it we are free and run the next request it hands us, up to ``MAX_USES``.
    Each attempt still has a supervisor of its own that outlives the zygote: a supervisor takes the
    next request only after its attempt ended and was recorded. A fork and the copy-on-write faults
    of a fresh process were most of a supervisor's CPU (issue 16): a reused one has its pages."""
    previous: tuple[str, ...] = ()  # the run dirs of our last attempts (a late stop of one is not for the next)
    for use in range(1, MAX_USES + 1):
        req = _request(payload)
        if req is not None:
            sup.attempt(req, keep=(ctl,) if ctl >= 0 else (), previous=previous)
            previous = (req["run_dir"], *previous[:RECENT - 1])
        if ctl < 0 or use == MAX_USES:
            break  # (not free: a request handed to us now would never run)
        os.chdir("/")  # not the workdir of the last attempt while we wait
        try:
            os.write(ctl, b"R")
            following = _read_frame(ctl)
        except OSError:
            break
        if following is None:
            break  # the zygote left, or had no use for us
        payload = following
    os._exit(0)


def _read_frame(fd: int) -> bytes | None:
    """One length-prefixed frame from the zygote; None at the end of the stream (or garbage)."""
    head = _read_exact(fd, _LEN.size)
    if head is None:
        return None
    size = _LEN.unpack(head)[0]
    return _read_exact(fd, size) if size <= MAX_FRAME else None


def _read_exact(fd: int, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if not pid:
            return


def _ours(path: str, ino: int) -> bool:
    try:
        return os.stat(path).st_ino == ino
    except OSError:
        return False


def serve(home: str, idle_s: float, sup: ModuleType) -> int:
    """Answer launch requests until idle, forking supervisors of ``sup`` (backends/_supervisor.py, as
    the script imports it); 0 at once when another zygote holds the home's lock."""
    try:
        lock = os.open(os.path.join(home, LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as err:
        print(f"autoresearch zygote: cannot use home {home}: {err.strerror}", file=sys.stderr)
        return 1
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(lock)
        return 0
    path = os.path.join(home, SOCK)
    _yield_on_wake(sup)
    import socket  # the zygote's own (a listener's accept() is socket.py's)

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    clients: dict[int, tuple[_socket.socket, bytearray]] = {}
    pool: _Pool | None = None
    ino = -1
    try:
        try:
            os.unlink(path)  # a dead zygote's (we hold the lock: no live one's)
        except FileNotFoundError:
            pass
        address, dir_fd = _address(home)
        mask = os.umask(0o177)
        try:
            listener.bind(address)
        finally:
            os.umask(mask)
            if dir_fd >= 0:
                os.close(dir_fd)
        ino = os.stat(path).st_ino
        listener.listen(256)
        listener.setblocking(False)
        os.ftruncate(lock, 0)
        os.write(lock, f"{os.getpid()}\n".encode())
        # The supervisors that ended are reaped after each request and every WAKE_S, not on SIGCHLD:
        # every wakeup writes pages the last fork shared (a fault each); a zombie reads as dead.
        gc.freeze()  # what we imported stays shared with every child, untouched
        last = time.monotonic()
        poller = select.poll()  # (not select: a supervisor running its attempt keeps a socket open here)
        poller.register(listener.fileno(), select.POLLIN)
        pool = _Pool(poller)
        while True:
            for r, _ in poller.poll(WAKE_S * 1000):
                if r == listener.fileno():
                    fd = _accept(listener, clients)
                    if fd >= 0:
                        poller.register(fd, select.POLLIN)
                elif r in clients:
                    if _serve_client(clients, r, sup, pool):
                        last = time.monotonic()
                    if r not in clients:
                        poller.unregister(r)  # (closed: the launcher left)
                elif r in pool.socks:
                    pool.event(r)
            _reap()
            if time.monotonic() - last >= idle_s or not _ours(path, ino):
                break
    finally:
        if pool is not None:
            pool.close()  # the supervisors waiting for a request leave; the others when their attempt ends
        _reap()
        try:
            if _ours(path, ino):
                os.unlink(path)  # from here a launcher finds nobody and forks its supervisors itself
        except OSError:
            pass
        listener.close()
        for sock, _ in clients.values():
            sock.close()
        os.close(lock)
    return 0


def _yield_on_wake(sup: Any) -> None:
    """Run ourselves, and the supervisors we fork, as SCHED_BATCH: a wakeup of ours (a request, a
    child's end) then never preempts the process that woke us (a loop controller, the bottleneck of
    short trials: on 2 busy cores each launch's send lost it ~0.4 ms of wall to us, for ~0.1 ms of
    its CPU). Same weight, same share of the CPU; we run when a core is free or at the next tick.
    Commands, and the on_exit hook, are spawned with the policy we were started with
    (``sup.COMMAND_POLICY``). Only from SCHED_OTHER: anything else was somebody's choice."""
    try:
        if os.sched_getscheduler(0) != os.SCHED_OTHER:
            return
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except (OSError, AttributeError):
        return
    sup.COMMAND_POLICY = os.SCHED_OTHER


def _accept(listener: socket.socket, clients: dict[int, tuple[_socket.socket, bytearray]]) -> int:
    """Take a launcher's connection: its descriptor, -1 when refused."""
    try:
        sock, _ = listener.accept()
    except OSError:
        return -1
    try:
        creds = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, struct.calcsize("3i"))
        if struct.unpack("3i", creds)[1] != os.getuid():
            raise PermissionError("a peer of another user")
        sock.setblocking(False)
    except OSError:
        sock.close()
        return -1
    clients[sock.fileno()] = (sock, bytearray())
    return sock.fileno()


def _serve_client(clients: dict[int, tuple[_socket.socket, bytearray]], fd: int, sup: ModuleType,
                  pool: _Pool | None = None) -> bool:
    """Read what one launcher sent and answer every whole request in it (handed to a supervisor of the
    ``pool`` that waits for one, else forked); True when it sent one."""
    sock, buf = clients[fd]
    try:
        data = sock.recv(1 << 16)
    except BlockingIOError:
        return False
    except OSError:
        data = b""
    if not data:  # the launcher is gone (a request it did not finish is dropped: never run)
        del clients[fd]
        sock.close()
        return False
    buf += data
    served = False
    while len(buf) >= _HEAD.size:
        size, version = _HEAD.unpack_from(buf)
        if size > MAX_FRAME:  # not our launcher's: nothing on this connection is trusted any more
            del clients[fd]
            sock.close()
            return served
        if len(buf) < _HEAD.size + size:
            break
        payload = bytes(buf[_HEAD.size:_HEAD.size + size])
        del buf[:_HEAD.size + size]
        # Another version's launcher (or garbage): refused, and it does not keep us from going idle,
        # so after an upgrade the old zygote leaves and the launchers start one with the new code.
        pid = -1
        if version == VERSION:
            if b'"rootbox": true' in payload:
                _preload_rootbox(sup)
            pid = (pool.hand(payload) if pool is not None else 0) or _fork(payload, sup, pool)
        served = served or pid > 0
        try:
            sock.sendall(_ACK.pack(pid))
        except OSError:  # the launcher left (the supervisor runs anyway), or reads no answers: end it
            del clients[fd]
            sock.close()
            return served
    return served


def main(argv: list[str], sup: ModuleType) -> int:
    if len(argv) not in (1, 2) or not argv[0].startswith("/"):
        print("usage: python -S -E _zygote.py HOME [IDLE_S]", file=sys.stderr)
        return 2
    try:
        idle = float(argv[1]) if len(argv) == 2 else IDLE_S
    except ValueError:
        idle = IDLE_S
    if not 0 <= idle <= 86400:  # (NaN too)
        idle = IDLE_S
    return serve(argv[0], idle, sup)


if __name__ == "__main__":
    import importlib

    # Run as a script under -S -E: this folder is sys.path[0], and the supervisor module alone
    # (stdlib only) is imported from it, not the package (its __init__ imports the registry).
    sys.exit(main(sys.argv[1:], importlib.import_module("_supervisor")))
