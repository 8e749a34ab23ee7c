"""A real single-node Slurm cluster for the session (backends/slurm/kit.py), when Slurm is installed.

`.ci/run` installs slurm-wlm and munge; elsewhere the Slurm tests skip and say why.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

KIT = Path(__file__).resolve().parents[2] / "backends" / "slurm" / "kit.py"


def _kit_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("slurm_kit", KIT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _installed() -> bool:
    return all(shutil.which(t) or Path("/usr/sbin", t).exists() for t in ("slurmctld", "slurmd", "munged", "sbatch"))


@dataclass
class Cluster:
    dir: Path
    conf: str
    kit: ModuleType

    def run(self, *argv: str) -> str:
        env = {**os.environ, "SLURM_CONF": self.conf}
        return subprocess.run(list(argv), env=env, capture_output=True, text=True, timeout=30, check=True).stdout

    def jobs_named(self, name: str) -> list[str]:
        return self.run("squeue", "-h", "-t", "all", "-n", name, "-o", "%i %T").splitlines()


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if not _installed():
        pytest.skip("Slurm is not installed here (apt-get install -y slurm-wlm munge; .ci/run does it)")
    kit = _kit_module()
    where = tmp_path_factory.mktemp("slurm")
    conf = kit.start(where, gpus=4)
    patch = pytest.MonkeyPatch()
    patch.setenv("SLURM_CONF", str(conf))
    try:
        yield Cluster(where, str(conf), kit)
    finally:
        patch.undo()
        kit.stop(where)


@pytest.fixture(scope="session")
def slurm_two_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A 2-node kit (two slurmd on this host at 127.0.0.1 and 127.0.0.2), for gangs."""
    if not _installed():
        pytest.skip("Slurm is not installed here (apt-get install -y slurm-wlm munge; .ci/run does it)")
    kit = _kit_module()
    where = tmp_path_factory.mktemp("slurm2")
    conf = kit.start(where, gpus=2, nodes=2)
    try:
        yield Cluster(where, str(conf), kit)
    finally:
        kit.stop(where)


@pytest.fixture
def slurm(slurm_cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    """The session's cluster, emptied of jobs after the test (so one test's jobs never hold another's GPUs)."""
    monkeypatch.setenv("SLURM_CONF", slurm_cluster.conf)
    yield slurm_cluster
    subprocess.run(["scancel", "--me"], env={**os.environ, "SLURM_CONF": slurm_cluster.conf},
                   capture_output=True, timeout=30)


DOCKER_KIT = Path(__file__).resolve().parents[2] / "backends" / "docker" / "kit.py"


@dataclass
class Engine:
    dir: Path
    host: str
    image: str
    kit: ModuleType


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[Engine]:
    """A real private Docker engine (backends/docker/kit.py) and the test image, when dockerd runs here.

    `.ci/run` installs docker.io; elsewhere (or where dockerd cannot start) the tests skip and say why."""
    import tempfile

    spec = importlib.util.spec_from_file_location("docker_kit", DOCKER_KIT)
    assert spec and spec.loader
    kit = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kit)
    missing = kit.installed()
    if missing:
        pytest.skip(f"Docker is not installed here: {missing}; .ci/run does it")
    where = Path(tempfile.mkdtemp(prefix="ar-docker-"))  # short: dockerd's sockets live under it
    try:
        host = kit.start(where)
        image = kit.image(where)
    except (RuntimeError, OSError, subprocess.SubprocessError) as err:
        kit.stop(where)
        shutil.rmtree(where, ignore_errors=True)
        pytest.skip(f"dockerd cannot run here: {err}")
    try:
        yield Engine(where, host, image, kit)
    finally:
        kit.stop(where)
        shutil.rmtree(where, ignore_errors=True)
