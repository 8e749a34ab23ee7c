"""The simulated driver's fleet differential (``Driver._differential``, what HealthStore.differential reads)
counts the nodes up for work from the few unhealthy ones and reads a job's endings on the nodes its verdicts
went to, not the whole fleet: at every call of several seeded runs with faults, misbehaving jobs and gangs,
its answer is the one walking every node's status and findings gives."""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

import pytest

from autoresearch.health import policy as P
from autoresearch.health.findings import Finding
from autoresearch.sim import driver as D
from autoresearch.sim.fleet import parse

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import bench_sim_week as B  # noqa: E402

HOT = {**B.FAULTS, "node_loss": 0.005, "xid": 0.03, "nccl_hang": 0.03, "thermal": 0.05}


class _Checked(D.Driver):
    """The driver, each differential compared with a walk of the whole fleet."""

    calls = 0
    answered = 0

    def _differential(self, node: str, found: list[Finding], t: float) -> P.Differential | None:
        got = super()._differential(node, found, t)
        since = t - self.health.cordon_window_s
        jobs = {f.job_id for f in found if f.source == "ending" and f.job_id is not None and f.ts >= since}
        if not jobs:
            assert got is None
            return got
        assert got is not None
        others = sum(1 for n, st in self.status.items() if n != node and st.state in ("healthy", "degraded"))
        elsewhere = {f.job_id for n, fs in self.findings.items() if n != node for f in fs
                     if f.source == "ending" and f.job_id in jobs and f.ts >= since}
        assert got.other_nodes == others
        assert got.failed_elsewhere == frozenset(j for j in elsewhere if j is not None)
        type(self).calls += 1
        type(self).answered += bool(got.failed_elsewhere)
        return got


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_the_differential_reads_the_same_as_a_walk_of_the_fleet(seed: int) -> None:
    rng = random.Random(seed)
    nodes = rng.choice((8, 12, 16))
    horizon = 2 * 86400.0
    fleet = parse([{"name": "h100", "count": nodes, "gpus": 8}], HOT, seed)
    jobs = B.misbehave(B.job_mix(seed, horizon, nodes), seed, 0.15, 0.05)
    driver: Any = _Checked(fleet, jobs, horizon)
    driver.run()


def test_the_check_sees_differentials_with_endings_elsewhere() -> None:
    """(The runs above reach the interesting case: a job whose endings were filed on more than one node.)"""
    _Checked.calls = _Checked.answered = 0
    for seed in (1, 2, 3, 4):
        test_the_differential_reads_the_same_as_a_walk_of_the_fleet(seed)
    assert _Checked.calls > 20
    assert _Checked.answered > 0
