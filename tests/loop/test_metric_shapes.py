"""Metrics a researcher cannot miss (issue 13): a trial that prints its objective in a common
shape is heard (so early stopping works), and one that never shows it gets a warning naming
the accepted shapes, on its job (``status``) and in the live display."""

from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from autoresearch.cli._live import LiveTable
from autoresearch.engine import metrics as M
from autoresearch.loop.controller import Controller
from autoresearch.loop.plan import parse_plan
from autoresearch.loop.views import LoopView, TrialRow

EPOCH_LINES = textwrap.dedent("""\
    import sys, time
    x = float(sys.argv[1])
    for epoch in range(12):
        time.sleep(0.15)
        print(f"epoch {epoch} val_loss: {x + 1.0 / (epoch + 1)}", flush=True)
""")
SILENT = textwrap.dedent("""\
    import time
    print("loading data...", flush=True)
    time.sleep(2.0)
    print("loss: 1.0")
""")


def plan_for(work: Path, script: str, metric: str, **extra: Any) -> Any:
    (work / "trial.py").write_text(script)
    return parse_plan({"name": "shapes", "objective": {"metric": metric},
                       "trial": {"command": f"{sys.executable} trial.py {{x}}", "grace": 1},
                       "space": {"x": {"choices": [0.0, 5.0, 6.0]}}, "proposer": {"kind": "grid"},
                       "budget": {"trials": 3, "parallel": 1}, **extra}, base_dir=work)


def test_asha_hears_a_trial_printing_epoch_lines(api: Any, tmp_path: Path) -> None:
    plan = plan_for(tmp_path, EPOCH_LINES, "val_loss",
                    early_stop={"kind": "asha", "min_steps": 1, "reduction_factor": 2})
    view = Controller(plan, runtime=api._runtime, monitor_every_s=0.1).run()
    states = {t.params["x"]: t.state for t in view.trials}
    assert states == {0.0: "succeeded", 5.0: "stopped", 6.0: "stopped"}
    assert view.best_value == pytest.approx(0.0 + 1.0 / 12)


def test_a_trial_silent_on_its_objective_is_warned_once_with_the_formats(
        api: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(M, "UNSEEN_AFTER_S", 0.5)
    plan = plan_for(tmp_path, SILENT, "loss", budget={"trials": 1, "parallel": 1},
                    early_stop={"kind": "asha", "min_steps": 1})
    view = Controller(plan, runtime=api._runtime, monitor_every_s=0.1).run()
    job = api.status(view.trials[0].job_id)
    warned = [w for w in job.warnings if "no 'loss' seen" in w]
    assert len(warned) == 1 and "epoch 3 loss: 0.95" in warned[0] and "JSON" in warned[0]
    assert api._ledger.one("SELECT COUNT(*) AS n FROM events WHERE kind='metric_unseen'")["n"] == 1


def test_the_live_display_warns_once_about_an_unseen_objective(capsys: pytest.CaptureFixture[str]) -> None:
    plan = type("P", (), {})()
    started = time.time() - 2 * M.UNSEEN_AFTER_S
    trial = TrialRow(7, 7, "explore", "running", {"lr": 0.1}, None, None, None, None, started_at=started)
    heard = TrialRow(8, 8, "explore", "running", {"lr": 0.2}, None, None, None, None, step=3, value=0.5,
                     started_at=started)
    view = LoopView("demo", 1, "running", "val_acc", "maximize", [trial, heard], {"running": 2}, None, None)
    live = LiveTable(plan, interactive=False)
    live.update(view)
    live.update(view)
    out = capsys.readouterr().out
    assert out.count("warning: trial 7: no 'val_acc' seen") == 1 and "trial 8" not in out
    assert "epoch 3 val_acc: 0.95" in out
    table = LiveTable(plan, interactive=True)._table(view)  # on a terminal: under the table while it lasts
    assert "no 'val_acc' seen" in str(table.caption)
