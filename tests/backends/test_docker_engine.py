"""The Docker backend against a real engine: a private dockerd from backends/docker/kit.py and an
image imported there from a root filesystem tarball (no registry is reachable here)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

from autoresearch.backends import Backend
from autoresearch.backends._docker import DockerBackend
from autoresearch.testing.backends import BackendConformance
from tests.conftest import wait_for
from tests.runtime.test_cli import cli


class TestDockerConformance(BackendConformance):
    timeout_s = 60.0

    @pytest.fixture
    def backend(self, docker_engine: Any) -> Backend:
        return DockerBackend(image=docker_engine.image, host=docker_engine.host)

    def fresh(self, backend: Backend) -> Backend:
        return DockerBackend(image=backend.image, host=backend.host)  # type: ignore[attr-defined]


def _profile(home: Path, engine: Any) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.yaml").write_text(f"backends:\n  box: {{kind: docker, host: '{engine.host}', gpus: 1}}\n")


def _docker(engine: Any, *args: str) -> str:
    env = {**os.environ, "DOCKER_HOST": engine.host}
    return subprocess.run(["docker", *args], env=env, capture_output=True, text=True, timeout=60, check=True).stdout


@pytest.mark.slow
def test_a_loop_runs_its_trials_in_the_image_with_its_mounts(docker_engine: Any, home: Path, tmp_path: Path) -> None:
    _profile(home, docker_engine)
    data = tmp_path / "data"
    data.mkdir()
    target = f"/ar-data-{os.getpid()}"  # a path inside the container only
    plan = tmp_path / "plan.yaml"
    plan.write_text(f"""\
name: boxed
objective: {{metric: loss}}
trial:
  command: python -c "import os; open('{target}/x-{{x}}', 'w').write(os.uname().nodename); print('loss:', {{x}})"
  image: {docker_engine.image}
  mounts: {{{target}: {data}}}
space:
  x: {{choices: [0.5, 0.25]}}
proposer: grid
budget: {{trials: 2, parallel: 2}}
""")
    cli(str(plan), "--backend", "box", "--json", "--no-report")
    jobs = json.loads(cli("list", "--json").stdout)["jobs"]
    assert len(jobs) == 2
    for job in jobs:
        wait_for(lambda j=job: json.loads(cli("status", str(j["id"]), "--json").stdout)["state"] == "succeeded",
                 timeout=120)
        assert "loss:" in cli("logs", str(job["id"])).stdout
    # The trials wrote through the bind mount (a real one: the target exists only in the container),
    # from containers (their host names are container ids, not this host's).
    written = sorted(p.name for p in data.iterdir())
    assert written == ["x-0.25", "x-0.5"] and not os.path.lexists(target)
    assert all((data / name).read_text() not in ("", socket.gethostname()) for name in written)
    def ours() -> list[str]:  # this home's containers (the engine is the session's: other tests' are there too)
        dirs = _docker(docker_engine, "ps", "-a", "--format", '{{.Label "autoresearch.run_dir"}}').split("\n")
        return [d for d in dirs if d.startswith(str(home))]

    wait_for(lambda: not ours(), timeout=60)  # released once the ledger recorded each ending


@pytest.mark.slow
def test_cancel_stops_the_container_and_its_log_reads_what_it_printed(docker_engine: Any, home: Path) -> None:
    _profile(home, docker_engine)
    script = "trap 'echo got TERM; exit 5' TERM; echo ready; while :; do sleep 0.2; done"
    job = cli("submit", "--backend", "box", "--image", docker_engine.image, "--", "/bin/sh", "-c",
              script).stdout.strip()
    wait_for(lambda: "ready" in cli("logs", job).stdout, timeout=120)
    rows = _docker(docker_engine, "ps", "--format", '{{.Names}} {{.Label "autoresearch.run_dir"}}').splitlines()
    running = [row.split(" ", 1)[0] for row in rows if row.split(" ", 1)[-1].startswith(str(home))]
    assert len(running) == 1
    cli("cancel", job)
    wait_for(lambda: json.loads(cli("status", job, "--json").stdout)["state"] == "cancelled", timeout=120)
    assert cli("logs", job).stdout.splitlines() == ["ready", "got TERM"]  # the TERM reached the container's shell
    wait_for(lambda: not _docker(docker_engine, "ps", "-aq", "--filter", f"name={running[0]}").split(), timeout=60)


def test_paths_with_colons_commas_and_quotes_mount_as_one_path(docker_engine: Any, tmp_path: Path) -> None:
    # Before: `-v source:target` split a path at its ':' ("invalid mode"), and every attempt failed to start.
    from autoresearch.backends import LaunchRequest

    work = tmp_path / 'w:ork,dir"q'
    data = tmp_path / "da:ta,1"
    work.mkdir()
    data.mkdir()
    (data / "f").write_text("through the mount\n")
    backend = DockerBackend(image=docker_engine.image, host=docker_engine.host)
    request = LaunchRequest(key="colon.1", argv=["/bin/sh", "-c", 'cat /in/f; pwd; echo made > out'], env={},
                            workdir=str(work), log_path=str(tmp_path / "log" / "a.log"), run_dir=str(tmp_path / "run"),
                            mounts={"/in": str(data)})
    ext = backend.start(request)
    wait_for(lambda: backend.poll(ext).ended, timeout=60)
    assert backend.poll(ext).exit_code == 0
    assert backend.read_log(ext).decode().splitlines() == ["through the mount", str(work)]
    assert (work / "out").read_text() == "made\n"


def test_a_cli_submit_through_a_docker_profile_imports_none_of_the_heavy_packages(
        docker_engine: Any, home: Path) -> None:
    """The CLI's submit through a docker profile (the profile read, the backend, its nodes, docker run)
    stays on the fast path, as Slurm's does: none of tests/runtime/test_cli_imports.py's heavy
    packages, no entry-point scan (importlib.metadata: ~0.17 s here), no inspect (~15 ms: a dataclass
    without a docstring), no socket (~4 ms: the node's name is os.uname's). The first read parses
    config.yaml (yaml) and keeps it as JSON for the next."""
    from tests.runtime.test_cli_imports import HEAVY, loaded

    _profile(home, docker_engine)
    watch = (*HEAVY, "importlib.metadata", "dis", "socket")  # (dis: imported by inspect alone here)
    args = ("submit", "--backend", "box", "--image", docker_engine.image, "--workdir", str(home.parent), "--", "true")
    assert "yaml" in loaded(*args, watch=watch)  # (and what yaml imports)
    assert loaded(*args, watch=watch) == []
