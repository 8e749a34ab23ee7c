"""The job store's units of work stay whole: what the engine did in one transaction is one
method and one transaction (an error half-way writes nothing), and a unit that finds
another process got there first writes nothing and says so. Real SQLite, the fake backend."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from autoresearch.api import Api
from autoresearch.backends import AttemptStatus
from autoresearch.backends.fake import FakeBackend
from autoresearch.store.jobstore import JobStore


def running_job(home: Path) -> tuple[Api, JobStore, int]:
    api = Api(home, backend=FakeBackend(gpus=1))
    job = int(api.submit({"command": ["train"], "workdir": os.getcwd(), "gpus": 1}).id)
    api._runtime.tick()
    return api, JobStore(api._runtime.ledger), job


def test_an_ending_whose_rule_fails_half_way_leaves_the_attempt_and_its_job_as_they_were(home: Path) -> None:
    api, jobs, job = running_job(home)
    ended = AttemptStatus("exited", exit_code=0, ended_at=1.0)

    def broken(_job: Any) -> tuple[str, int]:
        raise RuntimeError("the rule broke after the attempt's row was written")

    with pytest.raises(RuntimeError):
        jobs.end_attempt(job, 1, ended, "exit", "exited 0", broken)
    assert [a["state"] for a in jobs.active_attempts("fake")] == ["running"]  # the attempt's update rolled back
    assert api.status(job, refresh=False).state == "running"  # type: ignore[union-attr]

    assert jobs.end_attempt(job, 1, ended, "exit", "exited 0", lambda j: ("succeeded", j["retries_used"])) == \
        "succeeded"
    assert jobs.end_attempt(job, 1, ended, "exit", "exited 0", lambda j: ("failed", 0)) is None  # already ended
    assert api.status(job, refresh=False).state == "succeeded"  # type: ignore[union-attr]


def test_an_attempt_begins_only_for_a_queued_job(home: Path) -> None:
    _, jobs, job = running_job(home)
    assert jobs.begin_attempt(job, "node-0", ("0",), home / "jobs" / str(job)) is None  # it has one already
    assert [(a["job_id"], a["n"]) for a in jobs.active_attempts("fake")] == [(job, 1)]


def test_a_chunk_someone_else_stored_is_not_stored_twice(home: Path) -> None:
    _, jobs, job = running_job(home)
    att = jobs.attempt(job, 1)
    assert att is not None
    point = [(job, 1, "loss", 1, 0.5, 1.0, "report")]
    assert jobs.store_points(att, (0, 0), point, (10, 0), {}, (0, ""))
    assert not jobs.store_points(att, (0, 0), point, (10, 0), {}, (0, ""))  # offsets moved: another process did it
    assert [(p["name"], p["value"]) for p in jobs.metric_points(job)] == [("loss", 0.5)]
    assert not jobs.skip_chunk(att, (0, 0), (20, 0), "unreadable")
    assert jobs.attempt(job, 1)["metrics_offset"] == 10  # type: ignore[index]
