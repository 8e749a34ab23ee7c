"""A loop on the in-memory fake backend: the controller's bookkeeping without processes.

Each trial's program is a fake :class:`Script` that prints its objective from its own
argv (``train {x}``) and exits, so a grid search finishes in a blink and the best trial
is known in advance.
"""

from __future__ import annotations

from pathlib import Path

from autoresearch.backends import LaunchRequest
from autoresearch.backends.fake import FakeBackend, Script
from autoresearch.engine.runtime import Runtime
from autoresearch.loop.controller import Controller
from autoresearch.loop.plan import parse_plan


def loss_of(request: LaunchRequest) -> bytes:
    x = float(request.argv[1])
    return f"loss: {(x - 0.5) ** 2}\n".encode()


def test_grid_loop_on_the_fake_backend_finds_the_best_trial(home: Path, tmp_path: Path) -> None:
    fake = FakeBackend(gpus=1, programs={"train": Script(loss_of, exit_code=0)})
    plan = parse_plan({"name": "fake-grid", "objective": {"metric": "loss"},
                       "trial": {"command": "train {x}"}, "space": {"x": [0.1, 0.5, 0.9, 1.3]},
                       "proposer": "grid", "budget": {"trials": 4, "parallel": 2}}, base_dir=tmp_path)
    view = Controller(plan, runtime=Runtime(home, backend=fake), poll_s=0.01).run()
    assert view.state == "finished" and view.counts == {"succeeded": 4}
    assert sorted(a.request.argv[1] for a in fake.attempts()) == ["0.1", "0.5", "0.9", "1.3"]
    assert view.best_params == {"x": 0.5} and view.best_value == 0.0
