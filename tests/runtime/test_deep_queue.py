"""A submit behind a deep queue on a full cluster costs what it costs behind an empty one (issue 16:
no scan of all jobs per event). Its pass used to read and place the whole queue (O(queue): ~9 us a
queued job, 28 ms a submit at 3,000 queued); when no queued job could start or preempt
(scheduler.nothing_starts) it now reads none of it. Counted in rows read, not timed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from autoresearch.store.jobstore import JobStore
from autoresearch.store.ledger import Ledger
from tests.conftest import wait_for, wait_state


@pytest.fixture
def rows_read(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Rows every ledger query of this process returned, one entry per query."""
    seen: list[int] = []
    real = Ledger.query

    def query(self: Ledger, sql: str, params: Any = ()) -> Any:
        out = real(self, sql, params)
        seen.append(len(out))
        return out

    monkeypatch.setattr(Ledger, "query", query)
    return seen


def spec(tmp_path: Path, **kw: Any) -> dict[str, Any]:
    return {"command": ["sleep", "60"], "workdir": str(tmp_path), "gpus": 1, **kw}


def test_a_submit_to_a_full_cluster_reads_the_same_rows_however_deep_the_queue(
        api: Any, tmp_path: Path, rows_read: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    hold = [api.submit(spec(tmp_path)).id for _ in range(2)]  # normal: nothing may preempt them
    for job in hold:
        wait_state(api, job, "running")
    placed_whole_queue: list[int] = []
    real_queued = JobStore.queued
    monkeypatch.setattr(JobStore, "queued", lambda self, backend: placed_whole_queue.append(1) or real_queued(self, backend))

    def rows_per_submit() -> int:
        rows_read.clear()
        api.submit(spec(tmp_path, priority="best-effort"))
        return sum(rows_read)

    shallow = [rows_per_submit() for _ in range(3)]
    api.submit_many([spec(tmp_path, priority="best-effort") for _ in range(300)])
    deep = [rows_per_submit() for _ in range(3)]
    assert placed_whole_queue == [] and max(deep) <= max(shallow), (shallow, deep)
    queued = [j.id for j in api.list_jobs(state="queued", limit=500).jobs]
    assert len(queued) == 306
    api.cancel(queued + hold)


def test_a_job_that_can_start_or_preempt_still_gets_its_placement(api: Any, tmp_path: Path) -> None:
    """Behind the same full cluster: a job that needs no GPU starts, a critical one stops a
    best-effort attempt for its slot, and a slot freed by an ending goes to the queue's head."""
    hold = [api.submit(spec(tmp_path, priority="best-effort")).id for _ in range(2)]
    for job in hold:
        wait_state(api, job, "running")
    waiting = [api.submit(spec(tmp_path, priority="best-effort", command=["true"])).id for _ in range(3)]
    gpuless = api.submit(spec(tmp_path, gpus=0, command=["true"])).id
    wait_state(api, gpuless, "succeeded")
    critical = api.submit(spec(tmp_path, priority="critical", command=["true"])).id
    wait_for(lambda: api.status(critical).state == "succeeded", timeout=60)
    preempted = [j for j in hold if any(a.end_reason == "preempted" for a in api.status(j).attempt_list)]
    assert preempted, "the critical job ran without stopping a best-effort one for its slot"
    api.cancel(hold)
    for job in waiting:
        wait_state(api, job, "succeeded")
