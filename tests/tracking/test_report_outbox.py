"""A loop's report reaches its MLflow run through the outbox: recorded in the ledger, sent by a pass."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from autoresearch import tracking
from autoresearch.loop.views import loop_view
from tests.tracking.conftest import client, make_loop


def _plan(name: str) -> dict[str, Any]:
    return {"name": name, "objective": {"metric": "loss"}, "budget": {"trials": 1, "parallel": 1}}


def _artifacts(uri: str, run_id: str) -> set[str]:
    return {item.path for item in client(uri).list_artifacts(run_id, "report")}


def test_the_report_goes_through_the_outbox_and_the_caller_gets_the_run(api: Any, quiet: Path,
                                                                          tmp_path: Path) -> None:
    loop_id = make_loop(api, "reported", _plan("reported"))
    out = tmp_path / "report"
    out.mkdir()
    (out / "summary.md").write_text("# reported\n")
    view = loop_view(api._ledger, "reported")
    view.report_dir = str(out)

    run_id = tracking.log_to_mlflow(api._ledger, view)

    row = api._ledger.one("SELECT * FROM tracking_outbox WHERE kind='report'")
    assert row is not None and row["loop_id"] == loop_id and row["done_at"] is not None
    assert run_id is not None and row["sent_ref"] == run_id
    loop_run = api._ledger.one("SELECT run_id FROM tracking_runs WHERE entity=?", (f"loop:{loop_id}",))
    assert loop_run["run_id"] == run_id
    assert _artifacts(tracking.tracking_uri(quiet), run_id) == {"report/summary.md"}


def test_a_report_recorded_while_tracking_is_down_is_sent_by_a_later_pass(api: Any, quiet: Path,
                                                                          tmp_path: Path) -> None:
    from autoresearch.store import outbox

    loop_id = make_loop(api, "later", _plan("later"))
    out = tmp_path / "report"
    out.mkdir()
    (out / "summary.md").write_text("# later\n")
    entry = outbox.record_report(api._ledger, loop_id, out)  # what log_to_mlflow leaves behind when the sync fails
    tracking.sync(quiet)
    row = api._ledger.one("SELECT sent_ref, done_at FROM tracking_outbox WHERE id=?", (entry,))
    assert row["done_at"] is not None
    assert _artifacts(tracking.tracking_uri(quiet), row["sent_ref"]) == {"report/summary.md"}
    tracking.sync(quiet)  # sent once: a second pass does nothing with it
    assert api._ledger.one("SELECT done_at FROM tracking_outbox WHERE id=?", (entry,))["done_at"] == row["done_at"]


def test_tracking_off_records_nothing(api: Any, quiet: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTORESEARCH_TRACKING", "off")
    make_loop(api, "untracked", _plan("untracked"))
    view = loop_view(api._ledger, "untracked")
    view.report_dir = str(tmp_path)
    assert tracking.log_to_mlflow(api._ledger, view) is None
    assert api._ledger.query("SELECT * FROM tracking_outbox") == []
