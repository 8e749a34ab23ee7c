"""Sweep benchmarks for issue 16 (not tests). Prints tables of figures measured in one run.

1. Sweep wall vs ideal: N trials of `sleep S; echo loss: x` at parallel P (ideal = N*S/P), the
   autoresearch loop (random proposer, local backend, tracking off, no display: like --json)
   beside Optuna (n_jobs=P, in-memory study, the same subprocess per trial) and a bare thread
   pool running the same subprocess (the machine's floor), each with the machine's CPU per trial. Defaults: the two
   sweeps of the issue, 500 x 0.2 s and 1,000 x 0.05 s at parallel 16. ``--trace``: where the
   turnover loses time, from a trial's end to the controller noticing, the next trial's submit,
   its placement and its command running (medians, means and 90th percentiles, ms).
2. Controller CPU per 100 trials over a long loop (`true` trials), with the live display (the
   table rendered on every update, as `autoresearch plan.yaml` does on a terminal) and
   without (--json): CPU seconds of the controller's process (all its threads) per hundred
   trials ended: the first, second, middle and last hundreds, and late / early (the median of the
   five hundreds before the last over that of hundreds 2-6; flat from trial 100 on is the goal).
4. As users run it (``--only users``): the CLI with tracking on until it returns, beside a plain Popen
   loop running the same ``python3 -c`` trials; the tail after the last trial, the command's RSS, and
   the mirror's catch-up CPU per trial.
3. Time to first trial: `autoresearch plan.yaml` (the CLI, a fresh interpreter) to the first
   trial's command running, with tracking off and on (on: the first trials must not wait for
   the mirror's mlflow import).

    python bench/bench_sweep.py                         # everything (many minutes)
    python bench/bench_sweep.py --only sweep --sweeps 500x0.2,1000x0.05 [--trace] [--rounds 3]
    python bench/bench_sweep.py --only cpu --cpu-trials 5000
    python bench/bench_sweep.py --only first
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from bench_loop import _child  # bench/ is on sys.path when run as a script; a fresh interpreter, one JSON line
from bench_runtime import fs_line, pct

ROOT = Path(__file__).resolve().parent.parent


def _env(home: str, tracking: str = "off") -> dict[str, str]:
    return {"AUTORESEARCH_HOME": home, "AUTORESEARCH_TRACKING": tracking, "AUTORESEARCH_GPUS": "0",
            "PYTHONPATH": str(ROOT)}


def sweep_ours(n: int, parallel: int, sleep: float, trace: bool = False) -> dict:
    """The loop's sweep; ``trace``: also the turnover's timeline (see :func:`_TRACE`)."""
    home = tempfile.mkdtemp(prefix="bench-sweep-")
    code = textwrap.dedent(f"""
        import json, time
        from autoresearch.loop.plan import parse_plan
        from autoresearch.loop.controller import Controller
        plan = parse_plan({{"name": "sweep", "objective": {{"metric": "loss"}},
                           "trial": {{"command": "sleep {sleep}; echo loss: {{x}}", "shell": True, "grace": 1}},
                           "space": {{"x": {{"low": 0.0, "high": 1.0}}}}, "proposer": {{"kind": "random"}},
                           "budget": {{"trials": {n}, "parallel": {parallel}}}}}, base_dir=".")
        trace = {trace!r}
    """) + (_TRACE if trace else "") + textwrap.dedent(f"""
        t0, t0_wall = time.perf_counter(), time.time()
        c = Controller(plan, home={home!r})
        view = c.run()
        out = {{"wall": time.perf_counter() - t0, "counts": view.counts}}
        if trace:
            out["gaps"] = gaps(c, {parallel}, t0_wall)
        print(json.dumps(out))
    """)
    return _child(code, _env(home))


# The turnover's timeline, per trial: its command ended (the supervisor's exit.json), a pass recorded
# the ending (its `end` event), the controller noticed (outcomes.ended), the next trial was proposed
# (Controller._accept) and submitted (jobs.submit_many called; negative: it was queued ahead before
# the ending), its attempt row was written (the pass placed it) and its command ran (state.json).
# The k-th ending frees the slot of the (parallel + k)-th start.
_TRACE = textwrap.dedent("""
    import os, statistics
    from autoresearch.engine import jobs as job_ops
    from autoresearch.backends import _supervisor as sup
    from autoresearch.loop import controller as C, outcomes
    ev = {"notice": {}, "propose": [], "submit": {}, "wakes": 0}
    _ended, _accept, _submit, _poll = outcomes.ended, C.Controller._accept, job_ops.submit_many, C.Controller._poll
    def ended(c, tid, row, job):
        ev["notice"][row["job_id"]] = time.time()
        return _ended(c, tid, row, job)
    def accept(self, result, call_n):
        ev["propose"].append(time.time())
        return _accept(self, result, call_n)
    def submit_many(*a, **k):
        t = time.time()
        ids = _submit(*a, **k)
        ev["submit"].update((j, t) for j in ids)
        return ids
    def poll(self):
        ev["wakes"] += bool(self._woke)
        return _poll(self)
    outcomes.ended, C.Controller._accept, job_ops.submit_many, C.Controller._poll = ended, accept, submit_many, poll
    def gaps(c, parallel, t0):
        starts, ends, rows = {}, {}, {}
        for r in c.ledger.query("SELECT job_id, external_id, created_at FROM attempts"):
            starts[r[0]] = (sup.read_json(os.path.join(r[1], "state.json")) or {}).get("started_at")
            ends[r[0]] = (sup.read_json(os.path.join(r[1], "exit.json")) or {}).get("ended_at")
            rows[r[0]] = r[2]
        recorded = {r[0]: r[1] for r in c.ledger.query("SELECT job_id, MIN(ts) FROM events WHERE kind='end' "
                                                         "GROUP BY job_id")}
        by_start = sorted((j for j in starts if starts[j]), key=starts.get)
        by_end = sorted((j for j in ends if ends[j]), key=ends.get)
        out = {"end -> recorded (its pass)": [], "end -> noticed": [], "end -> next submitted": [],
               "end -> next attempt row": [], "end -> next running": [], "submitted -> attempt row": [],
               "attempt row -> running": []}
        for k, je in enumerate(by_end[:max(0, len(by_start) - parallel)]):
            jn = by_start[parallel + k]
            if je in recorded:
                out["end -> recorded (its pass)"].append(recorded[je] - ends[je])
            if je in ev["notice"]:
                out["end -> noticed"].append(ev["notice"][je] - ends[je])
            if jn in ev["submit"]:
                out["end -> next submitted"].append(ev["submit"][jn] - ends[je])
            out["end -> next attempt row"].append(rows[jn] - ends[je])
            out["end -> next running"].append(starts[jn] - ends[je])
        for j in by_start:
            if j in ev["submit"]:
                out["submitted -> attempt row"].append(rows[j] - ev["submit"][j])
            out["attempt row -> running"].append(starts[j] - rows[j])
        res = {k: [1000 * statistics.median(v), 1000 * statistics.mean(v), 1000 * sorted(v)[int(0.9 * (len(v) - 1))]]
               for k, v in out.items() if v}
        if len(by_start) > parallel and by_end:  # the first wave: one figure each (median = mean)
            first = [("Controller() -> first trial running", starts[by_start[0]] - t0),
                     (f"Controller() -> all {parallel} of the first wave running", starts[by_start[parallel - 1]] - t0),
                     ("first end -> its successor running", starts[by_start[parallel]] - ends[by_end[0]])]
            res.update((k, [1000 * v, 1000 * v, 1000 * v]) for k, v in first)
        res["wakes"], res["proposals"], res["submits"] = ev["wakes"], len(ev["propose"]), len(set(ev["submit"].values()))
        return res
""")


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


def sweep_bare(n: int, parallel: int, sleep: float) -> dict:
    """The machine's floor for this command: a pool of threads, each running the same subprocess."""
    code = textwrap.dedent(f"""
        import json, subprocess, time
        from concurrent.futures import ThreadPoolExecutor
        def one(i):
            return subprocess.run(f"sleep {sleep}; echo loss: {{i / {n}}}", shell=True, capture_output=True).stdout
        t0 = time.perf_counter()
        with ThreadPoolExecutor({parallel}) as pool:
            done = sum(1 for out in pool.map(one, range({n})) if out)
        print(json.dumps({{"wall": time.perf_counter() - t0, "counts": {{"succeeded": done}}}}))
    """)
    return _child(code)


def _busy_s() -> float:
    """The machine's busy CPU seconds so far, every process (/proc/stat: all but idle and iowait)."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return float("nan")
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def _measured(run: Any, n: int) -> dict:
    """``run()``'s result with the machine's CPU per trial (ms) while it ran (its interpreter's start included)."""
    before = _busy_s()
    result = dict(run())
    result["cpu_ms"] = (_busy_s() - before) / n * 1000
    return result


def sweeps(specs: list[tuple[int, float]], parallel: int, trace: bool = False, rounds: int = 1) -> None:
    """One row per sweep and round (the three runs of a round side by side); with several rounds, a
    row of medians per sweep after its rounds (the host's speed moves single runs by +-10%)."""
    print(f"\n## Sweep wall vs ideal at parallel {parallel} (trial: `sleep S; echo loss: x`; load "
          f"{os.getloadavg()[0]:.1f} at start; {fs_line()})\n")
    print("CPU: the whole machine's busy CPU per trial while each ran (the command's own share is in the bare "
          "pool's: a thread pool running the same subprocess, the floor of this machine for this command).\n")
    print("| trials x sleep | ideal s | autoresearch s | / ideal | CPU ms | optuna s | / ideal | CPU ms | "
          "bare pool s | / ideal | CPU ms | ours / optuna | done (ours) | load |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    traces = []
    for n, sleep in specs:
        ideal = n * sleep / parallel
        kept: list[list[float]] = []  # per round: the three walls and CPUs, when all three ran
        for _ in range(rounds):
            ours = _measured(lambda n=n, sleep=sleep: sweep_ours(n, parallel, sleep, trace), n)
            theirs = _measured(lambda n=n, sleep=sleep: sweep_optuna(n, parallel, sleep), n)
            bare = _measured(lambda n=n, sleep=sleep: sweep_bare(n, parallel, sleep), n)
            cells = []
            for r in (ours, theirs, bare):
                cells += ["-", f"error: {r['error']}", "-"] if "error" in r else [
                    f"{r['wall']:.2f}", f"{r['wall'] / ideal:.3f}", f"{r['cpu_ms']:.1f}"]
            rel = f"{ours['wall'] / theirs['wall']:.2f}" if "wall" in ours and "wall" in theirs else "-"
            done = ours.get("counts", {}).get("succeeded", "-")
            print(f"| {n} x {sleep:g} | {ideal:.2f} | {' | '.join(cells)} | {rel} | {done} | "
                  f"{os.getloadavg()[0]:.1f} |", flush=True)
            if all("wall" in r for r in (ours, theirs, bare)):
                kept.append([x for r in (ours, theirs, bare) for x in (r["wall"], r["cpu_ms"])])
            if ours.get("gaps"):
                traces.append((f"{n} x {sleep:g}", ours["gaps"]))
        if rounds > 1 and kept:
            med = [statistics.median(column) for column in zip(*kept, strict=True)]
            cells = [c for wall, cpu in zip(med[::2], med[1::2], strict=True)
                     for c in (f"{wall:.2f}", f"{wall / ideal:.3f}", f"{cpu:.1f}")]
            print(f"| **median of {len(kept)}** | {ideal:.2f} | {' | '.join(cells)} | "
                  f"{statistics.median(r[0] / r[2] for r in kept):.2f} | | |", flush=True)
    for name, g in traces:
        print(f"\n### Turnover of {name}: from a trial's end to the next trial running (ms; wakes "
              f"{g.pop('wakes')}, propose calls {g.pop('proposals')}, submit batches {g.pop('submits')})\n")
        print("| gap | median ms | mean ms | p90 ms |")
        print("|---|---|---|---|")
        for k, (med, mean, p90) in g.items():
            print(f"| {k} | {med:.1f} | {mean:.1f} | {p90:.1f} |")


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
    """The goal is flat from trial 100 on. The first hundred (imports, warm-up) and the last (the
    drain: no launches, fewer endings per wake) are shown but not judged: the ratio is the median
    of the five hundreds before the last over the median of hundreds 2-6 (medians: a loaded
    machine's CPU seconds move with its load)."""
    print(f"\n## Controller CPU per 100 trials over {n} `echo` trials at parallel {parallel} (load "
          f"{os.getloadavg()[0]:.1f} at start)\n")
    print("| display | wall s | 0-100 s | 100-200 s | middle 100 s | last 100 s | hundreds 2-6 (median) | "
          "5 before the last (median) | late / early | load at end |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for live in (True, False):
        r = controller_cpu(n, parallel, live)
        name = "live table" if live else "--json (none)"
        if "error" in r or len(r.get("per100") or ()) < 12:
            print(f"| {name} | error: {r.get('error', 'too few hundreds (--cpu-trials >= 1200)')} | | | | | | | | |")
            continue
        per = r["per100"]
        mid = len(per) // 2
        early, late = pct(per[1:6], 50), pct(per[-6:-1], 50)
        print(f"| {name} | {r['wall']:.1f} | {per[0]:.2f} | {per[1]:.2f} | {per[mid]:.2f} (#{mid + 1}) | "
              f"{per[-1]:.2f} | {early:.2f} | {late:.2f} | {late / early:.2f} | {os.getloadavg()[0]:.1f} |", flush=True)
        print(f"<!-- {name} per 100: {' '.join(f'{x:.2f}' for x in per)} -->")


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


_USER_CLI = """\
import json, resource, sys, time
from autoresearch.cli import main
t0 = time.time()
code = main(sys.argv[1:])
sys.stdout.flush()
print(json.dumps({"t0": t0, "t_return": time.time(), "code": code,
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "heavy": sorted(m for m in ("matplotlib", "mlflow", "pandas", "scipy", "sklearn", "optuna",
                                              "pyarrow", "sqlalchemy") if m in sys.modules)}), file=sys.stderr)
raise SystemExit(code)
"""


def as_users_run_it(n: int, parallel: int, tracking: str = "on") -> dict:
    """``autoresearch --json plan.yaml`` in a fresh interpreter, as a user runs it (tracking on, the
    background syncer on, the report): N trials of ``python3 -c "print('v=...')"``; the wall until the
    command returns, the tail from the last trial's end to that return, the command's peak RSS, the
    heavy modules its process imported; then the mirror's catch-up: ``autoresearch sync`` until nothing
    is pending, its CPU per trial."""
    import json
    import resource
    import sqlite3

    home = tempfile.mkdtemp(prefix="bench-user-")
    work = Path(home) / "work"
    work.mkdir()
    (work / "plan.yaml").write_text(textwrap.dedent(f"""\
        name: user
        objective: {{metric: v, goal: minimize}}
        trial: {{command: "python3 -c \\"print('v={{x}}')\\"", gpus: 0}}
        space: {{x: {{low: 0.0, high: 1.0}}}}
        proposer: {{kind: random}}
        budget: {{trials: {n}, parallel: {parallel}}}
        """))
    env = {**os.environ, **_env(home + "/h", tracking)}
    env.pop("AUTORESEARCH_SYNC", None)
    t0 = time.time()
    done = subprocess.run([sys.executable, "-c", _USER_CLI, "--json", str(work / "plan.yaml")], cwd=work, env=env,
                          capture_output=True, text=True)
    wall = time.time() - t0
    stats = json.loads(done.stderr.strip().splitlines()[-1])
    with sqlite3.connect(Path(home) / "h" / "ledger.db") as conn:
        first, last, ok = conn.execute("SELECT MIN(submitted_at), MAX(ended_at), SUM(state='succeeded') FROM jobs"
                                       ).fetchone()
    out = {"wall": wall, "tail": stats["t_return"] - last, "rss_mb": stats["rss_mb"], "heavy": stats["heavy"],
           "trials_wall": last - first, "succeeded": ok, "code": done.returncode}
    if tracking == "on":  # the mirror's catch-up, in the foreground, after the background syncer had its go
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        sync = subprocess.run([sys.executable, "-m", "autoresearch.cli", "sync", "--json"], env=env,
                              capture_output=True, text=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        out["sync_cpu_s"] = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
        out["sync_ok"] = sync.returncode == 0
    return out


def popen_loop(n: int, parallel: int) -> float:
    """The machine's floor: a plain loop keeping ``parallel`` Popens of the same command running."""
    code = textwrap.dedent(f"""
        import subprocess, time
        t0 = time.perf_counter(); running = []; started = 0
        while started < {n} or running:
            while started < {n} and len(running) < {parallel}:
                running.append(subprocess.Popen(["python3", "-c", f"print('v={{started / {n}}}')"],
                                                stdout=subprocess.DEVNULL))
                started += 1
            running[0].wait(); running = [p for p in running if p.poll() is None]
        print(time.perf_counter() - t0)
    """)
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout)


def users_table(sizes: list[int], parallel: int) -> None:
    print(f"\n## As users run it: `autoresearch --json plan.yaml` until it returns, tracking on (trial: "
          f"`python3 -c \"print('v=...')\"`, parallel {parallel}; load {os.getloadavg()[0]:.1f} at start)\n")
    print("Tail: from the last trial's end to the command's return. Mirror CPU: `autoresearch sync` run after "
          "the command (the background syncer had until then), per trial, its interpreter's start and mlflow's "
          "import included.\n")
    print("| trials | Popen loop s | ours s | / Popen | trials alone s | tail s | command RSS MB | heavy modules "
          "in the command | mirror catch-up CPU ms/trial | succeeded |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n in sizes:
        floor = popen_loop(n, parallel)
        ours = as_users_run_it(n, parallel)
        print(f"| {n} | {floor:.2f} | {ours['wall']:.2f} | {ours['wall'] / floor:.2f}x | {ours['trials_wall']:.2f} | "
              f"{ours['tail']:.2f} | {ours['rss_mb']:.0f} | {', '.join(ours['heavy']) or '-'} | "
              f"{ours.get('sync_cpu_s', float('nan')) / n * 1000:.1f} | {ours['succeeded']} |", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", choices=["sweep", "cpu", "first", "users"], action="append")
    p.add_argument("--users", default="24,600", help="users: trial counts, comma separated (e.g. 24,600,5000)")
    p.add_argument("--sweeps", default="500x0.2,1000x0.05", help="N x sleep, comma separated")
    p.add_argument("--parallel", type=int, default=16)
    p.add_argument("--cpu-trials", type=int, default=5000)
    p.add_argument("--first-runs", type=int, default=3)
    p.add_argument("--rounds", type=int, default=1, help="sweep: rounds of the three runs side by side, "
                                                             "then their medians (default 1)")
    p.add_argument("--trace", action="store_true", help="sweep: also the turnover's gaps (ending, noticed, "
                                                         "submitted, placed, running)")
    args = p.parse_args()
    parts = args.only or ["sweep", "cpu", "first", "users"]
    if "sweep" in parts:
        specs = [(int(n), float(s)) for n, s in (item.split("x") for item in args.sweeps.split(","))]
        sweeps(specs, args.parallel, args.trace, max(1, args.rounds))
    if "cpu" in parts:
        cpu_table(args.cpu_trials, args.parallel)
    if "first" in parts:
        first_table(args.first_runs)
    if "users" in parts:
        users_table([int(x) for x in args.users.split(",")], args.parallel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
