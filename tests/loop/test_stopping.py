"""Early stopping rules, their registry, and the noise floor (pure functions)."""

from __future__ import annotations

import math

import pytest

from autoresearch.errors import PlanError
from autoresearch.loop import stopping
from autoresearch.loop.noise import judge
from autoresearch.loop.plan import EarlyStop, parse_plan
from autoresearch.loop.stopping import ASHA, MedianRule, Series, StopVerdict


def curve(start: float, rate: float, steps: int) -> list[tuple[int, float]]:
    return [(s, start * math.exp(-rate * s)) for s in range(steps)]


def test_asha_stops_a_trial_outside_the_top_fraction_at_a_rung() -> None:
    asha = ASHA(min_steps=2, reduction_factor=3)
    good = {1: curve(1.0, 0.5, 10), 2: curve(1.0, 0.4, 10)}
    assert asha.rungs(20) == [2, 6, 18]
    bad = curve(3.0, 0.01, 3)  # at step 2 far worse than both
    verdict = asha.check(3, bad, {**good, 3: bad})
    assert verdict is not None and verdict.step == 2 and "asha rung 2" == verdict.rule
    # judged once per rung: asking again at the same step does not re-judge
    assert asha.check(3, bad, {**good, 3: bad}) is None


def test_asha_keeps_the_first_trial_and_good_ones() -> None:
    asha = ASHA(min_steps=1, reduction_factor=2)
    first = curve(1.0, 0.1, 5)
    assert asha.check(1, first, {1: first}) is None
    better = curve(0.5, 0.1, 5)
    assert asha.check(2, better, {1: first, 2: better}) is None


def test_asha_adopted_trials_are_not_judged_again_for_passed_rungs() -> None:
    asha = ASHA(min_steps=1, reduction_factor=2)
    others = {1: curve(0.1, 0.1, 10), 2: curve(0.1, 0.1, 10)}
    worse = curve(5.0, 0.0, 3)
    asha.adopt(3, worse)
    assert asha.check(3, worse, {**others, 3: worse}) is None


def test_median_rule_needs_enough_trials_then_stops_losers() -> None:
    rule = MedianRule(min_steps=2, min_trials=2)
    others = {1: curve(1.0, 0.3, 6)}
    loser = curve(2.0, 0.0, 4)
    assert rule.check(9, loser, others) is None  # only one other trial got there
    others[2] = curve(1.0, 0.2, 6)
    verdict = rule.check(9, loser, others)
    assert verdict is not None and verdict.rule == "median" and verdict.step == 3


def test_judge_keeps_the_incumbent_within_the_noise() -> None:
    assert judge(0.5, None, None).promote
    assert judge(0.5, 0.6, None).promote  # noise not measured yet: strictly better wins
    within = judge(0.59, 0.6, 0.05)
    assert not within.promote and within.margin > 0 and "noise floor" in within.rationale
    assert judge(0.5, 0.6, 0.05).promote
    assert not judge(0.7, 0.6, 0.0).promote


class _StopAtStep(stopping.Stopper):
    """A custom rule: stop every trial once it reaches ``min_steps``."""

    kind = "at-step"

    @classmethod
    def from_config(cls, cfg: object) -> _StopAtStep:
        return cls(int(getattr(cfg, "min_steps", 1)))

    def __init__(self, step: int) -> None:
        self.step = step

    def check(self, trial: int, series: Series, others: dict[int, Series]) -> StopVerdict | None:
        if series and series[-1][0] >= self.step:
            return StopVerdict(self.step, series[-1][1], 0.0, "at-step", f"reached step {self.step}")
        return None


def test_built_in_stoppers_come_from_the_registry() -> None:
    assert stopping.kinds()[:2] == ["asha", "median"]
    assert isinstance(stopping.make_stopper(EarlyStop(kind="asha", reduction_factor=2)), ASHA)
    median = stopping.make_stopper(EarlyStop(kind="median", min_trials=5))
    assert isinstance(median, MedianRule) and median.min_trials == 5
    assert stopping.make_stopper(None) is None


def test_a_registered_stopper_is_a_plan_kind_and_make_stopper_builds_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stopping, "_REGISTERED", {})  # undone after the test
    plan = {"name": "x", "objective": {"metric": "loss"}, "trial": {"command": "echo {lr}"},
            "space": {"lr": [1, 2]}, "early_stop": {"kind": "at-step", "min_steps": 4}}
    with pytest.raises(PlanError) as err:
        parse_plan(plan)
    assert "early_stop.kind: Input should be 'asha', 'median', 'hyperband' or 'curve'" in err.value.message
    stopping.register("at-step", _StopAtStep)
    assert stopping.kinds() == ["asha", "median", "hyperband", "curve", "at-step"]
    parsed = parse_plan(plan)
    stopper = stopping.make_stopper(parsed.early_stop)
    assert isinstance(stopper, _StopAtStep) and stopper.step == 4
    assert stopper.check(1, [(0, 1.0), (3, 0.5)], {}) is None
    verdict = stopper.check(1, [(0, 1.0), (4, 0.5)], {})
    assert verdict is not None and verdict.rule == "at-step"
    with pytest.raises(PlanError) as err:
        parse_plan({**plan, "early_stop": "pbt"})
    assert "Input should be 'asha', 'median', 'hyperband', 'curve' or 'at-step'" in err.value.message


def test_first_wave_holds_for_the_quorum_then_the_best_leads_and_the_rest_are_judged_at_the_rung() -> None:
    """No max_steps: a rung is judged once a trial went past it. In the first wave nobody had, so every
    trial went on and the losers were stopped a step past their rung."""
    from autoresearch.loop.stopping import Hyperband, first_wave

    asha = ASHA(min_steps=2, reduction_factor=2)
    curves: dict[int, Series] = {1: [(1, 3.0), (2, 2.5)], 2: [(1, 6.0), (2, 5.5)], 3: [(1, 7.0)]}
    at = {t: r for t, s in curves.items() if (r := asha.waiting_rung(t, s, curves)) is not None}
    assert at == {1: 2, 2: 2}  # trial 3 has not reached the rung
    assert first_wave(asha, at, curves, {1, 2, 3}, set()) == {1: "hold", 2: "hold"}  # 3 may still arrive
    assert first_wave(asha, at, {**curves, 3: []}, {1, 2, 3}, set()) == {1: "lead", 2: "hold"}  # 3 just started
    # at rung 4 the quorum is the peers that reached rung 2: one still at step 1 is not waited for
    late: dict[int, Series] = {1: [(2, 2.5), (3, 2.4), (4, 2.3)], 2: [(2, 5.5), (3, 5.4), (4, 5.3)], 3: [(1, 7.0)]}
    assert first_wave(ASHA(2, 2), {1: 4, 2: 4}, late, {1, 2, 3}, set()) == {1: "lead", 2: "hold"}
    curves[3] = [(1, 7.0), (2, 6.5)]
    at[3] = 2
    assert first_wave(asha, at, curves, {1, 2, 3}, set()) == {1: "lead", 2: "hold", 3: "hold"}
    asha.keep_at(1, 2)
    assert asha.waiting_rung(1, curves[1], curves) is None and first_wave(asha, {3: 2}, curves, {1, 3}, set()) == {
        3: "hold"}  # a peer was kept at the rung: wait for it to go past
    curves[1] = [*curves[1], (3, 2.4)]  # the lead went past: the rung is below the end, the others are judged there
    assert asha.waiting_rung(3, curves[3], curves) is None
    verdict = asha.check(3, curves[3], curves)
    assert verdict is not None and verdict.step == 2
    # the rung was the last epoch: a trial finished there, so those waiting go on unjudged
    short: dict[int, Series] = {1: [(1, 3.0), (2, 2.5)], 2: [(1, 6.0), (2, 5.5)]}
    assert first_wave(ASHA(2, 2), {2: 2}, short, {2}, finished={1}) == {2: "end"}
    # max_steps given: every rung below it is judged at once, nothing waits
    assert ASHA(2, 2, max_steps=8).waiting_rung(1, [(2, 1.0)], {}) is None
    # Hyperband: a bracket's quorum and lead are its own (trials 1 and 5 are in bracket 0 of 2, 3 in bracket 1)
    hb = Hyperband(min_steps=1, reduction_factor=3, brackets=2, allocation="geometric")
    assert hb.bracket(1) == hb.bracket(5) == 0 != hb.bracket(3)
    wave: dict[int, Series] = {1: [(1, 2.0)], 5: [(1, 1.0)], 3: [(1, 9.0)]}  # 3's first rung is 3: not waiting
    at = {t: r for t, s in wave.items() if (r := hb.waiting_rung(t, s, wave)) is not None}
    assert at == {1: 1, 5: 1}
    assert first_wave(hb, at, wave, {1, 3, 5}, set()) == {1: "hold", 5: "lead"}  # 3 is no peer: no quorum wait
