"""One scheduling pass with fair share on: queue size x fleet (issue 11).

    python bench/bench_scheduler.py [--runs 7] [--sizes 1000,3000,10000,30000]

A fleet of 128 nodes x 8 GPUs (1,024 GPUs), a quarter of it busy with normal work and a
quarter with preemptible best-effort work, 20 projects (weights 1-4, a GPU quota on half
of them), a mix of classes, job sizes 1-8 GPUs and some 2- and 4-node gangs. Prints the
median and p95 wall time (and the median CPU time, which a loaded machine distorts least) of
``scheduler.schedule`` with fair share off and on at each queue size. ``--fleets`` prints, per fleet
size, the pure pass and a kept one (``Scheduler``) on a half-free fleet, a full one and a reclaim storm.
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
    Scheduler,
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


def storm(gpus: int, queued: int = 10_000, gangs: bool = False) -> tuple[list[NodeState], list[Running],
                                                                        list[Pending], FairShare]:
    """A reclaim storm: a full fleet of borrowers' normal work (4 two-GPU attempts a node, the 10 projects
    without a guarantee) and ``queued`` normal jobs of the 10 guaranteed ones (each guaranteed a 20th of the
    fleet), single jobs (or one in 10 a 2-node gang): every placement is a reclaim."""
    n = gpus // 8
    nodes = [NodeState(f"node{i:05d}", tuple(str(g) for g in range(8)), cpus=64.0) for i in range(n)]
    running = [Running(1_000_000 + 4 * i + k, 1, "normal", ((f"node{i:05d}", (str(2 * k), str(2 * k + 1))),),
                       float(4 * i + k), cpus=4.0, project=PROJECTS[1 + 2 * ((i + k) % 10)])
               for i in range(n) for k in range(4)]
    fair = FairShare({p: Share(guaranteed=gpus // 20 if j % 2 == 0 else 0) for j, p in enumerate(PROJECTS)})
    pending = [Pending(i, "normal", [1, 2, 4, 8][i % 4], 2 if gangs and i % 10 == 0 else 1, cpus=1.0,
                       project=PROJECTS[2 * (i % 10)]) for i in range(queued)]
    return nodes, running, pending, fair


def time_kept(pending: list[Pending], nodes: list[NodeState], running: list[Running], runs: int,
              step: float = 0.0, **kwargs: object) -> tuple[list[float], object]:
    """CPU milliseconds per pass of one :class:`Scheduler` handed the same inputs again and again (its
    records, queue and reclaim heaps kept; no holds carried, so each pass decides what the pure pass
    decides), after a first pass that builds them. ``step``: each pass ``now`` later by this many seconds
    (as the runtime passes: the work a victim would lose grows, so the kept bounds are priced again at the
    top); each of those passes is checked against the pure pass at its ``now``."""
    sched = Scheduler()
    now = float(kwargs.pop("now", 1e6)) if step else kwargs.get("now")  # type: ignore[arg-type]
    at = {"now": now} if step else {}
    out = sched.schedule(pending, nodes, running, held={}, **at, **kwargs)  # type: ignore[arg-type]
    cpu = []
    for _ in range(runs):
        if step:
            now = at["now"] = now + step  # type: ignore[operator]
        c0 = time.process_time()
        out = sched.schedule(pending, nodes, running, held={}, **at, **kwargs)  # type: ignore[arg-type]
        cpu.append((time.process_time() - c0) * 1000)
        if step:
            assert out == schedule(pending, nodes, running, held={}, **at, **kwargs), "kept and pure differ"  # type: ignore[arg-type]
    return cpu, out


def fleets(sizes: list[int], runs: int, queued: int = 10_000) -> None:
    """A pass with ``queued`` jobs at each fleet size (8-GPU nodes), fair share on: CPU p50 and p99 of the
    pure pass (``schedule``) and of a kept one (``Scheduler``, its records and queue kept between passes)."""
    print(f"scheduler, {queued:,} queued, fair share on, 20 projects (runs={runs}, {os.cpu_count()} cores, "
          f"load {os.getloadavg()[0]:.1f}); CPU ms")
    head = (f"{'GPUs':>7} {'scenario':>13} {'pure p50':>9} {'p99':>7} {'kept p50':>9} {'p99':>7} {'kept +5 s':>10} "
            f"{'p99':>7} {'decisions':>10} "
            f"{'goal':>6} {'uncapped p50':>13} {'decisions':>10}")
    print(head)
    print("-" * len(head))
    pending = queue(queued)
    for gpus in sizes:
        cases: list[tuple[str, list[Pending], list[NodeState], list[Running], dict[str, object]]] = []
        for name, make in (("half free", fleet), ("full", full_fleet)):
            nodes, running = make(gpus // 8)
            cases.append((name, pending, nodes, running, {"fair": shares()}))
        for gangs in (False, True):
            nodes, running, jobs, fair = storm(gpus, queued, gangs)
            cases.append(("reclaim gangs" if gangs else "reclaim", jobs, nodes, running, {"fair": fair, "now": 1e6}))
        for name, jobs, nodes, running, kwargs in cases:
            cpu = []
            for _ in range(runs):
                c0 = time.process_time()
                out = schedule(jobs, nodes, running, **kwargs)  # type: ignore[arg-type]
                cpu.append((time.process_time() - c0) * 1000)
            kept, again = time_kept(jobs, nodes, running, runs, **kwargs)
            assert again == out, f"{name}: the kept pass decided otherwise than the pure one"
            moving, _ = time_kept(jobs, nodes, running, runs, step=5.0, **kwargs)
            decided = len(out.placements) + len(out.preemptions) + len(out.reserved)
            uncapped = all_decided = ""
            if not name.startswith("reclaim"):
                _, whole = time_pass(jobs, nodes, running, shares(), runs, max_starts=None)
                every = schedule(jobs, nodes, running, fair=shares(), max_starts=None)
                uncapped = f"{statistics.median(whole):.1f}"
                all_decided = f"{len(every.placements) + len(every.preemptions) + len(every.reserved):,}"
            print(f"{gpus:7,} {name:>13} {statistics.median(cpu):9.1f} {pct(cpu, 0.99):7.1f} "
                  f"{statistics.median(kept):9.1f} {pct(kept, 0.99):7.1f} {statistics.median(moving):10.1f} "
                  f"{pct(moving, 0.99):7.1f} {decided:10,} "
                  f"{'<= 20' if gpus == 16_384 else '':>6} {uncapped:>13} {all_decided:>10}")
    print(f"half free: a quarter of the GPUs busy with normal work, a quarter with best-effort (the pass places "
          f"thousands); full: every GPU held, one node in 8 best-effort (the steady state); reclaim: a full fleet "
          f"of borrowers and 10,000 queued of 10 guaranteed projects, every placement a reclaim (gangs: one in 10 a "
          f"2-node gang). pure: schedule(); kept: one Scheduler passing again on the same inputs; kept +5 s: the same "
          f"with now 5 s later each pass (as the runtime passes), each pass checked against the pure one. decisions: "
          f"placements, preemptions and reservations, at most max_starts={MAX_STARTS} starts a pass (the runtime "
          f"passes again at once); uncapped: the pure pass with no cap (max_starts=None)")


def reclaims(sizes: list[int], runs: int, queued: int = 10_000) -> None:
    """:func:`storm` at each fleet size: CPU p50 of a (capped) pure pass."""
    print(f"scheduler.schedule, reclaims: {queued:,} queued of 10 guaranteed projects, a full fleet of borrowers "
          f"(runs={runs}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f})")
    print(f"{'GPUs':>7} {'jobs':>7} {'CPU p50 ms':>11} {'p99':>8} {'victims':>8}")
    for gpus in sizes:
        for gang in (False, True):
            nodes, running, pending, fair = storm(gpus, queued, gang)
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
