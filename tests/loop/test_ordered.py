"""Reproducible sweeps: a seeded CI run gives the same trials, decisions and best whatever order its
trials end in (autoresearch/loop/ordered.py)."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from autoresearch.loop.controller import Controller
from autoresearch.loop.plan import parse_plan

# loss x + 1/step over 6 printed epochs; how fast each trial goes is the run's DELAYS (by x), not its values
TRIAL = textwrap.dedent("""\
    import os, sys, time
    x = float(sys.argv[1])
    delay = float(os.environ["DELAYS"].split(",")[int(x)])
    for step in range(1, 7):
        time.sleep(delay)
        print(f"epoch {step} loss: {x + 1.0 / step}", flush=True)
""")


def _run(api: Any, work: Path, name: str, delays: str) -> dict[str, Any]:
    plan = parse_plan({
        "name": name, "objective": {"metric": "loss"},
        "trial": {"command": f"{sys.executable} trial.py {{x}}", "grace": 5, "env": {"DELAYS": delays}},
        "space": {"x": {"choices": [0.0, 1.0, 2.0, 3.0]}}, "proposer": {"kind": "grid", "seed": 0},
        "budget": {"trials": 4, "parallel": 4},
        "early_stop": {"kind": "asha", "min_steps": 1, "reduction_factor": 2}}, base_dir=work)
    view = Controller(plan, runtime=api._runtime, hard_budgets=True).run()  # a --ci run
    loop = api._ledger.query("SELECT id FROM loops WHERE name=?", (name,))[0]["id"]
    stops = {d["trial_id"]: json.loads(d["inputs"])["step"] for d in api._ledger.query(
        "SELECT * FROM decisions WHERE loop_id=? AND kind='stop'", (loop,))}
    first = min(t.trial_id for t in view.trials)  # (trial ids are the home's: numbered within the loop here)
    return {"trials": sorted((t.trial_id - first, t.params["x"], t.state, t.objective) for t in view.trials),
            "stops": {t - first: step for t, step in stops.items()},
            "best": (None if view.best_trial is None else view.best_trial - first, view.best_value)}


@pytest.mark.slow
def test_a_seeded_ci_sweep_is_the_same_whatever_order_its_trials_end_in(api: Any, home: Path, tmp_path: Path) -> None:
    """Before, a rung compared a trial with whichever trials had got there first: the fastest trial
    (the worst here) reached every rung alone, was never stopped and finished, in one order and not
    in the other. Now a trial is judged against the trials below it, once they are in."""
    (tmp_path / "trial.py").write_text(TRIAL)
    first = _run(api, tmp_path, "fast-first", "0.03,0.25,0.25,0.25")  # trial 1 ends before the others start
    last = _run(api, tmp_path, "fast-last", "0.35,0.25,0.15,0.03")  # trial 4 reaches every rung first
    assert first == last, (first, last)
    states = {x: state for _, x, state, _ in first["trials"]}
    assert states[0.0] == "succeeded" and states[3.0] == "stopped" and first["best"][0] == 0
