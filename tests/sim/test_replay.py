"""The search benchmark's harness (autoresearch/sim/replay.py): our proposers and stoppers and
Optuna's, replayed on recorded curves in simulated time."""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path
from typing import Any

import pytest

from autoresearch.errors import SpecError
from autoresearch.loop import stopping
from autoresearch.sim.curves import CurveTable
from autoresearch.sim.replay import Run, make_searcher, replay, run_strategy, target_of

ROOT = Path(__file__).resolve().parents[2]
STEPS = 9


def synthetic(n: int = 64, seed: int = 0) -> CurveTable:
    """Curves that fall towards a final value set by lr (best near 1e-2) and units; noisy times."""
    rng = random.Random(seed)
    configs = []
    for _ in range(n):
        lr = float(f"{math.exp(rng.uniform(math.log(1e-4), 0.0)):.6g}")
        units = rng.randint(8, 128)
        final = 0.05 + 0.1 * (math.log10(lr) + 2) ** 2 + abs(units - 64) / 640
        tau = 1 + 4 * rng.random()
        configs.append({"params": {"lr": lr, "units": units, "act": rng.choice(["relu", "tanh"])},
                        "values": [final + math.exp(-s / tau) for s in range(1, STEPS + 1)],
                        "seconds": [0.1 + units / 500 + 0.05 * rng.random() for _ in range(STEPS)]})
    return CurveTable({"format": "autoresearch-curves/1", "workload": "synthetic", "metric": "loss", "mode": "min",
                       "space": {"lr": {"low": 1e-4, "high": 1.0, "log": True}, "units": {"low": 8, "high": 128},
                                 "act": ["relu", "tanh"]}, "max_step": STEPS, "configs": configs})


class AtStep(stopping.Stopper):
    """Stops every trial at min_steps: the point that crosses it, not one step later."""

    kind = "replay-test-at-step"

    @classmethod
    def from_config(cls, cfg: Any) -> AtStep:
        return cls(cfg.min_steps)

    def __init__(self, step: int) -> None:
        self.step = step

    def check(self, trial: int, series: stopping.Series, others: dict[int, stopping.Series]) -> Any:
        step, value = series[-1]
        return stopping.StopVerdict(step, value, value, "test", "at step") if step >= self.step else None


stopping.register(AtStep.kind, AtStep)


class Counting:
    """Wraps a searcher: the most trials running at once."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.running, self.most = inner, 0, 0

    def ask(self, ids: list[int]) -> list[dict[str, Any]]:
        out = self.inner.ask(ids)
        self.running += len(out)
        self.most = max(self.most, self.running)
        return out

    def report(self, trial: int, step: int, value: float) -> bool:
        return bool(self.inner.report(trial, step, value))

    def end(self, trial: int, state: str) -> None:
        self.running -= 1
        self.inner.end(trial, state)


def steps_by_trial(run: Run) -> dict[int, int]:
    out: dict[int, int] = {}
    for p in run.points:
        out[p.trial] = out.get(p.trial, 0) + 1
    return out


@pytest.fixture(scope="module")
def table() -> CurveTable:
    return synthetic()


def test_stopped_trials_count_their_steps_and_stop_at_the_point(table: CurveTable) -> None:
    run = run_strategy("random+" + AtStep.kind, table, seed=0, budget=60, stopper_options={"min_steps": 3})
    per_trial = steps_by_trial(run)
    assert run.compute == 60 == sum(per_trial.values())
    assert run.completed == 0 and run.stopped >= 16
    # every stopped trial trained exactly to the point that triggered its stop, and no further
    assert max(per_trial.values()) == 3 and sum(1 for n in per_trial.values() if n == 3) == run.stopped
    assert sum(1 for n in per_trial.values() if n < 3) <= 4  # the ones in flight when the budget ran out
    assert [p.compute for p in run.points] == list(range(1, 61))


def test_a_stopper_that_stops_at_the_first_rung_consumes_fewer_steps_per_trial(table: CurveTable) -> None:
    plain = run_strategy("random", table, seed=1, budget=120)
    early = run_strategy("random+" + AtStep.kind, table, seed=1, budget=120, stopper_options={"min_steps": 1})
    assert plain.compute == early.compute == 120
    assert early.trials >= 116 and plain.trials <= 120 // STEPS + 4
    assert plain.completed >= 120 // STEPS - 4 and early.completed == 0


@pytest.mark.parametrize("strategy", ["tpe+asha", "optuna:tpe+sh", "optuna:tpe+hb", "random", "optuna:random"])
def test_same_seed_same_run(table: CurveTable, strategy: str) -> None:
    a = run_strategy(strategy, table, seed=3, budget=150)
    b = run_strategy(strategy, table, seed=3, budget=150)
    assert a.points == b.points and a.trials == b.trials
    c = run_strategy(strategy, table, seed=4, budget=150)
    assert c.points != a.points


@pytest.mark.parametrize("strategy", ["tpe+asha", "optuna:tpe+sh", "optuna:tpe+hb"])
def test_stoppers_stop_and_parallelism_holds(table: CurveTable, strategy: str) -> None:
    searcher = Counting(make_searcher(strategy, table, seed=0, parallel=3))
    run = replay(table, searcher, parallel=3, budget=200, strategy=strategy)
    assert searcher.most == 3
    assert run.stopped > 0 and run.completed > 0
    per_trial = steps_by_trial(run)
    assert any(n < STEPS for n in per_trial.values()) and max(per_trial.values()) == STEPS
    # simulated time moves forward; a trial's points come in step order
    assert all(a.time <= b.time for a, b in zip(run.points, run.points[1:], strict=False))


def test_targets_and_best_count_only_fully_trained_trials(table: CurveTable) -> None:
    run = run_strategy("random", table, seed=0, budget=300)
    best_final = min(p.value for p in run.points if p.final)
    assert run.best_at(300) == best_final
    assert run.compute_to(best_final) == next(p.compute for p in run.points if p.final and p.value == best_final)
    assert run.compute_to(-1.0) == math.inf and run.best_at(0) is None
    assert target_of(table, 0.02) == sorted(table.finals())[1]  # 2% of 64 configs: the 2 best


def test_bad_strategies(table: CurveTable) -> None:
    with pytest.raises(SpecError):
        make_searcher("optuna:tpe+nonsense", table)
    with pytest.raises(SpecError):
        make_searcher("optuna:cmaes", table)
    with pytest.raises(SpecError):  # our registry's own error for an unknown proposer kind
        make_searcher("tpee", table)
    with pytest.raises(SpecError):
        replay(table, make_searcher("random", table), budget=0)


def test_small_benchmark_table() -> None:
    """bench/bench_search.py on 2 seeds of a shipped workload: a row per strategy, the reference's ratio is 1."""
    data = sorted((ROOT / "autoresearch" / "sim" / "data").glob("*.json.gz"))
    if not data:
        pytest.skip("no tables recorded yet")
    sys.path.insert(0, str(ROOT))
    from bench.bench_search import REFERENCE, aa_check, run_all, summarize

    strategies = ["random", "tpe+asha", "optuna:random", REFERENCE]
    results = run_all(data[:1], strategies, [0, 1], parallel=4, budget=8, top=0.05, jobs=1)
    assert len(results) == 8 and all(r["compute"] == 8 * CurveTable.load(data[0]).max_step for r in results)
    text = summarize(results, strategies, 8)
    rows = [line for line in text.splitlines() if line.split()[1:2] and line.split()[1] in strategies]
    assert len(rows) == 4
    ref_row = next(line for line in rows if line.split()[1] == REFERENCE)
    assert ref_row.split()[5] == "1.00"
    assert "A/A check" in aa_check(results, "random", "optuna:random")


def test_proposer_options_in_a_strategy_name(table: CurveTable) -> None:
    searcher = make_searcher("bohb[fit=all,gamma=0.2]+hyperband", table, seed=0)
    assert (searcher.proposer.fit, searcher.proposer.gamma) == ("all", 0.2)
    run = replay(table, searcher, budget=150)
    assert run.compute == 150 and run.stopped > 0
    with pytest.raises(SpecError, match="key=value"):
        make_searcher("bohb[fit]+hyperband", table)
    with pytest.raises(SpecError, match=r"\[key=value"):
        make_searcher("bohb[fit=all+hyperband", table)


def test_stopper_options_in_a_strategy_name(table: CurveTable) -> None:
    """Tuning a default tries the stopper's options too (Hyperband's brackets); its rungs stay matched."""
    searcher = make_searcher("bohb[min_points=3]+hyperband[brackets=4]", table, seed=0)
    assert searcher.stopper.n == 4 and searcher.proposer.min_points == 3 and searcher.stopper.rf == 3
    assert make_searcher("bohb+hyperband[brackets=1]", table, seed=0).stopper.n == 1
    run = replay(table, searcher, budget=150)
    assert run.compute == 150
    with pytest.raises(SpecError, match="other rungs"):
        make_searcher("bohb+hyperband[reduction_factor=4]", table)


def test_a_reference_that_never_reaches_the_target_counts_as_the_budget_in_the_ratio() -> None:
    """Optuna's median compute-to-target may be "never": the ratio then counts it as the budget (a
    lower bound on its compute, so the ratio is an upper bound), with a bootstrap interval."""
    sys.path.insert(0, str(ROOT))
    from bench.bench_search import REFERENCE, summarize

    def row(strategy: str, c2t: float) -> dict[str, Any]:
        return {"workload": "w", "strategy": strategy, "compute_to_target": c2t, "best": 1.0, "trials": 9,
                "stopped": 3, "grid": [500.0, 1000.0]}

    results = [row(REFERENCE, math.inf if i % 3 else 400.0) for i in range(9)]
    results += [row("ours", 100.0 + i) for i in range(9)]
    text = summarize(results, [REFERENCE, "ours"], 1000)
    ours = next(line.split() for line in text.splitlines() if line.split()[1:2] == ["ours"])
    assert ours[2] == "104" and ours[4] == "9/9" and ours[5] == "0.10", ours  # 104 / 1000 (never -> budget)
    low, high = (float(x) for x in ours[6].strip("[]").split(","))
    assert 0.1 <= low <= 0.104 <= high <= 0.27


def test_optuna_runs_on_our_rungs_or_on_its_own_defaults(table: CurveTable) -> None:
    """optuna:tpe+hb and +sh-matched take the stopper's min_steps and reduction_factor and the table's
    max_step (the rungs ours runs on); +sh and +hb-default are Optuna's own defaults."""
    def pruner(strategy: str, **options: Any) -> Any:
        return make_searcher(strategy, table, seed=0, **options).study.pruner

    sh = pruner("optuna:tpe+sh-matched")
    assert (sh._min_resource, sh._reduction_factor) == (1, 3)
    hb = pruner("optuna:tpe+hb")
    assert (hb._min_resource, hb._max_resource, hb._reduction_factor) == (1, table.max_step, 3)
    moved = pruner("optuna:tpe+hb", stopper_options={"min_steps": 3, "reduction_factor": 2})
    assert (moved._min_resource, moved._reduction_factor) == (3, 2)
    default_sh = pruner("optuna:tpe+sh")
    assert default_sh._min_resource in (None, "auto") and default_sh._reduction_factor == 4  # None: "auto"
    assert pruner("optuna:tpe+hb-default")._max_resource in (None, "auto")
    run = replay(table, make_searcher("optuna:tpe+sh-matched", table, seed=0), budget=120)
    assert run.compute == 120 and run.stopped > 0


def test_the_oracle_is_the_floor_of_compute_to_target(table: CurveTable) -> None:
    target = target_of(table)
    oracle = run_strategy("oracle", table, seed=1, budget=40 * STEPS)
    first = [p for p in oracle.points if p.trial == 1]
    # its first trial is the fastest-training target config, trained in full; every other stops at step 1
    assert [p.step for p in first] == list(range(1, STEPS + 1)) and first[-1].value <= target
    assert all(oracle.steps_of(t) <= 1 for t in range(2, oracle.trials + 1))  # (the last ones: cut by the budget)
    assert oracle.compute_to(target) == first[-1].compute
    hits = [c for c in table.curves if c.values[-1] <= target]
    assert first[-1].time == pytest.approx(min(c.seconds_to(STEPS) for c in hits))
    for strategy in ("random", "optuna:random"):  # no search gets a fully trained target config sooner in time
        for s in range(3):
            run = run_strategy(strategy, table, seed=s, budget=40 * STEPS)
            hit = next((p for p in run.points if p.final and p.value <= target), None)
            assert hit is None or hit.time >= first[-1].time, (strategy, s)
