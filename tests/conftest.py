"""Shared fixtures: every test gets its own AUTORESEARCH_HOME and 2 fake GPU slots.

Owned by the lead; add fixtures of a subsystem to tests/<subsystem>/conftest.py.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# How the suite is split over xdist's workers (each engine's tests on one worker): tests/_scopes.py.
from tests._scopes import ENGINE_TIMEOUT_S, _engine_of, pytest_xdist_make_scheduler  # noqa: E402,F401


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _engine_of(item.nodeid) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(ENGINE_TIMEOUT_S))


def pytest_configure(config: pytest.Config) -> None:
    # Started in the background by a non-interactive shell, pytest inherits SIGINT ignored, and so
    # would every loop the interrupt tests start (a Ctrl-C they could never hear): undo that.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # For every test and every process a test starts: no background MLflow syncer (an
    # mlflow import per throwaway home) unless a test turns it on (tests/tracking/).
    os.environ["AUTORESEARCH_SYNC"] = "off"
    # The host's own kernel log (/dev/kmsg) is machine evidence about this machine: a real `NVRM: Xid`
    # in a developer's boot log would cordon the local node of every test. Tests that read a kernel log
    # point AUTORESEARCH_KMSG at a file of their own.
    os.environ["AUTORESEARCH_KMSG"] = "off"
    # CI=true without a terminal turns `autoresearch plan.yaml` into --ci mode (docs/ci.md); the
    # suite means the interactive command wherever it runs (tests/loop/test_ci.py sets CI itself).
    for name in ("CI", "GITHUB_STEP_SUMMARY", "GITHUB_ACTIONS"):
        os.environ.pop(name, None)
    # Property tests draw the same examples on every run, so CI is red only for a real change;
    # PROPERTY_RANDOM=1 explores new ones (then fix what it finds and pin it with @example).
    try:
        from hypothesis import settings
    except ImportError:
        return
    settings.register_profile("suite", derandomize=not os.environ.get("PROPERTY_RANDOM"), database=None)
    settings.load_profile("suite")


@pytest.fixture(autouse=True)
def _sigint_as_a_terminal_leaves_it() -> Iterator[None]:
    """Every test starts with Ctrl-C as a terminal delivers it (Python's handler, not blocked):
    the suite's subprocesses inherit both, and a loop started with SIGINT ignored or blocked
    (nohup's semantics, which the loop keeps) never hears the Ctrl-C the interrupt tests send.
    A test that leaves it changed is named on stderr, and the state is put back."""
    yield
    changed = signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    blocked = signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, set())
    if changed or blocked:
        print(f"\n[conftest] a test left SIGINT {'blocked' if blocked else 'handled elsewhere'}; restored",
              file=sys.stderr)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "home"
    monkeypatch.setenv("AUTORESEARCH_HOME", str(path))
    monkeypatch.setenv("AUTORESEARCH_GPUS", "2")
    monkeypatch.delenv("AUTORESEARCH_BACKEND", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return path


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A project root for tools that take paths relative to ``--root``."""
    root = tmp_path / "project"
    root.mkdir()
    return root


@pytest.fixture
def api(home: Path) -> Iterator[Any]:
    from autoresearch.api import Api

    yield Api(home)


WAIT_S = 60.0  # the default bound of a wait by condition: generous, it ends as soon as the condition holds
# (the suite runs on 2 shared cores at load 10-20, where 20 s bounds failed and passed alone)


def wait_for(predicate: Callable[[], Any], timeout: float = WAIT_S, interval: float = 0.05) -> Any:
    """Poll until ``predicate()`` is truthy; return its value or fail with what it last saw."""
    deadline = time.monotonic() + timeout
    value = None
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s (last value: {value!r})")


def wait_state(api: Any, job_id: int, states: tuple[str, ...] | str, timeout: float = WAIT_S) -> Any:
    """Wait until a job reaches one of ``states``; return its detailed view."""
    wanted = (states,) if isinstance(states, str) else states

    def check() -> Any:
        view = api.status(job_id)
        return view if view.state in wanted else None

    try:
        return wait_for(check, timeout)
    except AssertionError:
        view = api.status(job_id)
        raise AssertionError(f"job {job_id} is {view.state}, wanted {wanted}: {view}") from None


@pytest.fixture(autouse=True)
def _mlflow_uri_left_as_found() -> Iterator[None]:
    """``mlflow.set_tracking_uri`` (what the tracking hooks call in-process) also writes
    MLFLOW_TRACKING_URI into os.environ: a later test's subprocess in the same worker then saw
    that store instead of none (test_ci's 'no MLflow store' case failed in a full run). Put back."""
    before = os.environ.get("MLFLOW_TRACKING_URI")
    yield
    if os.environ.get("MLFLOW_TRACKING_URI") != before:
        if before is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = before
