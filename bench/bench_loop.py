"""Loop benchmarks (not tests). Prints tables of figures measured in one run.

1. Sweep overhead: N trials of `sleep S` at parallel P -> wall / ideal (ideal = N*S/P),
   for the autoresearch loop (random proposer, local backend), Ray Tune (reuse_actors,
   each trial runs the same `sleep` subprocess) and Optuna (n_jobs=P, in-memory study).
2. Time-to-target on the digits example: tpe vs random, median over K seeds.

    python bench/bench_loop.py                       # everything (several minutes)
    python bench/bench_loop.py --only sweep --trials 200
    python bench/bench_loop.py --only target --seeds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _child(code: str, env: dict[str, str] | None = None, timeout: float = 900) -> dict:
    """Run a measurement in a fresh interpreter (no shared imports or threads); it prints one JSON line."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, cwd=ROOT)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1][:120]}
    return json.loads(lines[-1])


def sweep_ours(n: int, parallel: int, sleep: float) -> dict:
    home = tempfile.mkdtemp(prefix="bench-loop-")
    code = textwrap.dedent(f"""
        import json, time
        from autoresearch.loop.plan import parse_plan
        from autoresearch.loop.controller import Controller
        plan = parse_plan({{"name": "sweep", "objective": {{"metric": "loss"}},
                           "trial": {{"command": "sleep {sleep}", "grace": 1}},
                           "space": {{"x": {{"low": 0.0, "high": 1.0}}}}, "proposer": {{"kind": "random"}},
                           "budget": {{"trials": {n}, "parallel": {parallel}}}}}, base_dir=".")
        t0 = time.perf_counter()
        c = Controller(plan, home={home!r})
        view = c.run()
        wall = time.perf_counter() - t0
        print(json.dumps({{"wall": wall, "counts": view.counts}}))
    """)
    return _child(code, {"AUTORESEARCH_HOME": home, "AUTORESEARCH_TRACKING": "off", "AUTORESEARCH_GPUS": "0"})


def sweep_optuna(n: int, parallel: int, sleep: float) -> dict:
    code = textwrap.dedent(f"""
        import json, subprocess, time, optuna
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        def objective(trial):
            x = trial.suggest_float("x", 0.0, 1.0)
            subprocess.run(["sleep", "{sleep}"], check=True)
            return x
        study = optuna.create_study()
        t0 = time.perf_counter()
        study.optimize(objective, n_trials={n}, n_jobs={parallel})
        print(json.dumps({{"wall": time.perf_counter() - t0, "counts": {{"succeeded": len(study.trials)}}}}))
    """)
    return _child(code)


def sweep_ray(n: int, parallel: int, sleep: float) -> dict:
    code = textwrap.dedent(f"""
        import json, os, subprocess, time
        os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
        import ray
        from ray import tune
        ray.init(num_cpus={parallel}, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
        def trainable(config):
            subprocess.run(["sleep", "{sleep}"], check=True)
            return {{"loss": config["x"]}}
        tuner = tune.Tuner(trainable, param_space={{"x": tune.uniform(0.0, 1.0)}},
                           tune_config=tune.TuneConfig(num_samples={n}, max_concurrent_trials={parallel},
                                                       reuse_actors=True),
                           run_config=tune.RunConfig(verbose=0, storage_path="/tmp/bench-ray"))
        t0 = time.perf_counter()
        results = tuner.fit()
        wall = time.perf_counter() - t0
        print(json.dumps({{"wall": wall, "counts": {{"succeeded": len(results)}}}}))
    """)
    return _child(code)


def sweep(n: int, parallel: int, sleep: float, which: list[str]) -> None:
    ideal = n * sleep / parallel
    load = os.getloadavg()[0]
    print(f"\n## Sweep overhead: {n} trials of `sleep {sleep}` at parallel {parallel} "
          f"(ideal {ideal:.2f} s; {os.cpu_count()} cores, load {load:.1f} at start)\n")
    print("| system | wall s | wall / ideal | trials done | note |")
    print("|---|---|---|---|---|")
    runners = {"autoresearch": sweep_ours, "ray-tune": sweep_ray, "optuna": sweep_optuna}
    notes = {"autoresearch": "local backend, each trial a supervised process, ledger writes, tracking off",
             "ray-tune": "reuse_actors=True, trial runs the same sleep subprocess, ray.init not timed",
             "optuna": "n_jobs threads, in-memory storage"}
    for name in which:
        result = runners[name](n, parallel, sleep)
        if "error" in result:
            print(f"| {name} | - | - | - | did not run: {result['error']} |")
            continue
        done = sum(result["counts"].values())
        print(f"| {name} | {result['wall']:.2f} | {result['wall'] / ideal:.3f} | {done} | {notes[name]} |")
        sys.stdout.flush()


def target(seeds: int, trials: int, parallel: int, goal: float) -> None:
    print(f"\n## Time to target on examples/digits: val_loss <= {goal} "
          f"(budget {trials} trials at parallel {parallel}, no early stopping or repeats; median of {seeds} seeds)\n")
    print("| proposer | median s to target | reached | median best val_loss | per-seed s |")
    print("|---|---|---|---|---|")
    for kind in ("tpe", "random"):
        times, bests = [], []
        for seed in range(seeds):
            home = tempfile.mkdtemp(prefix="bench-ttt-")
            code = textwrap.dedent(f"""
                import json
                from autoresearch.loop.plan import load_plan
                from autoresearch.loop.controller import Controller
                plan = load_plan("examples/digits/plan.yaml")
                plan.name = "ttt-{kind}-{seed}"
                plan.proposer.kind = "{kind}"; plan.proposer.seed = {seed}
                plan.budget.trials = {trials}; plan.budget.parallel = {parallel}
                plan.early_stop = None; plan.repeats = None
                view = Controller(plan, home={home!r}).run()
                start = min(t.created_at for t in view.trials)
                hit = [t.ended_at - start for t in view.trials
                       if t.state == "succeeded" and t.objective is not None and t.objective <= {goal}]
                best = min(t.objective for t in view.trials if t.objective is not None)
                print(json.dumps({{"t": min(hit) if hit else None, "best": best}}))
            """)
            result = _child(code, {"AUTORESEARCH_HOME": home, "AUTORESEARCH_TRACKING": "off"})
            if "error" in result:
                print(f"| {kind} | error: {result['error']} | | | |")
                break
            times.append(result["t"])
            bests.append(result["best"])
        reached = [t for t in times if t is not None]
        # a seed that never reached the target counts as infinitely slow in the median
        ordered = sorted(t if t is not None else float("inf") for t in times)
        med = statistics.median(ordered) if ordered else float("nan")
        shown = " ".join("-" if t is None else f"{t:.0f}" for t in times)
        print(f"| {kind} | {med:.1f} | {len(reached)}/{len(times)} | "
              f"{statistics.median(bests) if bests else float('nan'):.4f} | {shown} |")
        sys.stdout.flush()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", choices=["sweep", "target"], action="append")
    p.add_argument("--trials", type=int, default=500)
    p.add_argument("--parallel", type=int, default=16)
    p.add_argument("--sleep", type=float, default=0.2)
    p.add_argument("--systems", default="autoresearch,ray-tune,optuna")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--target-trials", type=int, default=16)
    p.add_argument("--target-parallel", type=int, default=4)
    p.add_argument("--goal", type=float, default=0.085)
    args = p.parse_args()
    parts = args.only or ["sweep", "target"]
    if "sweep" in parts:
        sweep(args.trials, args.parallel, args.sleep, args.systems.split(","))
    if "target" in parts:
        target(args.seeds, args.target_trials, args.target_parallel, args.goal)
    return 0


if __name__ == "__main__":
    sys.exit(main())
