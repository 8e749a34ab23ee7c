"""README's two commands are the contract with a new user; CI must run the second verbatim."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def readme_commands() -> list[str]:
    block = re.search(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert block, "README must open with a bash block of commands"
    return [line for line in block.group(1).splitlines() if line.strip() and not line.startswith("#")]


def test_readme_opens_with_two_commands() -> None:
    commands = readme_commands()
    assert len(commands) == 2
    assert commands[0].startswith("pip install -e .") and "autoresearch" in commands[0]
    assert "pytest" in commands[1]


def test_ci_runs_readme_test_command_verbatim() -> None:
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert readme_commands()[1] in ci_lines
