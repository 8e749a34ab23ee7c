"""Per-event cost of the engine is flat in the size of the ledger and the depth of the queue
(issue 16): counted in SQLite virtual-machine steps and statements, not in time.

SQLite's progress handler is called once per VM instruction: an indexed look-up costs the same
few instructions at any table size, a scan one or more per row. So a submit, an ending and a
status read that touch only indexed rows count the same steps with 100 or 2,000 jobs in the
ledger; a query that scans jobs (the old ``SELECT DISTINCT backend``, a re-placement of the
whole queue on every read) counts more, and fails here.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from autoresearch.api import Api
from autoresearch.backends.fake import FakeBackend
from autoresearch.engine.jobs import submit_many

SPEC = {"command": ["train"], "workdir": os.getcwd()}


class Counter:
    def __init__(self) -> None:
        self.steps = 0
        self.statements: list[str] = []

    def step(self) -> int:
        self.steps += 1
        return 0


@contextmanager
def counted(api: Api) -> Iterator[Counter]:
    """VM steps and statements of everything ``api`` runs on its ledger in this thread."""
    conn = api._ledger.connection()
    counter = Counter()
    conn.set_progress_handler(counter.step, 1)
    conn.set_trace_callback(counter.statements.append)
    try:
        yield counter
    finally:
        conn.set_progress_handler(None, 1)
        conn.set_trace_callback(None)


def engine(home: Path, seeded: int) -> tuple[Api, FakeBackend]:
    fake = FakeBackend(gpus=1)
    api = Api(home, backend=fake)
    api._runtime.jobs.seed_finished(seeded, "fake", '{"command": ["train"], "workdir": "/"}')
    warm = int(api.submit(SPEC).id)  # nodes recorded, first-pass work done
    fake.finish(f"{warm}.1", 0)
    api._runtime.tick()
    return api, fake


def costs(home: Path, seeded: int) -> dict[str, tuple[int, int]]:
    """(VM steps, statements) of a submit, its ending's pass, a status read and a list page."""
    api, fake = engine(home, seeded)
    out: dict[str, tuple[int, int]] = {}

    def measure(name: str, action: Callable[[], Any]) -> Any:
        with counted(api) as c:
            result = action()
        out[name] = (c.steps, len(c.statements))
        return result

    job = measure("submit", lambda: int(api.submit(SPEC).id))
    measure("status", lambda: api.status(job))
    fake.finish(f"{job}.1", 0)
    measure("ending", api._runtime.tick)
    measure("status after", lambda: api.status(job))
    measure("list", lambda: api.list_jobs(limit=20))
    measure("batch of 5", lambda: submit_many(api._runtime, [SPEC] * 5))
    return out


def test_submit_ending_and_reads_cost_the_same_at_100_and_2000_jobs_in_the_ledger(tmp_path: Path,
                                                                                 home: Path) -> None:
    small, large = costs(tmp_path / "small", 100), costs(tmp_path / "large", 2000)
    assert small == large, f"per-event cost grows with the ledger: {small} vs {large}"


def test_a_submit_reads_the_node_table_once(tmp_path: Path) -> None:
    """The capacity check refreshes the nodes; the submit's own pass places onto those rows (it recorded
    no ending and ran no health check in between) and its warnings read them too: one read of the
    backend's nodes, not one per step (five before). A pass on its own reads them once as well."""
    api, fake = engine(tmp_path / "h", 0)
    with counted(api) as c:
        job = int(api.submit({**SPEC, "gpus": 1}).id)
    reads = [s for s in c.statements if "FROM nodes WHERE backend" in s]
    assert len(reads) == 1, reads
    assert api.status(job, refresh=False).state == "starting"
    fake.finish(f"{job}.1", 0)
    with counted(api) as c:
        api._runtime.tick()
    assert len([s for s in c.statements if "FROM nodes WHERE backend" in s]) == 1, c.statements


def queued_read_cost(home: Path, queued: int) -> tuple[int, int]:
    api, _ = engine(home, 0)
    blocker = int(api.submit({**SPEC, "gpus": 1}).id)  # holds the only GPU: the rest queue
    submit_many(api._runtime, [{**SPEC, "gpus": 1}] * queued)
    api.status(blocker)
    with counted(api) as c:
        api.status(blocker)
        api.list_jobs(limit=20)
    return c.steps, len(c.statements)


def test_reads_cost_the_same_with_100_or_2000_jobs_queued(tmp_path: Path, home: Path) -> None:
    small, large = queued_read_cost(tmp_path / "small", 100), queued_read_cost(tmp_path / "large", 2000)
    assert small == large, f"a read re-places the queue: {small} vs {large} (VM steps, statements)"


def test_a_change_places_the_queue_again(tmp_path: Path, home: Path) -> None:
    """The skip above is not a blind one: an ending frees the GPU and the next pass places the head."""
    api, fake = engine(tmp_path / "h", 0)
    blocker = int(api.submit({**SPEC, "gpus": 1}).id)
    waiting = submit_many(api._runtime, [{**SPEC, "gpus": 1}] * 3)
    api.status(blocker)
    assert [api.status(j, refresh=False).state for j in waiting] == ["queued"] * 3
    fake.finish(f"{blocker}.1", 0)
    api.status(blocker)  # a read's pass: it sees the ending, then places
    assert [api.status(j, refresh=False).state for j in waiting] == ["starting", "queued", "queued"]


@pytest.mark.parametrize("count", [1, 50])
def test_a_batch_is_one_transaction_and_one_pass(tmp_path: Path, count: int,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    api, _ = engine(tmp_path / "h", 0)
    passes = []
    real_tick = api._runtime.tick
    monkeypatch.setattr(api._runtime, "tick", lambda wait=True, **kw: passes.append(1) or real_tick(wait, **kw))
    with counted(api) as c:
        ids = submit_many(api._runtime, [SPEC] * count)
    assert len(ids) == count and ids == sorted(ids)
    inserts = [s for s in c.statements if s.startswith("INSERT INTO jobs")]
    assert len(inserts) == count
    first, last = c.statements.index(inserts[0]), c.statements.index(inserts[-1])
    assert "BEGIN" not in " ".join(c.statements[first:last + 1])  # all of them in one transaction
    assert len(passes) == 1


def test_a_bad_spec_refuses_the_whole_batch(tmp_path: Path) -> None:
    from autoresearch.errors import SpecError

    api, _ = engine(tmp_path / "h", 0)
    before = len(api.list_jobs(limit=1000, refresh=False).jobs)
    with pytest.raises(SpecError):
        submit_many(api._runtime, [SPEC, {**SPEC, "priority": "urgent!"}, SPEC])
    assert len(api.list_jobs(limit=1000, refresh=False).jobs) == before  # nothing recorded
    assert submit_many(api._runtime, []) == []


def _one_transaction(statements: list[str], prefix: str, count: int) -> None:
    hits = [i for i, s in enumerate(statements) if s.startswith(prefix)]
    assert len(hits) == count, (prefix, statements)
    assert "BEGIN" not in " ".join(statements[hits[0]:hits[-1] + 1]), f"{prefix}: one transaction each"


def test_the_launches_of_a_pass_are_one_transaction(tmp_path: Path) -> None:
    api, _ = engine(tmp_path / "h", 0)
    with counted(api) as c:
        ids = submit_many(api._runtime, [SPEC] * 8)
    assert [api.status(j, refresh=False).state for j in ids] == ["starting"] * 8
    _one_transaction(c.statements, "INSERT INTO attempts", 8)


def test_the_endings_a_pass_finds_are_one_transaction(tmp_path: Path) -> None:
    api, fake = engine(tmp_path / "h", 0)
    ids = submit_many(api._runtime, [SPEC] * 8)
    for job in ids:
        fake.finish(f"{job}.1", 0)
    with counted(api) as c:
        api._runtime.tick()
    assert [api.status(j, refresh=False).state for j in ids] == ["succeeded"] * 8
    _one_transaction(c.statements, "UPDATE attempts SET state='ended'", 8)


def test_the_last_points_of_a_passs_endings_are_one_transaction(tmp_path: Path) -> None:
    """Each ending's last points (its log and metrics file read to the end) are stored together: one
    transaction for the pass, not one per ending, and every point once."""
    api, fake = engine(tmp_path / "h", 0)
    ids = submit_many(api._runtime, [SPEC] * 6)
    for i, job in enumerate(ids):
        fake.emit(f"{job}.1", f"step {i}\nloss: {i / 10}\n")
        fake.report(f"{job}.1", step=1, acc=float(i))
        fake.finish(f"{job}.1", 0)
    with counted(api) as c:
        api._runtime.tick()
    _one_transaction(c.statements, "INSERT INTO metrics", 6 * 2)
    assert sum(s.startswith("BEGIN") for s in c.statements) == 2, c.statements  # the points, the endings
    for i, job in enumerate(ids):
        last = {m.name: m.last for m in api.metrics(job)}
        assert last == {"loss": i / 10, "acc": float(i)}, (job, last)
        assert len(api._runtime.jobs.metric_points(job)) == 2


def test_an_ending_with_more_than_a_chunk_left_is_ingested_on_its_own_whole(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """An ending whose rest fills a read chunk, and one whose metrics file cannot be read, are left to the
    per-attempt ingest (which reads on, and words the trouble); the others still go in one transaction."""
    from autoresearch.engine import ingest

    monkeypatch.setattr(ingest, "LOG_CHUNK", 64)
    api, fake = engine(tmp_path / "h", 0)
    ids = submit_many(api._runtime, [SPEC] * 4)
    long = "".join(f"loss: {k}\n" for k in range(40))  # ~400 bytes: seven chunks of 64
    fake.emit(f"{ids[0]}.1", long)
    for job in ids[1:]:
        fake.emit(f"{job}.1", "loss: 0.5\n")
    bad = api._runtime.jobs.attempt(ids[3], 1)["metrics_path"]
    os.makedirs(bad)  # a directory where its metrics file goes
    for job in ids:
        fake.finish(f"{job}.1", 0)
    api._runtime.tick()
    assert [p["value"] for p in api._runtime.jobs.metric_points(ids[0])] == [float(k) for k in range(40)]
    for job in ids[1:]:  # (a directory at the metrics path once lost the log's points too)
        assert [p["value"] for p in api._runtime.jobs.metric_points(job)] == [0.5]
    assert any("metrics file is not a regular file" in w for w in api.status(ids[3], refresh=False).warnings)


def test_an_ending_that_cannot_be_recorded_leaves_the_others_recorded(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The batch is all or nothing; a bad one (here: its rule raises) is then retried alone, guarded."""
    api, fake = engine(tmp_path / "h", 0)
    ids = submit_many(api._runtime, [SPEC] * 3)
    real_end = api._runtime.jobs._end

    def end(c: Any, job_id: int, *rest: Any) -> Any:
        if job_id == ids[1]:
            raise RuntimeError("a bug in one ending")
        return real_end(c, job_id, *rest)

    monkeypatch.setattr(api._runtime.jobs, "_end", end)
    for job in ids:
        fake.finish(f"{job}.1", 0)
    api._runtime.tick()
    states = [api.status(j, refresh=False).state for j in ids]
    assert states[0] == states[2] == "succeeded" and states[1] in ("starting", "running")  # not recorded: the next pass tries again
    assert any("a bug in one ending" in w for w in api.status(ids[1], refresh=False).warnings)


def _submit_in_thread(api: Api) -> tuple[Any, list[int]]:
    import threading

    out: list[int] = []
    thread = threading.Thread(target=lambda: out.append(int(api.submit(SPEC).id)), daemon=True)
    thread.start()
    return thread, out


def test_a_submit_does_not_queue_behind_a_listeners_pass(tmp_path: Path) -> None:
    """While another process runs a pass (the pass daemon, busy with endings), a submit pokes the
    listener, whose next pass places the job, instead of waiting for the lock for a pass of its own."""
    from autoresearch.engine.watcher import Watcher

    api, _ = engine(tmp_path / "h", 0)
    with Watcher(api._ledger.home, "fake", claim=False) as daemon, api._ledger.pass_lock() as held:
        assert held
        thread, out = _submit_in_thread(api)
        thread.join(timeout=30)
        assert not thread.is_alive(), "the submit waited for the other pass"
        assert api.status(out[0], refresh=False).state == "queued" and daemon.wait(0)
    api._runtime.tick()  # the listener's pass
    assert api.status(out[0], refresh=False).state == "starting"


def test_with_nobody_listening_a_submit_waits_for_the_lock_and_places_its_job(tmp_path: Path) -> None:
    api, _ = engine(tmp_path / "h", 0)
    with api._ledger.pass_lock() as held:
        assert held
        thread, out = _submit_in_thread(api)
        thread.join(timeout=0.5)
        assert thread.is_alive()  # nobody would run a pass after the holder's: it waits
    thread.join(timeout=30)
    assert api.status(out[0], refresh=False).state == "starting"
