"""Early stopping rules and the noise floor (pure functions)."""

from __future__ import annotations

import math

from autoresearch.loop.evaluator import ASHA, MedianRule, judge, noise_floor


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


def test_noise_floor_is_pooled_std_over_seed_groups() -> None:
    assert noise_floor([[1.0]]) is None
    assert math.isclose(noise_floor([[1.0, 3.0]]) or 0, math.sqrt(2))
    pooled = noise_floor([[1.0, 3.0], [10.0, 10.0, 10.0]])
    assert pooled is not None and math.isclose(pooled, math.sqrt(2 / 3))


def test_judge_keeps_the_incumbent_within_the_noise() -> None:
    assert judge(0.5, None, None).promote
    assert judge(0.5, 0.6, None).promote  # noise not measured yet: strictly better wins
    within = judge(0.59, 0.6, 0.05)
    assert not within.promote and within.margin > 0 and "noise floor" in within.rationale
    assert judge(0.5, 0.6, 0.05).promote
    assert not judge(0.7, 0.6, 0.0).promote
