"""The in-memory fake backend passes the same backend contract as the local one."""

from __future__ import annotations

import pytest

from autoresearch.backends import Backend, LaunchRequest, get_backend
from autoresearch.backends.fake import FakeBackend, Script
from autoresearch.testing.backends import BackendConformance


class TestFakeBackend(BackendConformance):
    @pytest.fixture
    def backend(self) -> Backend:
        return get_backend("fake", nodes=2, gpus=2)

    def prepare(self, backend: Backend, request: LaunchRequest, script: Script) -> None:
        assert isinstance(backend, FakeBackend)
        backend.expect(request.key, script)

    def fresh(self, backend: Backend) -> Backend:
        assert isinstance(backend, FakeBackend)
        return backend.twin()
