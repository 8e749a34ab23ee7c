"""Budgets that hold: a ``steps`` budget is not exceeded by more than what the running trials
reported since the loop's last look (they are stopped once it is spent)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

from autoresearch.loop.controller import Controller
from autoresearch.loop.plan import parse_plan

TRIAL = textwrap.dedent("""\
    import sys, time
    for step in range(1, 41):
        time.sleep(0.05)
        print(f"epoch {step} loss: {float(sys.argv[1]) + 1.0 / step}", flush=True)
""")


def test_a_steps_budget_holds(api: Any, tmp_path: Path) -> None:
    """Before, once the budget was spent nothing launched but the running trials trained to their end
    (here 2 x 40 = 80 steps against a budget of 20)."""
    (tmp_path / "trial.py").write_text(TRIAL)
    plan = parse_plan({
        "name": "steps", "objective": {"metric": "loss"},
        "trial": {"command": f"{sys.executable} trial.py {{x}}", "grace": 5},
        "space": {"x": {"choices": [0.0, 1.0, 2.0]}}, "proposer": {"kind": "grid"},
        "budget": {"trials": 3, "parallel": 2, "steps": 20}}, base_dir=tmp_path)
    view = Controller(plan, runtime=api._runtime).run()
    spent = sum(int(api._ledger.query("SELECT max(step) AS s FROM metrics WHERE job_id=? AND name='loss'",
                                      (t.job_id,))[0]["s"] or 0) for t in view.trials if t.job_id is not None)
    assert view.counts == {"stopped": 2, "skipped": 1} or view.counts == {"stopped": 2}, view.counts
    # the overshoot: what two trials report in a look (0.5 s) and their stop, with room for a loaded machine
    assert 20 <= spent < 60, spent
    assert view.budget_spent == f"steps {spent}/20", view.budget_spent  # the summary shows spent vs budget
    from autoresearch.loop.report import summary_markdown

    assert f"**Budgets spent / given:** steps {spent}/20." in summary_markdown(view, {}, [])
