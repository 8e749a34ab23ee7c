"""The controller on real jobs (local backend): parallel trials, write-ahead decisions,
failures fed back, early stopping through cancel, the noise floor, resume after kill -9."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from autoresearch.errors import PlanError
from autoresearch.loop import report_later, stopping
from autoresearch.loop.controller import Controller
from autoresearch.loop.plan import Plan, parse_plan
from autoresearch.loop.proposers import Proposal, Proposer, ProposeResult, ProposerInfo, TrialRecord, register
from tests.conftest import wait_for

TRIAL = textwrap.dedent("""\
    import os, sys, time
    from autoresearch import report
    x = float(sys.argv[1]); steps = int(sys.argv[2]); pause = float(sys.argv[3])
    seed = int(os.environ["AUTORESEARCH_SEED"])
    if x < 0:
        print("boom: x must be >= 0", file=sys.stderr)
        sys.exit(3)
    for step in range(steps):
        time.sleep(pause)
        report(step=step, loss=x + 1.0 / (step + 1) + [0.0, 0.1, -0.1][seed % 3])
""")


@pytest.fixture
def work(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AUTORESEARCH_TRACKING", "off")
    (tmp_path / "trial.py").write_text(TRIAL)
    return tmp_path


def make_plan(work: Path, space: dict[str, Any], steps: int = 1, pause: float = 0.0, **extra: Any) -> Plan:
    data = {"name": "t", "objective": {"metric": "loss"},
            "trial": {"command": f"{sys.executable} trial.py {{x}} {steps} {pause}", "grace": 1},
            "space": space, "proposer": {"kind": "grid"}, "budget": {"trials": 4, "parallel": 2}}
    data.update(extra)
    return parse_plan(data, base_dir=work)


def rows(api: Any, sql: str, *params: Any) -> list[Any]:
    return api._ledger.query(sql, params)


def test_loop_runs_trials_in_parallel_with_decisions_written_first(api: Any, work: Path) -> None:
    plan = make_plan(work, {"x": {"choices": [0.5, 0.25, 0.75, 1.0]}}, steps=2, pause=0.3)
    view = Controller(plan, runtime=api._runtime).run()
    assert view.state == "finished" and view.counts == {"succeeded": 4}
    assert view.best_value == pytest.approx(0.25 + 0.5) and view.best_params == {"x": 0.25}
    trials = rows(api, "SELECT * FROM trials ORDER BY id")
    jobs = {j["id"]: j for j in rows(api, "SELECT * FROM jobs")}
    assert sorted(t["job_id"] for t in trials) == sorted(jobs)
    for t in trials:
        job = jobs[t["job_id"]]
        spec = json.loads(job["spec"])
        assert spec["tags"]["autoresearch.trial_id"] == str(t["id"]) and job["experiment"] == "t"
        launch = rows(api, "SELECT * FROM decisions WHERE kind='launch' AND trial_id=?", t["id"])
        assert len(launch) == 1 and launch[0]["created_at"] <= job["submitted_at"]  # recorded before acted on
        propose = rows(api, "SELECT * FROM decisions WHERE id=?", t["decision_id"])[0]
        assert propose["kind"] == "propose" and t["id"] in json.loads(propose["outputs"])["trial_ids"]
    # two trials overlapped in time: no generation barrier, parallel 2
    spans = sorted((j["started_at"], j["ended_at"]) for j in jobs.values())
    assert any(b[0] < a[1] for a, b in zip(spans, spans[1:], strict=False))
    # the same plan again redoes nothing and adds no decision
    before = len(rows(api, "SELECT id FROM decisions"))
    again = Controller(plan, runtime=api._runtime).run()
    assert again.counts == view.counts and len(rows(api, "SELECT id FROM decisions")) == before
    assert len(rows(api, "SELECT id FROM jobs")) == 4
    # a different plan under the same name needs --resume
    changed = make_plan(work, {"x": {"choices": [0.5, 0.1]}})
    with pytest.raises(PlanError, match="already exists"):
        Controller(changed, runtime=api._runtime).run()
    # --resume continues under the new plan: a larger budget runs only the new trials
    bigger = make_plan(work, {"x": {"choices": [0.5, 0.25, 0.75, 1.0, 0.1, 2.0]}}, steps=2,
                       budget={"trials": 6, "parallel": 2})
    more = Controller(bigger, runtime=api._runtime, resume=True).run()
    assert more.counts == {"succeeded": 6} and more.best_params == {"x": 0.1}
    assert len(rows(api, "SELECT id FROM jobs")) == 6
    replan = rows(api, "SELECT inputs FROM decisions WHERE kind='replan'")
    assert len(replan) == 1 and json.loads(replan[0]["inputs"])["plan_changed"] is True


class Recorder(Proposer):
    """A real proposer that proposes given values in order and keeps what it observed."""

    kind = "recorder"
    blocking = True  # exercise the worker-thread path
    values = [1.0, -1.0, 2.0]
    seen: list[TrialRecord] = []

    def propose(self, history: list[TrialRecord], n: int) -> ProposeResult:
        left = self.values[len(history):len(history) + n]
        return ProposeResult([Proposal({"x": v}, rationale=f"try {v}") for v in left], ProposerInfo("recorder"),
                             rationale="scripted")

    def observe(self, trial: TrialRecord) -> None:
        Recorder.seen.append(trial)


def test_user_failure_is_fed_back_with_log_tail_and_grid_exhaustion_ends(api: Any, work: Path) -> None:
    register("recorder", Recorder)
    Recorder.seen = []
    plan = make_plan(work, {"x": {"low": -2.0, "high": 2.0}}, proposer={"kind": "recorder"},
                     budget={"trials": 10, "parallel": 2})
    view = Controller(plan, runtime=api._runtime).run()
    assert view.counts == {"succeeded": 2, "failed": 1}
    assert "nothing more to propose" in view.stop_reason
    failed = [t for t in Recorder.seen if t.state == "failed"]
    assert len(failed) == 1 and failed[0].params == {"x": -1.0}
    assert failed[0].failure is not None and "exited 3" in failed[0].failure and "boom" in failed[0].failure
    proposer = json.loads(rows(api, "SELECT proposer FROM decisions WHERE kind='propose' LIMIT 1")[0]["proposer"])
    assert proposer["kind"] == "recorder"


def test_asha_stops_losers_through_cancel(api: Any, work: Path) -> None:
    plan = make_plan(work, {"x": {"choices": [0.0, 5.0, 6.0]}}, steps=12, pause=0.15,
                     budget={"trials": 3, "parallel": 1},
                     early_stop={"kind": "asha", "min_steps": 1, "reduction_factor": 2})
    view = Controller(plan, runtime=api._runtime, monitor_every_s=0.1).run()
    states = {t.params["x"]: t.state for t in view.trials}
    assert states == {0.0: "succeeded", 5.0: "stopped", 6.0: "stopped"}
    stops = rows(api, "SELECT * FROM decisions WHERE kind='stop'")
    assert len(stops) == 2 and all("asha" in json.loads(s["inputs"])["rule"] for s in stops)
    for t in view.trials[1:]:
        job = api.status(t.job_id)
        assert job.state == "cancelled"
        assert job.ended_at - job.started_at < 12 * 0.15  # stopped well before its natural end


class StopAtStep(stopping.Stopper):
    """A registered rule: stop every trial once it reports ``min_steps``."""

    kind = "at-step"

    @classmethod
    def from_config(cls, cfg: Any) -> StopAtStep:
        return cls(cfg.min_steps)

    def __init__(self, step: int) -> None:
        self.step = step

    def check(self, trial: int, series: stopping.Series,
              others: dict[int, stopping.Series]) -> stopping.StopVerdict | None:
        if series and series[-1][0] >= self.step:
            return stopping.StopVerdict(series[-1][0], series[-1][1], 0.0, "at-step", f"reached step {self.step}")
        return None


def test_a_registered_stopper_stops_trials_through_cancel(api: Any, work: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stopping, "_REGISTERED", {})  # undone after the test
    stopping.register("at-step", StopAtStep)
    plan = make_plan(work, {"x": {"choices": [0.0, 5.0]}}, steps=40, pause=0.1, budget={"trials": 2, "parallel": 1},
                     early_stop={"kind": "at-step", "min_steps": 2})
    view = Controller(plan, runtime=api._runtime, monitor_every_s=0.1).run()
    assert [t.state for t in view.trials] == ["stopped", "stopped"]
    stops = rows(api, "SELECT * FROM decisions WHERE kind='stop'")
    assert [json.loads(s["inputs"])["rule"] for s in stops] == ["at-step", "at-step"]


def test_noise_floor_keeps_incumbent_against_gains_within_noise(api: Any, work: Path) -> None:
    # seed s adds [0, +0.1, -0.1][s]: the incumbent's 3 seeds give a noise floor of 0.1
    plan = make_plan(work, {"x": {"choices": [1.0, 0.95, 0.5]}}, budget={"trials": 7, "parallel": 1},
                     repeats={"seeds": 3})
    view = Controller(plan, runtime=api._runtime).run()
    by_x = {(t.params["x"], t.role, t.seed): t for t in view.trials}
    assert {k for k in by_x} == {(1.0, "explore", 0), (1.0, "repeat", 1), (1.0, "repeat", 2),
                                 (0.95, "explore", 0), (0.5, "explore", 0), (0.5, "repeat", 1),
                                 (0.5, "repeat", 2)}
    assert view.best_trial == by_x[(0.5, "explore", 0)].trial_id
    assert view.best_value == pytest.approx(1.5) and view.best_seeds == 3
    assert view.noise_floor == pytest.approx(0.1) and view.rejected_as_noise == 1
    verdict = rows(api, "SELECT * FROM decisions WHERE kind='promote' AND trial_id=?",
                   by_x[(0.95, "explore", 0)].trial_id)[0]
    assert json.loads(verdict["outputs"])["promoted"] is False and "noise floor" in verdict["rationale"]


RUNNER = textwrap.dedent("""\
    import sys
    from autoresearch.loop.plan import load_plan
    from autoresearch.loop.controller import Controller
    Controller(load_plan(sys.argv[1])).run()
""")

PLAN = """\
name: resume
objective: {metric: loss}
trial: {command: "%s trial.py {x} 2 %s", grace: 1}
space: {x: {choices: [0.3, 0.1, 0.2, 0.4]}}
proposer: grid
budget: {trials: 4, parallel: 2}
"""


def test_resume_after_kill_adopts_running_trials(api: Any, work: Path) -> None:
    (work / "plan.yaml").write_text(PLAN % (sys.executable, 1.0))
    (work / "runner.py").write_text(RUNNER)
    proc = subprocess.Popen([sys.executable, str(work / "runner.py"), str(work / "plan.yaml")], cwd=work)
    try:
        wait_for(lambda: len(rows(api, "SELECT id FROM jobs WHERE state='running'")) == 2, timeout=30)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    running = {r["id"] for r in rows(api, "SELECT id FROM jobs WHERE state IN ('starting','running')")}
    assert len(running) == 2
    from autoresearch.loop.plan import load_plan

    view = Controller(load_plan(work / "plan.yaml"), runtime=api._runtime).run()
    assert view.counts == {"succeeded": 4} and view.best_params == {"x": 0.1}
    jobs = rows(api, "SELECT id FROM jobs")
    assert len(jobs) == 4 and running <= {j["id"] for j in jobs}  # adopted, not relaunched
    kinds = [d["kind"] for d in rows(api, "SELECT kind FROM decisions ORDER BY id")]
    assert kinds.count("launch") == 4 and kinds.count("replan") == 1
    replan = json.loads(rows(api, "SELECT inputs FROM decisions WHERE kind='replan'")[0]["inputs"])
    assert len(replan["adopted_trials"]) == 2


def test_cli_json_report_and_ctrl_c_without_a_terminal(api: Any, work: Path, home: Path) -> None:
    (work / "plan.yaml").write_text(PLAN % (sys.executable, 0.05))
    cli = [sys.executable, "-m", "autoresearch.cli"]
    out = subprocess.run([*cli, str(work / "plan.yaml"), "--json"], capture_output=True, text=True, cwd=work,
                         stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    view = json.loads(out.stdout)
    assert view["state"] == "finished" and view["best_params"] == {"x": 0.1} and len(view["trials"]) == 4
    report_dir = Path(view["report_dir"])
    assert view["report_state"] == "writing"  # the command returned with the answer; a helper writes the report
    wait_for(lambda: (report_later.state(home, "resume") or {}).get("state") == "done", timeout=120)
    assert {"summary.md", "best_vs_trials.png", "best_vs_time.png", "parallel.png"} <= set(os.listdir(report_dir))
    assert "**Best:** trial" in (report_dir / "summary.md").read_text()
    rep = subprocess.run([*cli, "report", "resume", "--json", "--out", str(work / "rep")], capture_output=True,
                         text=True)
    assert rep.returncode == 0 and json.loads(rep.stdout)["best_params"] == {"x": 0.1}

    slow = (work / "slow.yaml")
    slow.write_text(PLAN.replace("name: resume", "name: slow") % (sys.executable, 20))
    proc = subprocess.Popen([*cli, str(slow)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=work,
                            stdin=subprocess.DEVNULL)
    wait_for(lambda: len(rows(api, "SELECT id FROM jobs WHERE state='running' AND experiment='slow'")) == 2,
             timeout=30)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    running = [r["id"] for r in rows(api, "SELECT id FROM jobs WHERE state='running' AND experiment='slow'")]
    assert len(running) == 2  # left running, and told how to stop them
    assert f"autoresearch cancel {' '.join(map(str, sorted(running)))}" in err and "--resume" in err
    api.cancel(running)


def test_request_stop_from_another_thread_stops_trials_and_finishes(api: Any, work: Path) -> None:
    import threading

    plan = make_plan(work, {"x": {"choices": [0.1, 0.2, 0.3]}}, steps=1, pause=30.0)
    controller = Controller(plan, runtime=api._runtime)
    result: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: result.setdefault("view", controller.run()))
    thread.start()
    wait_for(lambda: len(rows(api, "SELECT id FROM jobs WHERE state='running'")) == 2, timeout=30)
    t0 = time.monotonic()
    controller.request_stop("enough", stop_trials=True)
    thread.join(timeout=30)
    assert not thread.is_alive() and time.monotonic() - t0 < 15
    view = result["view"]
    assert view.state == "finished" and view.stop_reason == "enough"
    assert view.counts == {"stopped": 2}
    assert len(rows(api, "SELECT id FROM decisions WHERE kind='stop'")) == 2
