"""Ray backend benchmark: submit->running over Ray's own submit_job, throughput, the digits loop.

    python bench/bench_ray.py [--n 10] [--jobs 200] [--digits-trials 4] [--address URL]

Starts a head from backends/ray/ (unless --address names one) with 4 CPUs and 2 fake GPUs,
and prints a table of figures measured in this run on this machine (not a test):

* submit->running: from the submit call to the program's first line (it writes time.time()
  to a file), for Ray's bare ``JobSubmissionClient.submit_job`` and for ``Api.submit`` on the
  ray backend (ledger row, pass, our wrapper);
* throughput: ``--jobs`` short jobs (``true``) submitted at once, until all ended, both ways;
* the digits loop (examples/digits, ``--digits-trials`` trials, 2 in parallel) on local and on ray.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
KIT = ROOT / "backends" / "ray"
STAMP = "import sys, time; open(sys.argv[1], 'w').write(repr(time.time()))"


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def stamp_of(path: Path, timeout: float = 300.0) -> float:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            text = path.read_text().strip()
            if text:
                return float(text)
        except FileNotFoundError:
            pass
        time.sleep(0.005)
    raise RuntimeError(f"{path} never written")


def bench_latency(address: str, n: int, tmp: Path) -> tuple[list[float], list[float]]:
    from ray.job_submission import JobSubmissionClient

    from autoresearch.api import Api

    client = JobSubmissionClient(address)
    raw, ours = [], []
    api = Api(tmp / "home-latency")
    for i in range(n):
        marker = tmp / f"raw-{i}"
        t0 = time.time()
        client.submit_job(entrypoint=f"{sys.executable} -c \"{STAMP}\" {marker}")
        raw.append(stamp_of(marker) - t0)
        marker = tmp / f"ours-{i}"
        t0 = time.time()
        job = api.submit({"command": [sys.executable, "-c", STAMP, str(marker)], "workdir": str(tmp)}).id
        ours.append(stamp_of(marker) - t0)
        while api.status(job).state not in ("succeeded", "failed"):
            time.sleep(0.05)
    return raw, ours


def bench_throughput(address: str, jobs: int, tmp: Path) -> tuple[float, float]:
    from ray.job_submission import JobStatus, JobSubmissionClient

    from autoresearch.api import Api

    client = JobSubmissionClient(address)
    t0 = time.time()
    ids = [client.submit_job(entrypoint="true", entrypoint_num_cpus=1) for _ in range(jobs)]
    pending = set(ids)
    while pending:
        pending = {s for s in pending if not client.get_job_status(s).is_terminal()}
        time.sleep(0.2)
    raw = time.time() - t0
    assert all(client.get_job_status(s) == JobStatus.SUCCEEDED for s in ids)
    api = Api(tmp / "home-throughput")
    t0 = time.time()
    mine = [api.submit({"command": ["true"], "workdir": str(tmp)}).id for _ in range(jobs)]
    unfinished = "SELECT COUNT(*) AS n FROM jobs WHERE state NOT IN ('succeeded', 'failed', 'cancelled')"
    while api._ledger.one(unfinished)["n"]:
        api.tick()
        time.sleep(0.2)
    ours = time.time() - t0
    assert all(api.status(j).state == "succeeded" for j in mine)
    return jobs / raw, jobs / ours


def bench_digits(address: str, trials: int, tmp: Path) -> dict[str, float]:
    from autoresearch.loop.controller import Controller
    from autoresearch.loop.plan import parse_plan

    out = {}
    digits = ROOT / "examples" / "digits"
    for kind, options in (("local", {}), ("ray", {"address": address})):
        plan = parse_plan({
            "name": f"digits-{kind}", "objective": {"metric": "val_loss", "goal": "minimize"},
            "trial": {"command": "python train.py --lr {lr} --hidden {hidden} --epochs 20 --seed 0",
                      "workdir": str(digits), "timeout": "2m", "grace": "5s"},
            "space": {"lr": {"low": 1e-4, "high": 0.3, "log": True}, "hidden": {"choices": [16, 32, 64, 128]}},
            "proposer": {"kind": "random", "seed": 0}, "budget": {"trials": trials, "parallel": 2},
            "backend": {"kind": kind, "options": options},
        }, base_dir=digits)
        t0 = time.time()
        view = Controller(plan, home=tmp / f"home-digits-{kind}").run()
        out[kind] = time.time() - t0
        assert view.counts.get("succeeded") == trials, view.counts
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--digits-trials", type=int, default=4)
    parser.add_argument("--address")
    args = parser.parse_args()
    os.environ.setdefault("AUTORESEARCH_SYNC", "off")
    os.environ["AUTORESEARCH_TRACKING"] = "off"
    tmp = Path(tempfile.mkdtemp(prefix="arb-", dir="/tmp"))
    head = None
    if not args.address:
        head = tmp / "head"
        t0 = time.time()
        subprocess.run([str(KIT / "start.sh"), "--dir", str(head), "--num-gpus", "2", "--num-cpus", "4",
                        "--port", "26400", "--dashboard-port", "28300"], check=True)
        print(f"head started in {time.time() - t0:.1f} s")
        args.address = "http://127.0.0.1:28300"
    os.environ["AUTORESEARCH_BACKEND"] = "ray"
    os.environ["RAY_ADDRESS"] = args.address
    rows: list[tuple[str, str]] = []
    try:
        raw, ours = bench_latency(args.address, args.n, tmp)
        rows += [("submit->running, Ray submit_job (p50 / p95)", f"{statistics.median(raw):.2f} / {pct(raw, .95):.2f} s"),
                 ("submit->running, autoresearch on ray (p50 / p95)",
                  f"{statistics.median(ours):.2f} / {pct(ours, .95):.2f} s"),
                 ("overhead over submit_job (p50)", f"{statistics.median(ours) - statistics.median(raw):+.2f} s")]
        print(rows)
        if args.jobs:
            raw_tp, our_tp = bench_throughput(args.address, args.jobs, tmp)
            rows += [(f"{args.jobs} short jobs, Ray submit_job", f"{raw_tp:.2f} jobs/s"),
                     (f"{args.jobs} short jobs, autoresearch on ray", f"{our_tp:.2f} jobs/s")]
            print(rows[-2:])
        if args.digits_trials:
            walls = bench_digits(args.address, args.digits_trials, tmp)
            rows += [(f"digits loop, {args.digits_trials} trials x 20 epochs, local", f"{walls['local']:.1f} s"),
                     (f"digits loop, {args.digits_trials} trials x 20 epochs, ray", f"{walls['ray']:.1f} s")]
    finally:
        if head is not None:
            subprocess.run([str(KIT / "stop.sh"), "--dir", str(head)], check=False)
        shutil.rmtree(tmp, ignore_errors=True)
    _print(rows)
    return 0


def _print(rows: list[tuple[str, Any]]) -> None:
    width = max(len(r[0]) for r in rows)
    print(f"\n{'measure'.ljust(width)}  value\n{'-' * width}  -----")
    for name, value in rows:
        print(f"{name.ljust(width)}  {value}")


if __name__ == "__main__":
    sys.exit(main())
