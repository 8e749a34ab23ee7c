"""`autoresearch plan.yaml --ci` end to end: real loops of `python` trials through the CLI, the gate's
exit codes (0 pass, 1 regression, 2 error), JUnit read back by junitparser, the summaries' numbers,
hard budgets, and bad input refused before any trial runs."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

junitparser = pytest.importorskip("junitparser")

CLI = [sys.executable, "-m", "autoresearch.cli"]
TRIAL = """\
import sys, time
x, seed = float(sys.argv[1]), int(sys.argv[2])
if x == 2:
    print("boom \\x1b[31m<b>&</b>\\x00 \\x07 the model diverged")
    sys.exit(3)
if x >= 3:  # 3 and 3.0001: two trials that run until stopped
    time.sleep(60)
noise = 0.04 * (seed == 1) - 0.04 * (seed == 2)
print("loss:", x + noise)
"""
PLAN = """\
name: {name}
objective: {{metric: loss}}
trial: {{command: "{python} trial.py {{x}} {{seed}}", grace: 1s}}
space: {{x: {xs}}}
proposer: grid
budget: {{trials: {trials}, parallel: {parallel}{budget}}}
{extra}
"""


def plan(tmp: Path, name: str, xs: list[float], trials: int | None = None, parallel: int = 3, budget: str = "",
         extra: str = "gate: {metric: loss, max_regression: 1%}") -> Path:
    (tmp / "trial.py").write_text(TRIAL)
    path = tmp / f"{name}.yaml"
    path.write_text(PLAN.format(name=name, python=sys.executable, xs=json.dumps(xs), trials=trials or len(xs),
                                parallel=parallel, budget=budget, extra=extra))
    return path


def ci(home: Path, plan_path: Path, *args: str, env: dict[str, str] | None = None,
       timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "--home", str(home), "run", str(plan_path), *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)


def loops_in(home: Path) -> int:
    ledger = home / "ledger.db"
    if not ledger.exists():
        return 0
    with sqlite3.connect(ledger) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        return conn.execute("SELECT COUNT(*) FROM loops").fetchone()[0] if "loops" in tables else 0


def cases(path: Path) -> dict[str, Any]:
    xml = junitparser.JUnitXml.fromfile(str(path))
    return {case.name: case for suite in xml for case in suite}


def test_pass_then_regression_then_within_tolerance(tmp_path: Path) -> None:
    out = tmp_path / "reports"
    first = ci(tmp_path / "h1", plan(tmp_path, "nightly", [1.5, 1, 1.2]), "--ci", "--json", str(out / "base.json"),
               "--junit", str(out / "base.xml"), "--summary", str(out / "base.md"), "--plots")
    assert first.returncode == 0, first.stderr
    assert "trial 2 launched: x=1" in first.stdout and re.search(r"trial 2 \(job \d+\) succeeded: loss=1", first.stdout)
    assert "PASS (exit 0)" in first.stdout and "\x1b" not in first.stdout
    base = json.loads((out / "base.json").read_text())
    assert base["format"] == "autoresearch-ci/1" and base["best"]["value"] == 1.0 and base["exit_code"] == 0
    assert base["gate"]["verdict"] == "no-baseline" and len(base["trials"]) == 3
    suite = cases(out / "base.xml")
    assert len(suite) == 4 and all(c.is_passed for n, c in suite.items() if n.startswith("trial"))
    assert suite["gate loss"].is_skipped  # no baseline the first night
    assert (out / "base.files" / "best_vs_trials.png").stat().st_size > 0
    assert "](base.files/best_vs_trials.png)" in (out / "base.md").read_text()

    step = tmp_path / "step_summary.md"
    step.write_text("earlier step\n")
    worse = ci(tmp_path / "h2", plan(tmp_path, "nightly", [1.5, 1.05, 1.2]), "--ci", "--json", str(out / "worse.json"),
               "--junit", str(out / "worse.xml"), "--summary", str(out / "worse.md"), "--baseline",
               str(out / "base.json"), env={"GITHUB_STEP_SUMMARY": str(step)})
    assert worse.returncode == 1, worse.stdout + worse.stderr
    assert "REGRESSION (exit 1)" in worse.stdout
    assert not list((out / "worse.files").glob("*.png"))  # plots only when asked (--plots)
    assert "(worse.files/" not in (out / "worse.md").read_text()
    gate = json.loads((out / "worse.json").read_text())["gate"]
    assert gate["verdict"] == "regression" and gate["candidate"] == 1.05 and gate["baseline"]["value"] == 1.0
    assert gate["worse_by"] == pytest.approx(0.05) and gate["allowed"] == pytest.approx(0.01)
    md = (out / "worse.md").read_text()
    assert "REGRESSION (exit 1)" in md and "| baseline | 1 (trial 2 of loop nightly (base.json)) |" in md
    assert "| this run | 1.05 (trial 2) |" in md and "| worse by | 0.05 (+5.00%) |" in md
    assert "| 2 | explore | 0 | 1.05 |" in md  # the loop's own leaderboard, under the gate
    shown = step.read_text()
    assert shown.startswith("earlier step\n") and "worse by 0.05" in shown and ".png)" not in shown
    assert cases(out / "worse.xml")["gate loss"].result[0].type == "regression"

    close = ci(tmp_path / "h3", plan(tmp_path, "nightly", [1.5, 1.005, 1.2]), "--baseline", str(out / "base.json"))
    assert close.returncode == 0, close.stdout + close.stderr  # 0.5% worse: within max_regression 1%
    assert "pass: loss 1.005 vs baseline 1: worse by 0.005" in close.stdout


def test_a_regression_within_the_noise_floor_passes(tmp_path: Path) -> None:
    """Seeds of the incumbent vary by ±0.04: 2% worse than the baseline is noise, not a regression."""
    base = tmp_path / "base.json"
    base.write_text(json.dumps({"format": "autoresearch-ci/1", "loop": "old", "metric": "loss", "goal": "minimize",
                                "best": {"trial": 1, "value": 1.0}, "noise_floor": None}))
    path = plan(tmp_path, "noisy", [1.02], trials=3, extra="gate: {metric: loss, max_regression: 1%}\n"
                                                         "repeats: {seeds: 3}")
    done = ci(tmp_path / "h", path, "--json", str(tmp_path / "s.json"), "--baseline", str(base))
    assert done.returncode == 0, done.stdout + done.stderr
    gate = json.loads((tmp_path / "s.json").read_text())["gate"]
    assert gate["candidate"] == pytest.approx(1.02) and gate["candidate_seeds"] == 3
    assert gate["noise"] == pytest.approx(0.04) and gate["allowed"] == pytest.approx(0.04)
    assert gate["verdict"] == "pass" and gate["worse_by"] == pytest.approx(0.02)


def test_junit_failures_skips_and_a_hard_wall(tmp_path: Path) -> None:
    """A failing trial is a failure with its log; the one still running at --max-wall is stopped
    (skipped, with the reason) and the sweep ends with its reports instead of waiting for it."""
    path = plan(tmp_path, "mixed", [1, 2, 3], extra="")
    t0 = time.monotonic()
    done = ci(tmp_path / "h", path, "--ci", "--max-wall", "4s", "--junit", str(tmp_path / "j.xml"),
              "--json", str(tmp_path / "s.json"))
    assert time.monotonic() - t0 < 50  # the trial sleeps 60 s
    assert done.returncode == 0, done.stdout + done.stderr  # trial 1 succeeded; no gate in this plan
    assert "budget hit: wall budget 4s used (--max-wall)" in done.stdout
    assert "trial 3 stopping: stopping the loop: wall budget" in done.stdout and re.search(r"trial 2 \(job \d+\) failed: exited 3", done.stdout)
    suite = cases(tmp_path / "j.xml")
    failed = next(c for n, c in suite.items() if n.startswith("trial 2 "))
    assert failed.result[0].type == "failed" and "exited 3" in failed.result[0].message
    assert "<b>&</b>" in failed.result[0].text and "the model diverged" in failed.result[0].text
    stopped = next(c for n, c in suite.items() if n.startswith("trial 3 "))
    assert stopped.is_skipped and "wall budget 4s used" in stopped.result[0].message
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["stop_reason"].startswith("wall budget") and summary["best"]["value"] == 1.0
    assert {t["trial"]: t["state"] for t in summary["trials"]} == {1: "succeeded", 2: "failed", 3: "stopped"}


def test_gpu_hours_budget_stops_running_trials_in_ci(tmp_path: Path) -> None:
    """Outside CI a GPU-hours budget only stops launching; in CI it stops the running trial too."""
    path = plan(tmp_path, "gpu", [3], parallel=1, budget=", gpu_hours: 0.0005", extra="")
    path.write_text(path.read_text().replace("grace: 1s}", "grace: 1s, gpus: 1}"))
    t0 = time.monotonic()
    done = ci(tmp_path / "h", path, "--ci", "--json", str(tmp_path / "s.json"), env={"AUTORESEARCH_GPUS": "2"})
    assert time.monotonic() - t0 < 50
    assert done.returncode == 2, done.stdout + done.stderr  # nothing finished: a budget, not a regression
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["stop_reason"].startswith("gpu_hours budget") and summary["trials"][0]["state"] == "stopped"
    assert "no trial finished" in summary["reason"]


def test_a_backend_that_runs_nothing_ends_with_exit_2(tmp_path: Path) -> None:
    """Trials that never finish (the fake backend runs nothing): the hard wall ends the sweep, exit 2."""
    path = plan(tmp_path, "stuck", [1, 2], extra="backend: {kind: fake}")
    done = ci(tmp_path / "h", path, "--max-wall", "2s", "--junit", str(tmp_path / "j.xml"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "ERROR (exit 2): no trial finished with 'loss' (wall budget 2s used (--max-wall))" in done.stdout
    assert all(c.is_skipped for c in cases(tmp_path / "j.xml").values())


def test_every_trial_failing_is_exit_1(tmp_path: Path) -> None:
    done = ci(tmp_path / "h", plan(tmp_path, "broken", [2], extra=""), "--ci")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 failed: the code under test is broken" in done.stdout


def test_ci_true_without_a_terminal_means_ci_mode(tmp_path: Path) -> None:
    done = ci(tmp_path / "h", plan(tmp_path, "auto", [1], extra=""), env={"CI": "true"})
    assert done.returncode == 0 and "] trial 1 launched: x=1" in done.stdout and "PASS (exit 0)" in done.stdout
    off = ci(tmp_path / "h2", plan(tmp_path, "auto", [1], extra=""), "--no-ci", env={"CI": "true"})
    assert off.returncode == 0 and "launched" not in off.stdout


@pytest.mark.parametrize("case", ["missing-file", "other-metric", "not-a-summary", "no-store", "junit-under-file",
                                  "summary-is-dir", "same-path", "no-gate", "bad-wall", "gate-metric"])
def test_bad_input_exits_2_before_any_trial(tmp_path: Path, case: str) -> None:
    path = plan(tmp_path, "bad", [1])
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"format": "autoresearch-ci/1", "metric": "acc", "goal": "maximize",
                                 "best": {"trial": 1, "value": 0.9}}))
    (tmp_path / "notes.json").write_text("[1, 2")
    (tmp_path / "afile").write_text("x")
    (tmp_path / "adir").mkdir()
    args, needle = {
        "missing-file": (["--baseline", str(tmp_path / "nope.json")], "does not exist"),
        "other-metric": (["--baseline", str(other)], "has no metric 'loss'"),
        "not-a-summary": (["--baseline", str(tmp_path / "notes.json")], "not a readable JSON summary"),
        "no-store": (["--baseline", "nightly-experiment"], "no MLflow store"),
        "junit-under-file": (["--junit", str(tmp_path / "afile" / "j.xml")], "cannot create its folder"),
        "summary-is-dir": (["--summary", str(tmp_path / "adir")], "is a folder"),
        "same-path": (["--json", str(tmp_path / "r"), "--junit", str(tmp_path / "r")], "are the same file"),
        "no-gate": (["--baseline", str(other)], "--baseline needs a gate"),
        "bad-wall": (["--max-wall", "soon"], "--max-wall"),
        "gate-metric": ([], "gate.metric 'acc' is not a metric this plan's loop measures"),
    }[case]
    if case == "no-gate":
        path = plan(tmp_path, "bad", [1], extra="")
    if case == "gate-metric":
        path.write_text(path.read_text().replace("metric: loss, max", "metric: acc, max"))
    home = tmp_path / "h"
    done = ci(home, path, "--ci", *args)
    assert done.returncode == 2, done.stdout + done.stderr
    assert needle in done.stderr and "\nhint: " in done.stderr and "Traceback" not in done.stderr
    assert loops_in(home) == 0  # refused before the loop (and any trial) existed


def test_a_summary_baseline_keeps_mlflow_off_the_path(tmp_path: Path) -> None:
    base = tmp_path / "base.json"
    base.write_text(json.dumps({"format": "autoresearch-ci/1", "metric": "loss", "goal": "minimize",
                                "best": {"trial": 1, "value": 1.0}, "noise_floor": 0.01}))
    code = ("import sys; from autoresearch.api import Api, load_plan; api = Api(sys.argv[1]); "
            "b = api.resolve_baseline(sys.argv[2], load_plan(sys.argv[3])); "
            "print(b.value, b.noise_floor, 'mlflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "h"), str(base), str(plan(tmp_path, "p", [1]))],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1.0", "0.01", "False"]


def test_gate_uses_the_baseline_noise_floor_when_this_run_has_none() -> None:
    from autoresearch.loop.gate import Baseline, evaluate
    from autoresearch.loop.plan import Gate
    from autoresearch.loop.views import LoopView

    view = LoopView("n", 1, "finished", "acc", "maximize", [], {"succeeded": 1}, 1, 0.90)
    gate = Gate(metric="acc", max_regression=0.001)
    noisy = evaluate(view, gate, Baseline("b.json", "json", "acc", 0.92, noise_floor=0.03))
    assert noisy.verdict == "pass" and noisy.worse_by == pytest.approx(0.02) and noisy.allowed == 0.03
    exact = evaluate(view, gate, Baseline("b.json", "json", "acc", 0.92))
    assert exact.verdict == "regression" and exact.allowed == 0.001
    better = evaluate(view, gate, Baseline("b.json", "json", "acc", 0.85))
    assert better.verdict == "pass" and "better by 0.05" in better.rationale


def test_a_cancelled_job_stops_its_trials_and_still_reports(tmp_path: Path) -> None:
    path = plan(tmp_path, "cancel", [3, 3.0001], extra="")
    log = tmp_path / "out.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([*CLI, "--home", str(tmp_path / "h"), "run", str(path), "--ci", "--json",
                                 str(tmp_path / "s.json")], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while "trial 2 launched" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        proc.terminate()  # what a runner sends a cancelled job
        assert proc.wait(timeout=60) == 2, log.read_text()
    summary = json.loads((tmp_path / "s.json").read_text())
    # "stopped N": the trials running at that instant (the second may still be starting); both are
    # asked to stop either way, as the ledger shows below.
    assert summary["exit_code"] == 2 and summary["reason"].startswith("interrupted (the job was cancelled); stopped ")
    with sqlite3.connect(tmp_path / "h" / "ledger.db") as conn:  # the trials' jobs were asked to stop
        rows = conn.execute("SELECT id, state, cancel_requested FROM jobs").fetchall()
        assert sum(r[2] for r in rows) == 2, (rows, log.read_text())


@pytest.mark.parametrize("value, ok", [("1%", True), (" 0.5 % ", True), (0.002, True), ("2e-3", True), (0, True),
                                       ("abc", False), (-1, False), ("1_0", False), ("-1%", False)])
def test_schema_and_loader_agree_on_the_gate(tmp_path: Path, value: Any, ok: bool) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    from autoresearch.api import schema
    from autoresearch.errors import PlanError
    from autoresearch.loop.plan import parse_plan

    raw = {"name": "g", "objective": {"metric": "loss"}, "trial": {"command": "true {x}"}, "space": {"x": {"low": 0,
           "high": 1}}, "gate": {"metric": "loss", "max_regression": value}}
    valid = jsonschema.Draft202012Validator(schema("plan")).is_valid(raw)
    try:
        parse_plan(raw, base_dir=tmp_path)
        loaded = True
    except PlanError:
        loaded = False
    assert valid == loaded == ok


def test_a_hard_stop_gives_up_on_trials_that_do_not_end(tmp_path: Path) -> None:
    """A backend that cannot stop its trials: the loop ends anyway, naming them (exit 2), never hangs."""
    from autoresearch.loop import _limits
    from autoresearch.loop.gate import exit_code
    from autoresearch.loop.plan import parse_plan
    from autoresearch.loop.state import LoopState
    from autoresearch.loop.views import LoopView

    plan = parse_plan({"name": "s", "objective": {"metric": "loss"}, "trial": {"command": "true {x}"},
                       "space": {"x": [1]}, "budget": {"gpu_hours": 1, "stop_in_flight": False}}, base_dir=tmp_path)
    soft = LoopState(plan, 1.0, stop_reason="gpu_hours budget 1 used")
    soft.active = {5: {"job_id": 9}}
    assert _limits.check_limits(soft) == []  # outside CI, when asked (stop_in_flight: false): let it finish
    hard = LoopState(plan, 1.0, stop_reason="gpu_hours budget 1 used", hard_budgets=True)
    hard.active = {5: {"job_id": 9}}
    assert _limits.check_limits(hard) == [5] and hard.stop_deadline is not None
    assert not _limits.done(hard, None)  # waits for it, within the grace and a minute
    hard.stop_deadline = time.monotonic() - 1
    assert _limits.done(hard, None) and "trial(s) 5 did not end" in hard.stop_reason and not hard.active
    view = LoopView("s", 1, "finished", "loss", "minimize", [], {"running": 1, "succeeded": 1}, 2, 0.5,
                    stop_reason=hard.stop_reason)
    code, reason = exit_code(view, None)
    assert code == 2 and "1 trial(s) did not end" in reason


@pytest.mark.parametrize("body, needle", [
    ('{"format": "autoresearch-ci/1", "metric": "loss", "best": {"value": NaN}}', "no value of 'loss'"),
    ('{"format": "autoresearch-ci/1", "metric": "loss", "best": {"value": "1.0"}}', "no value of 'loss'"),
    ('{"format": "autoresearch-ci/1", "metric": "loss", "best": [1]}', "no value of 'loss'"),
    ('{"format": "autoresearch-ci/1", "metric": "loss", "goal": "maximize", "best": {"value": 1}}', "maximizes"),
    ('{"metric": "loss", "best": {"value": 1}}', "not an autoresearch summary"),
    ('[]', "not an autoresearch summary"),
    ("\udcff", "not a readable JSON summary"),
])
def test_hostile_baseline_files_are_refused(tmp_path: Path, body: str, needle: str) -> None:
    from autoresearch.errors import SpecError
    from autoresearch.loop.gate import baseline_from_summary

    path = tmp_path / "b.json"
    path.write_bytes(body.encode("utf-8", "surrogateescape"))
    with pytest.raises(SpecError) as err:
        baseline_from_summary(path, "loss", "minimize")
    assert needle in err.value.message and err.value.hint
