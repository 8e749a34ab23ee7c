"""Runs before launch go through the outbox: the loop records a request, the mirror's run maker
(or a later sync pass) creates the runs and writes them to the ledger, where a trial finds its run."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

from autoresearch import tracking
from autoresearch.loop._mlflow_runs import RunMaker
from autoresearch.store import outbox
from tests.conftest import wait_for
from tests.tracking.conftest import client, make_decision, make_loop, make_trial


def _trial(api: Any, name: str) -> int:
    loop_id = make_loop(api, name, {"name": name, "objective": {"metric": "loss"}})
    return make_trial(api, loop_id, make_decision(api, loop_id), {"x": 1})


def test_the_run_maker_answers_a_request_in_the_outbox(api: Any, quiet: Path) -> None:
    trial = _trial(api, "asked")
    maker = RunMaker(quiet)
    try:
        runs = maker.ask([trial])
    finally:
        maker.close()

    row = api._ledger.one("SELECT * FROM tracking_outbox WHERE kind='trial_run'")
    assert row is not None and json.loads(row["payload"]) == [trial] and row["done_at"] is not None
    assert json.loads(row["sent_ref"]) == {str(trial): runs[trial]}
    assert outbox.trial_runs(api._ledger, [trial]) == runs
    env = outbox.attempt_env(api._ledger, 999, {"tags": {outbox.TRIAL_TAG: str(trial)}})
    assert env["MLFLOW_RUN_ID"] == runs[trial]  # what the trial's attempt gets at launch
    assert client(tracking.tracking_uri(quiet)).get_run(runs[trial]).info.run_name == f"trial-{trial}"


def test_a_request_nobody_answered_is_taken_by_the_next_pass(api: Any, quiet: Path) -> None:
    trial = _trial(api, "unanswered")
    entry = outbox.request_runs(api._ledger, [trial])  # the controller was killed before its helper answered
    assert outbox.trial_runs(api._ledger, [trial]) == {}

    tracking.sync(quiet)

    runs = outbox.trial_runs(api._ledger, [trial])
    assert set(runs) == {trial}
    row = outbox.entry(api._ledger, entry)
    assert row is not None and row["done_at"] is not None and json.loads(row["sent_ref"]) == {str(trial): runs[trial]}
    assert api._ledger.one("SELECT COUNT(*) AS n FROM tracking_outbox WHERE done_at IS NULL")["n"] == 0


def test_the_loops_end_does_not_kill_the_run_maker_while_it_creates_the_store(api: Any, quiet: Path) -> None:
    """The loop ends (``close``, which does not wait) while the run maker is creating ``mlflow.db``:
    the helper finishes the creation and its answer, then exits, so the database is whole (killed
    mid-creation, it is left half-made and every later client of it fails)."""
    trial = _trial(api, "ending")
    maker = RunMaker(quiet)

    def ask() -> None:
        with contextlib.suppress(OSError):  # its answer never comes: the helper is killed
            maker.ask([trial])

    asking = threading.Thread(target=ask, daemon=True)
    asking.start()

    def creating() -> bool:  # the helper holds the creation lock and the database file is there
        with outbox.creation_lock(quiet, wait_s=0) as free:
            return not free and (quiet / "mlflow.db").exists()

    wait_for(creating, timeout=120, interval=0.01)
    maker.close()
    asking.join(120)

    with sqlite3.connect(quiet / "mlflow.db") as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert "alembic_version" in tables, tables
        assert conn.execute("SELECT version_num FROM alembic_version").fetchone() is not None
    assert client(tracking.tracking_uri(quiet)).search_experiments()  # a later client opens it
