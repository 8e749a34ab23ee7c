"""A stop is recorded before it is sent (write-ahead). A process killed between the two (an
interrupted ``cancel``, a controller's kill -9, a pass that preempts) left an attempt that was
never told: it ran to its end, and a preemption's victim held its GPUs all that time. A pass now
sends the stop again once the attempt has outlived its grace by ``STOP_AGAIN_AFTER_S``."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from autoresearch.engine.runtime import Runtime
from tests.conftest import wait_for, wait_state

CANCEL_DIES = textwrap.dedent("""\
    import os, sys
    from autoresearch.api import Api
    from autoresearch.backends._local import LocalBackend
    from autoresearch.engine.runtime import Runtime
    if sys.argv[2] == "before_the_signal":  # the stop is on the attempt, the signal never sent
        LocalBackend.stop = lambda self, external_id, grace=None: os._exit(9)
    else:  # the job's cancel is recorded, its attempt's stop not even that
        Runtime.request_stop = lambda self, job_id, n, reason, **data: os._exit(9)
    Api().cancel([int(sys.argv[1])])
""")


@pytest.mark.parametrize("where", ["before_the_signal", "before_the_stop"])
def test_a_cancel_killed_before_its_stop_was_sent_is_carried_out_by_a_later_pass(
        api: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    job = api.submit({"command": ["sleep", "120"], "workdir": str(tmp_path), "grace": 1}).id
    wait_state(api, job, "running")
    done = subprocess.run([sys.executable, "-c", CANCEL_DIES, str(job), where], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 9, done.stderr
    assert api._ledger.one("SELECT cancel_requested FROM jobs WHERE id=?", (job,))["cancel_requested"] == 1
    time.sleep(1.5)
    assert api.status(job).state == "running"  # never told: it would run its 120 s (and hold its slot)

    monkeypatch.setattr(Runtime, "STOP_AGAIN_AFTER_S", 1.0, raising=False)

    def cancelled() -> bool:  # our own passes, waiting for the pass lock (the pass daemon's use the default)
        api._runtime.tick(wait=True)
        return api.status(job).state == "cancelled"

    wait_for(cancelled, timeout=30, interval=0.2)
    view = api.status(job)
    assert view.end_reason == "cancelled"
    again = api._ledger.query("SELECT data FROM events WHERE job_id=? AND kind='stop'", (job,))
    assert any('"again": true' in r["data"] for r in again), [r["data"] for r in again]
