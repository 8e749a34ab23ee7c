"""The simulated fleet's driver keeps the scheduler's inputs between passes (the queued jobs' views it
sees, the live attempts' views), changed on submit, start, end and stop and by the heaps of waits and
checkpoints: at every pass of seeded random runs (gangs, sweeps, best-effort soak that gets preempted,
retries after faults, group caps, a small SHAPE_CAP so jobs move in and out of view) they equal a fresh
build's. And the figures of small seeded weeks are pinned: the same seed gives the same passes, attempts,
goodput and Jain's index as the driver that built its views afresh each pass."""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path
from typing import Any

import pytest

from autoresearch.engine import scheduler as S
from autoresearch.engine.scheduler import FairShare, Share
from autoresearch.sim import driver as D
from autoresearch.sim.fleet import parse

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import bench_sim_week as B  # noqa: E402

HOT = {**B.FAULTS, "node_loss": 0.01, "xid": 0.02, "nccl_hang": 0.02, "thermal": 0.05}


def _fresh_pending(d: D.Driver, t: float) -> list[tuple[Any, ...]]:
    """What the scheduler must see of the queue: the first SHAPE_CAP queued jobs of each shape, by id."""
    ids = sorted(i for ids in d.queues.values() for i in ids[:D.SHAPE_CAP] if d.jobs[i].state == "queued")
    out = []
    for i in ids:
        job = d.jobs[i]
        out.append((job.id, job.priority, job.gpus, job.nodes, job.cpus, job.memory, frozenset(job.avoid),
                    job.project, job.group, t - job.queued_since >= D.RESERVE_AFTER_S))
    return out


def _seen_pending(views: list[S.Pending]) -> list[tuple[Any, ...]]:
    return [(p.job_id, p.priority, p.gpus, p.nodes, p.cpus, p.memory, p.avoid, p.project, p.group,
             p.waited_s >= D.RESERVE_AFTER_S) for p in views]


def _fresh_running(d: D.Driver, t: float) -> list[S.Running]:
    out = []
    for att in d.running.values():
        saved = max((at for at, _ in att.life.checkpoints if at <= t), default=None)
        if att.stopping or att.job.priority != "best-effort":
            saved = None  # (it weighs only in a best-effort attempt's price: test_scheduler_saved_at.py)
        out.append(S.Running(att.job.id, att.n, att.job.priority, att.alloc, att.rec.t0, att.job.cpus,
                             att.job.memory, stopping=att.stopping, project=att.job.project, saved_at=saved))
    return out


class _Checked(D.Driver):
    """The driver, its kept views compared with a fresh build's at every pass."""

    checks = 0

    def _queue_views(self, t: float) -> list[S.Pending]:
        views = super()._queue_views(t)
        assert _seen_pending(views) == _fresh_pending(self, t)
        return views

    def _running_views(self, t: float) -> list[S.Running]:
        views = super()._running_views(t)
        assert views == _fresh_running(self, t)
        self.checks += 1
        return views


def _jobs(rng: random.Random, horizon: float, nodes: int) -> list[D.Job]:
    jobs: list[D.Job] = []
    for i in range(rng.randint(40, 120)):
        kind = rng.choice(("gang", "sweep", "sweep", "soak"))
        steps = rng.randint(1, 8)
        step_s = rng.uniform(60, 600)
        priority = {"gang": rng.choice(("critical", "normal")), "sweep": "normal", "soak": "best-effort"}[kind]
        gpus, n = (8, rng.randint(2, min(4, nodes))) if kind == "gang" else (rng.choice((1, 2, 8)), 1)
        jobs.append(D.Job(i + 1, priority, gpus, n, (step_s,) * steps, rng.uniform(0, horizon / 2),
                          rng.choice((0, 1, 3)), kind, project=f"p{rng.randrange(3)}",
                          group="g" if kind == "sweep" and rng.random() < 0.3 else ""))
    return jobs


@pytest.mark.parametrize("seed", range(6))
def test_kept_views_equal_a_fresh_build_at_every_pass(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(D, "SHAPE_CAP", 3)  # jobs come into view and leave it often
    rng = random.Random(seed)
    nodes = rng.randint(3, 6)
    fleet = parse([{"name": "h100", "count": nodes, "gpus": 8}], HOT, seed)
    horizon = 86400.0
    fair = FairShare({"p0": Share(1.0), "p1": Share(2.0), "p2": Share(1.0)}) if seed % 2 else None
    d = _Checked(fleet, _jobs(rng, horizon, nodes), horizon, cordon=seed % 3 != 0, fair=fair,
                 group_caps={"g": 2})
    stats = d.run()
    assert d.checks > 20 and stats.attempts > 20
    if seed == 0:
        assert stats.lost_preempt_gpu_s > 0  # (a run that stops best-effort attempts)


def _pinned(nodes: int, days: float, fair: bool, cordon: bool, caps: bool) -> tuple[Any, ...]:
    fleet = parse([{"name": "h100", "count": nodes, "gpus": 8}], HOT, 7)
    h = days * 86400
    jobs = B.shared_mix(7, h, nodes) if fair else B.misbehave(B.job_mix(7, h, nodes), 7, 0.05, 0.02)
    if caps:
        for job in jobs:
            if job.kind == "sweep":
                job.group = job.project
    s = D.Driver(fleet, jobs, h, cordon=cordon, fair=FairShare({p: Share(w) for p, w in B.PROJECTS.items()})
                 if fair else None, group_caps={j.group: 4 for j in jobs if j.group}).run()
    return (s.passes, s.attempts, round(s.goodput, 9), round(B.jain(s), 9), s.cordons, s.jobs_done, s.jobs_failed,
            round(s.lost_preempt_gpu_s / 3600, 3))


@pytest.mark.parametrize(("run", "figures"), [
    # (nodes, days, fair share, cordons, group caps): passes, attempts, goodput, Jain, cordons, done, failed,
    # GPU-hours lost to preemption; what the driver that built its views afresh every pass gave (with the
    # scheduler that holds the slots it freed for a job)
    ((16, 1, True, True, False), (448, 172, 0.703050177, 0.940696814, 12, 113, 1, 34.029)),
    ((12, 1, False, True, True), (95, 57, 0.72041755, 0.0, 9, 11, 2, 72.334)),
    ((12, 2, False, False, False), (306, 993, 0.233488845, 0.0, 0, 111, 284, 67.124)),
])
def test_a_seeded_run_gives_the_pinned_figures(run: tuple[Any, ...], figures: tuple[Any, ...]) -> None:
    assert _pinned(*run) == figures
    assert math.isfinite(figures[2])
