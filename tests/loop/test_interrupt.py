"""Ctrl-C always stops a loop: not lost in the supervisor's fork (Python ignores a
KeyboardInterrupt raised in an after-fork callback), nor swallowed by code that catches
everything; and the helper that creates MLflow runs closes quietly under a waiting worker."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from autoresearch.loop._mlflow_runs import Prepare, RunMaker

# The loop in a process of its own, with one Ctrl-C delivered at a chosen, otherwise unlucky, moment.
SCRIPT = textwrap.dedent("""\
    import os, signal, sys
    from autoresearch.loop import _launch
    from autoresearch.loop.controller import Controller, LoopInterrupted
    from autoresearch.loop.plan import parse_plan

    fired = []

    def ctrl_c():
        if not fired:
            fired.append(1)
            os.kill(os.getpid(), signal.SIGINT)

    if sys.argv[1] == "fork":  # lands in the after-fork callbacks of the supervisor's fork
        os.register_at_fork(after_in_parent=ctrl_c)
    else:  # lands in code that swallows it
        spec = _launch.trial_spec

        def swallowing(*args, **kwargs):
            try:
                ctrl_c()
                for _ in range(1000):
                    pass
            except BaseException:
                pass
            return spec(*args, **kwargs)

        _launch.trial_spec = swallowing
    plan = parse_plan({"name": "ctrl-c", "objective": {"metric": "loss"},
                       "trial": {"command": "echo loss: 1", "grace": 1},
                       "space": {"x": {"choices": [1, 2, 3, 4, 5, 6]}}, "proposer": {"kind": "grid"},
                       "budget": {"trials": 6, "parallel": 1}}, base_dir=sys.argv[2])
    try:
        Controller(plan).run()
    except LoopInterrupted as err:
        print("interrupted:", err.message)
        if len(sys.argv) > 3:  # then stop its trials, as `autoresearch plan.yaml` does after a Ctrl-C
            from autoresearch.api import Api
            print("stopped:", Api().stop_trials(plan, "stopped by the user after Ctrl-C"))
        sys.exit(130)
    print("finished")
""")


@pytest.mark.parametrize("where", ["fork", "swallowed"])
def test_a_ctrl_c_stops_the_loop_wherever_it_lands(where: str, api: Any, tmp_path: Path) -> None:
    (tmp_path / "ctrl_c.py").write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(tmp_path / "ctrl_c.py"), where, str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 130, done.stdout + done.stderr
    assert "interrupted" in done.stdout
    assert api._ledger.one("SELECT state FROM loops")["state"] == "interrupted"
    assert len(api._ledger.query("SELECT id FROM jobs")) <= 1  # no trial launched after the Ctrl-C


def test_a_job_submitted_just_before_the_ctrl_c_is_stopped_not_orphaned(api: Any, tmp_path: Path) -> None:
    # The Ctrl-C lands in the supervisor's fork: the job exists, its trial's row never got its id.
    (tmp_path / "ctrl_c.py").write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(tmp_path / "ctrl_c.py"), "fork", str(tmp_path), "stop"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 130, done.stdout + done.stderr
    jobs = [r["id"] for r in api._ledger.query("SELECT id FROM jobs")]
    assert jobs and f"stopped: {jobs}" in done.stdout, done.stdout  # every submitted job, linked or not
    assert all(r["cancel_requested"] or r["state"] in ("succeeded", "failed", "cancelled")
               for r in api._ledger.query("SELECT cancel_requested, state FROM jobs"))


LAUNCH = textwrap.dedent("""\
    import os, signal, sys
    from autoresearch.backends import _supervisor

    os.register_at_fork(after_in_parent=lambda: os.kill(os.getpid(), signal.SIGINT))
    try:
        _supervisor.launch({"run_dir": sys.argv[1]})  # (the child exits at once: no job in the request)
    except KeyboardInterrupt:
        print("raised")
        sys.exit(130)
    print("lost")
""")


def test_a_ctrl_c_during_the_supervisors_fork_reaches_the_caller(tmp_path: Path) -> None:
    (tmp_path / "launch.py").write_text(LAUNCH)
    done = subprocess.run([sys.executable, str(tmp_path / "launch.py"), str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (130, "raised"), done.stderr
    assert "Exception ignored" not in done.stderr


def test_closing_the_run_maker_under_a_waiting_worker_is_quiet(home: Path, capfd: pytest.CaptureFixture[str]) -> None:
    home.mkdir(parents=True)
    maker = RunMaker(home)
    worker = Prepare(maker, [1])  # the helper imports mlflow (seconds) before it answers
    worker.start()
    deadline = time.monotonic() + 10
    while maker.proc is None and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    maker.close()  # the loop ends meanwhile: the helper answers what it has in hand, then exits
    worker.join(120)
    assert not worker.is_alive()
    assert "cannot create" not in capfd.readouterr().err  # no AttributeError, no message at all
    assert maker.ask([2]) == {}  # closed for good: no new helper
    assert maker.proc is None
