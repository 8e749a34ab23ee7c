"""A fake fleet whose GPUs are recorded NVML states (tests/fixtures/nvml/), and a fake backend
that remembers the cordons it was asked for (as Slurm's would drain)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from autoresearch.api import Api
from autoresearch.backends.fake import FakeBackend

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nvml"


class CordoningFake(FakeBackend):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cordons: list[tuple[str, str]] = []
        self.uncordons: list[str] = []

    def cordon(self, node: str, reason: str) -> None:
        self.cordons.append((node, reason))

    def uncordon(self, node: str) -> None:
        self.uncordons.append(node)


class Fleet:
    """The recorded states of the fake nodes; ``set(node, fixture)`` changes one."""

    def __init__(self, path: Path, states: dict[str, str]) -> None:
        self.path = path
        self.states = dict(states)
        self.write()

    def set(self, node: str, fixture: str) -> None:
        self.states[node] = fixture
        self.write()

    def write(self) -> None:
        nodes = {n: json.loads((FIXTURES / f"{f}.json").read_text()) for n, f in self.states.items()}
        self.path.write_text(json.dumps({"nodes": nodes}))
        stamp = self.path.stat().st_mtime + len(self.states) + sum(map(len, self.states.values()))
        os.utime(self.path, (stamp, stamp))  # a new mtime even within the file system's resolution


@pytest.fixture
def fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Fleet:
    path = tmp_path / "fleet.json"
    monkeypatch.setenv("AUTORESEARCH_NVML_FAKE", str(path))
    return Fleet(path, {"fake-0": "healthy", "fake-1": "healthy"})


def configure(home: Path, text: str) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.yaml").write_text("health:\n" + "".join(f"  {line}\n" for line in text.strip().splitlines()))


def setup(home: Path, nodes: int = 2, gpus: int = 8) -> tuple[Api, CordoningFake]:
    fake = CordoningFake(nodes=nodes, gpus=gpus)
    return Api(home, backend=fake), fake


def submit(api: Api, **spec: Any) -> int:
    return int(api.submit({"command": ["train"], "workdir": os.getcwd(), **spec}).id)


def view(api: Api, job: int) -> Any:
    result = api.status(job, refresh=False)
    assert not isinstance(result, list)
    return result


def node_states(api: Api) -> dict[str, tuple[str, str]]:
    return {n.name: (n.state, n.reason) for n in api.nodes()}
