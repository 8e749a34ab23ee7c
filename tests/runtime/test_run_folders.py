"""Run folders belong to the one ledger that made them: a ledger made afresh beside another's run
folders refuses to open, a launch never adopts a folder someone else left (copied in from another
home), and ``autoresearch doctor --move-aside`` keeps the old state aside and says what it kept.
Before, a fresh ledger numbered its first job 1, found ``jobs/1/attempt-1`` of the old ledger's job 1
there, reported its exit 0 and its metrics, and never ran the new command."""

from __future__ import annotations

import os
import shutil
import sqlite3
import sys
from pathlib import Path

import pytest

from autoresearch.api import Api, doctor
from autoresearch.errors import LedgerError, StateError
from autoresearch.store.ledger import MIGRATIONS, Ledger
from tests.conftest import wait_for, wait_state

OLD = ["sh", "-c", "echo 'loss: 1'; exit 0"]
NEW = ["sh", "-c", "echo NEW; exit 3"]


def _run_one(home: Path, command: list[str], workdir: Path) -> Api:
    api = Api(home)
    job = api.submit({"command": command, "workdir": str(workdir)})
    wait_state(api, job.id, ("succeeded", "failed"))
    return api


def test_each_ledger_has_its_own_identity_kept_across_opens(tmp_path: Path) -> None:
    first, second = Ledger(tmp_path / "a"), Ledger(tmp_path / "b")
    assert len(first.identity) == 32 and first.identity != second.identity
    assert Ledger(tmp_path / "a").identity == first.identity


def test_a_ledger_made_before_identities_gets_one_on_upgrade(tmp_path: Path) -> None:
    Ledger(tmp_path)
    conn = sqlite3.connect(tmp_path / "ledger.db")  # as a ledger of the release before: no identity-1
    conn.executescript("DROP TABLE ledger_identity; DELETE FROM migrations WHERE name='identity-1'; "
                       f"PRAGMA user_version={len(MIGRATIONS) - 1};")
    conn.close()
    os.makedirs(tmp_path / "jobs" / "1" / "attempt-1")  # its own run folders: an upgrade is no fresh start
    assert len(Ledger(tmp_path).identity) == 32


@pytest.mark.parametrize("how", ["moved", "emptied"])
def test_a_new_or_empty_ledger_beside_run_folders_refuses_to_open(home: Path, tmp_path: Path, how: str) -> None:
    _run_one(home, OLD, tmp_path)
    for name in ("ledger.db", "ledger.db-wal", "ledger.db-shm"):
        if (home / name).exists():
            os.rename(home / name, home / f"{name}.bad")
    if how == "emptied":
        (home / "ledger.db").write_bytes(b"")

    with pytest.raises(LedgerError) as err:
        Api(home).submit({"command": NEW, "workdir": str(tmp_path)})
    assert "1 run folder(s)" in err.value.message and "autoresearch doctor --move-aside" in err.value.hint
    with pytest.raises(LedgerError):  # and so every read, until someone decides
        Api(home).status(1)


def test_a_run_folder_copied_in_from_another_home_is_never_adopted(home: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    (tmp_path / "w").mkdir()
    _run_one(other, OLD, tmp_path / "w")
    api = Api(home)  # this home's ledger, made before the copy: no job yet
    shutil.copytree(other / "jobs", home / "jobs", dirs_exist_ok=True)  # (a home makes its jobs/ when opened)

    job = api.submit({"command": NEW, "workdir": str(tmp_path / "w")})
    view = wait_state(api, job.id, ("succeeded", "failed"))

    assert (job.id, view.state, view.exit_code) == (1, "failed", 3)  # the new command ran, and failed
    log = api.logs(1).text
    assert "NEW" in log and "loss" not in log
    assert api.metrics(1) == []
    kept = list((home / "jobs" / "1").glob("foreign-*/attempt-1.log"))
    assert len(kept) == 1 and "loss: 1" in kept[0].read_text()  # the other home's files, kept, not lost
    event = api._ledger.one("SELECT data FROM events WHERE kind='foreign_run_folder'")
    assert event is not None and Ledger(other).identity in event["data"]
    assert any("moved to" in w and "foreign-" in w for w in api.status(1).warnings)  # status says so


def test_doctor_moves_the_old_state_aside_and_a_fresh_ledger_starts(home: Path, tmp_path: Path) -> None:
    _run_one(home, OLD, tmp_path)
    old_id = Ledger(home).identity
    (home / "ledger.db").write_bytes(b"not a database, truncated" * 10)
    for name in ("ledger.db-wal", "ledger.db-shm"):
        (home / name).unlink(missing_ok=True)

    broken = doctor(home)
    assert not broken.ledger_ok and "corrupt" in broken.problem and "--move-aside" in broken.hint

    fixed = doctor(home, move_aside=True)
    assert fixed.ledger_ok and fixed.ledger_id and fixed.ledger_id != old_id
    assert fixed.aside_run_folders == 1 and "ledger.db" in fixed.moved and "jobs" in fixed.moved
    assert (Path(fixed.aside) / "jobs" / "1" / "attempt-1.log").read_text().startswith("loss: 1")

    api = Api(home)
    job = api.submit({"command": NEW, "workdir": str(tmp_path)})
    view = wait_state(api, job.id, ("succeeded", "failed"))
    assert (view.state, view.exit_code) == ("failed", 3) and "NEW" in api.logs(job.id).text


def test_doctor_refuses_to_move_a_home_whose_attempt_still_runs(home: Path, tmp_path: Path) -> None:
    api = Api(home)
    job = api.submit({"command": [sys.executable, "-c", "import time; time.sleep(60)"], "workdir": str(tmp_path)})
    wait_state(api, job.id, "running")
    try:
        with pytest.raises(StateError) as err:
            doctor(home, move_aside=True)
        assert "still run" in err.value.message
        assert (home / "ledger.db").exists() and not list(home.glob("aside-*"))
    finally:
        api.cancel([job.id])
        wait_state(api, job.id, "cancelled")


def test_a_ledger_emptied_under_a_running_job_reports_nothing_that_did_not_happen(home: Path, tmp_path: Path) -> None:
    api = Api(home)
    job = api.submit({"command": ["sh", "-c", "echo 'loss: 1'; sleep 1; exit 0"], "workdir": str(tmp_path)})
    wait_state(api, job.id, "running")
    ledger = Ledger(home)
    (home / "ledger.db").write_bytes(b"")  # emptied in place under it (the same inode)
    for name in ("ledger.db-wal", "ledger.db-shm"):
        (home / name).unlink(missing_ok=True)
    assert ledger.replaced()  # a long-lived process (the pass daemon) lets go of it

    run_dir = home / "jobs" / str(job.id) / "attempt-1"
    wait_for(lambda: (run_dir / "exit.json").exists(), timeout=30)
    with pytest.raises(LedgerError):  # never a fresh ledger that reads the job's folder as someone's result
        Api(home).status(job.id)
