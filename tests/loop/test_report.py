"""The report: plots and summary from the ledger, including a code-edit lineage."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from autoresearch.errors import NotFoundError, SpecError
from autoresearch.loop.report import write_report


def seed_loop(api: Any) -> None:
    """A finished loop as the controller leaves it: a base trial, two edits of it, one edit of an edit."""
    plan = {"name": "edits", "objective": {"metric": "val_bpb", "goal": "minimize"}, "budget": {"trials": 4,
            "parallel": 2}, "repeats": None}
    now = time.time()
    with api._ledger.tx() as c:
        loop = c.execute("INSERT INTO loops(name, plan, state, experiment, created_at, updated_at) VALUES "
                         "('edits', ?, 'finished', 'edits', ?, ?)", (json.dumps(plan), now, now)).lastrowid
        trials = [(None, None, "succeeded", 1.00), (1, "--- a\n+++ b\n", "succeeded", 0.98),
                  (1, "--- a\n+++ b\n", "failed", None), (2, "--- a\n+++ b\n", "succeeded", 0.97)]
        for i, (parent, patch, state, value) in enumerate(trials):
            c.execute("INSERT INTO trials(loop_id, parent_trial, params, patch, seed, proposer, state, objective, "
                      "created_at, updated_at, started_at, ended_at, failure) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                      (loop, parent, json.dumps({"lr": 0.01 * (i + 1)}), patch, 0, "code", state, value, now, now,
                       now + i, now + i + 1, "exited 1\nSyntaxError" if state == "failed" else None))
        c.execute("INSERT INTO decisions(loop_id, kind, outputs, created_at, trial_id) VALUES "
                  "(?, 'promote', ?, ?, 4)", (loop, json.dumps({"promoted": True, "trial_id": 4}), now))


def test_report_has_plots_lineage_and_summary(api: Any, tmp_path: Path) -> None:
    seed_loop(api)
    view = write_report(api._ledger, "edits", tmp_path / "out")
    files = {p.name for p in (tmp_path / "out").iterdir()}
    assert {"best_vs_trials.png", "best_vs_time.png", "parallel.png", "lineage.png", "summary.md"} <= files
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "**Best:** trial 4" in summary and "0.97" in summary
    assert "trial 3 (failed): exited 1" in summary
    assert "Noise floor:** not measured" in summary
    assert view.best_trial == 4 and view.counts == {"succeeded": 3, "failed": 1}


def test_report_of_unknown_loop_lists_known_ones(api: Any) -> None:
    seed_loop(api)
    with pytest.raises(NotFoundError) as info:
        write_report(api._ledger, "edit")
    assert "edits" in info.value.hint


def test_unknown_backend_fails_before_anything_launches(home: Path, tmp_path: Path) -> None:
    from autoresearch.loop.controller import Controller
    from autoresearch.loop.plan import parse_plan

    with pytest.raises(SpecError) as info:  # refused when the plan is loaded, before any loop row
        plan = parse_plan({"name": "b", "objective": {"metric": "loss"}, "trial": {"command": "true {x}"},
                           "space": {"x": [1]}, "backend": {"kind": "slurmm"}}, base_dir=tmp_path)
        Controller(plan, home=home).run()
    assert "unknown backend 'slurmm'" in info.value.message and "local" in info.value.hint


def test_importances_with_under_three_finished_trials_import_no_scikit_learn() -> None:
    """The plot needs 3 finished trials; with fewer it is skipped before optuna.importance and
    scikit-learn are imported (~2 s of a short CLI loop's report)."""
    code = textwrap.dedent("""\
        import sys
        from types import SimpleNamespace as N
        from autoresearch.loop._plots import ReportData, plot_importances
        t = lambda v: N(role="explore", state="succeeded", objective=v, params={"x": v}, created_at=0.0)
        view = N(trials=[t(0.1), t(0.2), N(role="explore", state="failed", objective=None, params={}, created_at=0.0)],
                 goal="minimize", metric="loss", name="l")
        data = ReportData(view=view, plan={"space": {"x": {"low": 0.0, "high": 1.0}}})
        print(plot_importances(data), "optuna.importance" in sys.modules, "sklearn" in sys.modules)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["None", "False", "False"], done.stderr[-2000:]


def test_an_all_failed_loop_draws_its_report_without_matplotlib_warnings(api: Any, tmp_path: Path,
                                                                         recwarn: pytest.WarningsRecorder) -> None:
    plan = {"name": "broken", "objective": {"metric": "loss", "goal": "minimize"}, "budget": {"trials": 3,
            "parallel": 1}, "repeats": None}
    now = time.time()
    with api._ledger.tx() as c:
        loop = c.execute("INSERT INTO loops(name, plan, state, experiment, created_at, updated_at) VALUES "
                         "('broken', ?, 'finished', 'broken', ?, ?)", (json.dumps(plan), now, now)).lastrowid
        for i in range(3):
            c.execute("INSERT INTO trials(loop_id, params, seed, proposer, state, created_at, updated_at, "
                      "started_at, ended_at, failure) VALUES (?,?,?,?,?,?,?,?,?,?)",
                      (loop, json.dumps({"lr": 0.1 * (i + 1)}), 0, "random", "failed", now, now, now + i, now + i + 1,
                       "exited 1\nImportError: no module named torch"))
    view = write_report(api._ledger, "broken", tmp_path / "out")
    assert view.counts == {"failed": 3} and (tmp_path / "out" / "summary.md").exists()
    said = [str(w.message) for w in recwarn.list]
    assert not [w for w in said if "No artists with labels" in w], said
