"""Issue 16: the controller's cost per trial event is flat in the number of trials done.

A loop that already has N ended trials (seeded in the ledger: 100, then 2,000) runs a few
more real trials with the live table attached; we count, per trial that ends, the rows the
loop reads from its own tables (trials, decisions, loops) and the ``json.loads`` calls made
by the loop and the live table. Counters, not time: the machine may be loaded.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from autoresearch.ledger import Ledger
from autoresearch.loop.controller import Controller
from autoresearch.loop.plan import parse_plan, plan_json
from autoresearch.loop.proposers import Proposal, ProposeResult, ProposerInfo
from autoresearch.loop.store import LoopStore

NEW = 12  # real trials run on top of the seeded ones
LOOP_TABLES = ("FROM trials", "FROM decisions", "FROM loops")
OURS = ("autoresearch.loop", "autoresearch.cli._live")


def _plan(tmp_path: Path, trials: int) -> Any:
    return parse_plan({"name": "flat", "objective": {"metric": "loss"},
                       "trial": {"command": f"{sys.executable} -c \"print('loss: {{x}}')\"", "grace": 1},
                       "space": {"x": {"low": 0.0, "high": 1.0}}, "proposer": {"kind": "random"},
                       "budget": {"trials": trials, "parallel": 4}}, base_dir=tmp_path)


def _seed(ledger: Ledger, plan: Any, n: int) -> None:
    """A loop row and ``n`` ended trials with their keep-or-discard decisions, as a run leaves them."""
    store = LoopStore.create(ledger, plan.name, plan_json(plan), plan.digest(), plan.name)
    info = ProposerInfo(kind="random")
    for start in range(0, n, 100):
        proposals = [Proposal({"x": (start + i) / n}) for i in range(min(100, n - start))]
        ids = store.record_proposals(ProposeResult(proposals, info), proposals, inputs={})
        for k, trial_id in enumerate(ids):
            value = 1.0 - (start + k) / n  # each one better: every trial is promoted (the worst case for a rescan)
            store.update_trial(trial_id, state="succeeded", objective=value, ended_at=1e9 + trial_id,
                               started_at=1e9 + trial_id - 1, metrics=json.dumps({"loss": value}))
            store.decide("promote", trial_id=trial_id, outputs={"promoted": True, "trial_id": trial_id,
                                                                 "margin": 0.1})


def _per_event(api: Any, tmp_path: Path, seeded: int) -> dict[str, float]:
    """Rows of the loop's tables read and json.loads calls of the loop, per trial that ends."""
    from rich.console import Console

    from autoresearch.cli._live import LiveTable

    plan = _plan(tmp_path, seeded + NEW)
    _seed(api._ledger, plan, seeded)
    counts = {"rows": 0, "loads": 0, "events": 0}
    seen = dict(counts)  # the counters at the last live update (the final view reads the whole loop once)
    counting = [False]
    query, loads = Ledger.query, json.loads

    def counted_query(self: Ledger, sql: str, params: Any = ()) -> Any:
        rows = query(self, sql, params)
        if counting[0] and any(t in sql for t in LOOP_TABLES):
            counts["rows"] += len(rows)
        return rows

    def counted_loads(*args: Any, **kwargs: Any) -> Any:
        if counting[0] and sys._getframe(1).f_globals.get("__name__", "").startswith(OURS):
            counts["loads"] += 1
        return loads(*args, **kwargs)

    table = LiveTable(plan, interactive=True)
    table.console = Console(file=io.StringIO(), width=200)
    ended: set[int] = set()

    def update(view: Any) -> None:
        table.console.print(table._table(view))  # what the live display renders, every time
        fresh = {t.trial_id for t in view.trials if t.ended_at} - ended
        ended.update(fresh)
        if not counting[0]:  # the first view replays the past once (a resumed loop): not per event
            counting[0] = True
            return
        if view.state == "running":
            counts["events"] += len(fresh)
            seen.update(counts)

    # Only the forced updates (one per trial end) and no timed monitor: the counts do not depend on speed.
    controller = Controller(plan, runtime=api._runtime, resume=True, on_update=update, update_every_s=1e9,
                            monitor_every_s=1e9)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Ledger, "query", counted_query)
        patch.setattr(json, "loads", counted_loads)
        view = controller.run()
    assert view.counts.get("succeeded", 0) == seeded + NEW, view.counts
    assert NEW - 4 <= seen["events"] <= NEW, seen
    return {k: seen[k] / seen["events"] for k in ("rows", "loads")}


def test_the_loops_reads_per_trial_end_do_not_grow_with_the_trials_done(home: Path, tmp_path: Path) -> None:
    from autoresearch.api import Api

    small = _per_event(Api(home / "small"), tmp_path, 100)
    large = _per_event(Api(home / "large"), tmp_path, 2000)
    print("per trial end:", small, large)
    # Before issue 16 the live view re-read every trial and decision per update: ~2,000 rows and
    # ~4,000 json.loads per event at 2,000 trials, 20x the figures at 100.
    assert large["rows"] <= small["rows"] * 1.25 + 5, (small, large)
    assert large["loads"] <= small["loads"] * 1.25 + 5, (small, large)
    assert large["rows"] < 100 and large["loads"] < 100, large
