"""The ledger on its own: migrations, transactions, the pass lock and its errors."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from autoresearch.errors import LedgerError
from autoresearch.store.ledger import MIGRATIONS, Ledger


def applied(ledger: Ledger) -> list[str]:
    return [r["name"] for r in ledger.query("SELECT name FROM migrations ORDER BY rowid")]


def test_migrations_run_once_in_order_and_are_idempotent(tmp_path: Path) -> None:
    first = Ledger(tmp_path)
    assert applied(first) == [name for name, _ in MIGRATIONS]
    assert first.one("PRAGMA user_version")[0] == len(MIGRATIONS)  # type: ignore[index]
    with first.tx() as c:
        c.execute("INSERT INTO jobs(name, state, priority, spec, gpus, nodes, backend, submitted_at, updated_at) "
                  "VALUES ('kept', 'queued', 'normal', '{}', 0, 1, 'local', 0, 0)")
    Ledger(tmp_path)  # the fast path: user_version says all are applied
    with first.tx() as c:
        c.execute("PRAGMA user_version=0")  # as if a newer MIGRATIONS list appeared: the slow path runs
    again = Ledger(tmp_path)
    assert applied(again) == [name for name, _ in MIGRATIONS]  # each name once: nothing re-applied
    assert [r["name"] for r in again.query("SELECT name FROM jobs")] == ["kept"]
    assert again.one("PRAGMA user_version")[0] == len(MIGRATIONS)  # type: ignore[index]


def test_a_home_and_its_ledger_are_private(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "home")
    assert ledger.home.stat().st_mode & 0o777 == 0o700
    assert ledger.path.stat().st_mode & 0o777 == 0o600


def test_a_new_ledger_opens_while_another_connection_writes_it(tmp_path: Path) -> None:
    """Several processes opening a new home at once (an agent's six ``submit``s): the first write of
    one held off another's switch to WAL, which SQLite refuses at once; it failed with "stayed locked
    for 15 s" within a millisecond (tests/runtime/test_cli.py's two CLIs, once in a full run)."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    os.close(os.open(home / "ledger.db", os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0o600))  # as Ledger makes it
    other = sqlite3.connect(home / "ledger.db", isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    done = threading.Timer(0.3, other.execute, ("COMMIT",))
    done.start()
    try:
        began = time.monotonic()
        ledger = Ledger(home)
        waited = time.monotonic() - began
    finally:
        done.join()
        other.close()
    assert waited >= 0.25  # it waited for the other writer, as a busy write does
    assert ledger.one("PRAGMA journal_mode")[0] == "wal"  # type: ignore[index]
    assert ledger.one("PRAGMA user_version")[0] == len(MIGRATIONS)  # type: ignore[index]


def test_a_failing_transaction_leaves_nothing_behind(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    with pytest.raises(RuntimeError, match="boom"), ledger.tx() as c:
        Ledger.event(c, "first")
        raise RuntimeError("boom")
    assert ledger.query("SELECT * FROM events") == []
    with ledger.tx() as c:  # the connection is usable again: no transaction left open
        Ledger.event(c, "second", 7, 1, why="test")
    row = ledger.one("SELECT kind, job_id, attempt, data FROM events")
    assert row is not None and tuple(row) == ("second", 7, 1, '{"why": "test"}')


def test_bad_sql_is_a_ledger_error_with_a_hint(tmp_path: Path) -> None:
    with pytest.raises(LedgerError) as err:
        Ledger(tmp_path).query("SELECT nope FROM nowhere")
    assert err.value.hint and "nowhere" in str(err.value)


def test_the_pass_lock_never_blocks_a_reader(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom autoresearch.store.ledger import Ledger\n"
         "with Ledger(sys.argv[1]).pass_lock() as locked:\n    print(locked, flush=True)\n    time.sleep(30)",
         str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "True"
        started = time.monotonic()
        with ledger.pass_lock(wait=False) as locked:
            assert locked is False
        assert time.monotonic() - started < 10  # a waiting lock would wait for the holder's 30 s
    finally:
        holder.kill()
        holder.wait()
    with ledger.pass_lock(wait=False) as locked:  # the holder is gone: its lock went with it
        assert locked is True
        with ledger.pass_lock(wait=False) as inner:  # a second open of the lock file conflicts, even here
            assert inner is False


def test_a_corrupt_ledger_is_a_ledger_error_that_says_what_to_do(tmp_path: Path) -> None:
    (tmp_path / "ledger.db").write_bytes(b"this is not a SQLite database, just bytes " * 200)
    with pytest.raises(LedgerError) as err:
        Ledger(tmp_path)
    assert "corrupt" in str(err.value)
    assert err.value.hint is not None and "autoresearch doctor --move-aside" in err.value.hint


def test_an_unwritable_home_is_a_ledger_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(LedgerError) as err:
        Ledger(tmp_path / "file" / "home")
    assert "AUTORESEARCH_HOME" in (err.value.hint or "")


def test_two_threads_of_a_process_queue_for_writes_on_a_mutex_not_in_sqlites_busy_sleeps(tmp_path: Path) -> None:
    """A second thread's write waits on the process's writer mutex (handed over at once when the
    first commits) and never reaches BEGIN IMMEDIATE while the first holds the write: in SQLite's busy
    handler it would sleep 1, 2, 5 ... 100 ms between tries, on every trial end of a loop."""
    import threading

    ledger, other = Ledger(tmp_path), Ledger(tmp_path)  # two handles, one file: one mutex
    ledger.query("CREATE TABLE t (x INTEGER)")
    inside, leave = threading.Event(), threading.Event()
    begins: list[str] = []

    def traced(handle: Ledger) -> Ledger:  # (each thread has its own connection)
        handle.connection().set_trace_callback(lambda sql: begins.append(sql) if sql.startswith("BEGIN") else None)
        return handle

    def first() -> None:
        with traced(ledger).tx() as c:
            c.execute("INSERT INTO t VALUES (1)")
            inside.set()
            leave.wait(10)

    def second() -> None:
        with traced(other).tx() as c:
            c.execute("INSERT INTO t VALUES (2)")

    a = threading.Thread(target=first)
    a.start()
    assert inside.wait(10)
    b = threading.Thread(target=second)
    b.start()
    time.sleep(0.3)
    assert b.is_alive() and begins == ["BEGIN IMMEDIATE"], begins  # the second waits before BEGIN
    leave.set()
    a.join(10)
    b.join(10)
    assert [r["x"] for r in ledger.query("SELECT x FROM t ORDER BY rowid")] == [1, 2]



def test_the_wal_is_checkpointed_every_few_thousand_pages_not_every_thousand(tmp_path: Path) -> None:
    """A checkpoint syncs the database (5-27 ms here, in whichever process commits past the threshold):
    SQLite's default of 1,000 pages made a sweep's controller pay 27 of them in 1,000 short trials. The
    WAL (reused from its start after each checkpoint) grows past 4 MB now, and stays bounded."""
    from autoresearch.store.ledger import WAL_CHECKPOINT_PAGES

    ledger = Ledger(tmp_path)
    wal = tmp_path / "ledger.db-wal"
    blob = "x" * 3000  # about a page of events a transaction
    sizes = []
    for i in range(2 * WAL_CHECKPOINT_PAGES):
        with ledger.tx() as c:
            Ledger.event(c, "bench", data=blob, i=i)
        if i % 500 == 0:
            sizes.append(wal.stat().st_size)
    page = ledger.one("PRAGMA page_size")[0]  # type: ignore[index]
    assert max(sizes) > 2000 * page  # (1,000 pages: it never went past ~1,000 frames)
    assert wal.stat().st_size < 1.5 * WAL_CHECKPOINT_PAGES * page  # checkpointed, and reused from its start
