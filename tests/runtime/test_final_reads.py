"""A final state means all its output is read, or says how much is still being read.

Before, an attempt whose output at its end was more than one read's cap (16 chunks) was recorded
final with the rest never read (a warning said so), and a final read that met a chunk another
process had just stored (a metrics read racing the pass) stopped there: ``succeeded`` while
``metrics`` showed a fifth of the points, with no sign more were coming. Here the read's sizes are
made small, so a few thousand lines stand for a job printing faster than it can be read."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoresearch.api import Api
from autoresearch.backends.fake import FakeBackend
from autoresearch.engine import ingest

LINES = 3000


@pytest.fixture
def small_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ingest, "LOG_CHUNK", 4096)  # ~290 lines a chunk
    monkeypatch.setattr(ingest, "MAX_CHUNKS", 2)  # a read stops after ~580 of the 3,000


def _job_that_printed(api: Api, fake: FakeBackend, tmp_path: Path) -> int:
    job = api.submit({"command": ["train"], "workdir": str(tmp_path)}).id
    fake.emit(f"{job}.1", "".join(f"loss: {i}\n" for i in range(LINES)))
    fake.finish(f"{job}.1", 0)
    return job


def test_an_ending_before_all_output_is_read_says_how_much_is_left_until_it_is_read(
        home: Path, tmp_path: Path, small_reads: None) -> None:
    fake = FakeBackend()
    api = Api(home, backend=fake)
    job = _job_that_printed(api, fake, tmp_path)
    api.tick()

    view = api.status(job, refresh=False)
    assert view.state == "succeeded"
    assert 1000 < view.unread_points < 5000  # an estimate of the ~2,400 still to read
    assert any("still being read" in w for w in view.warnings)
    first = api.metrics(job, refresh=False)
    assert first[0].count < LINES and first[0].unread_points > 0  # partial, and it says so

    for _ in range(10):  # each metrics read reads on (as the pass daemon does)
        rows = api.metrics(job, refresh=False)
        if rows[0].unread_points == 0:
            break
    assert (rows[0].count, rows[0].step, rows[0].unread_points) == (LINES, LINES - 1, 0)
    assert rows[0].last == LINES - 1
    done = api.status(job, refresh=False)
    assert done.unread_points == 0 and not any("still being read" in w for w in done.warnings)


def test_a_final_read_that_meets_a_chunk_read_by_another_process_reads_on_to_the_end(
        home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ingest, "LOG_CHUNK", 4096)
    fake = FakeBackend()
    api = Api(home, backend=fake)
    job = _job_that_printed(api, fake, tmp_path)
    ledger = api._ledger
    stale = api._jobs.attempt(job, 1)  # what the pass read before another process moved on
    monkeypatch.setattr(ingest, "MAX_CHUNKS", 1)
    ingest.ingest_attempt(ledger, fake, stale)  # "a metrics read": one chunk, then it stops
    monkeypatch.setattr(ingest, "MAX_CHUNKS", 16)

    ingest.ingest_attempt(ledger, fake, stale, final=True)  # the pass's final read, from the stale row

    assert ledger.one("SELECT COUNT(*) FROM metrics WHERE job_id=?", (job,))[0] == LINES
