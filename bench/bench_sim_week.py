"""A simulated week of a 512-GPU fleet (64 nodes x 8) with faults on: cordon policy on vs off.

The same seed gives both runs the same jobs and the same faults; only the health policy
differs (autoresearch/sim/driver.py: the pure scheduler places and preempts, the pure
health policy cordons). Job mix: gang jobs of 2-8 whole nodes (critical or normal,
checkpoint every 30 min), sweeps of 1-GPU trials (normal, checkpoint every 15 min), and a
best-effort soak backlog of whole-node jobs (checkpoint every hour) that fills idle GPUs.

    python bench/bench_sim_week.py [--seed 7] [--nodes 64] [--days 7]
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_runtime import pct  # noqa: E402

from autoresearch.sim.driver import Driver, Job, Stats  # noqa: E402
from autoresearch.sim.fleet import parse  # noqa: E402

FAULTS = {"node_loss": 0.001, "xid": 0.002, "nccl_hang": 0.002, "thermal": 0.005, "repair": "4h",
          "unattended_repair": "24h", "hang_timeout": "10m", "thermal_for": "2h", "thermal_slowdown": 1.5}


def job_mix(seed: int, horizon: float, nodes: int) -> list[Job]:
    rng = random.Random(seed)
    jobs: list[Job] = []

    def add(priority: str, gpus: int, n_nodes: int, hours: float, step_min: float, ckpt_steps: int, at: float,
            kind: str) -> None:
        steps = max(1, round(hours * 60 / step_min))
        jobs.append(Job(len(jobs) + 1, priority, gpus, n_nodes, (hours * 3600 / steps,) * steps, at, ckpt_steps,
                        kind))

    scale = nodes / 64
    t = 0.0
    while True:  # gang jobs: about one every 1.4 h at 64 nodes, ~half the fleet
        t += rng.expovariate(scale / 5000.0)
        if t >= horizon:
            break
        add("critical" if rng.random() < 0.3 else "normal", 8, rng.randint(2, 8),
            rng.lognormvariate(math.log(8), 0.5), 5.0, 6, t, "gang")
    t = 0.0
    while True:  # sweeps: 32-128 one-GPU trials of ~2 h every ~6 h
        t += rng.expovariate(scale / 21600.0)
        if t >= horizon:
            break
        for _ in range(rng.randint(32, 128)):
            add("normal", 1, 1, rng.lognormvariate(math.log(2), 0.4), 5.0, 3, t, "sweep")
    for _ in range(int(200 * scale)):  # the soak: a best-effort backlog from the start
        add("best-effort", 8, 1, rng.lognormvariate(math.log(12), 0.3), 15.0, 4, rng.uniform(0, 3600), "soak")
    return jobs


def run(seed: int, nodes: int, days: float, cordon: bool) -> tuple[Stats, float, float]:
    fleet = parse([{"name": "h100", "count": nodes, "gpus": 8}], FAULTS, seed)
    horizon = days * 86400
    started, cpu = time.perf_counter(), time.process_time()
    stats = Driver(fleet, job_mix(seed, horizon, nodes), horizon, cordon=cordon).run()
    return stats, time.perf_counter() - started, time.process_time() - cpu


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--days", type=float, default=7.0)
    args = parser.parse_args()
    rows = []
    for cordon in (True, False):
        stats, wall, cpu = run(args.seed, args.nodes, args.days, cordon)
        rows.append((cordon, stats, wall, cpu))
    gpus = args.nodes * 8
    print(f"simulated {args.days:g} days of {gpus} GPUs ({args.nodes} nodes x 8), seed {args.seed}, faults {FAULTS}")
    print()
    head = (f"{'cordon':8} {'goodput':>8} {'busy':>6} {'lost fault':>11} {'lost preempt':>13} {'failed':>7} "
            f"{'done':>6} {'attempts':>9} {'cordons':>8} {'fault hits':>32} {'wall s':>7} {'cpu s':>6}")
    print(head)
    print("-" * len(head))
    for cordon, s, wall, cpu in rows:
        hits = ", ".join(f"{k} {v}" for k, v in sorted(s.faults_hit.items()))
        print(f"{'on' if cordon else 'off':8} {100 * s.goodput:7.1f}% {100 * s.busy_gpu_s / s.capacity_gpu_s:5.1f}% "
              f"{s.lost_fault_gpu_s / 3600:9.0f} h {s.lost_preempt_gpu_s / 3600:11.0f} h {s.jobs_failed:7d} "
              f"{s.jobs_done:6d} {s.attempts:9d} {s.cordons:8d} {hits:>32} {wall:7.1f} {cpu:6.1f}")
    print()
    head = f"{'cordon':8} {'class':12} {'jobs':>6} {'wait p50':>10} {'wait p95':>10}"
    print(head)
    print("-" * len(head))
    for cordon, s, _, _ in rows:
        for cls in ("critical", "normal", "best-effort"):
            waits = s.waits.get(cls, [])
            if waits:
                print(f"{'on' if cordon else 'off':8} {cls:12} {len(waits):6d} {pct(waits, 0.5) / 60:8.1f} m "
                      f"{pct(waits, 0.95) / 60:8.1f} m")
    print("\ngoodput: GPU-hours of work kept (reached a checkpoint or the end) / GPU-hours of the fleet; "
          "lost: GPU-hours since the last checkpoint of attempts ended by a fault or a preemption; "
          "waits: submit to first start (jobs still queued at the end count their wait so far)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
