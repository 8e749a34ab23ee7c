"""Hyperband brackets and learning-curve extrapolation as stoppers (issue 15 item 2)."""

from __future__ import annotations

import json
import math
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from autoresearch.errors import PlanError
from autoresearch.loop._curvefit import forecast
from autoresearch.loop.controller import Controller
from autoresearch.loop.plan import EarlyStop, parse_plan
from autoresearch.loop.stopping import CurveStop, Hyperband, bracket_weight, make_stopper
from tests.loop.test_controller import TRIAL


def saturating(final: float, gap: float, rate: float, steps: int) -> list[tuple[int, float]]:
    return [(s, final + gap * math.exp(-rate * s)) for s in range(1, steps + 1)]


def test_hyperband_brackets_have_their_own_first_rung_and_hyperband_shares() -> None:
    hb = Hyperband(min_steps=1, reduction_factor=3, max_steps=27)
    # a bracket per rung below max_steps and one that trains in full (Hyperband's s_max + 1, as Optuna's)
    assert hb.n == 4 and [a.rungs(26) for a in hb.asha] == [[1, 3, 9], [3, 9], [9], []]
    shares = Counter(hb.bracket(t) for t in range(1, 491))
    assert shares[0] > shares[1] > shares[2] > shares[3] > 0  # 27 : 12 : 6 : 4, Hyperband's n_i (the default)
    assert abs(shares[0] / 490 - 27 / 49) < 0.05
    geometric = Counter(Hyperband(1, 3, 27, allocation="geometric").bracket(t) for t in range(1, 401))
    assert abs(geometric[0] / 400 - 27 / 40) < 0.05 and abs(geometric[3] / 400 - 1 / 40) < 0.02
    assert [hb.bracket(t) for t in range(1, 20)] == [Hyperband(1, 3, 27).bracket(t) for t in range(1, 20)]
    assert hb.decision_steps(next(t for t in range(1, 50) if hb.bracket(t) == 2)) == [9]
    assert hb.decision_steps(next(t for t in range(1, 400) if hb.bracket(t) == 3)) == []
    assert Hyperband(min_steps=1, reduction_factor=3).n == 3 and Hyperband(1, 3, 27, brackets=3).n == 3


def test_hyperband_allocation_gives_the_lax_brackets_hyperbands_own_share() -> None:
    assert [bracket_weight("hyperband", 4, b, 3) for b in range(4)] == [27, 12, 6, 4]  # ceil(4 * 3**s / (s + 1))
    assert [bracket_weight("geometric", 4, b, 3) for b in range(4)] == [27, 9, 3, 1]
    hb = Hyperband(1, 3, 27, allocation="hyperband")
    assert hb.edges == Hyperband(1, 3, 27).edges  # the default
    shares = Counter(hb.bracket(t) for t in range(1, 491))
    assert abs(shares[0] / 490 - 27 / 49) < 0.03 and abs(shares[3] / 490 - 4 / 49) < 0.03
    base = {"name": "p", "objective": {"metric": "loss"}, "trial": {"command": "true"},
            "space": {"x": {"low": 0.0, "high": 1.0}}}
    plan = parse_plan({**base, "early_stop": {"kind": "hyperband", "max_steps": 27, "allocation": "hyperband"}})
    made = make_stopper(plan.early_stop)
    assert isinstance(made, Hyperband) and made.edges == hb.edges
    with pytest.raises(PlanError, match="allocation"):
        parse_plan({**base, "early_stop": {"kind": "hyperband", "allocation": "<b>uniform</b>"}})


def test_hyperband_compares_a_trial_with_its_own_bracket_only() -> None:
    hb = Hyperband(min_steps=1, reduction_factor=2, max_steps=16, brackets=2)
    b0 = [t for t in range(1, 40) if hb.bracket(t) == 0][:3]
    b1 = [t for t in range(1, 40) if hb.bracket(t) == 1][:1]
    good = saturating(0.1, 1.0, 0.5, 16)
    bad = saturating(3.0, 1.0, 0.5, 16)
    # the bracket-1 trial is far better: a bad bracket-0 trial is judged against bracket 0 only
    curves = {b1[0]: good, b0[0]: bad, b0[1]: [(s, v + 1) for s, v in bad]}
    assert hb.check(b0[0], bad[:1], {**curves, b0[0]: bad[:1]}) is None  # rung 1: better than its bracket peer
    verdict = hb.check(b0[1], curves[b0[1]][:1], {**curves, b0[1]: curves[b0[1]][:1]})
    assert verdict is not None and verdict.rule == "hyperband bracket 0 rung 1"
    assert hb.check(b1[0], good[:2], {**curves, b1[0]: good[:2]}) is None  # bracket 1 waits for step 2


def test_hyperband_speaks_a_maximized_objective() -> None:
    hb = make_stopper(EarlyStop(kind="hyperband", min_steps=1, reduction_factor=2, max_steps=16), sign=-1.0)
    assert isinstance(hb, Hyperband)
    b0 = [t for t in range(1, 40) if hb.bracket(t) == 0][:2]
    good, bad = [(1, -0.94)], [(1, -0.9181)]  # signed: accuracies of 0.94 and 0.9181
    verdict = hb.check(b0[1], bad, {b0[0]: good, b0[1]: bad})
    assert verdict is not None and "its value 0.9181 " in verdict.rationale, verdict
    assert "-" not in verdict.rationale.split("its value", 1)[1]


def test_forecast_extrapolates_saturating_curves() -> None:
    curve = saturating(0.5, 2.0, 0.3, 8)
    fc = forecast([s for s, _ in curve], [v for _, v in curve], 30, 0.95)
    assert fc is not None and abs(fc.mean - (0.5 + 2.0 * math.exp(-9))) < 0.35
    assert fc.low < fc.mean
    assert forecast([1, 2], [1.0, 0.9], 30, 0.95) is None  # too few points
    assert forecast([1, 2, 3], [math.nan, 1.0, 0.9], 30, 0.95) is None


def test_curve_stopper_stops_a_curve_heading_worse_than_the_incumbent() -> None:
    stop = CurveStop(min_steps=4, confidence=0.95)
    incumbent = saturating(0.2, 1.0, 0.3, 30)  # ends near 0.2 at step 30
    loser = saturating(1.5, 1.0, 0.3, 6)  # flattening out near 1.5
    assert stop.check(2, loser[:3], {1: incumbent, 2: loser[:3]}) is None  # too few points
    verdict = stop.check(2, loser, {1: incumbent, 2: loser})
    assert verdict is not None and verdict.rule == "curve" and "step 30" in verdict.rationale
    assert stop.check(2, loser, {1: incumbent, 2: loser}) is None  # no new point: no new forecast
    steep = [(s, 3.0 - 0.3 * s) for s in range(1, 7)]  # still falling fast: may well end below 0.2
    assert stop.check(3, steep, {1: incumbent, 3: steep}) is None
    assert CurveStop(4).check(4, loser, {4: loser}) is None  # no finished trial: no incumbent


def test_curve_stopper_speaks_a_maximized_objective() -> None:
    stop = make_stopper(EarlyStop(kind="curve", min_steps=4), sign=-1.0)
    assert stop is not None
    incumbent = saturating(-0.9, 0.5, 0.3, 30)  # signed: an accuracy rising to 0.9
    loser = saturating(-0.4, 0.3, 0.5, 8)  # one rising to 0.4
    verdict = stop.check(2, loser, {1: incumbent, 2: loser})
    assert verdict is not None and "incumbent's 0.899" in verdict.rationale and "-0." not in verdict.rationale


@pytest.fixture
def work(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AUTORESEARCH_TRACKING", "off")
    (tmp_path / "trial.py").write_text(TRIAL)
    return tmp_path


@pytest.mark.parametrize("early", [{"kind": "hyperband", "min_steps": 1, "reduction_factor": 2, "brackets": 2},
                                   {"kind": "curve", "min_steps": 3}])
def test_a_loop_stops_losers_with(early: dict[str, Any], api: Any, work: Path) -> None:
    xs = [0.0, 4.0, 5.0, 6.0, 7.0]
    plan = parse_plan({
        "name": "mf", "objective": {"metric": "loss"},
        "trial": {"command": f"{sys.executable} trial.py {{x}} 14 0.1", "grace": 5},
        "space": {"x": {"choices": xs}}, "proposer": {"kind": "grid"},
        "budget": {"trials": len(xs), "parallel": 1}, "early_stop": early}, base_dir=work)
    view = Controller(plan, runtime=api._runtime, monitor_every_s=0.1).run()
    states = {t.params["x"]: t.state for t in view.trials}
    assert states[0.0] == "succeeded"
    stops = api._ledger.query("SELECT * FROM decisions WHERE kind='stop'", ())
    assert len(stops) >= 2 and all(json.loads(d["inputs"])["rule"].startswith(early["kind"]) for d in stops)
    assert sum(s == "stopped" for s in states.values()) == len(stops)
