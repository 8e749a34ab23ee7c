"""Early stopping that is right (issue 15 item 3): the last epoch is not a rung, stop messages
show a maximized objective's own values, and ``objective.target`` is reached by a reported point."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from autoresearch.loop.controller import Controller
from autoresearch.loop.plan import EarlyStop, parse_plan
from autoresearch.loop.stopping import ASHA, MedianRule, make_stopper

# value = start - slope * step for steps 1..epochs, then `tail` seconds of work (saving, evaluating)
LINE = textwrap.dedent("""\
    import sys, time
    from autoresearch import report
    start, slope = map(float, sys.argv[1].split("_"))
    epochs, pause, tail = map(float, sys.argv[2:5])
    for step in range(1, int(epochs) + 1):
        time.sleep(pause)
        report(step=step, loss=start - slope * step)
    time.sleep(tail)
""")


@pytest.fixture
def work(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AUTORESEARCH_TRACKING", "off")
    (tmp_path / "line.py").write_text(LINE)
    return tmp_path


def line_plan(work: Path, configs: list[str], epochs: int, pause: float, tail: float, **extra: Any) -> Any:
    data: dict[str, Any] = {
        "name": "right", "objective": {"metric": "loss"},
        "trial": {"command": f"{sys.executable} line.py {{c}} {epochs} {pause} {tail}", "grace": 5},
        "space": {"c": {"choices": configs}}, "proposer": {"kind": "grid"},
        "budget": {"trials": len(configs), "parallel": 1}}
    data.update(extra)
    return parse_plan(data, base_dir=work)


def test_asha_does_not_judge_a_rung_no_trial_went_past() -> None:
    asha = ASHA(min_steps=3, reduction_factor=3)
    done = {1: [(s, 10.0 - s) for s in range(1, 10)]}  # finished at step 9
    late = [(s, 6.0 - 0.4 * s) for s in range(1, 10)]  # better at 3, worse at 9: its last epoch
    assert asha.check(2, late[:3], {**done, 2: late[:3]}) is None  # rung 3: step 9 was passed, kept
    assert asha.check(2, late, {**done, 2: late}) is None  # rung 9: nobody went past it
    longer = {3: [(s, 0.0) for s in range(1, 12)]}  # a trial that goes on past 9: 9 is a rung after all
    verdict = asha.check(2, late, {**done, **longer, 2: late})
    assert verdict is not None and verdict.step == 9
    bounded = ASHA(min_steps=3, reduction_factor=3, max_steps=27)  # max_steps says 9 is not the end
    assert bounded.check(2, late, {**done, 2: late}) is not None


def test_median_rule_does_not_judge_the_last_step() -> None:
    rule = MedianRule(min_steps=1, min_trials=2)
    others = {1: [(s, 1.0) for s in range(1, 6)], 2: [(s, 1.0) for s in range(1, 6)]}
    loser = [(s, 2.0) for s in range(1, 6)]
    assert rule.check(3, loser, {**others, 3: loser}) is None  # step 5: everyone's last
    assert rule.check(3, loser[:4], {**others, 3: loser[:4]}) is not None


@pytest.mark.parametrize("kind", ["asha", "median"])
def test_stop_messages_show_a_maximized_objective_as_it_is(kind: str) -> None:
    stopper = make_stopper(EarlyStop(kind=kind, min_steps=1, reduction_factor=2, min_trials=2), sign=-1.0)
    assert stopper is not None
    others = {1: [(1, -9.0), (2, -9.5)], 2: [(1, -8.5), (2, -9.0)]}  # signed: scores of 9.0 and 8.5
    mine = [(1, -7.4021)]
    verdict = stopper.check(3, mine, {**others, 3: mine})
    assert verdict is not None and verdict.value == -7.4021  # the verdict itself stays signed
    assert "7.4021" in verdict.rationale and "-7.4021" not in verdict.rationale
    assert "-8" not in verdict.rationale and "-9" not in verdict.rationale


def test_a_trial_that_finished_its_epochs_is_not_stopped_while_it_wraps_up(api: Any, work: Path) -> None:
    # the second trial is better at rung 3 and worse at step 9, its last epoch, then saves for 1.5 s
    plan = line_plan(work, ["10_1", "6_0.4"], epochs=9, pause=0.05, tail=1.5,
                     early_stop={"kind": "asha", "min_steps": 3, "reduction_factor": 3})
    view = Controller(plan, runtime=api._runtime, monitor_every_s=0.1).run()
    assert [t.state for t in view.trials] == ["succeeded", "succeeded"]
    assert not api._ledger.query("SELECT * FROM decisions WHERE kind='stop'", ())


def test_target_is_reached_by_a_reported_point(api: Any, work: Path) -> None:
    # maximize; the first trial reports 7.4 at step 4 of 40 (4 s); the second never gets there
    plan = line_plan(work, ["-0.6_-2", "-0.1_-0.01"], epochs=40, pause=0.1, tail=0.0,
                     objective={"metric": "loss", "goal": "max", "target": 7.0},
                     budget={"trials": 2, "parallel": 2})
    view = Controller(plan, runtime=api._runtime).run()
    finish = api._ledger.query("SELECT * FROM decisions WHERE kind='finish'", ())[-1]
    reason = json.loads(finish["outputs"])["reason"]
    assert "target 7 reached by trial 1 at step 4" in reason
    # the best it names says whether its seeds confirmed it (no repeats here: null), for MLflow's tags
    outputs = json.loads(finish["outputs"])
    assert "best_confirmed" in outputs and outputs["best_confirmed"] is None and outputs["best_seeds"] == 1
    first, second = sorted(view.trials, key=lambda t: t.trial_id)
    assert first.state == "succeeded"  # the trial that got there finishes (the loop's best)
    assert second.state == "stopped"  # the others are stopped: the loop is done
    assert view.best_trial == first.trial_id
