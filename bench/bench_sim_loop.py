"""The research loop on a simulated fleet (issue 11, benchmark 3). Not a test; prints a table.

The real loop (controller, proposers, early stopping, runtime, ledger) runs unchanged on the
``sim`` backend with an events clock: trials replay recorded learning curves
(``autoresearch/sim/data/*.json.gz``, recorded by ``bench/record_curves.py``) and simulated time
jumps from one reported point to the next. For random, TPE and TPE + ASHA at 16 and 64 trials
in parallel it reports the simulated time until a reported point reaches the target (the value
the best ``--top`` fraction of the table's recorded configs reach at full fidelity), the best
value at the end of the budget, the GPU-hours spent, and the wall and CPU seconds the loop took.

    python bench/bench_sim_loop.py                              # digits-like table, 3 seeds
    python bench/bench_sim_loop.py --table PATH --parallel 16 --seeds 5 --trials 4
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "autoresearch" / "sim" / "data"

STRATEGIES = {
    "random": ({"kind": "random"}, None),
    "tpe": ({"kind": "tpe"}, None),
    "tpe+asha": ({"kind": "tpe"}, {"kind": "asha", "min_steps": 1, "reduction_factor": 3}),
}


def default_table() -> Path:
    tables = sorted(DATA.glob("*.json.gz"))
    digits = [t for t in tables if "digits" in t.name]
    if not (digits or tables):
        sys.exit(f"no curve table under {DATA}: record one with bench/record_curves.py, or pass --table")
    return (digits or tables)[0]


def target_of(table_path: Path, top: float) -> tuple[float, str, str]:
    """(target, metric, mode): the value the best ``top`` fraction of recorded configs reach."""
    sys.path.insert(0, str(ROOT))
    from autoresearch.sim.curves import CurveTable

    table = CurveTable.load(table_path)
    finals = sorted((c.values[-1] for c in table.curves), reverse=table.mode == "max")
    k = max(1, int(len(finals) * top))
    return finals[k - 1], table.metric, table.mode


def run_one(table: Path, strategy: str, parallel: int, trials_per_slot: int, seed: int, timeout: float,
            scale: float) -> dict:
    """One loop in a fresh interpreter and a fresh home; it prints one JSON line."""
    proposer, stopper = STRATEGIES[strategy]
    home = tempfile.mkdtemp(prefix="bench-sim-loop-")
    code = textwrap.dedent(f"""
        import json, resource, sqlite3, time
        from autoresearch.sim.curves import CurveTable
        from autoresearch.loop.plan import parse_plan
        from autoresearch.loop.controller import Controller
        table = CurveTable.load({str(table)!r})
        space = table.raw_space
        plan = {{
            "name": "sim-bench", "objective": {{"metric": table.metric,
                                               "goal": "maximize" if table.mode == "max" else "minimize"}},
            "trial": {{"command": "train " + " ".join(f"--{{k}} {{{{{{k}}}}}}" for k in space),
                       "gpus": 1, "timeout": "720h"}},
            "space": table.raw_space,
            "proposer": {{**{proposer!r}, "seed": {seed}}},
            "budget": {{"trials": {parallel * trials_per_slot}, "parallel": {parallel}}},
            "backend": {{"kind": "sim", "nodes": [{{"name": "gpu", "count": {math.ceil(parallel / 8)}, "gpus": 8,
                                                "speed": {1 / scale!r}}}],
                         "trial": {{"model": "curve", "file": {str(table)!r}, "metric": table.metric}},
                         "seed": {seed}, "clock": {{"mode": "events"}}}},
        }}
        if {stopper!r} is not None:
            plan["early_stop"] = {{**{stopper!r}, "max_steps": table.max_step}}
        plan = parse_plan(plan, base_dir=".")
        t0, c0 = time.perf_counter(), time.process_time()
        c = Controller(plan, home={home!r})
        view = c.run()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        db = sqlite3.connect({home!r} + "/ledger.db")
        first = db.execute("SELECT MIN(started_at) FROM jobs").fetchone()[0]
        points = db.execute("SELECT value, ts FROM metrics WHERE name=? AND value IS NOT NULL ORDER BY ts",
                            (table.metric,)).fetchall()
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        print(json.dumps({{"wall": wall, "cpu": cpu + children.ru_utime + children.ru_stime,
                          "elapsed": view.elapsed_s, "counts": view.counts, "first": first,
                          "gpu_h": c.state.store.gpu_seconds(now=c.state.now_ts()) / 3600,
                          "points": points}}))
    """)
    env = {**os.environ, "AUTORESEARCH_HOME": home, "AUTORESEARCH_TRACKING": "off", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=ROOT)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1][:160]}
    return json.loads(lines[-1])


def summarize(r: dict, target: float, mode: str) -> dict:
    """Simulated hours from the first trial's start to the first reported point at the target; the best point."""
    hit, best = None, None
    lower = mode == "min"
    for value, ts in r["points"]:
        if best is None or (value < best if lower else value > best):
            best = value
        if hit is None and (value <= target if lower else value >= target):
            hit = (ts - (r["first"] or ts)) / 3600
    return {**r, "hit_h": hit, "best": best}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--table", type=Path, default=None)
    ap.add_argument("--parallel", default="16,64", help="comma-separated parallel trials (default 16,64)")
    ap.add_argument("--trials", type=int, default=4, help="trials per parallel slot (budget = parallel x this)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--top", type=float, default=0.05, help="target: the value the best TOP fraction reach")
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    ap.add_argument("--timeout", type=float, default=1200)
    ap.add_argument("--scale", type=float, default=600.0,
                    help="a recorded step's seconds x SCALE = its simulated seconds (toy epochs -> GPU epochs)")
    args = ap.parse_args()
    table = args.table or default_table()
    target, metric, mode = target_of(table, args.top)
    print(f"table {table.name}: {metric} ({mode}); target {target:.4g} (best {args.top:.0%} of recorded configs "
          f"at full fidelity); recorded step times x {args.scale:g}; budget {args.trials} trials per parallel slot; {args.seeds} seeds; "
          f"load {os.getloadavg()[0]:.1f}")
    header = (f"{'strategy':<10} {'par':>4} {'hit':>5} {'sim h to target p50':>19} {'best p50':>10} "
              f"{'GPU-h p50':>10} {'stopped':>8} {'sim h':>7} {'wall s p50':>10} {'CPU s p50':>9}")
    print(header)
    print("-" * len(header))
    for parallel in (int(p) for p in args.parallel.split(",")):
        for strategy in args.strategies.split(","):
            rows = []
            for seed in range(args.seeds):
                r = run_one(table, strategy, parallel, args.trials, seed, args.timeout, args.scale)
                if "error" in r:
                    print(f"{strategy:<10} {parallel:>4} seed {seed}: error: {r['error']}")
                    continue
                rows.append(summarize(r, target, mode))
            if not rows:
                continue
            hit = [row["hit_h"] for row in rows if row["hit_h"] is not None]
            best = [row["best"] for row in rows if row["best"] is not None]
            med = statistics.median
            print(f"{strategy:<10} {parallel:>4} {len(hit):>2}/{len(rows):<2} "
                  f"{(med(hit) if hit else float('nan')):>19.2f} {(med(best) if best else float('nan')):>10.4g} "
                  f"{med(row['gpu_h'] for row in rows):>10.1f} "
                  f"{med(row['counts'].get('stopped', 0) for row in rows):>8.0f} "
                  f"{med(row['elapsed'] for row in rows) / 3600:>7.1f} {med(row['wall'] for row in rows):>10.1f} "
                  f"{med(row['cpu'] for row in rows):>9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
