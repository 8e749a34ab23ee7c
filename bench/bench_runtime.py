"""Runtime spine benchmark: start latency, status wall time, scheduling pass.

    python bench/bench_runtime.py [--n 30]

Prints a table of medians / p95 measured in this run on this machine (not a test).
Goals (issue 2): submit->running <= 50 ms over a bare spawn; `autoresearch status`
<= 0.3 s; one pass with 10,000 queued jobs over 128 nodes x 8 GPUs <= 50 ms.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def fs_create_us(where: str | None = None, n: int = 100) -> float:
    """Median µs to create a directory and a file in it, in a fresh directory under ``where`` (left
    in place: a delete would slow the next creates). A no-journal ext4 (this kind of VM's disk) skips
    every inode freed in the last 1-6 minutes on each create: after a burst of deletes (a test run's
    tmp cleanup, ``rm -rf`` of old homes) a create costs 0.5-10 ms instead of ~40 µs, and so does
    every job's launch; a figure taken then measures the disk, not the engine."""
    base = tempfile.mkdtemp(prefix="fsprobe-", dir=where)
    times = []
    for i in range(n):
        t = time.perf_counter()
        os.mkdir(f"{base}/{i}")
        os.close(os.open(f"{base}/{i}/f", os.O_CREAT | os.O_WRONLY, 0o600))
        times.append((time.perf_counter() - t) * 1e6 / 2)
    return statistics.median(times)


def fs_line(where: str | None = None) -> str:
    """What the header of a benchmark says of the disk under its homes."""
    us = fs_create_us(where)
    return f"a file create {us:.0f} µs" + (" (SLOW: deletes in the last minutes? see docs/performance.md)"
                                           if us > 200 else "")


def started_at(marker: Path, timeout: float = 10.0) -> float:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            text = marker.read_text().strip()
            if text:
                return float(text)
        except FileNotFoundError:
            pass
        time.sleep(0.001)
    raise RuntimeError(f"{marker} never written")


def bench_start(n: int, tmp: Path) -> tuple[list[float], list[float], list[float]]:
    from autoresearch.api import Api

    api = Api(tmp / "home")
    bare, ours, cli = [], [], []
    for i in range(n):
        for kind in ("bare", "ours", "cli"):
            marker = tmp / f"{kind}-{i}"
            argv = ["/bin/sh", "-c", f"date +%s.%N > {marker}"]
            t0 = time.time()
            if kind == "bare":
                subprocess.Popen(argv).wait()
            elif kind == "ours":
                api.submit({"command": argv, "workdir": str(tmp)})
            else:
                subprocess.run([sys.executable, "-m", "autoresearch.cli", "--home", str(tmp / "home"), "submit",
                                "--", *argv], check=True, capture_output=True)
            latency = started_at(marker) - t0
            {"bare": bare, "ours": ours, "cli": cli}[kind].append(latency * 1000)
            time.sleep(0.4)  # let the finished attempt's on-exit pass settle
    return bare, ours, cli


def bench_status(tmp: Path, runs: int = 10) -> tuple[list[float], list[float]]:
    home = tmp / "home"
    env = {**os.environ, "AUTORESEARCH_HOME": str(home)}
    exe = [sys.executable, "-m", "autoresearch.cli"]
    all_jobs, one_job = [], []
    for _ in range(runs):
        for target, args in ((all_jobs, ["status"]), (one_job, ["status", "1"])):
            t0 = time.perf_counter()
            subprocess.run([*exe, *args], check=True, capture_output=True, env=env)
            target.append((time.perf_counter() - t0) * 1000)
    return all_jobs, one_job


def bench_schedule(runs: int = 7) -> list[float]:
    from autoresearch.engine.scheduler import NodeState, Pending, Running, schedule

    nodes = [NodeState(f"node{i:03d}", tuple(str(g) for g in range(8))) for i in range(128)]
    classes = ["critical", "normal", "best-effort"]
    pending = [Pending(i, classes[i % 3], [1, 2, 4, 8][i % 4], waited_s=float(i % 600)) for i in range(10_000)]
    # half the cluster busy, a quarter of it with preemptible best-effort work
    running = [Running(100_000 + i, 1, "best-effort" if i % 2 else "normal", ((f"node{i:03d}", tuple(str(g) for g in range(4))),),
                       float(i)) for i in range(128)]
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        out = schedule(pending, nodes, running)
        times.append((time.perf_counter() - t0) * 1000)
    assert out.placements
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=30)
    args = parser.parse_args()
    from rich.console import Console
    from rich.table import Table

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        os.environ["AUTORESEARCH_HOME"] = str(tmp / "home")
        os.environ.setdefault("AUTORESEARCH_GPUS", "8")
        bare, ours, cli = bench_start(args.n, tmp)
        status_all, status_one = bench_status(tmp)
    sched = bench_schedule()
    over = [o - b for o, b in zip(ours, bare, strict=True)]
    table = Table(title=f"autoresearch runtime (n={args.n}, {os.cpu_count()} cores)")
    for col in ("measure", "p50", "p95", "goal"):
        table.add_column(col)
    rows = [
        ("bare spawn -> command running (ms)", bare, ""),
        ("Api.submit -> command running (ms)", ours, ""),
        ("  overhead over bare spawn (ms)", over, "<= 50"),
        ("CLI `autoresearch submit` -> running (ms)", cli, "(incl. interpreter start)"),
        ("`autoresearch status` wall, 3n jobs (ms)", status_all, "<= 300"),
        ("`autoresearch status 1` wall (ms)", status_one, "<= 300"),
        ("schedule(): 10k queued, 128x8 GPUs (ms)", sched, "<= 50"),
    ]
    for name, values, goal in rows:
        table.add_row(name, f"{statistics.median(values):.1f}", f"{pct(values, 0.95):.1f}", goal)
    Console().print(table)


if __name__ == "__main__":
    main()
