"""Issue 16: the controller's cost per trial event is flat in the number of trials done.

A loop that already has N ended trials (seeded in the ledger: 100, then 2,000) runs a few
more real trials with the live table attached; we count, per trial that ends, the rows the
loop reads from its own tables (trials, decisions, loops), the ``json.loads`` calls made
by the loop and the live table, and the trials the controller and the proposer walk in Python
(its mirror of the trial rows, their records and curves, the history a proposer gets).
Counters, not time: the machine may be loaded.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from autoresearch.loop.controller import Controller
from autoresearch.loop.plan import parse_plan, plan_json
from autoresearch.loop.proposers import Proposal, ProposeResult, ProposerInfo
from autoresearch.loop.state import LoopState
from autoresearch.loop.store import LoopStore
from autoresearch.store.ledger import Ledger

NEW = 12  # real trials run on top of the seeded ones
LOOP_TABLES = ("FROM trials", "FROM decisions", "FROM loops")
OURS = ("autoresearch.loop", "autoresearch.cli._live")
VM_UNIT = 100  # SQLite VM instructions per unit of "vm" (a query that scans every decision of the loop: ~tens)


def _plan(tmp_path: Path, trials: int) -> Any:
    return parse_plan({"name": "flat", "objective": {"metric": "loss"},
                       "trial": {"command": f"{sys.executable} -c \"print('loss: {{x}}')\"", "grace": 1},
                       "space": {"x": {"low": 0.0, "high": 1.0}}, "proposer": {"kind": "random"},
                       "budget": {"trials": trials, "parallel": 4, "llm_usd": 1e6}}, base_dir=tmp_path)  # (its check runs)


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


class _Walked(dict):  # type: ignore[type-arg]
    """A dict that counts the entries walked through it (``visits``), while ``on[0]``."""

    def __init__(self, data: dict[Any, Any], counts: dict[str, int], on: list[bool]) -> None:
        super().__init__(data)
        self.counts, self.on = counts, on

    def _walk(self, it: Any) -> Any:
        for x in it:
            if self.on[0]:
                self.counts["visits"] += 1
            yield x

    def __iter__(self) -> Any:
        return self._walk(super().__iter__())

    def keys(self) -> Any:
        return self._walk(super().keys())

    def values(self) -> Any:
        return self._walk(super().values())

    def items(self) -> Any:
        return self._walk(super().items())


class _WalkedList(list):  # type: ignore[type-arg]
    def __init__(self, data: list[Any], counts: dict[str, int], on: list[bool]) -> None:
        super().__init__(data)
        self.counts, self.on = counts, on

    def __iter__(self) -> Any:
        for x in super().__iter__():
            if self.on[0]:
                self.counts["visits"] += 1
            yield x


def _per_event(api: Any, tmp_path: Path, seeded: int) -> dict[str, float]:
    """Rows of the loop's tables read and json.loads calls of the loop, per trial that ends."""
    from rich.console import Console

    from autoresearch.cli._live import LiveTable

    plan = _plan(tmp_path, seeded + NEW)
    _seed(api._ledger, plan, seeded)
    counts = {"rows": 0, "vm": 0, "loads": 0, "visits": 0, "events": 0}
    seen = dict(counts)  # the counters at the last live update (the final view reads the whole loop once)
    counting = [False]
    query, loads = Ledger.query, json.loads

    def vm_steps() -> int:  # SQLite's progress handler: every VM_UNIT instructions of the query
        counts["vm"] += 1
        return 0

    def counted_query(self: Ledger, sql: str, params: Any = ()) -> Any:
        if not (counting[0] and any(t in sql for t in LOOP_TABLES)):
            return query(self, sql, params)
        conn = self._connect()  # the rows a query scans count, not only those it returns
        conn.set_progress_handler(vm_steps, VM_UNIT)
        try:
            rows = query(self, sql, params)
        finally:
            conn.set_progress_handler(None, VM_UNIT)
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
    real_open, real_history = Controller.open, LoopState.history

    def walked_open(self: Controller) -> None:  # the state's trial dicts count what is walked through them
        real_open(self)
        for name in ("rows", "records", "series"):
            setattr(self.state, name, _Walked(getattr(self.state, name), counts, counting))

    def walked_history(self: LoopState) -> list[Any]:  # and so does the history a proposer walks
        return _WalkedList(real_history(self), counts, counting)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Ledger, "query", counted_query)
        patch.setattr(json, "loads", counted_loads)
        patch.setattr(Controller, "open", walked_open)
        patch.setattr(LoopState, "history", walked_history)
        view = controller.run()
    assert view.counts.get("succeeded", 0) == seeded + NEW, view.counts
    assert NEW - 4 <= seen["events"] <= NEW, seen
    return {k: seen[k] / seen["events"] for k in ("rows", "vm", "loads", "visits")}


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
    # Work inside SQLite too: a query that returns nothing but scans every decision of the loop (the
    # stop_loop check, the llm_usd budget) grew with the trials done.
    assert large["vm"] <= small["vm"] * 1.25 + 20, (small, large)
    # Trials walked in Python per end: the pause check walked every row, the proposer's history every
    # record, the random proposer every record of it (~2,000+ per event at 2,000 trials before).
    assert large["visits"] <= small["visits"] * 1.25 + 5, (small, large)
    assert large["visits"] < 300, large


def test_the_random_proposers_incremental_count_proposes_what_a_fresh_one_would(tmp_path: Path) -> None:
    from autoresearch.loop.proposers import ProposerContext, TrialRecord, make_proposer

    plan = _plan(tmp_path, 100)

    def records(n: int, first: int = 1) -> list[TrialRecord]:
        return [TrialRecord(trial_id=i, params={"x": 0.5}, state="succeeded", objective=0.5,
                            role="repeat" if i % 3 == 0 else "explore") for i in range(first, first + n)]

    def fresh() -> Any:
        return make_proposer(ProposerContext(plan, 1, plan.name, tmp_path, None))

    growing, seen = fresh(), records(40)
    for n in (0, 5, 17, 40):  # a history that grows by appending, as the loop's does
        assert growing.propose(seen[:n], 3).proposals == fresh().propose(seen[:n], 3).proposals
    other = records(7, first=100)  # another history (a resumed loop, a test): counted anew
    assert growing.propose(other, 2).proposals == fresh().propose(other, 2).proposals


def test_a_trials_end_and_its_judgment_are_one_transaction(home: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Per trial that ends, the loop writes its row and its promote decision (keep or discard) in one
    transaction, not two: each is a commit on the controller's path, per trial."""
    statements: list[str] = []
    real = Ledger._connect

    def connect(self: Ledger) -> Any:
        conn = real(self)
        conn.set_trace_callback(statements.append)
        return conn

    monkeypatch.setattr(Ledger, "_connect", connect)
    plan = parse_plan({"name": "tx", "objective": {"metric": "loss"},
                       "trial": {"command": "echo loss: {x}", "shell": True, "grace": 1},
                       "space": {"x": {"low": 0.0, "high": 1.0}}, "proposer": {"kind": "random"},
                       "budget": {"trials": 6, "parallel": 3}}, base_dir=tmp_path)
    view = Controller(plan, home=home).run()
    assert view.counts.get("succeeded") == 6
    ends = [i for i, s in enumerate(statements) if s.startswith("UPDATE trials SET state='succeeded'")]
    assert len(ends) == 6
    for i in ends:
        rest = statements[i + 1:]
        commit = next(k for k, s in enumerate(rest) if s == "COMMIT")
        judged = [s for s in rest[:commit] if s.startswith("INSERT INTO decisions")]
        assert len(judged) == 1 and "'promote'" in judged[0], rest[:commit + 1]
