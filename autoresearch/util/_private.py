"""Private files under the home: directories 0700, files 0600 (docs/security.md, "The home is private").

Our own code creates what it writes with those modes. What third-party code writes (MLflow's
store and artifacts, matplotlib's report images, git's worktrees) is made under
:func:`private_umask`, or tightened after with :func:`tighten`. Stdlib only.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator

UMASK = 0o077
_FILE, _DIR = 0o600, 0o700


@contextlib.contextmanager
def private_umask() -> Iterator[None]:
    """Files and directories made meanwhile by this process (any thread) are private. For our own
    short commands and helper processes, which run no job: a job keeps its launcher's umask."""
    old = os.umask(UMASK)
    try:
        yield
    finally:
        os.umask(old)


def private_dir(path: str | os.PathLike[str]) -> None:
    """``path`` made 0700 (or tightened to it when it exists, is ours and is no link)."""
    try:
        os.mkdir(path, _DIR)
        return
    except FileExistsError:
        pass
    tighten(path, recursive=False)


def tighten(path: str | os.PathLike[str], recursive: bool = True) -> None:
    """Take group and other bits off ``path`` (and, recursive, everything beneath it): directories
    0700, files 0600 at most. Through file descriptors opened with ``O_NOFOLLOW`` beneath the top
    (``os.fwalk``): a link is never followed, even one swapped in meanwhile; other users' files are
    never touched; a file that goes meanwhile is skipped."""
    _fix(os.fspath(path), None)
    if not recursive:
        return
    try:
        for _top, dirs, files, top_fd in os.fwalk(path, follow_symlinks=False):
            for name in dirs + files:
                _fix(name, top_fd)
    except OSError:
        pass


_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def _fix(name: str, dir_fd: int | None) -> None:
    try:
        fd = os.open(name, _FLAGS, dir_fd=dir_fd)
    except OSError:  # a link (ELOOP), gone, or not ours to open
        return
    try:
        st = os.fstat(fd)
        if st.st_uid == os.getuid() and st.st_mode & 0o077 and (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
            keep = _DIR if stat.S_ISDIR(st.st_mode) else _FILE | 0o100
            os.fchmod(fd, stat.S_IMODE(st.st_mode) & keep)
    except OSError:
        pass
    finally:
        os.close(fd)


def open_beneath(root: str | os.PathLike[str], relative: str, create_dirs: bool = False,
                 dir_mode: int = 0o777) -> tuple[int, str]:
    """The directory that holds ``relative``'s last part, resolved beneath ``root`` one component at
    a time with ``O_NOFOLLOW`` (an ``openat`` walk: a link anywhere on the way, even one swapped in
    meanwhile, is an error, never followed), as an open descriptor, and that last part's name.
    ``create_dirs``: make the missing folders on the way (``dir_mode``, less the umask). Raises ValueError for an absolute path or
    one with ``.``/``..`` parts, OSError (ELOOP, ENOTDIR) for a link or a file on the way. The caller
    closes the descriptor and creates with ``dir_fd=``."""
    text = os.fspath(relative)
    parts = text.split("/")
    if not text or text.startswith("/") or "\0" in text or any(p in (".", "..") for p in parts):
        raise ValueError(f"{text[:200]!r} is not a relative path without '.' or '..'")
    parts = [p for p in parts if p]
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create_dirs:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, dir_mode, dir_fd=fd)
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd, parts[-1]


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
