"""Options for crossing curves: a stopper that learns whether low rungs predict later ranks
(``early_stop.adapt``), a start-up spread by a Latin hypercube (``proposer.options.init: lhs``) and
stopped trials counted at the final level with a predicted value (``proposer.options.stopped: predict``)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from autoresearch.errors import PlanError
from autoresearch.loop.plan import parse_plan
from autoresearch.loop.proposers import ProposerContext, TrialRecord, make_proposer
from autoresearch.loop.proposers._parzen import encode
from autoresearch.loop.stopping import ADAPT_MIN_PAIRS, ASHA, Hyperband, make_stopper, rank_agreement


def crossing(n: int, agree: bool) -> dict[int, list[tuple[int, float]]]:
    """``n`` finished curves of 27 steps: trial i is i-th best at step 1; at the end the same
    order (``agree``) or the reverse (curves cross)."""
    out = {}
    for i in range(n):
        first = float(i)
        last = float(i) if agree else float(n - i)
        out[i] = [(s, first + (last - first) * (s - 1) / 26 + 100.0) for s in range(1, 28)]
    return out


def test_rank_agreement_is_kendalls_tau_at_the_highest_level_both_reached() -> None:
    assert rank_agreement(crossing(8, True), 1, [3, 9, 27]) == (1.0, 28)
    assert rank_agreement(crossing(8, False), 1, [3, 9, 27]) == (-1.0, 28)
    assert rank_agreement(crossing(8, True), 1, []) == (0.0, 0)
    # a trial that stopped at step 1 has no later level: no pair
    curves = {**crossing(3, True), 9: [(1, 0.0)]}
    assert rank_agreement(curves, 1, [3, 27]) == (1.0, 3)


def test_adapt_keeps_the_best_third_where_ranks_hold_and_everyone_where_they_cross() -> None:
    newcomer = [(1, 150.0)]  # worse than every trial at step 1 (values 100-107.x there)
    for agree in (True, False):
        curves = crossing(8, agree)
        assert rank_agreement(curves, 1, [3, 9, 27])[1] >= ADAPT_MIN_PAIRS
        plain = ASHA(1, 3, 27)
        adaptive = ASHA(1, 3, 27, adapt=True)
        assert plain.check(99, newcomer, {**curves, 99: newcomer}) is not None  # outside the best third: stopped
        verdict = adaptive.check(99, newcomer, {**curves, 99: newcomer})
        assert (verdict is not None) == agree  # crossing curves (tau -1): kept at the rung
        if verdict is not None:
            assert "tau 1.00" in verdict.rationale
    # too few pairs past the rung: the reduction factor as without adapt
    few = crossing(4, False)
    assert ASHA(1, 3, 27, adapt=True).check(99, newcomer, {**few, 99: newcomer}) is not None


def test_without_adapt_the_cutoff_is_the_same_order_statistic_as_before() -> None:
    # 4 trials at a rung: the best third is the 2nd value of 4 exactly (percentile 100/3 at position 1.0);
    # a trial tied with it stays (a share computed as 100 * (1/3) lands below it and stopped such trials)
    others = {1: [(1, 0.1), (2, 0.1)], 2: [(1, 0.9), (2, 0.9)], 3: [(1, 1.5), (2, 1.5)]}
    mine = [(1, 0.7)]
    for stopper in (ASHA(1, 3, 27), ASHA(1, 3, 27, adapt=True)):  # adapt: too few pairs yet, the same cutoff
        assert stopper.check(9, mine, {**others, 9: mine}) is None
    assert ASHA(1, 3, 27).check(8, [(1, 0.95)], {**others, 8: [(1, 0.95)]}) is not None  # past the 2nd of 4


def test_hyperband_adapt_learns_from_every_bracket_and_comes_from_the_plan() -> None:
    base = {"name": "p", "objective": {"metric": "loss"}, "trial": {"command": "train {x}"},
            "space": {"x": {"low": -2.0, "high": 2.0}}}
    stop = {"kind": "hyperband", "max_steps": 27}
    hb = make_stopper(parse_plan({**base, "early_stop": {**stop, "adapt": True}}).early_stop)
    assert isinstance(hb, Hyperband) and all(a.adapt for a in hb.asha)
    assert not any(a.adapt for a in Hyperband(1, 3, 27).asha)
    # a plan that does not name adapt keeps its digest (the loop resumes); naming it changes the digest
    assert parse_plan({**base, "early_stop": stop}).digest() == "6a78b4d3bd99d0c7"
    assert parse_plan({**base, "early_stop": {**stop, "adapt": True}}).digest() != "6a78b4d3bd99d0c7"
    # the trials that teach the rank agreement may be in other brackets than the one judged
    curves = crossing(8, False)
    trial = next(t for t in range(100, 200) if hb.bracket(t) == 0)
    newcomer = [(1, 150.0)]
    assert hb.check(trial, newcomer, {**curves, trial: newcomer}) is None


def test_hyperband_adapt_promotes_against_its_own_bracket_and_learns_from_every_one() -> None:
    """A paused trial is compared with its bracket's trials at its rung (as without adapt); only the rank
    agreement is learnt from the other brackets' trials."""
    hb = Hyperband(1, 3, 27, adapt=True)
    agree = crossing(8, True)  # ranks hold: adapt keeps the best third, as without it
    b0 = [t for t in range(100, 400) if hb.bracket(t) == 0][:4]
    others_b = [t for t in range(400, 700) if hb.bracket(t) != 0][:6]
    curves = {t: [(1, 0.0)] for t in others_b}  # other brackets: all far better at step 1
    curves.update({t: [(1, 50.0 + i)] for i, t in enumerate(b0)})  # its own bracket: it is the best there
    curves.update({-i - 1: c for i, c in enumerate(agree.values())})  # (negative: bracket taken from the number)
    me = b0[0]
    peers_only = {t: c for t, c in curves.items() if hb.bracket(t) == hb.bracket(me)}
    assert hb.asha[0].promotable(me, curves[me], peers_only, everyone=curves)
    assert hb.promotable(me, curves[me], curves)  # the old rule compared it with every bracket: not promotable
    assert not hb.asha[0].promotable(me, curves[me], curves)


def test_rank_agreement_reads_the_latest_trials_only() -> None:
    """A long run's judgement costs O(ADAPT_MAX_ROWS**2), and reads its recent trials."""
    from autoresearch.loop import stopping

    old = {i: c for i, c in crossing(stopping.ADAPT_MAX_ROWS, False).items()}  # crossing, the earliest
    new = {10_000 + i: c for i, c in crossing(stopping.ADAPT_MAX_ROWS, True).items()}  # agreeing, the latest
    tau, pairs = rank_agreement({**old, **new}, 1, [3, 9, 27])
    assert (tau, pairs) == (1.0, stopping.ADAPT_MAX_ROWS * (stopping.ADAPT_MAX_ROWS - 1) // 2)


def lhs_plan(init: str | None, seed: int = 3) -> Any:
    options = {} if init is None else {"init": init}
    return parse_plan({"name": "p", "objective": {"metric": "loss"}, "trial": {"command": "train {a} {b} {c}"},
                       "space": {"a": {"low": 0.0, "high": 1.0}, "b": {"low": 1e-4, "high": 1.0, "log": True},
                                 "c": {"choices": ["x", "y", "z"]}},
                       "proposer": {"kind": "bohb", "seed": seed, "options": options},
                       "budget": {"trials": 40, "parallel": 4}})


def test_lhs_start_up_puts_one_trial_in_each_stratum_of_every_range() -> None:
    proposer = make_proposer(ProposerContext(lhs_plan("lhs")))
    m = proposer.min_points + 4  # the start-up plus a generation (parallel 4)
    params = [p.params for p in proposer.propose([], m).proposals]
    rows = [encode(proposer.dims, p) for p in params]
    for j in (0, 1):  # each of the m strata of a range holds one trial
        assert sorted(int(r[j] * m) for r in rows) == list(range(m))
    counts = [sum(1 for p in params if p["c"] == c) for c in "xyz"]
    assert max(counts) - min(counts) <= 1  # the choices spread evenly
    again = make_proposer(ProposerContext(lhs_plan("lhs")))
    assert [p.params for p in again.propose([], m).proposals] == params  # the same seed, the same design
    random_rows = [encode(proposer.dims, p.params) for p in make_proposer(ProposerContext(lhs_plan(None)))
                   .propose([], m).proposals]
    assert sorted(int(r[0] * m) for r in random_rows) != list(range(m))  # (the prior sample, for contrast)


def test_init_is_checked() -> None:
    with pytest.raises(PlanError, match="init"):
        make_proposer(ProposerContext(lhs_plan("<b>sobol</b>")))


def test_stopped_predict_gives_a_stopped_trial_the_final_value_of_its_nearest_finished_peers() -> None:
    data = {"name": "p", "objective": {"metric": "loss"}, "trial": {"command": "train {x}"},
            "space": {"x": {"low": 0.0, "high": 1.0}},
            "proposer": {"kind": "bohb", "seed": 1, "options": {"stopped": "predict"}},
            "early_stop": {"kind": "hyperband", "max_steps": 27}}
    proposer = make_proposer(ProposerContext(parse_plan(data)))
    full = [TrialRecord(i, {"x": i / 10}, "succeeded", final,
                        intermediate=[(s, at1 if s == 1 else final) for s in range(1, 28)])
            for i, (at1, final) in enumerate([(5.0, 0.1), (5.1, 0.2), (5.2, 0.3), (9.0, 7.0), (9.5, 8.0)], 1)]
    stopped = TrialRecord(9, {"x": 0.95}, "stopped", 5.05, intermediate=[(1, 5.05)])
    seen, _, _ = proposer._observations([*full, stopped])
    finals = {round(float(x[0]), 2): v for x, v in seen[math.inf]}
    assert finals[0.95] == 0.2  # the median of the finished trials nearest it at step 1 (0.1, 0.2, 0.3)
    # without predict (the default ignore) a stopped trial counts only at the rungs it reached
    data["proposer"]["options"] = {}
    plain, _, _ = make_proposer(ProposerContext(parse_plan(data)))._observations([*full, stopped])
    assert 0.95 not in {round(float(x[0]), 2) for x, _ in plain[math.inf]}
    # before 3 finished trials there is nothing to predict from
    few, _, _ = proposer._observations([*full[:2], stopped])
    assert 0.95 not in {round(float(x[0]), 2) for x, _ in few[math.inf]}


def test_stopped_predict_reads_no_diverged_value() -> None:
    """A stopped trial whose value at its rung diverged (NaN, inf) gets no prediction, and finished trials
    whose value there diverged are not its neighbours (a NaN distance sorts anywhere)."""
    data = {"name": "p", "objective": {"metric": "loss"}, "trial": {"command": "train {x}"},
            "space": {"x": {"low": 0.0, "high": 1.0}},
            "proposer": {"kind": "bohb", "seed": 1, "options": {"stopped": "predict"}},
            "early_stop": {"kind": "hyperband", "max_steps": 27}}
    proposer = make_proposer(ProposerContext(parse_plan(data)))
    pairs = [(math.nan, 9.0), (5.0, 0.1), (5.1, 0.2), (math.inf, 9.5), (5.2, 0.3), (math.nan, 8.0)]
    full = [TrialRecord(i, {"x": i / 10}, "succeeded", final,
                        intermediate=[(s, at1 if s == 1 else final) for s in range(1, 28)])
            for i, (at1, final) in enumerate(pairs, 1)]
    stopped = TrialRecord(9, {"x": 0.95}, "stopped", 5.05, intermediate=[(1, 5.05)])
    diverged = TrialRecord(10, {"x": 0.85}, "stopped", math.nan, intermediate=[(1, math.nan)])
    seen, _, _ = proposer._observations([*full, stopped, diverged])
    finals = {round(float(x[0]), 2): v for x, v in seen[math.inf]}
    assert finals[0.95] == 0.2  # its neighbours are the three finite ones, not a NaN at step 1
    assert 0.85 not in finals
