"""The local backend passes the shared backend contract."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from autoresearch.backends import Backend, _local, get_backend
from autoresearch.backends._base import LaunchRequest
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


def test_a_commands_start_does_not_wait_for_request_json(home: object, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The supervisor is handed its request first; request.json (a file's creation: 0.1-0.3 ms on a
    disk) is recorded after. Until it is, a run dir that is new reads as starting, not lost."""
    base = tmp_path
    seen: list[bool] = []
    monkeypatch.setattr(_local.sup, "launch", lambda request: seen.append(
        os.path.exists(os.path.join(request["run_dir"], "request.json"))))
    backend = _local.LocalBackend()
    request = LaunchRequest(key="1.1", argv=["true"], env={}, workdir=str(base), log_path=str(base / "attempt-1.log"),
                            run_dir=str(base / "attempt-1"))
    assert backend.start(request) == request.run_dir
    assert seen == [False]  # handed over before it was recorded
    assert (base / "attempt-1" / "request.json").exists()
    assert backend.start(request) == request.run_dir and seen == [False]  # recorded: not launched again

    fresh = base / "attempt-2"  # a launcher that died between its hand-off and request.json
    fresh.mkdir()
    assert backend.poll(str(fresh)).state == "starting"
    old = time.time() - _local.START_GRACE_S - 1
    os.utime(fresh, (old, old))
    lost = backend.poll(str(fresh))
    assert lost.state == "lost" and lost.detail == _local.sup.NEVER_STARTED
