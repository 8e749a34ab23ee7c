"""The noise floor a challenger is judged with: the incumbent's own seed-to-seed noise, not a
pooled std over every repeated configuration (found on README's digits loop: a noisy early
incumbent, lr 0.149, pooled with the later incumbent's tight seeds, gave a floor of ±0.0782, and
trial 12's 0.0539 against the incumbent's 0.0797, 33% better, was "within noise: not kept")."""

from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from autoresearch.loop import ci_report, outcomes
from autoresearch.loop._live_view import LiveView
from autoresearch.loop.gate import Baseline, evaluate
from autoresearch.loop.noise import Floor, incumbent_floor, judge, seed_std
from autoresearch.loop.plan import Gate, Plan, parse_plan, plan_json
from autoresearch.loop.proposers import Proposal, ProposeResult, ProposerInfo
from autoresearch.loop.report import summary_markdown
from autoresearch.loop.state import LoopState
from autoresearch.loop.store import LoopStore
from autoresearch.loop.views import loop_view
from autoresearch.store.ledger import Ledger

# The digits run: trial 3 (lr 0.149) was the first incumbent, repeated; trial 1 replaced it, repeated.
NOISY = [0.320, 0.444, 0.224]  # trial 3 and its two seeds
TIGHT = [0.0824, 0.0770, 0.0796]  # trial 1 and its two seeds
CHALLENGER = 0.0539  # trial 12


def test_seed_std_is_the_sample_std_of_one_configuration() -> None:
    assert seed_std([1.0]) is None and seed_std([]) is None
    assert seed_std([1.0, 3.0]) == pytest.approx(math.sqrt(2))
    assert seed_std(TIGHT) == pytest.approx(statistics.stdev(TIGHT))
    assert seed_std([1.0, math.inf]) is None and seed_std([math.nan, 1.0]) is None


def test_the_digits_scenario_is_judged_with_the_incumbents_own_noise() -> None:
    groups = {3: NOISY, 1: TIGHT}
    floor = incumbent_floor(1, groups)
    assert floor == Floor(pytest.approx(statistics.stdev(TIGHT)), 1, 3, fallback=False)
    assert floor.value is not None and floor.value < 0.003  # the pooled std of both groups was 0.0782
    verdict = judge(CHALLENGER, statistics.mean(TIGHT), floor.value, floor.basis(1))
    assert verdict.promote and verdict.margin == pytest.approx(0.0257, abs=1e-4)
    assert "std of one run of the incumbent #1 over its 3 seeds" in verdict.rationale
    # a challenger inside the incumbent's own noise is still not kept
    close = judge(statistics.mean(TIGHT) - 0.002, statistics.mean(TIGHT), floor.value, floor.basis(1))
    assert not close.promote and close.margin > 0 and "within the noise floor" in close.rationale


def test_before_the_incumbents_seeds_end_the_best_measured_configuration_stands_in() -> None:
    assert incumbent_floor(1, {}) == Floor(None) and "not measured" in Floor(None).basis(1)
    assert incumbent_floor(1, {1: [0.08]}).value is None  # one seed of its own measures nothing
    fallback = incumbent_floor(7, {3: NOISY, 1: TIGHT})  # incumbent #7's repeats still running
    assert fallback.config == 1 and fallback.fallback and fallback.value == pytest.approx(statistics.stdev(TIGHT))
    assert "#7's own seeds have not ended" in fallback.basis(7)
    # maximizing: the best measured configuration is the one with the highest mean
    assert incumbent_floor(7, {3: NOISY, 1: TIGHT}, sign=-1.0).config == 3


@dataclass
class Host:
    """What :func:`outcomes.judge` uses of the controller (:class:`autoresearch.loop.state.LoopHost`)."""

    state: LoopState
    plan: Plan
    sign: float

    def proposed(self, ids: list[int]) -> None:
        self.state.reload(ids)


def test_the_loop_keeps_the_challenger_and_every_view_shows_the_floor_that_judged(home: Path) -> None:
    plan = parse_plan({"name": "digits", "objective": {"metric": "val_loss", "goal": "minimize"},
                       "trial": {"command": "echo {lr}"}, "space": {"lr": {"low": 1e-4, "high": 0.3, "log": True}},
                       "budget": {"trials": 40, "parallel": 4}, "repeats": {"seeds": 3}})
    ledger = Ledger(home)
    state = LoopState(plan, plan.objective.sign())
    state.store = LoopStore.create(ledger, "digits", plan_json(plan), "d", "digits")
    host = Host(state, plan, state.sign)
    live = LiveView(state)

    def explore(lr: float) -> int:
        p = [Proposal({"lr": lr}, rationale="tpe")]
        ids = state.store.record_proposals(ProposeResult(p, ProposerInfo(kind="tpe")), p, inputs={})
        state.reload(ids)
        return ids[0]

    def end(trial: int, value: float) -> None:  # what outcomes.ended does for a succeeded trial
        now = time.time()
        row = state.update_trial(trial, state="succeeded", objective=value, started_at=now - 1, ended_at=now)
        verdict = outcomes.judge(host, row)
        if verdict is not None and verdict.promote:
            outcomes.promote(host, row)
        live.view("digits", {}, 1.0)

    noisy, tight = explore(0.149), explore(0.01)
    end(noisy, NOISY[0])  # the first incumbent; its two seeds are proposed
    end(tight, TIGHT[0])  # better by 0.24, no floor measured yet: the new incumbent
    for trial, value in zip(sorted(state.proposed), NOISY[1:] + TIGHT[1:], strict=True):
        end(trial, value)
    assert state.groups == {noisy: NOISY, tight: TIGHT}
    challenger = explore(0.02)
    end(challenger, CHALLENGER)

    decision = ledger.query("SELECT inputs, outputs, rationale FROM decisions WHERE kind='promote' AND trial_id=?",
                            (challenger,))[-1]
    inputs, outputs = json.loads(decision["inputs"]), json.loads(decision["outputs"])
    assert outputs["promoted"], decision["rationale"]  # today's pooled floor (0.0782) said "within noise"
    assert inputs["noise_floor"] == pytest.approx(statistics.stdev(TIGHT)) and inputs["noise_trial"] == tight
    assert f"std of one run of the incumbent #{tight} over its 3 seeds" in decision["rationale"]

    view = loop_view(ledger, "digits")
    assert view.best_trial == challenger and view.best_value == pytest.approx(CHALLENGER)
    assert not any(t.within_noise for t in view.trials) and view.rejected_as_noise == 0
    # the challenger's own seeds have not ended: the floor shown now is the best measured one (#tight's)
    assert view.noise_floor == pytest.approx(statistics.stdev(TIGHT))
    assert f"incumbent #{challenger}'s own seeds have not ended" in view.noise_basis
    # the plots' band: the floor in force after each trial ended (none until a config was measured)
    band = {c.trial_id: c.noise for c in view.curve}
    assert band[noisy] is None and band[tight] is None
    assert band[challenger] == pytest.approx(statistics.stdev(TIGHT))
    floor_line = next(line for line in summary_markdown(view, json.loads(plan_json(plan)), []).splitlines()
                      if line.startswith("**Noise floor:**"))
    assert f"±{view.noise_floor:.4g}" in floor_line and view.noise_basis in floor_line and "pooled" not in floor_line
    gated = evaluate(view, Gate(metric="val_loss"), Baseline("b.json", "json", "val_loss", 0.052))
    assert gated.noise == view.noise_floor and gated.verdict == "pass"  # worse by 0.0019, within the floor
    report = ci_report.summary(view, gated, 0, "", {})
    assert (report["noise_floor"], report["noise_basis"]) == (view.noise_floor, view.noise_basis)
    now = live.view("digits", {}, 1.0)  # the live table says the same
    assert (now.best_trial, now.noise_floor, now.noise_basis) == (view.best_trial, view.noise_floor, view.noise_basis)
