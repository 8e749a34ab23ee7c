"""The facade's shape (issue 8): one entry for jobs and loops, its engine hidden, the loop
below it, and the command line's status path light."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent / "autoresearch"
LOOP_OPERATIONS = ("start_loop", "run_loop", "loop_status", "submit_proposals", "leaderboard", "trial_patch",
                   "stop_loop", "loop_report")


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_the_facade_has_both_halves_and_hides_its_engine(api: Any) -> None:
    assert all(callable(getattr(api, name)) for name in ("submit", "status", "cancel", *LOOP_OPERATIONS))
    assert not hasattr(api, "runtime") and not hasattr(api, "ledger")


def test_the_loop_and_the_engine_never_call_the_facade() -> None:
    below = [*(ROOT / "loop").rglob("*.py"), ROOT / "engine" / "jobs.py", ROOT / "engine" / "runtime.py"]
    offenders = [str(p.relative_to(ROOT)) for p in below if any(m.startswith("autoresearch.api") for m in _imports(p))]
    assert offenders == []


def test_the_proposer_module_keeps_only_the_proposer() -> None:
    from autoresearch.loop.proposers import agent

    assert not any(hasattr(agent, name) for name in LOOP_OPERATIONS)


def test_status_on_the_command_line_stays_light(home: Path) -> None:
    code = ("import sys; from autoresearch.cli import main; main(['status']); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mlflow', 'mcp', 'anthropic', 'openai', "
            "'optuna') or m.startswith(('autoresearch.loop', 'autoresearch.tracking._'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"
