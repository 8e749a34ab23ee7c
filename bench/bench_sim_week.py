"""A simulated week of a 512-GPU fleet (64 nodes x 8) with faults on: cordon policy on vs off.

The same seed gives both runs the same jobs and the same faults; only the health policy
differs (autoresearch/sim/driver.py: the pure scheduler places and preempts, the pure
health policy cordons). Job mix: gang jobs of 2-8 whole nodes (critical or normal,
checkpoint every 30 min), sweeps of 1-GPU trials (normal, checkpoint every 15 min), and a
best-effort soak backlog of whole-node jobs (checkpoint every hour) that fills idle GPUs.

    python bench/bench_sim_week.py [--seed 7] [--nodes 64] [--days 7]
    python bench/bench_sim_week.py --scale 512,4096,16384 [--days 7]   # the fleet-size table
    python bench/bench_sim_week.py --scale 512 --days 30                # a simulated month of 512 GPUs

``--scale``: at each fleet size (GPUs), faults on, cordons on, preemption on, fair share between 8
projects (weights 1,1,1,1,2,2,4,4), every project with the same demand, more than the whole fleet
(the mix above plus a backlog of normal whole-node jobs per project): wall and CPU seconds, CPU per
simulated day, goodput and Jain's index over the projects' GPU-hours relative to their weights
(1: each got its weight's share), with fair share on and, at the first size, off.
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

from autoresearch.engine.scheduler import FairShare, Share  # noqa: E402
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


def misbehave(jobs: list[Job], seed: int, spoof: float, selfkill: float) -> list[Job]:
    """Give each job a project (gangs: one of 6 teams; sweeps: their own) and make ``spoof`` of them print
    fault-like lines (half a benign mention of an Xid, half an NCCL error line they exit 1 after) and
    ``selfkill`` of them kill themselves (SIGKILL) 30% into their run."""
    rng = random.Random(seed + 1)
    sweep = 0
    for job in jobs:
        if job.kind == "sweep":
            sweep += job.submit_t != (jobs[job.id - 2].submit_t if job.id > 1 else -1)
            job.project = f"sweep-{sweep}"
        else:
            job.project = f"team-{rng.randrange(6)}"
        roll = rng.random()
        if roll < spoof:
            job.behaviour = "spoof" if rng.random() < 0.5 else "nccl_fail"
        elif roll < spoof + selfkill:
            job.behaviour = "selfkill"
    return jobs


def run(seed: int, nodes: int, days: float, cordon: bool, policy: str = "owner", spoof: float = 0.0,
        selfkill: float = 0.0) -> tuple[Stats, float, float]:
    fleet = parse([{"name": "h100", "count": nodes, "gpus": 8}], FAULTS, seed)
    horizon = days * 86400
    started, cpu = time.perf_counter(), time.process_time()
    jobs = misbehave(job_mix(seed, horizon, nodes), seed, spoof, selfkill)
    stats = Driver(fleet, jobs, horizon, cordon=cordon, policy=policy).run()
    return stats, time.perf_counter() - started, time.process_time() - cpu


def misbehaving(args: argparse.Namespace) -> None:
    """The same week with misbehaving jobs: the policy whose evidence has an owner, the one that trusted
    job output (as before), and cordons off."""
    runs = [("owner", True), ("trusting", True), ("off", False)]
    print(f"\nthe same week, {100 * args.spoof:g}% of jobs printing fault-like lines (half a benign Xid mention, "
          f"half an NCCL error line, exit 1) and {100 * args.selfkill:g}% killing themselves (SIGKILL)")
    head = (f"{'policy':9} {'goodput':>8} {'cordons':>8} {'false':>6} {'faults caught':>14} "
            f"{'GPU-h false cordon':>19} {'GPU-h lost fault':>17} {'Xid to cordon p50/max s':>24} {'failed':>7} "
            f"{'done':>6} {'wall s':>7}")
    print(head)
    print("-" * len(head))
    for name, cordon in runs:
        s, wall, _ = run(args.seed, args.nodes, args.days, cordon, "trusting" if name == "trusting" else "owner",
                         args.spoof, args.selfkill)
        catch = f"{pct(s.catch_s, 0.5):.0f} / {max(s.catch_s):.0f}" if s.catch_s else "-"
        print(f"{name:9} {100 * s.goodput:7.1f}% {s.cordons:8d} {s.false_cordons:6d} {s.faults_caught:14d} "
              f"{s.false_cordon_gpu_s / 3600:19.0f} {s.lost_fault_gpu_s / 3600:17.0f} {catch:>24} {s.jobs_failed:7d} "
              f"{s.jobs_done:6d} {wall:7.1f}")
    print("owner: evidence has an owner (the machine's cordons; job output is a suspicion, differential rule); "
          "trusting: job output and outside signals counted as the machine's (as before); false: cordons of "
          "a node with no fault then; GPU-h false cordon: healthy GPUs kept out by them; Xid to cordon: from a GPU's "
          "Xid to its node's cordon, with the monitor polling every node each poll_interval (30 s)")


PROJECTS = {f"p{i}": w for i, w in enumerate((1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0))}


def shared_mix(seed: int, horizon: float, nodes: int) -> list[Job]:
    """The mix, each job in one of the 8 projects at random (same demand each), plus per project a backlog of
    normal whole-node jobs of ~6 h submitted over the horizon: half the fleet's GPU-hours each (every project
    wants more than its share: 4x the fleet in all)."""
    rng = random.Random(seed + 2)
    jobs = job_mix(seed, horizon, nodes)
    names = list(PROJECTS)
    for job in jobs:
        job.project = rng.choice(names)
    per = math.ceil(0.5 * nodes * horizon / (6 * 3600))
    for name in names:
        for _ in range(per):
            hours = rng.lognormvariate(math.log(6), 0.3)
            steps = max(1, round(hours * 12))
            jobs.append(Job(len(jobs) + 1, "normal", 8, 1, (hours * 3600 / steps,) * steps, rng.uniform(0, horizon),
                            6, "backlog", project=name))
    return jobs


def jain(stats: Stats) -> float:
    """Jain's fairness index over the projects' GPU-hours divided by their weights."""
    x = [stats.project_gpu_s.get(p, 0.0) / w for p, w in PROJECTS.items()]
    return sum(x) ** 2 / (len(x) * sum(v * v for v in x)) if any(x) else 0.0


def scale(args: argparse.Namespace) -> None:
    fair = FairShare({p: Share(w) for p, w in PROJECTS.items()})
    print(f"simulated {args.days:g} days, seed {args.seed}, faults {FAULTS}, cordons on, preemption on, 8 projects "
          f"(weights {', '.join(f'{w:g}' for w in PROJECTS.values())}), equal demand over the fleet's capacity")
    head = (f"{'GPUs':>7} {'fair':>5} {'wall s':>8} {'CPU s':>8} {'CPU s/day':>10} {'goodput':>8} {'Jain':>6} "
            f"{'passes':>7} {'attempts':>9} {'GPU-h by project / weight':>40}")
    print(head)
    print("-" * len(head))
    sizes = [int(g) for g in args.scale.split(",")]
    runs = [(sizes[0], None), *[(g, fair) for g in sizes]] if args.fair_off else [(g, fair) for g in sizes]
    for gpus, share in runs:
        nodes = gpus // 8
        fleet = parse([{"name": "h100", "count": nodes, "gpus": 8}], FAULTS, args.seed)
        horizon = args.days * 86400
        jobs = shared_mix(args.seed, horizon, nodes)
        started, cpu = time.perf_counter(), time.process_time()
        s = Driver(fleet, jobs, horizon, fair=share).run()
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        per = " ".join(f"{s.project_gpu_s.get(p, 0.0) / 3600 / w / 1000:.1f}" for p, w in PROJECTS.items())
        print(f"{gpus:7,} {'on' if share else 'off':>5} {wall:8.1f} {cpu:8.1f} {cpu / args.days:10.2f} "
              f"{100 * s.goodput:7.1f}% {jain(s):6.3f} {s.passes:7d} {s.attempts:9d} {per:>40}", flush=True)
    print("GPU-h by project / weight: thousands of GPU-hours each project's attempts held, over its weight "
          "(equal: fair); Jain's index over those (1.0: perfectly fair)")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--spoof", type=float, default=0.05, help="share of jobs printing fault-like lines")
    parser.add_argument("--selfkill", type=float, default=0.02, help="share of jobs killing themselves")
    parser.add_argument("--only-misbehaving", action="store_true", help="print only the misbehaving-jobs table")
    parser.add_argument("--scale", default="", help="fleet sizes in GPUs (e.g. 512,4096,16384): the fleet-size table")
    parser.add_argument("--fair-off", action="store_true", help="with --scale: also the first size with fair share off")
    args = parser.parse_args()
    if args.scale:
        scale(args)
        return 0
    if args.only_misbehaving:
        misbehaving(args)
        return 0
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
    misbehaving(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
