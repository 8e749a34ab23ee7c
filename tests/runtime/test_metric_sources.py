"""One rule, read everywhere: a value reported with ``report()`` beats one parsed from the log."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from autoresearch.engine import metrics as M
from autoresearch.loop.outcomes import final_metrics
from autoresearch.store.ledger import Ledger
from tests.conftest import wait_state


def row(name: str, source: str, value: float, attempt: int = 1, job_id: int = 1) -> dict[str, Any]:
    return {"name": name, "source": source, "value": value, "attempt": attempt, "job_id": job_id}


def test_a_log_point_gives_way_to_a_reported_one_of_the_same_name() -> None:
    points = [row("loss", "log", 9.0), row("loss", "report", 0.5), row("lr", "log", 0.1), row("loss", "log", 8.0)]
    assert M.best_source(points) == [row("loss", "report", 0.5), row("lr", "log", 0.1)]


def test_the_key_narrows_the_rule_and_a_window_takes_the_reported_keys_from_the_caller() -> None:
    points = [row("loss", "report", 0.5, attempt=1), row("loss", "log", 0.7, attempt=2)]
    per_attempt = M.best_source(points, key=lambda p: (p["job_id"], p["attempt"]))
    assert per_attempt == points  # attempt 2 reported nothing: its parsed line stands
    assert M.best_source(points) == points[:1]  # per job: the reported name wins over every attempt's log
    window = [row("loss", "log", 0.7, attempt=2)]
    assert M.best_source(window, reported={"loss"}) == []
    assert M.best_source(window, reported=set()) == window


def test_metrics_and_the_loop_read_the_reported_value(api: Any, home: Path) -> None:
    script = ("from autoresearch import report\n"
              "report(step=0, loss=0.5)\n"
              "print('loss: 99.0')\nprint('lr: 0.1')")
    job = int(api.submit({"command": [sys.executable, "-c", script], "workdir": os.getcwd()}).id)
    wait_state(api, job, "succeeded")
    by_name = {m.name: m for m in api.metrics(job)}
    assert by_name["loss"].last == pytest.approx(0.5) and by_name["loss"].count == 1
    assert by_name["lr"].last == pytest.approx(0.1)
    assert final_metrics(Ledger(home), job) == {"loss": pytest.approx(0.5), "lr": pytest.approx(0.1)}
