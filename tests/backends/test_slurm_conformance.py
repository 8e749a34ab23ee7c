"""The Slurm backend passes the shared backend contract against a real Slurm (the kit's cluster)."""

from __future__ import annotations

from typing import Any

import pytest

from autoresearch.backends import Backend
from autoresearch.backends._slurm import SlurmBackend
from autoresearch.testing.backends import BackendConformance


class TestSlurmConformance(BackendConformance):
    timeout_s = 60.0

    @pytest.fixture
    def backend(self, slurm: Any) -> Backend:
        return SlurmBackend(conf=slurm.conf)

    def fresh(self, backend: Backend) -> Backend:
        return SlurmBackend(conf=backend.cli.conf)  # type: ignore[attr-defined]
