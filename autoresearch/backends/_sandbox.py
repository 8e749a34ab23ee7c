"""The local backend's sandbox: bubblewrap (``bwrap``) mount and pid namespaces.

Inside, the host's file system is read-only but for the paths the runtime names as
the job's own (``Sandbox.own``); ``/tmp`` and ``/dev/shm`` are private and empty;
``/proc`` shows the job's own processes only (so no other process's environ); and
the hidden paths (the autoresearch home, the tokens file) are empty or ``/dev/null``.
Same uid, same network, same GPUs (``CUDA_VISIBLE_DEVICES`` only): see docs/security.md.

The supervisor learns the sandboxed child's pid from ``--info-fd`` and signals that
child's session (``--new-session``): bwrap itself dies on SIGTERM without passing it
on, which would cut the job's grace period short.
"""

from __future__ import annotations

import os
from functools import lru_cache

from autoresearch.backends._base import Sandbox
from autoresearch.errors import BackendError

INSTALL_HINT = ("install bubblewrap (Debian/Ubuntu: apt-get install -y bubblewrap; Fedora: dnf install bubblewrap) "
                "and make sure unprivileged user namespaces are allowed, then resubmit")


@lru_cache(maxsize=1)
def _probe() -> tuple[str | None, str]:
    import shutil
    import subprocess  # only when a tenant job is submitted or launched

    path = shutil.which("bwrap")
    if path is None:
        return None, "bubblewrap (bwrap) is not installed (not found on PATH)"
    try:
        done = subprocess.run([path, "--ro-bind", "/", "/", "--unshare-pid", "--proc", "/proc", "--dev", "/dev",
                               "true"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as err:
        return None, f"bubblewrap ({path}) cannot run: {err}"
    if done.returncode != 0:
        return None, f"bubblewrap ({path}) cannot create a sandbox here: {done.stderr.strip()[-300:]}"
    return path, ""


def bwrap() -> str:
    """The bwrap binary, checked once per process; refuses (fail closed) when it cannot sandbox."""
    path, why = _probe()
    if path is None:
        _probe.cache_clear()  # installing it must not need a restart
        raise BackendError(f"this job must run in a sandbox but {why}", hint=INSTALL_HINT)
    return path


def wrap(argv: list[str], workdir: str, sandbox: Sandbox) -> list[str]:
    """``argv`` inside a fresh sandbox (the supervisor inserts ``--info-fd N`` after ``argv[0]``)."""
    out = [bwrap(), "--new-session", "--unshare-pid", "--die-with-parent", "--ro-bind", "/", "/",
           "--dev-bind", "/dev", "/dev", "--tmpfs", "/dev/shm", "--proc", "/proc", "--tmpfs", "/tmp"]
    for path in (workdir, *sandbox.visible):  # read-only, and there even under the private /tmp
        if os.path.exists(path):
            out += ["--ro-bind", path, path]
    for path in sandbox.hidden:
        # A directory becomes an empty tmpfs, a file /dev/null: the job sees no content.
        if os.path.isdir(path):
            out += ["--tmpfs", path]
        elif os.path.lexists(path):
            out += ["--ro-bind", "/dev/null", path]
    for path in sandbox.own:  # what the job may write, bound on top of the hidden paths
        if os.path.exists(path):
            out += ["--bind", path, path]
    return [*out, "--chdir", workdir, "--", *argv]
