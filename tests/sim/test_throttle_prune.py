"""The sim driver keeps, of a node's throttling findings, only the latest poll's (sim/driver.py
``_latest_throttle``): the health policy's answer on the pruned list equals its answer on the whole
one, for random mixes of throttling, NVML errors, hard faults and infra endings, clearings and states."""

from __future__ import annotations

import random

import pytest

from autoresearch.health import policy as P
from autoresearch.health.config import HealthConfig
from autoresearch.health.findings import Finding
from autoresearch.sim.driver import _latest_throttle

KINDS = (("thermal_throttle", "throttle", "soft", "nvml"), ("nvml_error", "infra", "soft", "nvml"),
         ("xid_79", "infra", "hard", "nvml"), ("nccl_error", "infra", "soft", "ending"),
         ("nccl_error", P.SUSPECT, "soft", "ending"), ("power_brake", "throttle", "soft", "nvml"))


def _findings(rng: random.Random, now: float) -> list[Finding]:
    out = []
    for _ in range(rng.randint(0, 30)):
        sig, cls, sev, source = rng.choices(KINDS, weights=(6, 2, 0.15, 1, 1, 3))[0]
        ts = now - rng.choice((0.0, 30.0, 60.0, 590.0, 610.0, 1800.0, 4000.0)) - rng.choice((0.0, 0.5))
        out.append(Finding("n1", sig, cls, sev, source, str(rng.randrange(8)), f"{sig} at {ts}", ts,
                           rng.randrange(6) if source == "ending" else None))
    out.sort(key=lambda f: f.ts)
    return out


@pytest.mark.parametrize("seed", range(200))
def test_the_policy_answers_the_same_on_the_latest_throttling_only(seed: int) -> None:
    rng = random.Random(seed)
    now = 10_000.0
    found = _findings(rng, now)
    pruned = _latest_throttle(found)
    assert len(pruned) <= len(found)
    cleared = rng.choice((0.0, now - 620.0, now - 45.0))
    current = rng.choice((P.NodeStatus("healthy", "", 0.0, cleared),
                          P.NodeStatus("degraded", P.PREFIX + "throttling", now - 900.0, cleared)))
    config = HealthConfig()
    assert P.node_state(current, pruned, config, now) == P.node_state(current, found, config, now)


def test_only_older_throttling_goes() -> None:
    keep = [Finding("n1", "xid_79", "infra", "hard", "nvml", "0", "x", 5.0),
            Finding("n1", "thermal_throttle", "throttle", "soft", "nvml", "1", "new", 90.0),
            Finding("n1", "thermal_throttle", "throttle", "soft", "nvml", "2", "new too", 90.0)]
    old = [Finding("n1", "thermal_throttle", "throttle", "soft", "nvml", "1", "old", 60.0)]
    assert _latest_throttle([keep[0], *old, *keep[1:]]) == keep
