"""A loop (or a job) whose whole fleet is cordoned keeps waiting (a node comes back) but says why: in its
live output once, again when the reason changes or clears, and in loop_status from any process."""

from __future__ import annotations

import io
import sys
import threading
from pathlib import Path
from typing import Any

from autoresearch.loop.controller import Controller
from autoresearch.loop.plan import parse_plan
from autoresearch.loop.views import LoopView
from tests.conftest import wait_for


def test_a_loop_on_a_cordoned_fleet_says_why_it_waits_then_runs_once_a_node_is_back(api: Any, tmp_path: Path) -> None:
    plan = parse_plan({"name": "walled", "objective": {"metric": "loss"},
                       "trial": {"command": f"{sys.executable} -c \"print('loss: {{x}}')\"", "grace": 1},
                       "space": {"x": {"choices": [0.5, 0.25]}}, "proposer": {"kind": "grid"},
                       "budget": {"trials": 2, "parallel": 2}}, base_dir=tmp_path)
    node = api.nodes()[0].name
    api.cordon(node, reason="Xid 79: GPU has fallen off the bus")
    seen: list[str] = []
    controller = Controller(plan, runtime=api._runtime, on_update=lambda v: seen.append(v.blocked))
    out: dict[str, LoopView] = {}
    thread = threading.Thread(target=lambda: out.setdefault("view", controller.run()), daemon=True)
    thread.start()
    want = (f"no node can run this: 1 node cordoned ({node}: Xid 79: GPU has fallen off the bus); "
            f"uncordon with `autoresearch uncordon {node}`")
    wait_for(lambda: want in seen)
    view, running = api.loop_status("walled")  # the ledger's view, as another process reads it
    assert view.state == "running" and view.blocked == want and running
    assert view.counts == {"queued": 2}  # it waits, it does not give up
    api.cordon(node, reason="by hand")
    wait_for(lambda: seen and "by hand" in seen[-1])  # told again: the reason changed
    api.cordon(node, undo=True)
    thread.join(120)
    assert not thread.is_alive()
    final = out["view"]
    assert final.state == "finished" and final.counts == {"succeeded": 2} and final.blocked == ""
    assert seen[-1] == ""


def test_the_live_output_says_it_once_and_again_when_it_changes_or_clears() -> None:
    from autoresearch.cli._live import LiveTable

    class P:
        name, proposer, budget, objective = "p", type("K", (), {"kind": "grid"}), type(
            "B", (), {"trials": 2, "parallel": 2}), type("O", (), {"goal": "minimize", "metric": "loss"})

    table = LiveTable(P(), interactive=False)
    table.console.file = buf = io.StringIO()
    base = LoopView("p", 1, "running", "loss", "minimize", [], {}, None, None)
    for text in ("", "no node can run this: A", "no node can run this: A", "no node can run this: B", "", ""):
        base.blocked = text
        table.update(base)
    lines = buf.getvalue().splitlines()
    assert lines == ["waiting: no node can run this: A; the loop waits for a node (Ctrl-C stops it)",
                     "waiting: no node can run this: B; the loop waits for a node (Ctrl-C stops it)",
                     "no longer waiting for a node"]


def test_a_queued_jobs_status_says_why_as_the_nodes_are_now(api: Any, tmp_path: Path) -> None:
    """Cordoned after the job was sent (a health check, a person): its status says so then, and
    no longer once the node is back (the warning at submit only saw the nodes of that moment)."""
    from tests.conftest import wait_state

    busy = api.submit({"command": ["sleep", "60"], "workdir": str(tmp_path), "gpus": 2})
    wait_state(api, busy.id, "running")
    waiting = api.submit({"command": ["true"], "workdir": str(tmp_path), "gpus": 2})
    assert api.status(waiting.id).warnings == []  # queued for GPUs: a node can run it
    node = api.nodes()[0].name
    api.cordon(node, reason="Xid 48")
    assert api.status(waiting.id).warnings == [
        f"job: queued: no node can run this: 1 node cordoned ({node}: Xid 48); uncordon with `autoresearch uncordon {node}`"]
    api.cordon(node, undo=True)
    assert api.status(waiting.id).warnings == []
    api.cancel([busy.id, waiting.id])
