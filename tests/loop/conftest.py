"""Loop tests run with tracking off: the controller would otherwise import mlflow (~3 s) to
create its trials' MLflow runs. The loop's tracking is tested in tests/tracking/test_loop_tracking.py."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(autouse=True)
def _no_tracking(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTORESEARCH_TRACKING", "off")
    # CI=true without a terminal turns `autoresearch plan.yaml` into --ci mode (docs/ci.md): the
    # loop's CLI tests mean the interactive command, whatever CI runs them.
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)


def submit_batches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the batches ``jobs.submit_many`` is called with from now on (a loop's submits)."""
    from autoresearch.engine import jobs

    batches: list[int] = []
    real = jobs.submit_many

    def spy(runtime: Any, specs: list[Any], project: str = "", **kw: Any) -> list[int]:
        batches.append(len(specs))
        return real(runtime, specs, project, **kw)

    monkeypatch.setattr(jobs, "submit_many", spy)
    return batches
