"""The sim backend passes the same backend contract as the local and fake ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoresearch.backends import Backend, LaunchRequest, get_backend
from autoresearch.backends.fake import Script
from autoresearch.backends.sim import SimBackend
from autoresearch.testing.backends import BackendConformance


class TestSimBackend(BackendConformance):
    @pytest.fixture
    def backend(self, tmp_path: Path) -> Backend:
        return get_backend("sim", nodes=[{"name": "a100", "count": 2, "gpus": 4}], home_dir=str(tmp_path / "home"))

    def prepare(self, backend: Backend, request: LaunchRequest, script: Script) -> None:
        assert isinstance(backend, SimBackend)
        backend.scripts[request.key] = script

    def fresh(self, backend: Backend) -> Backend:
        assert isinstance(backend, SimBackend)
        return SimBackend(home_dir=str(backend.root.parent))  # no options: the home's current fleet, from disk
