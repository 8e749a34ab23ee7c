"""Loop tests run with tracking off: the controller would otherwise import mlflow (~3 s) to
create its trials' MLflow runs. The loop's tracking is tested in tests/tracking/test_loop_tracking.py."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _no_tracking(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTORESEARCH_TRACKING", "off")
