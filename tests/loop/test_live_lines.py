"""The loop's line per ended trial (no terminal: CI logs) says why "best" moved when a seed
repeat ended: best is the incumbent's mean over its seeds, so it can rise, or go back to an
earlier incumbent (seen on the README's digits run: best 0.0539, then 0.0626, then 0.0754)."""

from __future__ import annotations

import io
from typing import Any

from autoresearch.cli._live import LiveTable
from autoresearch.loop.views import LoopView, TrialRow


class _Plan:
    name = "p"
    proposer = type("K", (), {"kind": "grid"})
    budget = type("B", (), {"trials": 4, "parallel": 2})
    objective = type("O", (), {"goal": "minimize", "metric": "loss"})


def _row(trial_id: int, role: str, value: float, best: float, incumbent: int, parent: int | None = None,
         kept: bool = False) -> TrialRow:
    return TrialRow(trial_id, trial_id, role, "succeeded", {"x": 1}, 0, parent, value, best, ended_at=float(trial_id),
                    kept=kept, incumbent_after=incumbent)


def lines(trials: list[TrialRow]) -> list[str]:
    table = LiveTable(_Plan(), interactive=False)
    table.console.file = buf = io.StringIO()
    table.update(LoopView("p", 1, "running", "loss", "minimize", trials, {}, None, None))
    return buf.getvalue().splitlines()


def test_a_seed_repeat_line_says_best_is_the_incumbents_mean() -> None:
    out: list[Any] = lines([_row(1, "explore", 0.08, 0.08, 1, kept=True), _row(2, "explore", 0.054, 0.054, 2, kept=True),
                            _row(3, "repeat", 0.071, 0.0626, 2, parent=2), _row(4, "repeat", 0.106, 0.0754, 1, parent=2)])
    assert out[2].startswith("trial 3 (job 3) succeeded loss=0.071 (seed of #2; best: incumbent #2's mean over its "
                             "ended seeds) best=0.0626")
    assert "(seed of #2; best: incumbent #1's mean over its ended seeds) best=0.0754" in out[3]  # back to #1
    assert "(kept: new incumbent)" in out[1]
