"""skills/ follows the Agent Skills format, so coding agents load every skill."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

SKILLS = Path(__file__).resolve().parents[2] / "skills"
REQUIRED = {"autoresearch-run-jobs", "autoresearch-write-plan", "autoresearch-debug-failure"}
TOOLS = ("submit", "status", "logs", "metrics", "cancel", "list_jobs", "cluster_status")


def test_each_skill_has_valid_front_matter_and_a_short_body() -> None:
    folders = {p.name: p for p in SKILLS.iterdir() if p.is_dir()}
    assert REQUIRED <= set(folders)
    for name, folder in folders.items():
        text = (folder / "SKILL.md").read_text()
        assert text.startswith("---\n"), name
        front, body = text[4:].split("\n---\n", 1)
        meta = yaml.safe_load(front)
        assert meta["name"] == name and re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", name) and len(name) <= 64
        assert 40 <= len(meta["description"]) <= 1024 and "Use when" in meta["description"], name
        assert len(body.splitlines()) < 500, name
        for link in re.findall(r"\]\(([^)#]+)\)", body):
            assert (folder / link).exists(), f"{name} links to missing {link}"


def test_skills_name_only_tools_that_exist() -> None:
    text = (SKILLS / "autoresearch-run-jobs" / "SKILL.md").read_text()
    for tool in TOOLS:
        assert re.search(rf"\b{tool}\b", text), tool
    called = set(re.findall(r"^([a-z_]+) \{", text, re.M))
    assert called <= set(TOOLS), called - set(TOOLS)
