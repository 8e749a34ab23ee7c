"""Model-based search beyond finished trials (issue 15): bohb learning from every rung, the
proposer's history carrying each trial's curve, priors on the space, warm starts from earlier
loops and the steps (compute) budget. Loops run on the in-memory fake backend: each trial
prints its curve (``epoch k loss: v``) from its own argv."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

import pytest

from autoresearch.backends import LaunchRequest
from autoresearch.backends.fake import FakeBackend, Script
from autoresearch.engine.runtime import Runtime
from autoresearch.errors import PlanError
from autoresearch.loop.controller import Controller
from autoresearch.loop.plan import parse_plan
from autoresearch.loop.proposers import (
    Proposer,
    ProposerContext,
    ProposeResult,
    TrialRecord,
    make_proposer,
    register,
)
from autoresearch.loop.proposers.random import RandomProposer

EPOCHS = 9


def curve(x: float, k: str = "b") -> list[float]:
    """A learning curve whose every step ranks configurations alike: best at x = 1.3."""
    final = (x - 1.3) ** 2 + (0.5 if k == "a" else 0.0)
    return [final + 2.0 / step for step in range(1, EPOCHS + 1)]


def plan(kind: str, space: dict[str, Any] | None = None, **extra: Any) -> Any:
    data = {"name": "p", "objective": {"metric": "loss"}, "trial": {"command": "train {x} {k}"},
            "space": space or {"x": {"low": -2.0, "high": 2.0}, "k": {"choices": ["a", "b"]}},
            "proposer": {"kind": kind, "seed": 3}, "budget": {"trials": 40, "parallel": 4},
            "early_stop": {"kind": "asha", "min_steps": 1, "reduction_factor": 3, "max_steps": EPOCHS}}
    data.update(extra)
    return parse_plan(data)


def stopped_at(trial_id: int, params: dict[str, Any], rung: int) -> TrialRecord:
    values = curve(params["x"], params["k"])[:rung]
    return TrialRecord(trial_id, params, "stopped", values[-1], intermediate=list(enumerate(values, 1)))


def test_bohb_learns_from_rungs_when_no_trial_has_finished() -> None:
    # 12 trials, every one stopped at step 1 or 3 (ASHA's rungs): no final value anywhere.
    xs = [-1.9, -1.5, -1.0, -0.6, -0.2, 0.2, 0.5, 0.8, 1.1, 1.4, 1.7, 1.95]
    history = [stopped_at(i + 1, {"x": x, "k": "ab"[i % 2]}, 3 if i % 3 else 1) for i, x in enumerate(xs)]
    rand = [curve(p.params["x"], p.params["k"])[-1]
            for p in RandomProposer(ProposerContext(plan("random"))).propose(history, 8).proposals]
    # stopped: bad (the trials stopped at step 1 are bad at step 3 too) and ignore (the default: they are not)
    for stopped, bound in (("bad", 0.6), ("ignore", 0.7)):
        result = make_proposer(ProposerContext(plan("bohb", proposer={
            "kind": "bohb", "seed": 3, "options": {"random_fraction": 0, "stopped": stopped}}))).propose(history, 8)
        assert "model fitted at step 3" in result.rationale
        bohb = [curve(p.params["x"], p.params["k"])[-1] for p in result.proposals]
        assert statistics.median(bohb) < bound < 1.0 < statistics.median(rand), (stopped, bohb, rand)
        assert len({(p.params["x"], p.params["k"]) for p in result.proposals}) == 8  # a batch spreads out


def test_bohb_fit_all_weighs_every_rung_by_how_it_ranks_like_the_highest() -> None:
    """fit: all: a model per level with data; a lower level whose ranking disagrees with the
    highest's gets no weight, one that agrees gets weight 1."""
    xs = [-1.9, -1.5, -1.0, -0.6, -0.2, 0.2, 0.5, 0.8, 1.1, 1.4, 1.7, 1.95]
    history = [stopped_at(i + 1, {"x": x, "k": "b"}, 3) for i, x in enumerate(xs)]
    proposer = make_proposer(ProposerContext(plan("bohb", proposer={"kind": "bohb", "seed": 3, "options": {
        "fit": "all", "random_fraction": 0}})))
    seen, bad, _ = proposer._observations(history)  # type: ignore[attr-defined]
    fits = proposer._fits(seen, bad)  # type: ignore[attr-defined]
    assert [(w, lv) for w, lv, *_ in fits] == [(1.0, 1), (1.0, 3)]  # step 1 ranks exactly as step 3
    flipped = {x.tobytes(): -v for x, v in seen[1]}  # a lower level that ranks backwards
    seen[1] = [(x, flipped[x.tobytes()]) for x, _ in seen[1]]
    assert [lv for _, lv, *_ in proposer._fits(seen, bad)] == [3]  # type: ignore[attr-defined]
    result = proposer.propose(history, 8)
    assert "model fitted at step 3" in result.rationale
    finals = [curve(p.params["x"], p.params["k"])[-1] for p in result.proposals]
    rand = [curve(p.params["x"], p.params["k"])[-1]
            for p in RandomProposer(ProposerContext(plan("random"))).propose(history, 8).proposals]
    assert statistics.median(finals) < 0.8 < 1.0 < statistics.median(rand), (finals, rand)
    assert len({(p.params["x"], p.params["k"]) for p in result.proposals}) == 8


def test_a_plan_that_names_no_strategy_gets_bohb_and_hyperband() -> None:
    """The defaults the benchmark shows best (docs/search-benchmark.md): proposer bohb, stopper hyperband."""
    data = {"name": "d", "objective": {"metric": "loss"}, "trial": {"command": "train {x}"},
            "space": {"x": {"low": 0.0, "high": 1.0}}, "early_stop": {"min_steps": 1, "max_steps": 27}}
    parsed = parse_plan(data)
    assert (parsed.proposer.kind, parsed.early_stop.kind) == ("bohb", "hyperband")
    from autoresearch.loop.stopping import Hyperband, make_stopper

    assert isinstance(make_stopper(parsed.early_stop), Hyperband)
    assert make_proposer(ProposerContext(parsed)).kind == "bohb"
    # a plan without space (it has a code: section): runs its command as it is (bohb refused it; tpe did not)
    bare = parse_plan({"name": "b", "objective": {"metric": "loss"}, "trial": {"command": "train"},
                       "code": {"files": ["train.py"]}})
    result = make_proposer(ProposerContext(bare)).propose([], 3)
    assert [p.params for p in result.proposals] == [{}, {}, {}]


def test_bohb_counts_trials_stopped_below_a_level_as_bad_there() -> None:
    good = [TrialRecord(i, {"x": x, "k": "b"}, "succeeded", curve(x)[-1],
                        intermediate=list(enumerate(curve(x), 1))) for i, x in enumerate([1.0, 1.2, 1.5, 1.6], 1)]
    stopped = [stopped_at(10 + i, {"x": x, "k": "b"}, 1) for i, x in enumerate([-1.5, -1.0, 0.0])]
    proposer = make_proposer(ProposerContext(plan("bohb", proposer={"kind": "bohb", "seed": 3,
                                                                    "options": {"stopped": "bad"}})))
    seen, bad, _ = proposer._observations(good + stopped)  # type: ignore[attr-defined]
    assert len(seen[math.inf]) == 4 and len(bad[math.inf]) == 3 and len(bad[3]) == 3 and len(seen[1]) == 7
    assert "model fitted at the final values: 4 trials there, 3 known worse" in proposer.propose(good + stopped,
                                                                                                1).rationale


def test_bohb_can_ignore_stopped_trials_above_where_they_got() -> None:
    # where curves cross, a trial stopped at step 1 says nothing of its final value: stopped: ignore
    good = [TrialRecord(i, {"x": x, "k": "b"}, "succeeded", curve(x)[-1],
                        intermediate=list(enumerate(curve(x), 1))) for i, x in enumerate([1.0, 1.2, 1.5, 1.6], 1)]
    stopped = [stopped_at(10 + i, {"x": x, "k": "b"}, 1) for i, x in enumerate([-1.5, -1.0, 0.0])]
    failed = [TrialRecord(20, {"x": 0.3, "k": "a"}, "failed", None)]
    proposer = make_proposer(ProposerContext(plan("bohb")))  # ignore: the default
    seen, bad, _ = proposer._observations(good + stopped + failed)  # type: ignore[attr-defined]
    assert len(seen[math.inf]) == 4 and len(bad[math.inf]) == 1 and len(bad[3]) == 1 and len(seen[1]) == 7
    with pytest.raises(PlanError, match="stopped") as info:
        make_proposer(ProposerContext(plan("bohb", proposer={"kind": "bohb", "options": {"stopped": "../x"}})))
    assert "ignore" in (info.value.hint or "")


def test_bohb_and_tpe_start_from_the_prior() -> None:
    space = {"x": {"low": -2.0, "high": 2.0, "prior": {"guess": 1.0, "confidence": 0.9}},
             "k": {"choices": ["a", "b"], "prior": {"guess": "b", "confidence": 0.9}}}
    for kind in ("bohb", "tpe"):
        proposals = make_proposer(ProposerContext(plan(kind, space))).propose([], 8).proposals
        xs = [p.params["x"] for p in proposals]
        assert abs(statistics.median(xs) - 1.0) < 0.3, (kind, xs)
        assert sum(p.params["k"] == "b" for p in proposals) >= 6, kind
    no_prior = make_proposer(ProposerContext(plan("bohb"))).propose([], 8).proposals
    assert max(p.params["x"] for p in no_prior) - min(p.params["x"] for p in no_prior) > 2.0


def test_bohb_options_are_checked() -> None:
    with pytest.raises(PlanError, match="gamma") as info:
        make_proposer(ProposerContext(plan("bohb", proposer={"kind": "bohb", "options": {"gamma": 2}})))
    assert info.value.hint
    with pytest.raises(PlanError, match="unknown key 'gama'"):
        make_proposer(ProposerContext(plan("bohb", proposer={"kind": "bohb", "options": {"gama": 0.2}})))


def test_a_plans_digest_changes_only_with_the_new_keys() -> None:
    base = plan("tpe").digest()
    assert plan("tpe", budget={"trials": 40, "parallel": 4, "steps": 100}).digest() != base
    assert plan("tpe", warm_start=["old"]).digest() != base
    prior = {"x": {"low": -2.0, "high": 2.0, "prior": 0.5}, "k": {"choices": ["a", "b"]}}
    assert plan("tpe", prior).digest() != base
    assert plan("tpe", {"x": {"low": -2.0, "high": 2.0}, "k": {"choices": ["a", "b"]}}).digest() == base
    # hyperband's allocation, unset, leaves a plan's digest as before the key existed (the loop resumes)
    stop = {"kind": "hyperband", "max_steps": 27}
    one = {"name": "p", "objective": {"metric": "loss"}, "trial": {"command": "train {x}"},
           "space": {"x": {"low": -2.0, "high": 2.0}}, "early_stop": stop}
    assert parse_plan(one).digest() == "6a78b4d3bd99d0c7"  # the digest of this plan before allocation existed
    assert parse_plan({**one, "early_stop": {**stop, "allocation": "hyperband"}}).digest() != "6a78b4d3bd99d0c7"


# -- loops on the fake backend ----------------------------------------------------------------


def printed_curve(request: LaunchRequest) -> bytes:
    values = curve(float(request.argv[1]), request.argv[2])
    return "".join(f"epoch {step} loss: {v:.6f}\n" for step, v in enumerate(values, 1)).encode()


def loop_plan(name: str, tmp_path: Path, **extra: Any) -> Any:
    data = {"name": name, "objective": {"metric": "loss"}, "trial": {"command": "train {x} {k}", "grace": 0},
            "space": {"x": {"low": -2.0, "high": 2.0}, "k": {"choices": ["a", "b"]}},
            "proposer": {"kind": "bohb", "seed": 1}, "budget": {"trials": 6, "parallel": 2},
            "early_stop": {"kind": "asha", "min_steps": 100}}
    data.update(extra)
    return parse_plan(data, base_dir=tmp_path)


class Recorder(Proposer):
    """Random proposals; remembers every history it was given."""

    kind = "recorder"
    blocking = False
    seen: list[list[TrialRecord]] = []

    def propose(self, history: list[TrialRecord], n: int) -> ProposeResult:
        Recorder.seen.append([TrialRecord(r.trial_id, r.params, r.state, r.objective,
                                          intermediate=list(r.intermediate)) for r in history])
        return RandomProposer(self.ctx).propose(history, n)


def test_the_proposer_sees_each_trials_curve(home: Path, tmp_path: Path) -> None:
    register("recorder", Recorder)
    Recorder.seen = []
    fake = FakeBackend(programs={"train": Script(printed_curve, exit_code=0)})
    view = Controller(loop_plan("seen", tmp_path, proposer={"kind": "recorder", "seed": 1}),
                      runtime=Runtime(home, backend=fake)).run()
    assert view.counts == {"succeeded": 6}
    ended = [r for history in Recorder.seen for r in history if r.state == "succeeded"]
    assert ended, "no proposal was asked after a trial ended"
    for r in ended:  # in the objective's own direction, every epoch
        assert [step for step, _ in r.intermediate] == list(range(1, EPOCHS + 1))
        assert r.intermediate[-1][1] == pytest.approx(r.objective, abs=1e-5)


def test_steps_budget_ends_the_loop_with_at_most_the_trials_in_flight_over(home: Path, tmp_path: Path) -> None:
    fake = FakeBackend(programs={"train": Script(printed_curve, exit_code=0)})
    p = loop_plan("steps", tmp_path, budget={"trials": 20, "parallel": 1, "steps": 20})
    view = Controller(p, runtime=Runtime(home, backend=fake)).run()
    # 9 steps a trial, one at a time: 9, 18, 27 >= 20 after the third; nothing launches after.
    assert view.counts == {"succeeded": 3}
    assert len(fake.attempts()) == 3


def test_steps_budget_can_stop_the_trials_in_flight(home: Path, tmp_path: Path) -> None:
    runs_on = Script(printed_curve, exit_code=None)  # prints its curve, then never ends by itself
    fake = FakeBackend(programs={"train": runs_on})
    p = loop_plan("inflight", tmp_path, budget={"trials": 20, "parallel": 2, "steps": 10, "stop_in_flight": True})
    view = Controller(p, runtime=Runtime(home, backend=fake)).run()
    assert view.counts == {"stopped": 2}
    assert len(fake.attempts()) == 2
    from autoresearch.loop.store import LoopStore

    store = LoopStore(Runtime(home, backend=fake).ledger, LoopStore.find(Runtime(home, backend=fake).ledger,
                                                                          "inflight")["id"])
    finish = [d for d in store.decisions() if d["kind"] == "finish"]
    assert "steps budget 10 used" in finish[-1]["outputs"]


def test_warm_start_feeds_an_earlier_loops_trials_to_the_model(home: Path, tmp_path: Path) -> None:
    fake = FakeBackend(programs={"train": Script(printed_curve, exit_code=0)})
    runtime = Runtime(home, backend=fake)
    first = Controller(loop_plan("before", tmp_path, budget={"trials": 8, "parallel": 2}), runtime=runtime).run()
    assert first.counts == {"succeeded": 8}
    second = Controller(loop_plan("after", tmp_path, warm_start=["before"], budget={"trials": 1, "parallel": 1}),
                        runtime=runtime)
    second.open()
    try:
        assert len(second.ctx.warm) == 8 and all(len(r.intermediate) == EPOCHS for r in second.ctx.warm)
        result = second.proposer.propose([], 1)
        assert "model fitted at the final values: 8 trials there" in result.rationale
    finally:
        second.close()


def test_warm_start_refuses_an_incompatible_loop(home: Path, tmp_path: Path) -> None:
    fake = FakeBackend(programs={"train": Script(printed_curve, exit_code=0)})
    runtime = Runtime(home, backend=fake)
    Controller(loop_plan("old", tmp_path, budget={"trials": 2, "parallel": 2}), runtime=runtime).run()
    other_space = {"x": {"choices": [0.0, 1.0]}, "depth": {"low": 1, "high": 4}}
    cases = [
        (loop_plan("new1", tmp_path, warm_start=["old"], space=other_space, trial={"command": "train {x} {depth}"}),
         "parameters that differ: depth (only in this plan), k (only in the earlier loop), x (choices here, a range "
         "there)"),
        (loop_plan("new2", tmp_path, warm_start=["old"], objective={"metric": "loss", "goal": "max"}),
         "loop 'old' measures 'loss' (minimize), this plan 'loss' (maximize)"),
        (loop_plan("new3", tmp_path, warm_start=["missing"]), "no loop named 'missing'"),
    ]
    for p, message in cases:
        with pytest.raises(PlanError) as info:
            Controller(p, runtime=runtime).run()
        assert message in info.value.message and info.value.hint


def test_an_llms_suggestions_are_the_prior_of_bohb(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.fakes.llm_server import FakeLLMServer, anthropic_tool_answer

    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    with FakeLLMServer() as server:
        server.script(anthropic_tool_answer({"rationale": "x near 1.2 and k=b train best", "proposals": [
            {"params": {"x": 1.2, "k": "b"}, "rationale": "a"}, {"params": {"x": 1.25, "k": "b"}, "rationale": "b"}]},
            input_tokens=900, output_tokens=120))
        p = plan("bohb", proposer={"kind": "bohb", "seed": 3, "provider": "anthropic", "base_url": server.url,
                                   "model": "claude-sonnet-4-6", "options": {"llm_prior": 2, "llm_confidence": 0.8,
                                                                             "backoff_s": 0.01}})
        proposer = make_proposer(ProposerContext(p))
        assert proposer.blocking  # the controller calls it off the main thread
        first = proposer.propose([], 6)
        assert len(server.requests) == 1
        assert [q.params for q in first.proposals[:2]] == [{"x": 1.2, "k": "b"}, {"x": 1.25, "k": "b"}]
        assert first.proposals[0].rationale == "the LLM's suggestion (prior)"
        assert (first.tokens_in, first.tokens_out) == (900, 120) and first.cost_usd > 0  # counts for llm_usd
        assert "prior: 2 suggestion(s) of claude-sonnet-4-6" in first.rationale
        # after the suggestions: samples around them, not across the whole range
        rest = [q.params["x"] for q in first.proposals[2:]]
        assert abs(statistics.median(rest) - 1.2) < 0.5 and sum(abs(x - 1.2) < 1.0 for x in rest) >= 3, rest
        history = [TrialRecord(i + 1, q.params, "running") for i, q in enumerate(first.proposals)]
        again = proposer.propose(history, 2)
        assert len(server.requests) == 1 and again.cost_usd == 0  # asked once


def test_a_resumed_loop_counts_the_steps_its_ended_trials_used(home: Path, tmp_path: Path) -> None:
    fake = FakeBackend(programs={"train": Script(printed_curve, exit_code=0)})
    runtime = Runtime(home, backend=fake)
    first = Controller(loop_plan("again", tmp_path, budget={"trials": 2, "parallel": 1, "steps": 1000}, early_stop=None),
                       runtime=runtime).run()
    assert first.counts == {"succeeded": 2}  # 18 steps
    more = loop_plan("again", tmp_path, budget={"trials": 10, "parallel": 1, "steps": 20}, early_stop=None)
    view = Controller(more, runtime=runtime, resume=True).run()
    assert view.counts == {"succeeded": 3}  # 18 + 9 >= 20: one more trial, not three
