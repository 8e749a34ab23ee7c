"""Fair share's past usage through the runtime: the ledger's decayed accumulator folds each ending once
(a cursor over the 'end' events, never a scan of history) and the pass orders projects by it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from autoresearch.api import Api
from autoresearch.backends.fake import FakeBackend
from autoresearch.util.decay import accrued


def write_config(home: Path, text: str) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.yaml").write_text(text)


def submit(api: Api, project: str = "", **spec: Any) -> int:
    return int(api.submit({"command": ["train"], "workdir": os.getcwd(), **spec}, project=project).id)


def test_a_project_that_used_the_fleet_lately_waits_behind_one_that_did_not(home: Path) -> None:
    """a's first job held the one GPU for two hours (the fake fleet's clock set back); then a and b
    each queue a job. Neither holds anything, so without history submit order would start a's;
    with it b's goes first, and the accumulator holds a's two decayed hours, counted once."""
    fake = FakeBackend(nodes=1, gpus=1)
    write_config(home, "scheduler: {half_life: 1d}\n")
    api = Api(home, backend=fake)
    fake.fleet.offset = -7200.0
    a1 = submit(api, "a", gpus=1)
    assert api.status(a1).state != "queued"
    a2, b1 = submit(api, "a", gpus=1), submit(api, "b", gpus=1)
    fake.fleet.offset = 0.0
    fake.finish(f"{a1}.1")
    api.status(a1)  # a pass: the ending recorded, then the free GPU placed
    assert api.status(b1).state != "queued" and api.status(a2).state == "queued"
    jobs = api._runtime.jobs  # noqa: SLF001  (the store, to read the accumulator)
    att = jobs.ledger.one("SELECT started_at, ended_at FROM attempts WHERE job_id=?", (a1,))
    assert att["ended_at"] - att["started_at"] == pytest.approx(7200, abs=60)
    now = att["ended_at"]
    usage = jobs.share_usage("fake", 86_400.0, now)
    assert usage["a"] == pytest.approx(accrued(1, att["started_at"], att["ended_at"], now, 86_400.0), rel=1e-6)
    assert usage["a"] == pytest.approx(7200 * 0.97, rel=0.03) and "b" not in usage  # 2 h, barely decayed in a day
    # folded once: asking again (and after another ending) does not count a1 twice
    assert jobs.share_usage("fake", 86_400.0, now)["a"] == pytest.approx(usage["a"], rel=1e-9)
    fake.finish(f"{b1}.1")
    api.status(b1)
    again = jobs.share_usage("fake", 86_400.0, now + 86_400.0)
    assert again["a"] == pytest.approx(usage["a"] / 2, rel=1e-6)  # a day later: half
    assert jobs.ledger.one("SELECT COUNT(*) AS n FROM share_usage")["n"] == 2  # a and b: a row per project


def test_the_fold_reads_only_the_endings_past_its_cursor_in_bounded_steps(home: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeBackend(nodes=1, gpus=4)
    write_config(home, "scheduler: {half_life: 7d}\n")
    api = Api(home, backend=fake)
    ids = [submit(api, "p", gpus=1) for _ in range(4)]
    for j in ids:
        fake.finish(f"{j}.1")
    api.status(ids[0])
    jobs = api._runtime.jobs  # noqa: SLF001
    monkeypatch.setattr(type(jobs), "FOLD_LIMIT", 3)
    with jobs.ledger.tx() as c:
        c.execute("UPDATE share_cursor SET event_id=0")
        c.execute("DELETE FROM share_usage")
    now = jobs.ledger.one("SELECT MAX(ended_at) AS t FROM attempts")["t"]
    jobs.share_usage("fake", 7 * 86_400.0, now)
    first = jobs.ledger.one("SELECT event_id FROM share_cursor")["event_id"]
    last = jobs.ledger.one("SELECT MAX(id) AS id FROM events WHERE kind='end'")["id"]
    assert first < last  # three endings folded, one left for the next call
    jobs.share_usage("fake", 7 * 86_400.0, now)
    assert jobs.ledger.one("SELECT event_id FROM share_cursor")["event_id"] == last
