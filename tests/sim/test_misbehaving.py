"""Misbehaving jobs on the simulated fleet: printed fault-like lines and self-kills never cordon a node under
the policy whose evidence has an owner; the old, trusting one cordoned healthy nodes for them."""

from __future__ import annotations

from autoresearch.sim.driver import Driver, Job
from autoresearch.sim.fleet import parse

NO_FAULTS = {"node_loss": 0, "xid": 0, "nccl_hang": 0, "thermal": 0}


def jobs(kinds: tuple[str, ...]) -> list[Job]:
    out = []
    for i in range(60):
        behaviour = kinds[i % len(kinds)]
        out.append(Job(i + 1, "normal", 1, 1, (600.0,) * 6, i * 60.0, 2, "sweep", project=f"p{i % 3}",
                       behaviour=behaviour))
    return out


def run(policy: str, kinds: tuple[str, ...] = ("spoof", "selfkill", "")) -> Driver:
    fleet = parse([{"name": "h100", "count": 4, "gpus": 8}], NO_FAULTS, 3)
    driver = Driver(fleet, jobs(kinds), 86400.0, cordon=True, policy=policy)
    driver.run()
    return driver


def test_printed_faults_and_self_kills_never_cordon_and_are_retried() -> None:
    owner = run("owner")
    assert owner.stats.cordons == 0 and owner.stats.false_cordons == 0
    selfkills = [j for j in owner.jobs.values() if j.behaviour == "selfkill"]
    assert all(j.attempts == j.max_retries + 1 and j.state == "failed" for j in selfkills)  # unknown: retried
    assert all(j.state == "succeeded" for j in owner.jobs.values() if j.behaviour in ("", "spoof"))
    trusting = run("trusting")
    assert trusting.stats.false_cordons > 0 and trusting.stats.false_cordon_gpu_s > 0


def test_jobs_failing_with_nccl_lines_everywhere_cordon_fewer_nodes_than_before() -> None:
    """A job that fails the same way on every node is not evidence against one: the differential rule counts
    only failures its job (or project) did not also have elsewhere. (Several such jobs of two projects that
    first fail on the same node can still add up there: the rule weighs projects, not intent.)"""
    kinds = ("nccl_fail", "")
    owner, trusting = run("owner", kinds), run("trusting", kinds)
    assert owner.stats.false_cordons < trusting.stats.false_cordons
