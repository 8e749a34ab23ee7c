"""Chaos: ``kill -9`` of the loop controller at random points, resumed after each, then run to
the end: no trial lost or launched twice, no process of the home left behind, every MLflow
run ended (the harness: tests/loop/chaos.py; the long version: bench/bench_chaos.py)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.loop.chaos import run_chaos


@pytest.mark.chaos
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_kill_9_of_the_controller_loses_nothing_and_leaves_nothing(tmp_path: Path) -> None:
    seed = int(os.environ.get("AUTORESEARCH_CHAOS_SEED") or random.randrange(1 << 30))
    # 12 trials of 1 s: a loop that turns trials over fast (its trials queued ahead run on while it is
    # dead) must not end before its third life
    result = run_chaos(tmp_path, kills=5, trials=12, parallel=3, sleep=1.0, seed=seed)

    where = f"seed {seed} (rerun with AUTORESEARCH_CHAOS_SEED={seed}); {result}"
    assert result.kills >= 3, where  # (fewer than 5 when the loop finished before a late kill's decisions)
    assert result.final_rc == 0, where + (tmp_path / "controller.log").read_text()[-3000:]
    assert result.lost == [], where
    assert result.duplicates == [], where
    assert result.orphans == [], where
    assert result.runs_not_ended == [], where
    assert result.launched == 12, where  # the whole trial budget, no more


HELPER_PARENT = textwrap.dedent("""\
    import sys, time
    from autoresearch.loop._mlflow_runs import Prepare, RunMaker

    maker = RunMaker(sys.argv[1])
    Prepare(maker, [1]).start()  # the helper starts and imports mlflow (seconds)
    while maker.proc is None:
        time.sleep(0.01)
    print(maker.proc.pid, flush=True)
    time.sleep(60)
""")


def test_the_run_helper_leaves_with_its_controller(home: Path) -> None:
    home.mkdir(parents=True)
    parent = subprocess.Popen([sys.executable, "-c", HELPER_PARENT, str(home)], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        helper = int(parent.stdout.readline())
        parent.send_signal(signal.SIGKILL)  # the controller is killed -9 while its helper works
        parent.wait()
        killed = time.monotonic()

        def gone() -> bool:
            try:
                with open(f"/proc/{helper}/stat") as f:
                    return f.read().rsplit(")", 1)[-1].split()[0] == "Z"
            except OSError:
                return True

        wait_for(gone, timeout=60)
        assert time.monotonic() - killed < 2.5  # not after its mlflow import and its work
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
