"""Every MLflow run of a loop ends: a trial that will never run (skipped at the end of the
loop, refused at submit) ends KILLED with a tag saying why, and the loop's parent run ends
with the loop, also when the loop finished after a crash and a resume."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from autoresearch import tracking
from autoresearch.loop.controller import Controller
from autoresearch.loop.plan import parse_plan
from tests.tracking.conftest import client

TRAIN = "import sys; print(f'loss: {(float(sys.argv[1]) - 0.3) ** 2:.6f}')"


def _plan(tmp_path: Path, name: str, **extra: Any) -> Any:
    (tmp_path / "train.py").write_text(TRAIN)
    return parse_plan({
        "name": name, "objective": {"metric": "loss"},
        "trial": {"command": f"{sys.executable} train.py {{x}}", "workdir": str(tmp_path)},
        "space": {"x": {"choices": [0.1, 0.5, 0.9]}}, "proposer": {"kind": "grid"}, **extra,
    }, base_dir=tmp_path)


def _runs(api: Any, uri: str) -> dict[str, Any]:
    rows = api._ledger.query("SELECT entity, run_id FROM tracking_runs WHERE run_id IS NOT NULL")
    return {r["entity"]: client(uri).get_run(r["run_id"]) for r in rows}


def test_skipped_repeats_and_the_parent_run_end(api: Any, quiet: Path, tmp_path: Path) -> None:
    # Budget 2 with repeats: the first trial becomes the incumbent, two repeats are proposed (and
    # get their MLflow runs before launch), one launches, the other is skipped when the budget ends.
    plan = _plan(tmp_path, "skipped-repeats", budget={"trials": 2, "parallel": 1}, repeats={"seeds": 3})
    view = Controller(plan, runtime=api._runtime).run()
    assert view.counts.get("skipped") == 1, view.counts
    skipped = api._ledger.one("SELECT id FROM trials WHERE state='skipped'")["id"]

    tracking.sync()

    uri = tracking.tracking_uri(quiet)
    runs = _runs(api, uri)
    assert f"trial:{skipped}" in runs  # created ahead of a launch that never came
    not_ended = {entity: run.info.status for entity, run in runs.items() if run.info.status == "RUNNING"}
    assert not_ended == {}
    run = runs[f"trial:{skipped}"]
    assert run.info.status == "KILLED" and run.info.end_time
    assert run.data.tags["autoresearch.trial_state"] == "skipped"
    assert run.data.tags["autoresearch.skipped"].startswith("not launched: trial budget 2 used")
    loop_id = api._ledger.one("SELECT id FROM loops")["id"]
    assert runs[f"loop:{loop_id}"].info.status == "FINISHED"


def test_a_resumed_loop_reopens_its_parent_run_and_ends_it_again(api: Any, quiet: Path, tmp_path: Path) -> None:
    Controller(_plan(tmp_path, "resumed", budget={"trials": 1, "parallel": 1}), runtime=api._runtime).run()
    tracking.sync()
    uri = tracking.tracking_uri(quiet)
    loop = api._ledger.one("SELECT id, ended_at FROM loops")
    parent = _runs(api, uri)[f"loop:{loop['id']}"]
    assert parent.info.status == "FINISHED"

    more = Controller(_plan(tmp_path, "resumed", budget={"trials": 2, "parallel": 1}), runtime=api._runtime, resume=True)
    more.open()  # the loop runs again under the new plan ...
    try:
        tracking.sync()
        assert client(uri).get_run(parent.info.run_id).info.status == "RUNNING"  # ... and so does its run
    finally:
        more.close()
    view = Controller(_plan(tmp_path, "resumed", budget={"trials": 2, "parallel": 1}), runtime=api._runtime, resume=True).run()
    assert view.counts == {"succeeded": 2}, view.counts

    tracking.sync()

    again = client(uri).get_run(parent.info.run_id)
    assert again.info.status == "FINISHED"
    assert again.info.end_time > parent.info.end_time  # ended with the resumed loop, not the first run
    assert all(run.info.status != "RUNNING" for run in _runs(api, uri).values())


def test_a_run_whose_creation_was_cut_short_ends_with_its_skipped_trial(api: Any, quiet: Path, tmp_path: Path) -> None:
    # A controller killed -9 inside a run's creation: the write-ahead row has no run id, the
    # MLflow run exists; the resumed loop then ended without launching that trial.
    from autoresearch.tracking._sync import Syncer
    from tests.tracking.conftest import make_decision, make_loop, make_trial

    loop_id = make_loop(api, "cut-short")
    trial = make_trial(api, loop_id, make_decision(api, loop_id), {"x": 1})
    syncer = Syncer(quiet)
    run_id, _ = syncer.ensure_run(f"trial:{trial}", "cut-short", f"trial-{trial}", None)
    now = time.time()
    with api._ledger.tx() as c:
        c.execute("UPDATE tracking_runs SET run_id=NULL WHERE entity=?", (f"trial:{trial}",))
        c.execute("UPDATE trials SET state='skipped', failure='not launched: trial budget 1 used', updated_at=? "
                  "WHERE id=?", (now, trial))
        c.execute("UPDATE loops SET state='finished', updated_at=? WHERE id=?", (now, loop_id))

    tracking.sync()

    uri = tracking.tracking_uri(quiet)
    run = client(uri).get_run(run_id)
    assert run.info.status == "KILLED" and run.data.tags["autoresearch.trial_state"] == "skipped"
    assert all(r.info.status != "RUNNING" for r in _runs(api, uri).values())  # the loop's run too
