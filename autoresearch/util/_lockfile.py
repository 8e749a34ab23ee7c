"""Who holds a lock file: the pid a home's long-lived helper (its pass daemon, its zygote, its MLflow
syncer) writes in the file it holds its flock on; whether anyone holds one (a Slurm submit's). Stdlib only; imports nothing of autoresearch."""

from __future__ import annotations

import fcntl
import os


def _busy(fd: int) -> bool:
    """Whether another open file holds an flock on ``fd``'s file (a non-blocking probe: taken and, on
    close, let go when free). ``fd`` is opened read-write: NFS emulates flock with fcntl locks, whose
    exclusive lock needs a writable descriptor (EBADF on a read-only one, which would read as free)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True


def lock_holder(path: str | os.PathLike[str]) -> int | None:
    """The pid written in the lock file ``path`` while a process holds its flock (a home's pass
    daemon, its zygote); None when nobody holds it, or it is missing or unreadable."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not _busy(fd):
            return None  # nobody holds it
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
        return int(text) if text.isdigit() else None
    finally:
        os.close(fd)


def held(path: str | os.PathLike[str]) -> bool:
    """Whether a process holds the flock of ``path`` now, whether or not it wrote its pid there (a
    Slurm attempt's submit.lock). No file: nobody holds it. An flock that fails otherwise (ENOLCK on
    a filesystem without locks) reads as held: the caller waits rather than act on a lock it cannot see."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return _busy(fd)
    except OSError:
        return True
    finally:
        os.close(fd)
