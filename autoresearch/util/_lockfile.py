"""Who holds a lock file: the pid a home's long-lived helper (its pass daemon, its zygote, its MLflow
syncer) writes in the file it holds its flock on. Stdlib only; imports nothing of autoresearch."""

from __future__ import annotations

import fcntl
import os


def lock_holder(path: str | os.PathLike[str]) -> int | None:
    """The pid written in the lock file ``path`` while a process holds its flock (a home's pass
    daemon, its zygote); None when nobody holds it, or it is missing or unreadable."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return None  # nobody holds it
    except BlockingIOError:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
        return int(text) if text.isdigit() else None
    finally:
        os.close(fd)
