"""The local backend passes the shared backend contract."""

from __future__ import annotations

import pytest

from autoresearch.backends import Backend, get_backend
from autoresearch.testing.backends import BackendConformance


class TestLocalBackend(BackendConformance):
    @pytest.fixture
    def backend(self, home: object) -> Backend:
        return get_backend("local")


def test_unknown_backend_names_the_valid_ones() -> None:
    from autoresearch.errors import SpecError

    with pytest.raises(SpecError) as err:
        get_backend("locl")
    assert "did you mean 'local'" in err.value.hint
