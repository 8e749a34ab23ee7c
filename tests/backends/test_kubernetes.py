"""The kubernetes backend against a fake API server whose pods are real local processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoresearch.backends import Backend, get_backend
from autoresearch.backends.kubernetes import KubernetesBackend
from autoresearch.testing.backends import BackendConformance
from tests.fakes.k8s_api import FakeKubernetes


@pytest.fixture
def k8s(tmp_path: Path):
    with FakeKubernetes(tmp_path / "cluster") as server:
        yield server


def _backend(k8s: FakeKubernetes, tmp_path: Path, **options: object) -> KubernetesBackend:
    opts: dict[str, object] = dict(api=k8s.url, namespace="default", image="python:3.11",
                                   state_dir=str(tmp_path / "state"))
    opts.update(options)
    backend = get_backend("kubernetes", **opts)
    assert isinstance(backend, KubernetesBackend)
    return backend


class TestKubernetesBackend(BackendConformance):
    @pytest.fixture
    def backend(self, k8s: FakeKubernetes, tmp_path: Path) -> Backend:
        return _backend(k8s, tmp_path)

    def fresh(self, backend: Backend) -> Backend:
        assert isinstance(backend, KubernetesBackend)
        return KubernetesBackend(api=backend.api.server, namespace=backend.namespace, state_dir=str(backend.state_dir))
