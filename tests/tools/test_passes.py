"""A running server listens for attempt endings and runs the scheduling pass itself."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from autoresearch.tools.server import build_server, run_passes, server_api
from tests.conftest import wait_for


def test_server_runs_the_pass_when_attempts_end(home: Path) -> None:
    server = build_server(home=home)
    api: Any = server_api(server)
    stop = run_passes(api)
    try:
        first = api.submit({"command": ["sleep", "0.2"], "gpus": 2, "workdir": os.getcwd()}).id
        second = api.submit({"command": ["true"], "gpus": 2, "workdir": os.getcwd()}).id
        state = lambda j: api._ledger.one("SELECT state FROM jobs WHERE id=?", (j,))["state"]  # noqa: E731
        wait_for(lambda: state(second) == "succeeded", timeout=60)
        assert state(first) == "succeeded"
        # the server's thread ran the passes: no supervisor needed a fresh interpreter for it
        assert not (home / "jobs" / str(first) / "attempt-1" / "on_exit.log").exists()
    finally:
        stop.set()


def test_a_failed_pass_of_the_server_owes_a_whole_one(home: Path) -> None:
    """Its pass took the pokes' names, then failed: the next pass polls every attempt (only=None)."""
    from autoresearch.backends._supervisor import _poke
    from autoresearch.engine.watcher import Watcher, fifo_name

    home.mkdir(parents=True, exist_ok=True)
    calls: list[object] = []

    class Api:
        def watch(self) -> Watcher:
            return Watcher(home)

        def tick(self, wait: bool = True, only: object = None) -> bool:
            calls.append(only)
            if len(calls) == 1:
                raise RuntimeError("the ledger is locked")
            return True

    stop = run_passes(Api())
    try:
        fifo = str(home / fifo_name("local"))
        for n, expected in ((5, {(5, 1)}), (6, None), (7, {(7, 1)})):
            wait_for(lambda n=n: _poke(fifo, f"{n}.1"), timeout=60)
            wait_for(lambda n=n: len(calls) == n - 4, timeout=60)
            assert calls[-1] == expected, calls
    finally:
        stop.set()
