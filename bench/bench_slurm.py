"""Slurm backend benchmark against the kit's dev cluster (backends/slurm/kit.py), beside bare sbatch.

    python bench/bench_slurm.py [--n 10] [--jobs 200] [--digits-trials 4]

Starts a private kit cluster (stopped at the end), then prints a table measured in this run on
this machine (not a test):

* submit -> running: from the submit call to the program's first line, bare ``sbatch`` of the
  same command vs ``Api.submit`` on the slurm backend (our pass, the batch script and wrap.py);
* throughput: N short jobs (``true``) submitted one by one, until the last has ended;
* the digits loop (examples/digits/plan.yaml, fewer trials) on the local backend and on Slurm.

Slurm's own scheduling (``sched_interval=2``, backfill every 1 s) dominates both columns.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_runtime import pct, started_at  # bench/ is on sys.path when run as a script

ROOT = Path(__file__).resolve().parents[1]


def _kit() -> Any:
    spec = importlib.util.spec_from_file_location("slurm_kit", ROOT / "backends" / "slurm" / "kit.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module



def bench_start(api: Any, n: int, tmp: Path) -> tuple[list[float], list[float]]:
    bare, ours = [], []
    for i in range(n):
        for kind in ("bare", "ours"):
            marker = tmp / f"{kind}-{i}"
            command = f"date +%s.%N > {marker}"
            t0 = time.time()
            if kind == "bare":
                subprocess.run(["sbatch", "--parsable", "-o", "/dev/null", "--wrap", command], check=True,
                               capture_output=True)
            else:
                api.submit({"command": command, "shell": True, "workdir": str(tmp)})
            (bare if kind == "bare" else ours).append(started_at(marker, timeout=120.0) - t0)
    return bare, ours


def bench_throughput(api: Any, jobs: int, tmp: Path) -> tuple[float, float]:
    t0 = time.time()
    ids = [subprocess.run(["sbatch", "--parsable", "-o", "/dev/null", "--wrap", "true"], check=True,
                          capture_output=True, text=True).stdout.strip() for _ in range(jobs)]
    while True:
        out = subprocess.run(["squeue", "-h", "-t", "PD,R,CG,CF", "-j", ",".join(ids), "-o", "%i"],
                             capture_output=True, text=True).stdout
        if not out.strip():
            break
        time.sleep(0.2)
    bare = time.time() - t0
    t0 = time.time()
    mine = [api.submit({"command": ["true"], "workdir": str(tmp)}).id for _ in range(jobs)]
    while True:
        states = {api.status(j, refresh=False).state for j in mine}
        if states <= {"succeeded", "failed", "cancelled"}:
            break
        api.tick(wait=False)
        time.sleep(0.2)
    return bare, time.time() - t0


def bench_digits(trials: int, backend: dict[str, Any], tmp: Path) -> tuple[float, dict[str, int]]:
    import yaml

    from autoresearch.loop.controller import Controller
    from autoresearch.loop.plan import parse_plan

    digits = ROOT / "examples" / "digits"
    data = yaml.safe_load((digits / "plan.yaml").read_text())
    data.update(budget={"trials": trials, "parallel": min(4, trials)}, backend=backend)
    data.pop("repeats", None)
    t0 = time.time()
    view = Controller(parse_plan(data, base_dir=digits), home=tempfile.mkdtemp(dir=tmp)).run()
    return time.time() - t0, view.counts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=10, help="submit->running samples per column")
    parser.add_argument("--jobs", type=int, default=200, help="short jobs for the throughput row")
    parser.add_argument("--digits-trials", type=int, default=4, help="0 skips the digits rows")
    args = parser.parse_args()
    os.environ["AUTORESEARCH_SYNC"] = "off"
    kit = _kit()
    tmp = Path(tempfile.mkdtemp(prefix="bench-slurm-"))
    try:  # a kit that fails to start stops the daemons it started (kit.start); the finally stops a started one
        conf = kit.start(tmp / "kit", gpus=4)
        os.environ["SLURM_CONF"] = str(conf)
        from autoresearch.api import Api
        from autoresearch.backends._slurm import SlurmBackend

        api = Api(tmp / "home", SlurmBackend(conf=str(conf)))
        bare, ours = bench_start(api, args.n, tmp)
        print(f"{'measure':44} {'bare sbatch':>12} {'autoresearch':>13} {'overhead':>9}")
        print(f"{'submit -> program running, median (s)':44} {statistics.median(bare):12.2f} "
              f"{statistics.median(ours):13.2f} {statistics.median(ours) - statistics.median(bare):+9.2f}")
        print(f"{'submit -> program running, p90 (s)':44} {pct(bare, 0.9):12.2f} {pct(ours, 0.9):13.2f} "
              f"{pct(ours, 0.9) - pct(bare, 0.9):+9.2f}")
        raw, mine = bench_throughput(api, args.jobs, tmp)
        print(f"{f'{args.jobs} short jobs, submit to last ended (s)':44} {raw:12.1f} {mine:13.1f} {mine - raw:+9.1f}")
        print(f"{f'{args.jobs} short jobs, jobs/s':44} {args.jobs / raw:12.1f} {args.jobs / mine:13.1f}")
        if args.digits_trials:
            local, counts_l = bench_digits(args.digits_trials, {"kind": "local"}, tmp)
            slurm, counts_s = bench_digits(args.digits_trials, {"kind": "slurm", "options": {"conf": str(conf)}}, tmp)
            print(f"{f'digits loop, {args.digits_trials} trials (s): local | slurm':44} {local:12.1f} {slurm:13.1f} "
                  f"{slurm - local:+9.1f}   {counts_l} | {counts_s}")
    finally:
        kit.stop(tmp / "kit")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
