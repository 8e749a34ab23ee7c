"""``warm_start: true``: running a plan again after its loop finished starts a new loop from the
trials of the plan's earlier loops (issue 15 item 6, the "same plan name" case); the proposer
sees them as prior history, the new loop's counts, budgets and report hold its own trials only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from autoresearch.backends.fake import FakeBackend, Script
from autoresearch.engine.runtime import Runtime
from autoresearch.errors import PlanError
from autoresearch.loop.controller import Controller
from autoresearch.loop.plan import parse_plan
from autoresearch.loop.report import write_report
from autoresearch.loop.store import LoopStore
from tests.loop.test_bohb import loop_plan, printed_curve


@pytest.fixture
def runtime(home: Path) -> Runtime:
    return Runtime(home, backend=FakeBackend(programs={"train": Script(printed_curve, exit_code=0)}))


def names(runtime: Runtime) -> list[str]:
    return [r["name"] for r in runtime.ledger.query("SELECT name FROM loops ORDER BY id", ())]


def warm_decision(runtime: Runtime, name: str) -> Any:
    loop = LoopStore.find(runtime.ledger, name)
    return LoopStore(runtime.ledger, loop["id"]).last_decision("warm_start")


def test_a_rerun_of_a_finished_plan_starts_from_its_earlier_loops(runtime: Runtime, tmp_path: Path) -> None:
    def plan(trials: int) -> Any:
        return loop_plan("sweep", tmp_path, warm_start=True, budget={"trials": trials, "parallel": 2})

    first = Controller(plan(6), runtime=runtime).run()
    assert first.counts == {"succeeded": 6}
    assert first.warm_start == "warm start: none (no earlier finished loop of this plan yet)"

    second = Controller(plan(2), runtime=runtime)
    second.open()
    try:
        assert names(runtime) == ["sweep-1", "sweep"]  # the finished loop is kept, a new one takes the name
        assert len(second.ctx.warm) == 6 and all(r.intermediate for r in second.ctx.warm)
        assert "model fitted at the final values: 6 trials there" in second.proposer.propose([], 1).rationale
    finally:
        second.close()
    view = Controller(plan(2), runtime=runtime, resume=True).run()  # (its loop exists now: go on with it)
    assert view.counts == {"succeeded": 2} and len(view.trials) == 2  # its own trials only
    decision = warm_decision(runtime, "sweep")
    assert json.loads(decision["inputs"])["loops"] == {"sweep-1": 6}
    assert view.warm_start.startswith("warm start: 6 trial(s) of sweep-1 (6)")
    assert "kept as 'sweep-1'" in view.warm_start
    summary = Path(write_report(runtime.ledger, "sweep", plots=False).report_dir or "") / "summary.md"
    assert "**Warm start:** 6 trial(s) of sweep-1 (6)" in summary.read_text()
    assert LoopStore.find(runtime.ledger, "sweep-1")["state"] == "finished"
    assert "warm start: 6 trial(s) of sweep-1 (6)" in cli_summary(view)  # the command line's last lines
    status = mcp_loop_status(runtime, "sweep")  # and an agent's loop_status
    assert status["warm_start"] == view.warm_start and status["noise_basis"] == view.noise_basis

    third = Controller(plan(1), runtime=runtime).run()  # newest first: the second run, then the first
    assert names(runtime) == ["sweep-1", "sweep-2", "sweep"] and third.counts == {"succeeded": 1}
    assert json.loads(warm_decision(runtime, "sweep")["inputs"])["loops"] == {"sweep-2": 2, "sweep-1": 6}


def mcp_loop_status(runtime: Runtime, name: str) -> dict[str, Any]:
    import anyio
    from mcp import Client

    from autoresearch.api import Api
    from autoresearch.tools.server import build_server

    server = build_server(Api(runtime.ledger.home), root=runtime.ledger.home)

    async def ask() -> dict[str, Any]:
        async with Client(server) as client:
            result = await client.call_tool("loop_status", {"loop": name})
            assert not result.is_error, result
            return dict(result.structured_content or {})

    return anyio.run(ask)


def cli_summary(view: Any) -> str:
    import io

    from rich.console import Console

    from autoresearch.cli._live import LiveTable

    table = LiveTable(None, interactive=False)
    table.console = Console(file=io.StringIO(), width=200)
    table.summary(view)
    return str(table.console.file.getvalue())  # type: ignore[attr-defined]


def test_a_rerun_without_warm_start_true_is_unchanged(runtime: Runtime, tmp_path: Path) -> None:
    plan = loop_plan("plain", tmp_path, budget={"trials": 2, "parallel": 2})
    Controller(plan, runtime=runtime).run()
    again = Controller(plan, runtime=runtime).run()  # the same plan again: its finished loop, nothing redone
    assert names(runtime) == ["plain"] and again.counts == {"succeeded": 2} and again.warm_start == ""


def test_an_unfinished_loop_is_resumed_not_replaced(runtime: Runtime, tmp_path: Path) -> None:
    plan = loop_plan("half", tmp_path, warm_start=True, budget={"trials": 2, "parallel": 2})
    Controller(plan, runtime=runtime).run()
    LoopStore(runtime.ledger, LoopStore.find(runtime.ledger, "half")["id"]).set_loop(state="interrupted")
    Controller(plan, runtime=runtime).run()
    assert names(runtime) == ["half"]


def test_a_rerun_with_an_incompatible_space_is_refused_and_changes_nothing(runtime: Runtime, tmp_path: Path) -> None:
    Controller(loop_plan("grow", tmp_path, warm_start=True, budget={"trials": 2, "parallel": 2}),
               runtime=runtime).run()
    wider = loop_plan("grow", tmp_path, warm_start=True, budget={"trials": 2, "parallel": 2},
                      space={"x": {"choices": [0.0, 1.0]}, "k": {"choices": ["a"]}, "depth": {"low": 1, "high": 4}},
                      trial={"command": "train {x} {k} {depth}"})
    with pytest.raises(PlanError) as info:
        Controller(wider, runtime=runtime).run()
    assert ("parameters that differ: depth (only in this plan), x (choices here, a range there)"
            in info.value.message) and "warm_start" in info.value.hint
    assert names(runtime) == ["grow"]


@pytest.mark.parametrize("value, message", [
    (3, "warm_start is a list of earlier loops' names or true"),
    ({"loops": 2}, "warm_start is a list of earlier loops' names or true"),
    (["../x"], "is not a loop name"),
    ([None], "is not a loop name"),
    (["a" * 65], "is not a loop name"),
])
def test_garbage_warm_start_is_refused(value: Any, message: str, tmp_path: Path) -> None:
    with pytest.raises(PlanError) as info:
        parse_plan({"name": "g", "objective": {"metric": "loss"}, "trial": {"command": "train {x}"},
                    "space": {"x": {"low": 0.0, "high": 1.0}}, "warm_start": value}, base_dir=tmp_path)
    assert message in info.value.message and info.value.hint


def test_a_loop_that_does_not_exist_is_a_clear_error_with_a_hint(runtime: Runtime, tmp_path: Path) -> None:
    Controller(loop_plan("exists", tmp_path, budget={"trials": 1, "parallel": 1}), runtime=runtime).run()
    with pytest.raises(PlanError) as info:
        Controller(loop_plan("new", tmp_path, warm_start=["missing"]), runtime=runtime).run()
    assert "no loop named 'missing'" in info.value.message
    assert "exists" in info.value.hint and "warm_start: true" in info.value.hint


def test_a_kept_generation_of_a_64_character_name_is_still_a_loop_name(runtime: Runtime, tmp_path: Path) -> None:
    from autoresearch.loop.plan import NAME
    from autoresearch.loop.store import MAX_NAME

    name = "n" * MAX_NAME
    assert NAME.match(name)
    kept = []
    for _ in range(11):  # -1 .. -11: the cut grows with N's digits
        loop_id = LoopStore.create(runtime.ledger, name, json.dumps({"name": name}), "digest", name).loop_id
        kept.append(LoopStore.keep_as_generation(runtime.ledger, loop_id, name))
    assert kept[0] == "n" * 62 + "-1" and kept[10] == "n" * 61 + "-11"
    assert len(set(kept)) == 11 and all(len(k) <= MAX_NAME and NAME.match(k) for k in kept)
