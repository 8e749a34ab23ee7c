"""The mirror's per-second pass costs what changed, not what the ledger holds (issue 16: it
scanned the whole jobs table, 0.6 ms at 100 jobs and ~200 ms at 50k). A counter, not a timer:
SQLite's virtual-machine steps (a progress handler) in an idle pass at 100 and at 10,000
mirrored jobs."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest


def mirrored_home(root: Path, jobs: int) -> Any:
    """A home whose ``jobs`` jobs all ended and were mirrored long ago, and a syncer on it."""
    from autoresearch.store.ledger import Ledger
    from autoresearch.tracking._sync import Syncer

    ledger = Ledger(root / "home")
    old = time.time() - 3600
    spec = '{"command": ["true"], "tags": {}}'
    with ledger.tx() as c:
        c.executemany("INSERT INTO jobs(id, name, state, priority, spec, gpus, nodes, backend, submitted_at, "
                      "updated_at, ended_at, attempts) VALUES (?, 'true', 'succeeded', 'normal', ?, 0, 1, 'local', "
                      "?, ?, ?, 1)", [(i, spec, old, old, old) for i in range(1, jobs + 1)])
        c.executemany("INSERT INTO tracking_runs(entity, run_id, experiment_id, synced_version, finished, "
                      "created_at, updated_at) VALUES (?, ?, '0', ?, 1, ?, ?)",
                      [(f"job:{i}", f"run{i}", old, old, old) for i in range(1, jobs + 1)])
    syncer = Syncer(ledger, uri=f"sqlite:///{root / 'mlflow.db'}")
    syncer.run_once()  # a fresh syncer's first pass looks at everything
    return syncer


def steps(syncer: Any, every: int = 10) -> int:
    """SQLite VM steps of one idle pass (counted every ``every`` instructions)."""
    conn = syncer.ledger._connect()
    count = [0]

    def tick() -> int:
        count[0] += 1
        return 0

    conn.set_progress_handler(tick, every)
    try:
        report = syncer.run_once()
    finally:
        conn.set_progress_handler(None, every)
    assert report.runs_created == 0 and report.metrics == 0  # idle: nothing to mirror
    return count[0] * every


@pytest.mark.skipif(sys.platform != "linux", reason="the ledger's home is Linux-only")
def test_an_idle_pass_reads_as_much_at_10k_jobs_as_at_100(tmp_path: Path) -> None:
    small = steps(mirrored_home(tmp_path / "small", 100))
    large = steps(mirrored_home(tmp_path / "large", 10_000))
    # A scan of the jobs table costs ~10 steps a row: 100,000 more at 10k jobs than at 100.
    assert large <= small + 200, (small, large)


def test_a_job_that_changes_after_the_first_pass_is_still_mirrored(tmp_path: Path) -> None:
    """The watermark only narrows what is looked at: a change is seen by the next pass."""
    syncer = mirrored_home(tmp_path, 20)
    with syncer.ledger.tx() as c:
        c.execute("UPDATE jobs SET state='failed', updated_at=? WHERE id=7", (time.time(),))
    rows = syncer.store.jobs_to_sync(syncer.jobs_since)
    assert [r["id"] for r in rows] == [7]


def test_points_go_into_a_sqlite_store_in_bulk_with_log_batchs_rows(tmp_path: Path) -> None:
    """Issue 16: 100k points took 16.8 s through log_batch (1,000 a call). Into a SQLite store
    they go in one transaction per job window; the history and latest values MLflow shows are
    the very same, NaN included, and a replay (a crash before the cursor moved) adds nothing."""
    from autoresearch.store.ledger import Ledger
    from autoresearch.tracking._sync import Syncer

    ledger = Ledger(tmp_path / "home")
    now = time.time()
    with ledger.tx() as c:
        c.execute("INSERT INTO jobs(id, name, state, priority, spec, gpus, nodes, backend, submitted_at, updated_at, "
                  "ended_at, attempts) VALUES (1, 'train', 'succeeded', 'normal', '{\"command\": [\"x\"]}', 0, 1, "
                  "'local', ?, ?, ?, 1)", (now, now, now))
        c.executemany("INSERT INTO metrics(job_id, attempt, name, step, value, ts, source) VALUES (1, 1, ?, ?, ?, ?, "
                      "'report')", [(name, i, v, now + i / 1000) for i in range(3000)
                                    for name, v in (("loss", 1.0 / (i + 1)), ("acc", None if i == 7 else i / 3000))])
    syncer = Syncer(ledger, uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    calls: list[int] = []
    real = syncer.client.log_batch

    def counted(run_id: str, metrics: Any = (), **kw: Any) -> Any:
        calls.append(len(metrics))
        return real(run_id, metrics=metrics, **kw)

    syncer.client.log_batch = counted
    report = syncer.run_once()
    assert report.metrics == 6000
    assert sum(calls) == 0  # no point went through log_batch (it took 6 calls of 1,000 before)
    run_id = ledger.one("SELECT run_id FROM tracking_runs WHERE entity='job:1'")["run_id"]
    history = syncer.client.get_metric_history(run_id, "loss")
    assert sorted((m.step, m.value) for m in history) == [(i, 1.0 / (i + 1)) for i in range(3000)]
    acc = {m.step: m.value for m in syncer.client.get_metric_history(run_id, "acc")}
    assert len(acc) == 3000 and acc[7] != acc[7] and acc[2999] == 2999 / 3000  # NaN kept as NaN
    assert syncer.client.get_run(run_id).data.metrics == {"loss": 1.0 / 3000, "acc": 2999 / 3000}
    with ledger.tx() as c:
        c.execute("DELETE FROM tracking_state WHERE name='metrics'")  # as if the cursor never moved
    syncer.run_once()
    assert len(syncer.client.get_metric_history(run_id, "loss")) == 3000  # the replay added nothing


def test_the_background_syncer_alone_moves_the_imported_heap_out_of_the_collector(tmp_path: Path) -> None:
    """mlflow's and SQLAlchemy's import leave ~400,000 objects for the process's life; every full
    collection in a pass walked them all (~0.3 s of a 600-trial catch-up's ~1.1 s of user time). The
    background syncer's process freezes them (``gc.freeze``) once its Syncer is made. A Syncer made in
    any other process (a trial's ``start_run``, the loop's run maker, a server) freezes nothing: a
    frozen object that later becomes garbage in a cycle is never freed, and there the heap is the user's."""
    import subprocess
    import sys

    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}", "AUTORESEARCH_SYNC": "off"}
    library = ("import gc, sys; from autoresearch.store.ledger import Ledger; from autoresearch.tracking._sync import "
               "Syncer; Syncer(Ledger(sys.argv[1])); print(gc.get_freeze_count())")
    mirror = ("import gc, sys; from pathlib import Path; from autoresearch.tracking._daemon import serve; "
              "serve(Path(sys.argv[1]), idle_exit_s=0.5); print(gc.get_freeze_count())")
    counts = [int(subprocess.run([sys.executable, "-c", code, str(home)], env=env, capture_output=True, text=True,
                                 timeout=240, check=True).stdout.split()[-1]) for code in (library, mirror)]
    assert counts[0] == 0 and counts[1] > 100_000, counts
