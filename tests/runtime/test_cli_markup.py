"""User text is shown, never parsed as Rich markup: a job named `[/bold]` must not break
`list` or `status` for everyone (nor a metric, node reason, plan or parameter value)."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from tests.conftest import wait_state

CLI = [sys.executable, "-m", "autoresearch.cli"]
NAMES = ["[/bold]", "[red]x", "[link=file:///etc/passwd]click[/link]", "trailing\\"]


def cli(*args: str) -> str:
    proc = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"autoresearch {' '.join(args)} exited {proc.returncode}: {proc.stderr}"
    return proc.stdout


@pytest.mark.parametrize("name", NAMES)
def test_list_status_metrics_and_nodes_show_markup_in_user_text_verbatim(api: Any, tmp_path: Path,
                                                                         name: str) -> None:
    script = f"from autoresearch import report; report(step=1, **{{{name!r}: 0.5}}); raise SystemExit(3)"
    view = api.submit({"command": [sys.executable, "-c", script], "name": name, "experiment": name,
                       "workdir": str(tmp_path), "tags": {"k": name}, "max_retries": 0})
    wait_state(api, view.id, "failed")
    node = api.nodes()[0].name
    assert cli("cordon", node, "--reason", name) is not None
    listed = cli("list")
    shown = cli("status", str(view.id))
    metrics = cli("metrics", str(view.id))
    nodes = cli("nodes")
    for out in (listed, shown, metrics, nodes):
        assert name.rstrip("\\")[:6] in out.replace("\n", "").replace("│", "").replace(" ", ""), out
    assert "\x1b]8;" not in listed + shown  # no terminal hyperlink was made from the name


def test_loop_table_and_summary_show_markup_in_plan_text_verbatim() -> None:
    from autoresearch.cli._live import LiveTable
    from autoresearch.loop.views import LoopView, TrialRow

    class Plan:  # what LiveTable reads of a plan
        name = "[/bold]"

        class proposer:  # noqa: N801
            kind = "random"

        class budget:  # noqa: N801
            trials, parallel = 2, 1

        class objective:  # noqa: N801
            goal, metric = "minimize", "[red]loss"

    trials = [TrialRow(1, 1, "explore", "succeeded", {"opt": "[/]", "lr": 0.1}, 0, None, 0.5, 0.5, ended_at=1.0)]
    view = LoopView("[/bold]", 1, "finished", "[red]loss", "minimize", trials, {"succeeded": 1}, 1, 0.5,
                    best_params={"opt": "[/]"}, stop_reason="budget [/i] spent", budget_trials=2)
    for interactive in (True, False):
        table = LiveTable(Plan(), interactive=interactive)
        table.console = Console(file=io.StringIO(), width=200)
        with table:
            table.update(view)
        table.summary(view)
        if interactive:
            table.console.print(table._table(view))
        out = table.console.file.getvalue()
        assert "[/bold]" in out and "budget [/i] spent" in out
        if interactive:
            assert "[RED]LOSS" in out and "opt=[/]" in out


@pytest.mark.parametrize("width", [1, 20, 80, 400])
def test_terminal_escapes_in_user_text_are_shown_escaped_at_any_width(width: int) -> None:
    """The tables of status/list (cli/_table.py, without rich) never pass a control character
    through: a job named with an escape sequence cannot retitle, recolor or link the terminal."""
    from autoresearch.cli._table import Table

    table = Table("ID", "NAME")
    table.add_row(1, "\x1b]8;;http://evil\x07click\x1b]8;;\x07\x1b[2J宽字符\u0301")
    out = table.render(width)
    assert "\x1b" not in out and "\x07" not in out
    assert "\\x1b" in out.replace("\n", "").replace("│", "").replace(" ", "")
