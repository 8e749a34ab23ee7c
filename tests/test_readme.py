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


def test_layout_names_every_module() -> None:
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## Layout\n\n```\n(.*?)```", readme, re.S)
    assert block, "README needs a Layout block"
    words = set(re.findall(r"[\w./-]+", block.group(1)))
    package = ROOT / "autoresearch"
    missing = [path.relative_to(ROOT).as_posix() for path in sorted(package.rglob("*.py"))
               if path.name not in ("__init__.py", "__main__.py") and path.name not in words
               and path.relative_to(package).as_posix() not in words]
    missing += [f"{path.relative_to(package).as_posix()}/" for path in sorted(package.rglob("*"))
                if path.is_dir() and (path / "__init__.py").exists() and path != package
                and f"{path.relative_to(package).as_posix()}/" not in words]
    assert not missing, f"README's Layout leaves out {missing}: give each a word there"
