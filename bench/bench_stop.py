"""Epochs past the rung: how far a trial stopped by ASHA trains beyond the rung it was judged at.

A real loop (local backend, grid proposer, parallel 2): one good config and N bad ones, each
reporting one "epoch" every --epoch-s seconds; ASHA min 2, rf 2. For every stopped trial:
last reported step - the step of its stop verdict. Run it against another tree to compare
(e.g. main): ``PYTHONPATH=/work/main python bench/bench_stop.py``.

    python bench/bench_stop.py --bad 8 --epoch-s 0.2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import textwrap
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bad", type=int, default=8)
    ap.add_argument("--epoch-s", type=float, default=0.2)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--printed", action="store_true", help="trials print 'epoch N loss: X' lines")
    args = ap.parse_args()
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
        "budget": {"trials": len(xs), "parallel": 2},
        "early_stop": {"kind": "asha", "min_steps": 2, "reduction_factor": 2}}, base_dir=work)
    view = Controller(plan, runtime=api._runtime).run()
    ledger = api._ledger
    stops = {d["trial_id"]: json.loads(d["inputs"])["step"]
             for d in ledger.query("SELECT * FROM decisions WHERE kind='stop'", ())}
    past = []
    for t in view.trials:
        if t.trial_id in stops and t.job_id is not None:
            last = ledger.query("SELECT max(step) AS s FROM metrics WHERE job_id=? AND name='loss'", (t.job_id,))
            past.append(int(last[0]["s"]) - stops[t.trial_id])
    print(f"tree: {Path(sys.modules['autoresearch'].__file__ or '').parent.parent}")
    print(f"{'stopped':>8} {'mean past':>10} {'median':>7} {'max':>4}  epoch {args.epoch_s:g}s, {len(xs)} trials")
    if past:
        print(f"{len(past):>8} {statistics.mean(past):>10.2f} {statistics.median(past):>7g} {max(past):>4}")
    print(f"epochs past the rung per stopped trial: {past}")


if __name__ == "__main__":
    main()
