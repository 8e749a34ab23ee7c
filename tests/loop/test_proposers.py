"""random, grid and tpe proposers: the contract, determinism, resume by replay."""

from __future__ import annotations

import math

import pytest

from autoresearch.errors import PlanError
from autoresearch.loop.plan import parse_plan
from autoresearch.loop.proposers import ProposerContext, TrialRecord, kinds, make_proposer


def plan(kind: str, **space: object) -> object:
    return parse_plan({"name": "p", "objective": {"metric": "loss"}, "trial": {"command": "run"},
                       "space": space or {"x": {"low": -2.0, "high": 2.0}, "k": {"choices": ["a", "b"]}},
                       "proposer": {"kind": kind, "seed": 3}, "budget": {"trials": 40, "parallel": 4}})


def finished(history: list[TrialRecord], params: dict, value: float) -> None:
    history.append(TrialRecord(len(history) + 1, params, "succeeded", value))


def test_registry_lists_builtin_kinds() -> None:
    assert {"random", "grid", "tpe"} <= set(kinds())


def test_random_is_reproducible_and_resumes_where_it_stopped() -> None:
    p = make_proposer(ProposerContext(plan("random")))
    first = p.propose([], 3).proposals
    again = make_proposer(ProposerContext(plan("random"))).propose([], 3).proposals
    assert [a.params for a in first] == [b.params for b in again]
    history = [TrialRecord(i + 1, prop.params, "succeeded", 0.0) for i, prop in enumerate(first[:2])]
    resumed = make_proposer(ProposerContext(plan("random"))).propose(history, 1).proposals
    assert resumed[0].params == first[2].params
    for prop in first:
        assert -2.0 <= prop.params["x"] <= 2.0 and prop.params["k"] in ("a", "b")


def test_grid_covers_every_point_once_then_is_exhausted() -> None:
    p = make_proposer(ProposerContext(plan("grid", a={"choices": [1, 2, 3]}, b={"low": 0, "high": 1, "step": 1})))
    history: list[TrialRecord] = []
    seen = []
    while True:
        result = p.propose(history, 4)
        if not result.proposals:
            break
        for prop in result.proposals:
            seen.append((prop.params["a"], prop.params["b"]))
            finished(history, prop.params, 0.0)
    assert sorted(seen) == [(a, b) for a in (1, 2, 3) for b in (0, 1)]
    assert "exhausted" in p.propose(history, 1).rationale


def test_tpe_beats_random_on_a_quadratic_and_replays_history() -> None:
    def objective(params: dict) -> float:
        return (params["x"] - 1.3) ** 2 + (0.5 if params["k"] == "a" else 0.0)

    def best_after(kind: str, n: int) -> float:
        p = make_proposer(ProposerContext(plan(kind)))
        history: list[TrialRecord] = []
        while len(history) < n:
            for prop in p.propose(history, 2).proposals:
                finished(history, prop.params, objective(prop.params))
        return min(t.objective or math.inf for t in history)

    assert best_after("tpe", 30) < 0.05
    # A fresh TPE given a history (a resumed loop) proposes near the known optimum.
    history: list[TrialRecord] = []
    for x in [-2.0, -1.0, 0.0, 1.0, 1.2, 1.4, 2.0, 0.5, -0.5, 1.3, 1.25]:
        for k in ("a", "b"):
            finished(history, {"x": x, "k": k}, objective({"x": x, "k": k}))
    fresh = make_proposer(ProposerContext(plan("tpe")))
    proposals = fresh.propose(history, 8).proposals
    assert sum(1 for prop in proposals if prop.params["k"] == "b") >= 5
    assert sum(1 for prop in proposals if abs(prop.params["x"] - 1.3) < 0.8) >= 5


def test_tpe_journal_storage_survives_a_restart(tmp_path) -> None:  # type: ignore[no-untyped-def]
    p = plan("tpe")
    p.proposer.options = {"storage": "journal"}
    ctx = ProposerContext(p, loop_id=1, loop_name="j", home=tmp_path)
    first = make_proposer(ctx)
    history: list[TrialRecord] = []
    for prop in first.propose(history, 3).proposals:
        finished(history, prop.params, prop.params["x"] ** 2)
    first.propose(history, 1)  # tells the three finished trials
    first.close()
    assert (tmp_path / "loops" / "j" / "optuna-journal.log").exists()
    again = make_proposer(ProposerContext(p, loop_id=1, loop_name="j", home=tmp_path))
    told = [t for t in again.study.trials if "ar_trial" in t.user_attrs]  # type: ignore[attr-defined]
    assert sorted(t.user_attrs["ar_trial"] for t in told) == [1, 2, 3]
    again.propose(history, 1)  # nothing is told twice
    assert len([t for t in again.study.trials if "ar_trial" in t.user_attrs]) == 3  # type: ignore[attr-defined]


@pytest.mark.parametrize(("kind", "options", "key"), [
    ("llm", {"retries": "abc"}, "retries"), ("llm", {"timeout_s": float("nan")}, "timeout_s"),
    ("llm", {"price_in": "1e9", "price_out": 1.0}, "price_in"), ("agent", {"idle_timeout": "soon"}, "idle_timeout"),
    ("agent", {"idle_timeout": -1}, "idle_timeout"), ("bohb", {"candidates": 1e99}, "candidates")])
def test_bad_proposer_options_are_one_line_plan_errors(kind: str, options: dict, key: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Every proposer reads its options through one checked helper (proposers/_base.py): garbage is a
    PlanError naming the key, with a hint (llm and agent raised a bare ValueError: a traceback)."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    data = {"name": "p", "objective": {"metric": "loss"}, "trial": {"command": "run {x}"},
            "space": {"x": {"low": -2.0, "high": 2.0}}, "proposer": {"kind": kind, "options": options}}
    with pytest.raises(PlanError, match=f"proposer.options.{key} is") as info:
        make_proposer(ProposerContext(parse_plan(data)))
    assert f"options: {{{key}:" in (info.value.hint or "")
