"""Sweep benchmarks for issue 16 (not tests). Prints tables of figures measured in one run.

1. Sweep wall vs ideal: N trials of `sleep S; echo loss: x` at parallel P (ideal = N*S/P), the
   autoresearch loop (random proposer, local backend, tracking off, no display: like --json)
   beside Optuna (n_jobs=P, in-memory study, the same subprocess per trial). Defaults: the two
   sweeps of the issue, 500 x 0.2 s and 1,000 x 0.05 s at parallel 16.
2. Controller CPU per 100 trials over a long loop (`true` trials), with the live display (the
   table rendered on every update, as `autoresearch plan.yaml` does on a terminal) and
   without (--json): CPU seconds of the controller's process (all its threads) per hundred
   trials ended, first and last hundreds and the ratio.
3. Time to first trial: `autoresearch plan.yaml` (the CLI, a fresh interpreter) to the first
   trial's command running, with tracking off and on (on: the first trials must not wait for
   the mirror's mlflow import).

    python bench/bench_sweep.py                         # everything (many minutes)
    python bench/bench_sweep.py --only sweep --sweeps 500x0.2,1000x0.05
    python bench/bench_sweep.py --only cpu --cpu-trials 5000
    python bench/bench_sweep.py --only first
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from bench_loop import _child  # bench/ is on sys.path when run as a script; a fresh interpreter, one JSON line
from bench_runtime import pct

ROOT = Path(__file__).resolve().parent.parent


def _env(home: str, tracking: str = "off") -> dict[str, str]:
    return {"AUTORESEARCH_HOME": home, "AUTORESEARCH_TRACKING": tracking, "AUTORESEARCH_GPUS": "0",
            "PYTHONPATH": str(ROOT)}


def sweep_ours(n: int, parallel: int, sleep: float) -> dict:
    home = tempfile.mkdtemp(prefix="bench-sweep-")
    code = textwrap.dedent(f"""
        import json, time
        from autoresearch.loop.plan import parse_plan
        from autoresearch.loop.controller import Controller
        plan = parse_plan({{"name": "sweep", "objective": {{"metric": "loss"}},
                           "trial": {{"command": "sleep {sleep}; echo loss: {{x}}", "shell": True, "grace": 1}},
                           "space": {{"x": {{"low": 0.0, "high": 1.0}}}}, "proposer": {{"kind": "random"}},
                           "budget": {{"trials": {n}, "parallel": {parallel}}}}}, base_dir=".")
        t0 = time.perf_counter()
        view = Controller(plan, home={home!r}).run()
        print(json.dumps({{"wall": time.perf_counter() - t0, "counts": view.counts}}))
    """)
    return _child(code, _env(home))


def sweep_optuna(n: int, parallel: int, sleep: float) -> dict:
    code = textwrap.dedent(f"""
        import json, subprocess, time, optuna
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        def objective(trial):
            x = trial.suggest_float("x", 0.0, 1.0)
            out = subprocess.run(f"sleep {sleep}; echo loss: {{x}}", shell=True, check=True, capture_output=True,
                                 text=True).stdout
            return float(out.split(":")[1])
        study = optuna.create_study()
        t0 = time.perf_counter()
        study.optimize(objective, n_trials={n}, n_jobs={parallel})
        print(json.dumps({{"wall": time.perf_counter() - t0, "counts": {{"succeeded": len(study.trials)}}}}))
    """)
    return _child(code)


def sweeps(specs: list[tuple[int, float]], parallel: int) -> None:
    print(f"\n## Sweep wall vs ideal at parallel {parallel} (trial: `sleep S; echo loss: x`; load "
          f"{os.getloadavg()[0]:.1f} at start)\n")
    print("| trials x sleep | ideal s | autoresearch s | / ideal | optuna s | / ideal | done (ours) |")
    print("|---|---|---|---|---|---|---|")
    for n, sleep in specs:
        ideal = n * sleep / parallel
        ours, theirs = sweep_ours(n, parallel, sleep), sweep_optuna(n, parallel, sleep)
        cells = []
        for r in (ours, theirs):
            cells += ["-", f"error: {r['error']}"] if "error" in r else [f"{r['wall']:.2f}", f"{r['wall'] / ideal:.3f}"]
        done = ours.get("counts", {}).get("succeeded", "-")
        print(f"| {n} x {sleep:g} | {ideal:.2f} | {' | '.join(cells)} | {done} |", flush=True)


def controller_cpu(n: int, parallel: int, live: bool) -> dict:
    """CPU of the controller's process per hundred trials ended (time.process_time: all its threads)."""
    home = tempfile.mkdtemp(prefix="bench-cpu-")
    code = textwrap.dedent(f"""
        import io, json, time
        from autoresearch.loop import outcomes
        from autoresearch.loop.plan import parse_plan
        from autoresearch.loop.controller import Controller
        plan = parse_plan({{"name": "cpu", "objective": {{"metric": "loss"}},
                           "trial": {{"command": "echo loss: {{x}}", "shell": True, "grace": 1}},
                           "space": {{"x": {{"low": 0.0, "high": 1.0}}}}, "proposer": {{"kind": "random"}},
                           "budget": {{"trials": {n}, "parallel": {parallel}}}}}, base_dir=".")
        marks, ended = [time.process_time()], [0]
        real = outcomes.ended
        def counted(c, *args):
            real(c, *args)
            ended[0] += 1
            if ended[0] % 100 == 0:
                marks.append(time.process_time())
        outcomes.ended = counted
        on_update = None
        if {live!r}:
            from rich.console import Console
            from autoresearch.cli._live import LiveTable
            table = LiveTable(plan, interactive=True)
            table.console = Console(file=io.StringIO(), width=160, force_terminal=True)
            def on_update(view):
                table.console.file.seek(0); table.console.file.truncate()
                table.console.print(table._table(view))  # what the live display draws
        t0 = time.perf_counter()
        view = Controller(plan, home={home!r}, on_update=on_update).run()
        per = [b - a for a, b in zip(marks, marks[1:])]
        print(json.dumps({{"wall": time.perf_counter() - t0, "per100": per, "counts": view.counts}}))
    """)
    return _child(code, _env(home), timeout=3600)


def cpu_table(n: int, parallel: int) -> None:
    print(f"\n## Controller CPU per 100 trials over {n} `echo` trials at parallel {parallel} (load "
          f"{os.getloadavg()[0]:.1f} at start)\n")
    print("| display | wall s | first 100 s | median 100 s | last 100 s | last / first | max / median |")
    print("|---|---|---|---|---|---|---|")
    for live in (True, False):
        r = controller_cpu(n, parallel, live)
        name = "live table" if live else "--json (none)"
        if "error" in r or not r.get("per100"):
            print(f"| {name} | error: {r.get('error', 'no figures')} | | | | | |")
            continue
        per = r["per100"]
        med = pct(per, 50)
        print(f"| {name} | {r['wall']:.1f} | {per[0]:.2f} | {med:.2f} | {per[-1]:.2f} | {per[-1] / per[0]:.2f} | "
              f"{max(per) / med:.2f} |", flush=True)


def first_trial(tracking: str) -> float | None:
    """Seconds from `autoresearch plan.yaml` to the first trial's command running."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-first-"))
    mark = tmp / "started"
    (tmp / "plan.yaml").write_text(textwrap.dedent(f"""\
        name: first
        objective: {{metric: loss}}
        trial: {{command: "date +%s.%N > {mark}; echo loss: {{x}}", shell: true}}
        space: {{x: {{low: 0.0, high: 1.0}}}}
        proposer: {{kind: random}}
        budget: {{trials: 1, parallel: 1}}
    """))
    t0 = time.time()
    subprocess.run([sys.executable, "-c", "import sys; from autoresearch.cli import main; sys.exit(main())", "--json",
                    str(tmp / "plan.yaml"), "--no-report"],
                   env={**os.environ, **_env(str(tmp / "home"), tracking), "AUTORESEARCH_SYNC": "off"},
                   capture_output=True, timeout=300, cwd=tmp)
    return float(mark.read_text()) - t0 if mark.exists() else None


def first_table(runs: int) -> None:
    print(f"\n## Time to first trial: `autoresearch --json plan.yaml` to the trial's command (load "
          f"{os.getloadavg()[0]:.1f} at start; {runs} runs each)\n")
    print("| tracking | median s | max s |")
    print("|---|---|---|")
    for tracking in ("off", "on"):
        times = [t for t in (first_trial(tracking) for _ in range(runs)) if t is not None]
        if times:
            print(f"| {tracking} | {pct(times, 50):.2f} | {max(times):.2f} |", flush=True)
        else:
            print(f"| {tracking} | no trial ran | |")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", choices=["sweep", "cpu", "first"], action="append")
    p.add_argument("--sweeps", default="500x0.2,1000x0.05", help="N x sleep, comma separated")
    p.add_argument("--parallel", type=int, default=16)
    p.add_argument("--cpu-trials", type=int, default=5000)
    p.add_argument("--first-runs", type=int, default=3)
    args = p.parse_args()
    parts = args.only or ["sweep", "cpu", "first"]
    if "sweep" in parts:
        specs = [(int(n), float(s)) for n, s in (item.split("x") for item in args.sweeps.split(","))]
        sweeps(specs, args.parallel)
    if "cpu" in parts:
        cpu_table(args.cpu_trials, args.parallel)
    if "first" in parts:
        first_table(args.first_runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
