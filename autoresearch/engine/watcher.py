"""The watcher: a long-lived process hears attempt endings and runs the pass itself.

Stdlib only. See docs/DESIGN-NOTES.md ("Who starts queued jobs").
"""

from __future__ import annotations

import fcntl
import os
import select
import sys
import time
from pathlib import Path

WAKE_FIFO = "wake.fifo"
NAMED_MAX = 4096  # attempts named in pokes kept until take(); beyond, a whole pass is owed instead


def fifo_name(backend: str) -> str:
    """The FIFO of one backend's endings: a pass reconciles only its own backend's attempts, so a
    watcher on backend A must not swallow the pokes of backend B's attempts (their supervisors
    then run B's pass themselves). ``local`` keeps the historic name."""
    return WAKE_FIFO if backend == "local" else f"wake.{backend}.fifo"


def listener_lock(home: Path, backend: str = "local") -> Path:
    """The file a listening loop or server holds a shared lock on while its watcher is open."""
    return home / f"{fifo_name(backend)}.listen"


def others_listen(home: Path, backend: str = "local") -> bool:
    """Whether a loop or a server (a claiming :class:`Watcher`) listens on the backend's FIFO. (No file: nobody
    does; the listener makes it. Asking never makes it: the pass daemon asks in a home that may be removed.)"""
    from autoresearch.util.paths import lock_held

    return lock_held(listener_lock(home, backend))


def wake(home: Path, backend: str = "local") -> bool:
    """Poke whoever listens on the backend's FIFO (the pass daemon, a loop, a server: each runs a pass
    on a poke), as a finishing supervisor does; False when nobody listens."""
    from autoresearch.backends._supervisor import _poke

    return _poke(str(home / fifo_name(backend)))


def _key(piece: bytes) -> tuple[int, int] | None:
    """(job id, n) of a supervisor's poke ``eJOB.N`` (backends/_supervisor.py: _poke); None for anything else."""
    job, dot, n = piece[1:].partition(b".")
    if piece[:1] != b"e" or not dot or not (job.isdigit() and n.isdigit()) or len(job) > 18 or len(n) > 9:
        return None
    return int(job), int(n)


class Watcher:
    """Hear attempt endings, so a long-lived process (a loop, a server) runs the pass.

    While a watcher is open, a finishing supervisor pokes ``$AUTORESEARCH_HOME/wake.fifo``
    instead of starting a fresh interpreter for the pass (~150 ms of CPU each): at 16
    parallel short trials that is the difference between keeping up and not. When the
    watcher's process dies nobody reads the FIFO, and supervisors go back to running
    the pass themselves — nothing depends on the watcher staying alive.

        watcher = runtime.watch()
        while running:
            if watcher.wait(0.5):
                runtime.tick()
    """

    def __init__(self, home: Path, backend: str = "local", claim: bool = True) -> None:
        """``claim``: a loop's or a server's watcher, which the pass daemon makes way for
        (:mod:`autoresearch.engine.passd` opens its own with ``claim=False``)."""
        self._claim = -1
        if claim:
            try:
                self._claim = os.open(listener_lock(home, backend), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                fcntl.flock(self._claim, fcntl.LOCK_SH)
            except OSError:
                self._claim = -1
        path = home / fifo_name(backend)
        try:
            os.mkfifo(path, 0o600)
        except FileExistsError:
            pass
        # O_RDWR: we are also a writer, so the FIFO never reports EOF and select() blocks.
        self.fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        self.points = False  # the last wait heard a reported point that waits for a verdict
        # What the pokes since the last take() said: the attempts that ended (a local supervisor names
        # its own), and whether any poke named none (a stop request, a report(), another backend's
        # waiter, a poke lost to a full pipe): then only a whole pass sees everything.
        self._ended: set[tuple[int, int]] = set()
        self._unnamed = False
        try:
            self._pipe_size = fcntl.fcntl(self.fd, fcntl.F_GETPIPE_SZ)
        except (OSError, AttributeError):
            self._pipe_size = 65536  # Linux's default

    def wait(self, timeout: float) -> bool:
        """True when at least one attempt ended since the last call (pokes are coalesced)."""
        self.points = False
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return False
        chunks = []
        try:
            while chunk := os.read(self.fd, 4096):
                chunks.append(chunk)
        except BlockingIOError:
            pass
        data = b"".join(chunks)
        self.points = b"r" in data  # a trial's report() at a rung (loop/rungsync.py)
        # Writes of less than PIPE_BUF are whole, and we read until the pipe is empty: whole pokes. A
        # poke that found the pipe full was dropped, and then one read of ours ran to half of it or more.
        if len(data) >= self._pipe_size // 4:
            self._unnamed = True
        for piece in data.split(b"\n"):
            key = _key(piece)
            if key is not None:
                self._ended.add(key)
            elif piece:
                self._unnamed = True
        if len(self._ended) > NAMED_MAX:  # a listener that never takes them (a server, the pass daemon)
            self._ended.clear()
            self._unnamed = True
        return True

    def take(self) -> set[tuple[int, int]] | None:
        """The attempts (job id, n) whose endings were heard since the last take, or None when a
        poke named none (a pass must then look at every attempt); and forget them."""
        ended, unnamed = self._ended, self._unnamed
        self._ended, self._unnamed = set(), False
        return None if unnamed else ended

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self._claim >= 0:
            os.close(self._claim)
            self._claim = -1

    def __enter__(self) -> Watcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- the pass daemon's start (autoresearch/engine/passd.py is the daemon; it imports the runtime, which starts
# one after its pass: the start lives here, below both)

SPAWN_GRACE_S = 2.0  # a daemon started this recently may still be importing: no second one meanwhile
_OFF = ("0", "off", "false", "no")
_SUPERVISED = ("LocalBackend", "DockerBackend")  # backends whose supervisors poke the wake FIFO


def daemon_enabled() -> bool:
    return os.environ.get("AUTORESEARCH_PASSD", "").strip().lower() not in _OFF


def daemon_lock(home: Path, backend: str) -> Path:
    return home / f"passd.{fifo_name(backend)}.lock"


def daemon_pid(home: Path, backend: str = "local") -> int | None:
    """The pid of the daemon of ``home`` and ``backend``, when one runs."""
    from autoresearch.util._lockfile import lock_holder

    return lock_holder(daemon_lock(home, backend))


def ensure_daemon(runtime: object) -> bool:
    """Start the daemon of ``runtime``'s home and backend unless one runs, or another process
    listens on the wake FIFO, or the backend's attempts poke no FIFO, or one was started less than
    ``SPAWN_GRACE_S`` ago (it takes the lock only once its imports are done: many endings at once,
    each with nobody listening, would each start one, and all but one would exit). Never raises;
    True when it started one. Cheap when one runs: an open and a non-blocking flock."""
    backend = getattr(runtime, "backend", None)
    ledger = getattr(runtime, "ledger", None)
    if not daemon_enabled() or backend is None or ledger is None or type(backend).__name__ not in _SUPERVISED:
        return False
    home: Path = ledger.home
    try:
        fd = os.open(daemon_lock(home, backend.name), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # a daemon runs
        finally:
            os.close(fd)
        if others_listen(home, backend.name):
            return False  # a loop or a server runs the pass
        started = home / f"passd.{fifo_name(backend.name)}.started"
        try:
            if 0 <= time.time() - os.lstat(started).st_mtime < SPAWN_GRACE_S:
                return False  # one is starting
        except FileNotFoundError:
            pass
        # (a link: OSError; emptied: the daemon writes its pid there once it holds the lock)
        stamp = os.open(started, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.utime(stamp)
        finally:
            os.close(stamp)
        from autoresearch.backends._supervisor import spawn_detached

        spawn_detached([sys.executable, "-m", "autoresearch.engine.passd", "--home", str(home), "--backend", backend.name],
                       home / "passd.log")
        return True
    except OSError:
        return False
