"""Every `autoresearch WORD` a message or hint tells a user to run names a real command: a hint
that names none (`autoresearch leaderboard`, `autoresearch loops`) is a dead end for a person
and for an agent acting on error text (DESIGN: every error says what to do next)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from autoresearch.cli import build_parser

PACKAGE = Path(__file__).resolve().parents[2] / "autoresearch"
COMMAND = re.compile(r"`autoresearch ([a-z][a-z-]*)(?![.\w-])")  # not `autoresearch plan.yaml`


def named_commands() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                for word in COMMAND.findall(node.value):
                    found.setdefault(word, []).append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    return found


def test_every_command_a_message_names_exists() -> None:
    parser = build_parser()
    commands = next(a for a in parser._subparsers._group_actions if a.dest == "cmd").choices  # type: ignore[union-attr]
    named = named_commands()
    assert {"report", "logs", "uncordon"} <= set(named)  # the scan sees the messages
    missing = {word: where for word, where in named.items() if word not in commands}
    assert not missing, f"messages name commands that do not exist: {missing}"
