"""The runtime's passes on the in-memory fake backend: priorities, preemption, retries,
gangs, timeouts and metrics, driven step by step with no process and no waiting.

Processes are not the point here (tests/runtime/test_jobs.py runs real ones): each test
acts out what attempts do (``fake.finish``, ``fake.fail``...) and runs a pass with
``api._runtime.tick()``, the way an attempt's on-exit hook would.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from autoresearch.api import Api
from autoresearch.backends.fake import FakeBackend
from autoresearch.errors import CapacityError


def setup(home: Path, **fleet: Any) -> tuple[Api, FakeBackend]:
    fake = FakeBackend(**fleet)
    return Api(home, backend=fake), fake


def submit(api: Api, **spec: Any) -> int:
    return int(api.submit({"command": ["train"], "workdir": os.getcwd(), **spec}).id)


def state(api: Api, job: int) -> Any:
    view = api.status(job, refresh=False)
    assert not isinstance(view, list)
    return view


def started(fake: FakeBackend) -> list[str]:
    return [a.key for a in fake.attempts()]


def test_queue_runs_by_priority_then_submit_order(home: Path) -> None:
    api, fake = setup(home, gpus=1)
    first = submit(api, gpus=1)
    low, normal, high = submit(api, gpus=1, priority="best-effort"), submit(api, gpus=1), submit(
        api, gpus=1, priority="critical")
    assert started(fake) == [f"{first}.1"]
    for job in (first, high, normal):
        fake.finish(f"{job}.1", 0)
        api._runtime.tick()
        assert state(api, job).state == "succeeded"
    assert started(fake) == [f"{first}.1", f"{high}.1", f"{normal}.1", f"{low}.1"]


def test_critical_job_preempts_best_effort_and_the_victim_runs_again(home: Path) -> None:
    api, fake = setup(home, gpus=2)
    victim = submit(api, gpus=2, priority="best-effort")
    urgent = submit(api, gpus=2, priority="critical")  # its pass stops the victim (SIGTERM kills it)
    assert fake.attempt(f"{victim}.1").stopped
    api._runtime.tick()
    view = state(api, victim)
    assert (view.state, view.attempt_list[0].end_reason) == ("queued", "preempted")
    assert state(api, urgent).state == "starting" and started(fake) == [f"{victim}.1", f"{urgent}.1"]
    fake.finish(f"{urgent}.1", 0)
    api._runtime.tick()
    assert started(fake)[-1] == f"{victim}.2"
    fake.finish(f"{victim}.2", 0)
    api._runtime.tick()
    assert state(api, victim).state == "succeeded" and state(api, victim).attempts == 2


def test_a_victim_that_ignores_sigterm_keeps_its_slots_until_killed_after_grace(home: Path) -> None:
    api, fake = setup(home, gpus=1)
    victim = submit(api, gpus=1, priority="best-effort", grace=30)
    fake.hang(f"{victim}.1")
    urgent = submit(api, gpus=1, priority="critical")
    api._runtime.tick()
    assert state(api, urgent).state == "queued" and [a.key for a in fake.running()] == [f"{victim}.1"]
    fake.advance(31)  # past the grace period: SIGKILL
    api._runtime.tick()
    assert state(api, victim).attempt_list[0].signal == signal.SIGKILL
    assert state(api, urgent).state == "starting"


def test_infra_failures_are_retried_user_failures_are_not(home: Path) -> None:
    api, fake = setup(home, gpus=1)
    lost = submit(api, max_retries=2)
    fake.fail(f"{lost}.1", "supervisor died")
    api._runtime.tick()
    fake.kill(f"{lost}.2", signal.SIGKILL)  # a signal nobody sent, no machine evidence: unknown, retried
    api._runtime.tick()
    fake.fail(f"{lost}.3")
    api._runtime.tick()
    view = state(api, lost)
    # a lost attempt the machine did not confirm is infra-suspect (docs/health.md), retried like infra
    assert (view.state, view.attempts, view.failure_class) == ("failed", 3, "infra-suspect")
    assert view.attempt_list[1].failure_class == "unknown"
    assert view.attempt_list[0].detail == "supervisor died"
    crashed = submit(api)
    fake.kill(f"{crashed}.1", signal.SIGSEGV)  # its own fault
    api._runtime.tick()
    assert (state(api, crashed).state, state(api, crashed).attempts) == ("failed", 1)


def test_a_crashed_node_loses_its_attempts_which_run_again_elsewhere(home: Path) -> None:
    api, fake = setup(home, nodes=2, gpus=1)
    job = submit(api, gpus=1)
    node = fake.attempt(f"{job}.1").request.node
    fake.crash_node(node)
    api._runtime.tick()
    view = state(api, job)
    assert view.attempt_list[0].end_reason == "infra" and f"node {node} crashed" in view.attempt_list[0].detail
    assert view.attempts == 2 and fake.attempt(f"{job}.2").request.node not in (None, node)
    assert {n.name: n.state for n in api.nodes()}[node] == "down"


def test_gang_jobs_take_whole_nodes_and_capacity_still_counts(home: Path) -> None:
    api, fake = setup(home, nodes=2, gpus=1)
    gang = submit(api, nodes=2, gpus=1)
    assert fake.attempt(f"{gang}.1").request.nodes == 2
    with pytest.raises(CapacityError, match="only 2 exist"):
        submit(api, nodes=3)


def test_timeout_falls_due_on_the_fake_clock(home: Path) -> None:
    api, fake = setup(home)
    job = submit(api, timeout=3600, grace=5)
    fake.advance(3599)
    api._runtime.tick()
    assert state(api, job).state == "running"
    fake.advance(2)
    api._runtime.tick()
    view = state(api, job)
    assert (view.state, view.end_reason, view.attempts) == ("failed", "timeout", 1)


def test_logs_and_metrics_come_through_the_backend(home: Path) -> None:
    api, fake = setup(home)
    job = submit(api)
    for step in range(3):
        fake.report(f"{job}.1", step=step, loss=1.0 / (step + 1))
    fake.emit(f"{job}.1", "val_bpb: 0.9979\ndone\n")
    fake.finish(f"{job}.1", 0)
    api._runtime.tick()
    assert "done" in api.logs(job).text
    by_name = {m.name: m for m in api.metrics(job, series=True)}
    assert by_name["loss"].series == [(0, 1.0), (1, 0.5), (2, pytest.approx(1 / 3))]
    assert by_name["val_bpb"].last == pytest.approx(0.9979)
    assert fake.attempt(f"{job}.1").released  # the runtime let go of it once it was recorded


def test_cancel_stops_a_running_attempt(home: Path) -> None:
    api, fake = setup(home)
    job = submit(api)
    api.cancel([job])
    api._runtime.tick()
    assert fake.attempt(f"{job}.1").stopped and state(api, job).state == "cancelled"


def test_a_pass_capped_at_max_starts_is_followed_by_another_at_once(home: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The scheduler stops a pass after ``MAX_STARTS`` starts (``capped``); the runtime passes again at once,
    so one tick starts everything that fits, a few jobs a pass."""
    from autoresearch.engine import scheduler

    monkeypatch.setattr(scheduler, "MAX_STARTS", 2)
    api, fake = setup(home, gpus=5)
    big = submit(api, gpus=5)
    small = [submit(api, gpus=1) for _ in range(5)]
    assert started(fake) == [f"{big}.1"]
    fake.finish(f"{big}.1", 0)
    api._runtime.tick()
    assert sorted(started(fake)) == sorted([f"{big}.1", *(f"{job}.1" for job in small)])
