"""Fair share's past usage through the runtime: the ledger's decayed accumulator folds each ending once
(a cursor over the 'end' events, never a scan of history) and the pass orders projects by it."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pytest

from autoresearch.api import Api
from autoresearch.backends.fake import FakeBackend
from autoresearch.util.decay import accrued


def jobs_events(api: Api, job_id: int) -> list[str]:
    return [r["kind"] for r in api._runtime.ledger.query(  # noqa: SLF001
        "SELECT kind FROM events WHERE job_id=? ORDER BY id", (job_id,))]


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
    shown = {p.project: p for p in api.cluster().projects}  # `autoresearch nodes` and cluster_status show it
    assert shown["a"].decayed_gpu_h == pytest.approx(2.0 * 0.97, rel=0.02)
    assert shown["a"].gpus_used == 1  # a2 took the GPU b1 left
    assert "b" not in shown  # nothing running or queued, used a GPU for under 0.01 h, not listed in config.yaml
    # the share the queue orders by: the fleet's share held now, plus the past over the fleet's GPU-seconds
    # of a mean life (1 GPU x 1 d / ln 2)
    span = 86_400 / math.log(2)
    assert shown["a"].share == pytest.approx(1 + shown["a"].decayed_gpu_h * 3600 / span, rel=0.01)

def test_a_guarantee_takes_its_gpus_back_from_a_borrower_through_the_runtime(home: Path) -> None:
    """nlp borrowed both GPUs with normal jobs; vision, guaranteed 1, submits one: the pass stops nlp's
    younger job (preempted, queued again), and vision's starts once its slot is free."""
    fake = FakeBackend(nodes=1, gpus=2)
    write_config(home, "scheduler: {projects: {vision: {guaranteed: 1, borrow: 1}, nlp: {borrow: 2}}}\n")
    api = Api(home, backend=fake)
    fake.fleet.offset = -600.0
    old = submit(api, "nlp", gpus=1)
    fake.fleet.offset = -60.0
    young = submit(api, "nlp", gpus=1)
    fake.fleet.offset = 0.0
    assert api.status(old).state != "queued" and api.status(young).state != "queued"
    v = submit(api, "vision", gpus=1)
    for _ in range(200):  # (the fake ends a stopped attempt at once: a pass or two)
        if api.status(v).state != "queued":
            break
    assert api.status(v).state != "queued" and api.status(old).state != "queued"
    assert api.status(young).state == "queued"  # preempted: queued again
    assert jobs_events(api, young) == ["submit", "launch", "stop", "end"]
    assert api.status(old).state != "queued"  # the older one lost more: it runs on
    third = submit(api, "vision", gpus=1)  # past vision's guarantee: no more preemption, it waits
    assert api.status(third).state == "queued" and api.status(old).state not in ("queued",)


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


def test_a_running_attempt_counts_what_it_used_so_far(home: Path) -> None:
    """An attempt running for an hour on 2 GPUs (the fake clock set back) is 2 GPU-hours of past usage
    by now, decayed (half-life 12 h: ~2.8% less), before it ends; a second read (the weights kept) agrees."""
    fake = FakeBackend(nodes=1, gpus=2)
    write_config(home, "scheduler: {half_life: 12h}\n")
    api = Api(home, backend=fake)
    fake.fleet.offset = -3600.0
    job = submit(api, "a", gpus=2)
    fake.fleet.offset = 0.0
    assert api.status(job).state == "running"
    started = api._runtime.ledger.one("SELECT started_at FROM attempts WHERE job_id=?", (job,))["started_at"]  # noqa: SLF001
    first = {p.project: p for p in api.cluster().projects}["a"]
    import time

    want = accrued(2, started, time.time(), time.time(), 43_200.0) / 3600.0
    assert first.decayed_gpu_h == pytest.approx(want, abs=0.02) and 1.9 < first.decayed_gpu_h < 2.0
    again = {p.project: p for p in api.cluster().projects}["a"]
    assert again.decayed_gpu_h == pytest.approx(first.decayed_gpu_h, abs=0.01)
    api.cancel([job])


def test_nodes_and_cluster_status_read_past_usage_without_writing_it(home: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """a's job held the GPU two hours and ended while no scheduler section was set, so the ending sits
    past the accumulator's cursor, unfolded. Then fair share is configured and the cluster is read:
    api.cluster() (what MCP cluster_status returns) and `autoresearch nodes --json` show a's two decayed
    hours, computed in memory, and issue no statement that writes: the pass alone folds endings in."""
    import json
    import sqlite3

    from autoresearch.cli import main

    fake = FakeBackend(nodes=1, gpus=1)
    api = Api(home, backend=fake)
    fake.fleet.offset = -7200.0
    a1 = submit(api, "a", gpus=1)
    assert api.status(a1).state != "queued"
    fake.fleet.offset = 0.0
    fake.finish(f"{a1}.1")
    assert api.status(a1).state == "succeeded"
    ledger = api._runtime.ledger  # noqa: SLF001
    assert ledger.one("SELECT event_id FROM share_cursor")["event_id"] == 0  # nothing folded yet
    write_config(home, "health: {enabled: false}\n")
    assert main(["nodes", "--json"]) == 0  # (the CLI's backend, local, registers its node: its first pass)
    write_config(home, "scheduler: {half_life: 1d}\nhealth: {enabled: false}\n")
    writes: list[str] = []

    def watch(conn: sqlite3.Connection) -> sqlite3.Connection:
        conn.set_trace_callback(lambda sql: writes.append(sql) if sql.split()[0].upper() not in ("SELECT", "PRAGMA")
                                else None)
        return conn

    watch(ledger.connection())
    shown = {p.project: p for p in api.cluster().projects}
    assert shown["a"].decayed_gpu_h == pytest.approx(2.0 * 0.97, rel=0.02)
    assert writes == []
    real = sqlite3.connect
    monkeypatch.setattr(sqlite3, "connect", lambda *a, **k: watch(real(*a, **k)))  # the CLI opens its own
    capsys.readouterr()
    assert main(["nodes", "--json"]) == 0
    assert "projects" in json.loads(capsys.readouterr().out)
    assert writes == [], writes
    assert ledger.one("SELECT event_id FROM share_cursor")["event_id"] == 0
    assert ledger.one("SELECT COUNT(*) AS n FROM share_usage")["n"] == 0
    # the pass still folds: the accumulator then holds what the reads showed
    api._runtime.tick()  # noqa: SLF001
    now = ledger.clock()
    assert api._runtime.jobs.share_usage("fake", 86_400.0, now)["a"] == pytest.approx(  # noqa: SLF001
        shown["a"].decayed_gpu_h * 3600, rel=0.01)
    assert ledger.one("SELECT event_id FROM share_cursor")["event_id"] > 0


def test_the_runtime_keeps_its_scheduler_records_between_passes(home: Path) -> None:
    """The runtime passes through one Scheduler (the sim driver's too): jobs submitted, started and
    ended over several passes place as the pure pass would, and its records are built once, then kept
    (the nodes' views are the same objects while their rows are)."""
    fake = FakeBackend(nodes=2, gpus=2)
    write_config(home, "scheduler: {half_life: 1d}\n")
    api = Api(home, backend=fake)
    first = [submit(api, "a", gpus=1) for _ in range(3)]
    assert sorted(api.status(j).state != "queued" for j in first) == [True, True, True]
    more = [submit(api, "b", gpus=2), submit(api, "a", gpus=1)]
    for job in first:
        fake.finish(f"{job}.1")
        api.status(job)
    states = {j: api.status(j).state for j in more}
    assert all(s != "queued" for s in states.values()), states
    sched = api._runtime._scheduler  # noqa: SLF001
    assert sched is not None and sched.rebuilds == 1
