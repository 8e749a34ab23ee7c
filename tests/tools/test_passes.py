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
        wait_for(lambda: state(second) == "succeeded", timeout=20)
        assert state(first) == "succeeded"
        # the server's thread ran the passes: no supervisor needed a fresh interpreter for it
        assert not (home / "jobs" / str(first) / "attempt-1" / "on_exit.log").exists()
    finally:
        stop.set()
