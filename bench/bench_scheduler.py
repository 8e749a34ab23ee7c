"""One scheduling pass with fair share on: queue size x fleet (issue 11).

    python bench/bench_scheduler.py [--runs 7] [--sizes 1000,3000,10000,30000]

A fleet of 128 nodes x 8 GPUs (1,024 GPUs), a quarter of it busy with normal work and a
quarter with preemptible best-effort work, 20 projects (weights 1-4, a GPU quota on half
of them), a mix of classes, job sizes 1-8 GPUs and some 2- and 4-node gangs. Prints the
median and p95 wall time (and the median CPU time, which a loaded machine distorts least) of
``scheduler.schedule`` with fair share off and on at each queue size.
Goal: <= 50 ms at 10,000 queued x 1,024 GPUs with fair share on; with ``--fleets``, <= 20 ms at
16,384 GPUs (a pass starts at most ``MAX_STARTS`` jobs; the uncapped pass is printed beside it).
Not a test: figures depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_runtime import pct  # noqa: E402

from autoresearch.engine.scheduler import (  # noqa: E402
    MAX_STARTS,
    FairShare,
    NodeState,
    Pending,
    Running,
    Share,
    schedule,
)

PROJECTS = [f"p{i:02d}" for i in range(20)]


def full_fleet(nodes: int, gpus: int = 8) -> tuple[list[NodeState], list[Running]]:
    """Every GPU held, an attempt of a whole node each, one node in 8 best-effort: a fleet in its steady state."""
    states = [NodeState(f"node{i:05d}", tuple(str(g) for g in range(gpus)), cpus=64.0) for i in range(nodes)]
    running = [Running(1_000_000 + i, 1, "best-effort" if i % 8 == 0 else "normal",
                       ((f"node{i:05d}", tuple(str(g) for g in range(gpus))),), float(i), cpus=4.0,
                       project=PROJECTS[i % len(PROJECTS)]) for i in range(nodes)]
    return states, running


def fleet(nodes: int = 128, gpus: int = 8) -> tuple[list[NodeState], list[Running]]:
    states = [NodeState(f"node{i:05d}", tuple(str(g) for g in range(gpus)), cpus=64.0) for i in range(nodes)]
    running = [Running(1_000_000 + i, 1, "best-effort" if i % 2 else "normal",
                       ((f"node{i:05d}", tuple(str(g) for g in range(gpus // 2))),), float(i), cpus=4.0,
                       project=PROJECTS[i % len(PROJECTS)]) for i in range(nodes)]
    return states, running


def queue(n: int) -> list[Pending]:
    classes = ["critical", "normal", "normal", "best-effort"]
    out = []
    for i in range(n):
        gang = 1 if i % 10 else (2 if i % 20 else 4)
        out.append(Pending(i, classes[i % 4], [1, 2, 4, 8][i % 4], gang, cpus=float(1 + i % 8),
                           waited_s=float(i % 600), project=PROJECTS[(i * 7) % len(PROJECTS)]))
    return out


def shares() -> FairShare:
    return FairShare({p: Share(weight=1.0 + i % 4, quota=64 if i % 2 else None) for i, p in enumerate(PROJECTS)})


def time_pass(pending: list[Pending], nodes: list[NodeState], running: list[Running], fair: FairShare | None,
              runs: int, max_starts: int | None = MAX_STARTS) -> tuple[list[float], list[float]]:
    """Wall and CPU milliseconds per pass (CPU time is what a loaded machine distorts least)."""
    wall, cpu = [], []
    for _ in range(runs):
        t0, c0 = time.perf_counter(), time.process_time()
        out = schedule(pending, nodes, running, fair=fair, max_starts=max_starts)
        wall.append((time.perf_counter() - t0) * 1000)
        cpu.append((time.process_time() - c0) * 1000)
    assert out.placements or out.preemptions
    return wall, cpu


def fleets(sizes: list[int], runs: int, queued: int = 10_000) -> None:
    """A pass with ``queued`` jobs at each fleet size (8-GPU nodes), fair share on: wall and CPU p50 and p99."""
    print(f"scheduler.schedule, {queued:,} queued, fair share on, 20 projects (runs={runs}, {os.cpu_count()} cores, "
          f"load {os.getloadavg()[0]:.1f})")
    head = (f"{'GPUs':>7} {'fleet':>10} {'wall p50 ms':>12} {'p99':>8} {'CPU p50 ms':>11} {'p99':>8} {'decisions':>10} "
            f"{'goal':>6} {'uncapped CPU p50':>17} {'decisions':>10} {'us/decision':>12}")
    print(head)
    print("-" * len(head))
    pending = queue(queued)
    for gpus in sizes:
        for name, make in (("half free", fleet), ("full", full_fleet)):
            nodes, running = make(gpus // 8)
            wall, cpu = time_pass(pending, nodes, running, shares(), runs)
            out = schedule(pending, nodes, running, fair=shares())
            decided = len(out.placements) + len(out.preemptions) + len(out.reserved)
            _, whole = time_pass(pending, nodes, running, shares(), runs, max_starts=None)
            every = schedule(pending, nodes, running, fair=shares(), max_starts=None)
            all_decided = len(every.placements) + len(every.preemptions) + len(every.reserved)
            _, base = time_pass(pending[:1], nodes, running, shares(), runs)
            per = (statistics.median(whole) - statistics.median(base)) * 1000 / max(1, all_decided)
            print(f"{gpus:7,} {name:>10} {statistics.median(wall):12.1f} {pct(wall, 0.99):8.1f} "
                  f"{statistics.median(cpu):11.1f} {pct(cpu, 0.99):8.1f} {decided:10,} "
                  f"{'<= 20' if gpus == 16_384 else '':>6} {statistics.median(whole):17.1f} {all_decided:10,} "
                  f"{per:12.1f}")
    print(f"half free: a quarter of the GPUs busy with normal work, a quarter with best-effort (the pass places "
          f"thousands); full: every GPU held, one node in 8 best-effort (the steady state). decisions: placements, "
          f"preemptions and reservations the pass made, at most max_starts={MAX_STARTS} starts a pass (the runtime "
          f"passes again at once); uncapped: the same pass with no cap (max_starts=None); us/decision: its CPU less "
          f"a pass with one job queued (the setup: nodes, attempts), per decision")


def reclaims(sizes: list[int], runs: int, queued: int = 10_000) -> None:
    """A full fleet of borrowers' normal work (4 two-GPU attempts a node, the 10 projects without a guarantee)
    and ``queued`` normal jobs of the 10 guaranteed ones (each guaranteed a 20th of the fleet), single jobs
    or one in 10 a 2-node gang: every placement is a reclaim. CPU p50 of a (capped) pass."""
    print(f"scheduler.schedule, reclaims: {queued:,} queued of 10 guaranteed projects, a full fleet of borrowers "
          f"(runs={runs}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f})")
    print(f"{'GPUs':>7} {'jobs':>7} {'CPU p50 ms':>11} {'p99':>8} {'victims':>8}")
    for gpus in sizes:
        n = gpus // 8
        nodes = [NodeState(f"node{i:05d}", tuple(str(g) for g in range(8)), cpus=64.0) for i in range(n)]
        running = [Running(1_000_000 + 4 * i + k, 1, "normal", ((f"node{i:05d}", (str(2 * k), str(2 * k + 1))),),
                           float(4 * i + k), cpus=4.0, project=PROJECTS[1 + 2 * ((i + k) % 10)])
                   for i in range(n) for k in range(4)]
        fair = FairShare({p: Share(guaranteed=gpus // 20 if j % 2 == 0 else 0) for j, p in enumerate(PROJECTS)})
        for gang in (False, True):
            pending = [Pending(i, "normal", [1, 2, 4, 8][i % 4], 2 if gang and i % 10 == 0 else 1, cpus=1.0,
                               project=PROJECTS[2 * (i % 10)]) for i in range(queued)]
            cpu = []
            for _ in range(runs):
                c0 = time.process_time()
                out = schedule(pending, nodes, running, fair=fair, now=1e6)
                cpu.append((time.process_time() - c0) * 1000)
            print(f"{gpus:7,} {'gangs' if gang else 'single':>7} {statistics.median(cpu):11.1f} {pct(cpu, 0.99):8.1f} "
                  f"{len(out.preemptions):8,}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--sizes", default="1000,3000,10000,30000")
    parser.add_argument("--fleets", default="", help="GPU counts (e.g. 512,4096,16384): one pass with 10,000 queued "
                        "at each fleet size instead (fair share on), p50 and p99")
    parser.add_argument("--reclaim", default="", help="GPU counts: a pass where every placement is a reclaim "
                        "(guaranteed projects taking GPUs back from borrowers), single jobs and gangs")
    args = parser.parse_args()
    if args.reclaim:
        return reclaims([int(g) for g in args.reclaim.split(",")], args.runs)
    if args.fleets:
        return fleets([int(g) for g in args.fleets.split(",")], args.runs)
    from rich.console import Console
    from rich.table import Table

    nodes, running = fleet()
    table = Table(title=f"scheduler.schedule, 128 x 8 GPUs, 20 projects (runs={args.runs}, {os.cpu_count()} cores, "
                        f"load {os.getloadavg()[0]:.1f})")
    for col in ("queued", "fair off: wall p50 (ms)", "p95", "CPU p50", "fair on: wall p50 (ms)", "p95", "CPU p50",
                "goal"):
        table.add_column(col, justify="right")
    for size in (int(s) for s in args.sizes.split(",")):
        pending = queue(size)
        off, off_cpu = time_pass(pending, nodes, running, None, args.runs)
        on, on_cpu = time_pass(pending, nodes, running, shares(), args.runs)
        table.add_row(f"{size:,}", f"{statistics.median(off):.1f}", f"{pct(off, 0.95):.1f}",
                      f"{statistics.median(off_cpu):.1f}", f"{statistics.median(on):.1f}", f"{pct(on, 0.95):.1f}",
                      f"{statistics.median(on_cpu):.1f}", "<= 50" if size == 10_000 else "")
    Console().print(table)


if __name__ == "__main__":
    main()
