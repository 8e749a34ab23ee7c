"""The digits example's plan (smaller) on a real Ray head lands in MLflow like a local run:
trials' metrics reach the ledger through Ray's log and the mirror writes them to their runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoresearch import tracking
from autoresearch.loop.controller import Controller
from autoresearch.loop.plan import parse_plan
from tests.tracking.conftest import client

from .conftest import RayHead

pytestmark = pytest.mark.slow
DIGITS = Path(__file__).resolve().parents[2] / "examples" / "digits"


@pytest.mark.timeout(300)
def test_a_small_digits_plan_on_ray_lands_in_mlflow(ray_env: RayHead, home: Path) -> None:
    pytest.importorskip("sklearn")
    plan = parse_plan({
        "name": "digits-ray",
        "objective": {"metric": "val_loss", "goal": "minimize"},
        "trial": {"command": "python train.py --lr {lr} --hidden 16 --epochs 3 --seed 0", "workdir": str(DIGITS),
                  "timeout": "3m", "grace": "2s"},
        "space": {"lr": {"choices": [0.01, 0.05]}},
        "proposer": {"kind": "grid"},
        "budget": {"trials": 2, "parallel": 2},
        "backend": {"kind": "ray", "options": {"address": ray_env.address}},
    }, base_dir=DIGITS)
    view = Controller(plan, home=home).run()
    assert view.counts == {"succeeded": 2}, view
    tracking.sync(home)
    uri = tracking.tracking_uri(home)
    from autoresearch.store.ledger import Ledger

    ledger = Ledger(home)
    runs = ledger.query("SELECT run_id FROM tracking_runs WHERE entity LIKE 'trial:%'")
    assert len(runs) == 2
    for row in runs:
        history = client(uri).get_metric_history(row["run_id"], "val_loss")
        assert sorted(m.step for m in history) == [0, 1, 2]  # every epoch's report(), once
    backends = {r["backend"] for r in ledger.query("SELECT backend FROM jobs")}
    assert backends == {"ray"}
