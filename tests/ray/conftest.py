"""One real Ray head for every Ray test, started from the kit (backends/ray/start.sh).

The head takes ~2 GB and several seconds to start: one per session, stopped by its PID file.
Skipped (with the reason) where Ray is not installed; CI installs it (.ci/run).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

KIT = Path(__file__).resolve().parents[2] / "backends" / "ray"


@dataclass
class RayHead:
    dir: Path
    port: int
    dashboard_port: int
    gpus: int
    cpus: int

    @property
    def address(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def start(self) -> None:
        subprocess.run([str(KIT / "start.sh"), "--dir", str(self.dir), "--num-gpus", str(self.gpus), "--num-cpus",
                        str(self.cpus), "--port", str(self.port), "--dashboard-port", str(self.dashboard_port)],
                       check=True, capture_output=True, timeout=240)

    def alive(self) -> bool:
        try:
            os.kill(int((self.dir / "head.pid").read_text()), 0)
        except (OSError, ValueError):
            return False
        return True

    def stop(self, kill: bool = False) -> None:
        subprocess.run([str(KIT / "stop.sh"), "--dir", str(self.dir), *(["--kill"] if kill else [])],
                       check=True, capture_output=True, timeout=60)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def ray_head() -> Iterator[RayHead]:
    if shutil.which("ray") is None:
        pytest.skip("Ray is not installed (pip install 'autoresearch[ray]'; .ci/run installs it)")
    # Ray's sockets live under its temp dir: keep the path short.
    head = RayHead(Path(tempfile.mkdtemp(prefix="arr-", dir="/tmp")), _free_port(), _free_port(), gpus=2, cpus=4)
    try:
        try:
            head.start()
        except subprocess.CalledProcessError as err:
            log = head.dir / "head.log"
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:]) if log.exists() else "(no head.log)"
            pytest.fail(f"the Ray head did not start: {err.stdout.decode()} {err.stderr.decode()}\n"
                        f"head.log ends:\n{tail}")
        yield head
    finally:
        head.stop(kill=True)
        shutil.rmtree(head.dir, ignore_errors=True)


@pytest.fixture
def ray_env(ray_head: RayHead, home: Path, monkeypatch: pytest.MonkeyPatch) -> RayHead:
    """A home whose default backend is the session's Ray head (started again if a test left it down)."""
    if not ray_head.alive():
        ray_head.start()
    monkeypatch.setenv("AUTORESEARCH_BACKEND", "ray")
    monkeypatch.setenv("RAY_ADDRESS", ray_head.address)
    os.environ.pop("AUTORESEARCH_METRICS_FILE", None)
    return ray_head
