"""Epochs past the rung: how far a trial stopped by ASHA trains beyond the rung it was judged at.

A real loop (local backend, grid proposer, parallel 2): one good config and N bad ones, each
reporting one "epoch" every --epoch-s seconds; ASHA min 2, rf 2. For every stopped trial:
last reported step - the step of its stop verdict. Run it against another tree to compare
(e.g. main): ``PYTHONPATH=/work/main python bench/bench_stop.py``.

    python bench/bench_stop.py --bad 8 --epoch-s 0.2 [--printed] [--parallel 4] [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

TRIAL = textwrap.dedent("""\
    import sys, time
    from autoresearch import report
    x, steps, pause = float(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    for step in range(1, steps + 1):
        time.sleep(pause)
        report(step=step, loss=x + 1.0 / step)
""")
# the same trial printing its metric (a documented log format) instead of calling report()
PRINTED = textwrap.dedent("""\
    import sys, time
    x, steps, pause = float(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    for step in range(1, steps + 1):
        time.sleep(pause)
        print(f"epoch {step} loss: {x + 1.0 / step}", flush=True)
""")


def once(args: argparse.Namespace) -> tuple[list[int], int, float]:
    """One loop: epochs past the rung per stopped trial, epochs run by all trials, wall seconds."""
    work = Path(tempfile.mkdtemp(prefix="bench-stop-"))
    os.environ.update(AUTORESEARCH_HOME=str(work / "home"), AUTORESEARCH_TRACKING="off")
    (work / "trial.py").write_text(PRINTED if args.printed else TRIAL)
    from autoresearch.api import Api
    from autoresearch.loop.controller import Controller
    from autoresearch.loop.plan import parse_plan

    api = Api(work / "home")
    xs = [0.0, 0.1] + [5.0 + i for i in range(args.bad)]
    plan = parse_plan({
        "name": "stop", "objective": {"metric": "loss"},
        "trial": {"command": f"{sys.executable} trial.py {{x}} {args.epochs} {args.epoch_s}", "grace": 5},
        "space": {"x": {"choices": xs}}, "proposer": {"kind": "grid"},
        "budget": {"trials": len(xs), "parallel": args.parallel},
        "early_stop": {"kind": "asha", "min_steps": 2, "reduction_factor": 2}}, base_dir=work)
    t0 = time.perf_counter()
    view = Controller(plan, runtime=api._runtime).run()
    wall = time.perf_counter() - t0
    ledger = api._ledger
    stops = {d["trial_id"]: json.loads(d["inputs"])["step"]
             for d in ledger.query("SELECT * FROM decisions WHERE kind='stop'", ())}
    past, compute = [], 0
    for t in view.trials:
        if t.job_id is None:
            continue
        last = ledger.query("SELECT max(step) AS s FROM metrics WHERE job_id=? AND name='loss'", (t.job_id,))
        compute += int(last[0]["s"] or 0)
        if t.trial_id in stops:
            past.append(int(last[0]["s"]) - stops[t.trial_id])
    return past, compute, wall


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bad", type=int, default=8)
    ap.add_argument("--epoch-s", type=float, default=0.2)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--runs", type=int, default=1, help="loops run one after the other; medians printed")
    ap.add_argument("--printed", action="store_true", help="trials print 'epoch N loss: X' lines")
    args = ap.parse_args()
    rows = [once(args) for _ in range(args.runs)]
    print(f"tree: {Path(sys.modules['autoresearch'].__file__ or '').parent.parent}")
    print(f"{'run':>4} {'stopped':>8} {'mean past':>10} {'max':>4} {'epochs':>7} {'wall s':>7}  "
          f"epoch {args.epoch_s:g}s, {args.bad + 2} trials, parallel {args.parallel}, "
          f"{'printed' if args.printed else 'report()'}")
    for i, (past, compute, wall) in enumerate(rows):
        mean = f"{statistics.mean(past):.2f}" if past else "-"
        print(f"{i:>4} {len(past):>8} {mean:>10} {max(past, default=0):>4} {compute:>7} {wall:>7.1f}   {past}")
    allpast = [p for past, _, _ in rows for p in past]
    print(f"median {'':>3}{'':>8} {statistics.mean(allpast) if allpast else 0:>10.2f} "
          f"{max(allpast, default=0):>4} {statistics.median(r[1] for r in rows):>7g} "
          f"{statistics.median(r[2] for r in rows):>7.1f}   (mean past over all stopped trials; medians over runs)")


if __name__ == "__main__":
    main()
