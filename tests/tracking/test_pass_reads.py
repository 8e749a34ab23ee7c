"""A mirror pass reads the ledger in bulk: its queries do not grow with the trials it mirrors.

A catch-up of 600 trials made ~17,000 ledger queries (~28 a trial: each trial's loop, loop run,
trial, decision, verdict, last attempt, run id, error, reported names, logs), most of the mirror's
CPU a trial beside MLflow's own writes. A pass now reads each table once for its batch.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.tracking.conftest import make_decision, make_loop, make_trial


def _loop_home(home: Path, n: int) -> list[int]:
    """A loop's home: ``n`` proposals with a trial each that never ran, and a keep-or-discard decision
    on each (every other one promoted: the verdicts are retagged)."""
    from autoresearch.api import Api

    api = Api(home)
    loop = make_loop(api, "reads", {"name": "reads", "objective": {"metric": "loss", "goal": "minimize"},
                                    "space": {"lr": {"low": 0.0, "high": 1.0}}})
    trials = []
    for i in range(n):
        propose = make_decision(api, loop, "propose", outputs={"proposals": [{"lr": i / n}]})
        trial = make_trial(api, loop, propose, {"lr": i / n})
        promote = make_decision(api, loop, "promote", outputs={"promoted": i % 2 == 0},
                                inputs={"incumbent_trial": trials[-1] if trials and i % 2 == 0 else None})
        with api._ledger.tx() as c:
            c.execute("UPDATE decisions SET trial_id=? WHERE id=?", (trial, promote))
            c.execute("UPDATE trials SET state='skipped', failure='the loop ended first', updated_at=? WHERE id=?",
                      (time.time(), trial))
        trials.append(trial)
    with api._ledger.tx() as c:
        c.execute("UPDATE loops SET state='done', updated_at=? WHERE id=?", (time.time(), loop))
    return trials


def _queries_of_catch_up(home: Path, n: int) -> tuple[int, Any]:
    from autoresearch.tracking._sync import Syncer

    trials = _loop_home(home, n)
    syncer = Syncer(home)
    syncer.prepare_trials(trials)  # the runs, as the run maker makes them before launch
    calls = 0
    real = syncer.ledger.query

    def counted(sql: str, params: Any = ()) -> Any:
        nonlocal calls
        calls += 1
        return real(sql, params)

    syncer.ledger.query = counted  # type: ignore[method-assign]
    for _ in range(5):  # passes until one finds nothing to do
        if not syncer.run_once().did_work:
            break
    return calls, syncer


@pytest.mark.slow
def test_a_pass_reads_the_ledger_a_table_at_a_time_not_a_trial_at_a_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTORESEARCH_SYNC", "off")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    few, _ = _queries_of_catch_up(tmp_path / "few", 4)
    many, syncer = _queries_of_catch_up(tmp_path / "many", 16)
    # 12 trials more: 24 decisions, 12 verdicts, 12 runs ended. Before: ~7 queries each (~130 more).
    assert many - few <= 6, (few, many)
    # and everything was mirrored: the decisions, the trials' runs ended with their verdicts
    assert syncer.cursor("decisions") == 32
    ended = syncer.ledger.query("SELECT COUNT(*) AS n FROM tracking_runs WHERE entity LIKE 'trial:%' AND finished=1")
    assert ended[0]["n"] == 16
    run_id = syncer.store.run_id_of("trial:1")
    tags = syncer.client.get_run(run_id).data.tags
    assert tags["autoresearch.verdict"] == "replaced by #3" and tags["autoresearch.skipped"] == "the loop ended first"
