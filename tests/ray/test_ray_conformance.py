"""The Ray backend passes the shared contract against a real Ray head (tests/ray/conftest.py)."""

from __future__ import annotations

import pytest

from autoresearch.backends import Backend
from autoresearch.backends.ray import RayBackend
from autoresearch.testing.backends import BackendConformance

from .conftest import RayHead


class TestRayConformance(BackendConformance):
    timeout_s = 60.0

    @pytest.fixture
    def backend(self, ray_head: RayHead) -> Backend:
        return RayBackend(address=ray_head.address)

    def fresh(self, backend: Backend) -> Backend:
        assert isinstance(backend, RayBackend)
        return RayBackend(address=backend.address)
