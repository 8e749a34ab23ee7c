"""The scheduler's view of the running attempts is kept by the process that places: a placement
reads five numbers per running attempt and a whole row only for what it has not seen as it is now
(issue 16: with 400 jobs running, a submit's placement took 7.96 ms, 2.48 now)."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from autoresearch.api import Api
from autoresearch.backends.fake import FakeBackend
from autoresearch.engine import runtime as R
from autoresearch.store.jobstore import JobStore


def _truth(rt: R.Runtime) -> list[str]:
    """The view as a fresh read of every active attempt builds it (what placement read before)."""
    return sorted(map(repr, R._running(rt.jobs.placed(rt.backend.name))))


def _active(api: Api) -> int:
    return int(api._ledger.one("SELECT count(*) FROM attempts WHERE state IN ('starting','running')")[0])


def test_a_submit_beside_running_jobs_reads_only_the_attempts_it_has_not_seen(
        home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    api = Api(home, backend=FakeBackend(gpus=0))
    spec = {"command": ["train"], "workdir": os.getcwd()}
    api.submit_many([spec] * 40)
    api._runtime.tick()  # all 40 running
    api.submit(spec)  # (its placement reads the 40 as they run now)
    assert _active(api) == 41
    rows_read: list[int] = []
    real = JobStore.placed

    def placed(self: JobStore, backend: str, job_ids: object = None) -> list[object]:
        rows = real(self, backend) if job_ids is None else real(self, backend, job_ids)  # type: ignore[arg-type]
        rows_read.append(len(rows))
        return rows

    monkeypatch.setattr(JobStore, "placed", placed)
    for _ in range(10):
        api.submit(spec)  # each placement: the one launched by the submit before (and its start), not the 40
    assert _active(api) == 51
    assert sum(rows_read) <= 2 * 10, rows_read  # before: every running attempt's row, at every submit (>= 410)
    assert max(rows_read) <= 2, rows_read


def test_the_kept_view_is_what_a_fresh_read_builds_whatever_happened(home: Path) -> None:
    """Starts, stop requests, endings, preemptions and retries in random order: after each, the
    kept view is the one every active attempt's row gives (a second process sees the same)."""
    fake = FakeBackend(nodes=3, gpus=4)
    api = Api(home, backend=fake)
    rt = api._runtime
    other = R.Runtime(home, backend=fake.twin())  # another process's placement, seeing the same ledger
    rng = random.Random(7)
    spec = {"command": ["train"], "workdir": os.getcwd()}
    seen_stopping = seen_retry = False
    for step in range(160):
        running = fake.running()
        roll = rng.random()
        if roll < 0.35 or not running:
            api.submit({**spec, "gpus": rng.choice([0, 1, 2, 4]),
                        "priority": rng.choice(["critical", "normal", "best-effort", "best-effort"]),
                        "retry_on_exit_codes": [137]})
        elif roll < 0.55:
            fake.finish(rng.choice(running).key, rng.choice([0, 1, 137]))  # 137: an infra-like failure, retried
        elif roll < 0.7:
            api.cancel([int(rng.choice(running).key.split(".")[0])])  # a stop request, then its ending
        else:
            rt.tick()
        view = rt.running_view()
        assert sorted(map(repr, view)) == _truth(rt), step
        seen_stopping = seen_stopping or any(a.stopping for a in view)
        seen_retry = seen_retry or any(a.attempt > 1 for a in view)
        if step % 5 == 0:
            assert sorted(map(repr, other.running_view())) == _truth(rt), step
    assert seen_stopping and seen_retry  # (the walk went through stop requests and retried attempts)
    assert len(rt._running_seen) <= 2 * len(rt.running_view()) + 256 + 10
