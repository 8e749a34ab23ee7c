"""Pause/resume promotions (issue 15 item 2): a losing trial that checkpoints is paused at its
rung and resumed from its checkpoint when promoted, so no epoch is trained twice; a trial that
never checkpoints makes the loop warn once and stop trials instead."""

from __future__ import annotations

import json
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from autoresearch.loop.controller import Controller
from autoresearch.loop.plan import parse_plan

# every epoch it trains is appended to epochs-<x>.log; with save=1 it checkpoints each epoch
TRIAL = textwrap.dedent("""\
    import json, os, sys, time
    from autoresearch import report
    x, steps, pause, save = float(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4] == "1"
    ckpt = os.environ.get("AUTORESEARCH_CHECKPOINT_DIR")
    state = os.path.join(ckpt, "state.json") if ckpt else None
    start = json.load(open(state))["step"] + 1 if state and os.path.exists(state) else 1
    with open(f"epochs-{x}.log", "a") as log:
        for step in range(start, steps + 1):
            time.sleep(pause)
            print(step, file=log, flush=True)
            if save and state:
                with open(state + ".tmp", "w") as f:
                    json.dump({"step": step}, f)
                os.replace(state + ".tmp", state)
            report(step=step, loss=x + 1.0 / step)
""")


@pytest.fixture
def work(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AUTORESEARCH_TRACKING", "off")
    (tmp_path / "trial.py").write_text(TRIAL)
    return tmp_path


def run(api: Any, work: Path, save: int) -> Any:
    plan = parse_plan({
        "name": "pause", "objective": {"metric": "loss"},
        "trial": {"command": f"{sys.executable} trial.py {{x}} 8 0.05 {save}", "grace": 5},
        "space": {"x": {"choices": [1.0, 2.0, 3.0, 4.0]}}, "proposer": {"kind": "grid"},
        "budget": {"trials": 4, "parallel": 1},
        "early_stop": {"kind": "asha", "min_steps": 1, "reduction_factor": 2, "pause": True}}, base_dir=work)
    return Controller(plan, runtime=api._runtime, monitor_every_s=0.1).run()


def decisions(api: Any, kind: str) -> list[Any]:
    return api._ledger.query("SELECT * FROM decisions WHERE kind=? ORDER BY id", (kind,))


def test_a_paused_trial_resumes_from_its_checkpoint_when_promoted(api: Any, work: Path) -> None:
    view = run(api, work, save=1)
    by_x = {t.params["x"]: t for t in view.trials}
    # x=2 loses at rung 1 (paused), is promoted once x=3 does worse there, loses again at rung 2
    resumes = decisions(api, "resume")
    assert [r["trial_id"] for r in resumes] == [by_x[2.0].trial_id]
    assert json.loads(resumes[0]["inputs"])["job_id"] != by_x[2.0].job_id  # a new job, the old checkpoint
    assert by_x[1.0].state == "succeeded"
    assert {by_x[x].state for x in (2.0, 3.0, 4.0)} == {"stopped"}  # paused ones stop when the loop ends
    for x in (1.0, 2.0, 3.0, 4.0):
        epochs = [int(line) for line in (work / f"epochs-{x}.log").read_text().split()]
        assert max(Counter(epochs).values()) == 1, (x, epochs)  # no epoch trained twice
    assert [int(e) for e in (work / "epochs-2.0.log").read_text().split()] == [1, 2]
    assert not decisions(api, "pause_fallback")


def test_a_trial_that_never_checkpoints_warns_once_and_falls_back_to_stopping(api: Any, work: Path) -> None:
    view = run(api, work, save=0)
    fallback = decisions(api, "pause_fallback")
    assert len(fallback) == 1 and "AUTORESEARCH_CHECKPOINT_DIR" in fallback[0]["rationale"]
    assert not decisions(api, "resume")
    assert sorted(t.state for t in view.trials) == ["stopped", "stopped", "stopped", "succeeded"]
    warned = api._ledger.query("SELECT job_id, data FROM events WHERE kind='pause_fallback'", ())
    assert len(warned) == 1 and "hint:" in warned[0]["data"]


# The same trial, with a gate: trials x >= 3 wait for the file `gate` before they train, and a
# trial x == 2 takes `term_s` seconds to leave on SIGTERM (saving, say).
GATED = TRIAL.replace("with open(f\"epochs-{x}.log\"", textwrap.dedent("""\
    import signal
    term_s = float(sys.argv[5])
    if x == 2.0 and term_s:
        signal.signal(signal.SIGTERM, lambda *_: (time.sleep(term_s), sys.exit(0)))
    while x >= 3.0 and not os.path.exists("gate"):
        time.sleep(0.05)
    with open(f"epochs-{x}.log\"""").rstrip("\n") + "", 1)
RUNNER = textwrap.dedent("""\
    import sys
    from autoresearch.loop.plan import load_plan
    from autoresearch.loop.controller import Controller
    Controller(load_plan(sys.argv[1]), monitor_every_s=0.1).run()
""")
PLAN = """\
name: pause-restart
objective: {metric: loss}
trial: {command: "%s trial.py {x} 8 0.3 1 %s", grace: 10}  # slow epochs: a stop lands before the next
space: {x: {choices: [1.0, 2.0, 3.0, 4.0]}}
proposer: grid
budget: {trials: 4, parallel: 1}
early_stop: {kind: asha, min_steps: 1, reduction_factor: 2, pause: true}
"""


def _kill_when(api: Any, work: Path, term_s: float, ready: Any) -> None:
    """Run the loop in a controller process and ``kill -9`` it once ``ready()`` holds."""
    import signal
    import subprocess

    from tests.conftest import wait_for

    (work / "trial.py").write_text(GATED)
    (work / "plan.yaml").write_text(PLAN % (sys.executable, term_s))
    (work / "runner.py").write_text(RUNNER)
    proc = subprocess.Popen([sys.executable, str(work / "runner.py"), str(work / "plan.yaml")], cwd=work)
    try:
        wait_for(ready, timeout=60, interval=0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def _resume_and_check(api: Any, work: Path) -> None:
    from autoresearch.loop.plan import load_plan

    (work / "gate").write_text("")
    view = Controller(load_plan(work / "plan.yaml"), runtime=api._runtime, monitor_every_s=0.1).run()
    by_x = {t.params["x"]: t for t in view.trials}
    # as without the restart: x=2, paused at rung 1, is promoted once x=3 does worse there
    assert [r["trial_id"] for r in decisions(api, "resume")] == [by_x[2.0].trial_id]
    assert by_x[1.0].state == "succeeded"
    assert {by_x[x].state for x in (2.0, 3.0, 4.0)} == {"stopped"}
    for x in (1.0, 2.0, 3.0, 4.0):
        epochs = [int(line) for line in (work / f"epochs-{x}.log").read_text().split()]
        assert max(Counter(epochs).values()) == 1, (x, epochs)  # no epoch trained twice
    assert [int(e) for e in (work / "epochs-2.0.log").read_text().split()] == [1, 2]  # resumed at its epoch 2
    assert len(decisions(api, "replan")) == 1


def _trial_state(api: Any, x: float) -> str | None:
    for row in api._ledger.query("SELECT state, params FROM trials", ()):
        if json.loads(row["params"]) == {"x": x}:
            return str(row["state"])
    return None


def test_a_trial_paused_when_the_controller_is_killed_is_promoted_after_resume(api: Any, work: Path) -> None:
    _kill_when(api, work, 0, lambda: _trial_state(api, 2.0) == "paused")
    assert _trial_state(api, 3.0) in (None, "proposed", "queued", "running")  # gated: x=2 not promotable yet
    _resume_and_check(api, work)


def test_a_trial_whose_pause_was_decided_before_the_kill_is_paused_when_its_job_ends(api: Any, work: Path) -> None:
    def pause_decided() -> bool:
        return any(json.loads(d["inputs"]).get("pause") for d in decisions(api, "stop"))

    _kill_when(api, work, 3.0, pause_decided)  # x=2 takes 3 s to leave: its job ends after the kill
    assert _trial_state(api, 2.0) == "running"
    _resume_and_check(api, work)


# The controller dies between recording a stop on the attempt (write-ahead) and delivering it.
DIES_AT_THE_STOP = textwrap.dedent("""\
    import os, signal
    from autoresearch.engine.runtime import Runtime
    def record_then_die(self, job_id, n, reason, **data):
        self.jobs.mark_stop(job_id, n, reason, **data)
        os.kill(os.getpid(), signal.SIGKILL)
    Runtime.request_stop = record_then_die
    """) + RUNNER


def test_a_pause_recorded_but_never_delivered_before_the_kill_is_delivered_after_resume(api: Any, work: Path) -> None:
    import subprocess

    (work / "trial.py").write_text(GATED)
    (work / "plan.yaml").write_text(PLAN % (sys.executable, 0))
    (work / "runner.py").write_text(DIES_AT_THE_STOP)
    proc = subprocess.run([sys.executable, str(work / "runner.py"), str(work / "plan.yaml")], cwd=work, timeout=120)
    assert proc.returncode == -9
    stopped = api._ledger.one("SELECT a.stop_reason, a.state FROM attempts a JOIN trials t ON t.job_id=a.job_id "
                              "WHERE t.params=?", (json.dumps({"x": 2.0}),))
    assert stopped is not None and stopped["stop_reason"] == "stopped" and stopped["state"] in ("starting", "running")
    _resume_and_check(api, work)  # x=2 is stopped at its rung and paused (it used to train all 8 epochs)
