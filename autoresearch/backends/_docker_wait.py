"""``python -m autoresearch.backends._docker_wait RUN_DIR``: a container attempt's host-side waiter.

Started detached by :class:`~autoresearch.backends._docker.DockerBackend.start`. It streams
``docker logs -f`` into the attempt's log file, waits for the container (``docker wait``,
enforcing the timeout through ``poll``), keeps the whole log, then does what the local
supervisor does at an ending: poke a listening watcher, else run the pass (``on_exit``).
Nothing depends on it: without it, passes still poll the engine. So when the engine has not
answered for ``GIVE_UP_S`` (it was stopped, or its host is gone), the waiter leaves instead of
asking it forever; the passes record the ending whenever the engine answers again.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

from autoresearch.backends._docker import REQUEST, DockerBackend, _read_json
from autoresearch.backends._supervisor import ACK_WAIT_S, REAPED, _poke
from autoresearch.errors import AutoresearchError

GIVE_UP_S = 600.0  # the engine silent this long, without a break: the waiter leaves (exit status 3)


def main(run_dir: str) -> int:
    req = _read_json(os.path.join(run_dir, REQUEST))
    if req is None:
        return 1
    backend = DockerBackend(**req["options"])
    env = {**os.environ, **({"DOCKER_HOST": backend.host} if backend.host else {})}
    with open(req["log_path"], "wb") as log:  # `logs -f` replays from the start: the file starts over
        follower = subprocess.Popen([backend.docker, "logs", "-f", req["name"]], env=env, stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT)
    silent_since: float | None = None  # (monotonic) the engine's first failed answer of a run of them
    try:
        while True:
            try:
                if backend.poll(run_dir).ended:
                    break
                silent_since = None
            except AutoresearchError as e:
                now = time.monotonic()  # the engine is down for now: try again, for a while
                silent_since = now if silent_since is None else silent_since
                if now - silent_since >= GIVE_UP_S:
                    print(f"waiter: the docker engine has not answered for {now - silent_since:.0f} s ({str(e)[:200]}); "
                          "leaving: the passes record the ending when it answers again", flush=True)
                    return 3
            begun = time.monotonic()
            with contextlib.suppress(subprocess.TimeoutExpired, OSError):
                subprocess.run([backend.docker, "wait", req["name"]], env=env, stdin=subprocess.DEVNULL,
                               capture_output=True, timeout=_wait_s(req), check=False)
            if time.monotonic() - begun < 0.5:
                time.sleep(0.5)  # `docker wait` failed at once (no container yet, engine down): no busy loop
    finally:
        with contextlib.suppress(subprocess.TimeoutExpired):
            follower.wait(timeout=5)
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    with contextlib.suppress(AutoresearchError, OSError):
        backend.read_log(run_dir, 0, 0)  # the whole log, before anyone removes the container
    if _poke(req.get("wake_fifo")):
        deadline = time.time() + ACK_WAIT_S
        while time.time() < deadline:
            if os.path.exists(os.path.join(run_dir, REAPED)):
                return 0
            time.sleep(0.02)
    hook = req.get("on_exit")
    if hook:
        with open(os.path.join(run_dir, "on_exit.log"), "ab") as out:
            subprocess.run(hook, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, check=False)
    return 0


def _wait_s(req: dict[str, object]) -> float:
    """How long one ``docker wait`` may block: until the timeout is due (poll then stops it), at most 30 s."""
    timeout = req.get("timeout")
    if not timeout:
        return 30.0
    left = float(req.get("created_at") or 0) + float(timeout) - time.time()  # type: ignore[arg-type]
    return min(30.0, max(0.2, left + 0.1))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
