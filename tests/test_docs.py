"""The docs say what the project does and why: decision records, not a diary of work, and links
between them that lead somewhere."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
NOTES_MAX_LINES = 400

# What a diary leaves behind: an issue's or a pull request's number, a date of work, a period of work.
ISSUE_REF = re.compile(r"(?i)\b(?:issues?|PR|pull request)\s*#?\d+|(?<![\w&/])#\d+\b")
DATE = re.compile(r"\b(?:19|20)\d\d-[01]\d-[0-3]\d\b")
PERIOD = re.compile(r"(?i)\b(?:(?:this|that|a later|same|earlier|next) (?:session|stretch|wave|sprint)"
                    r"|sessions? \d+|waves? \d+|(?:later|earlier) (?:that|the same) day|same day)\b")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def decision_records() -> list[Path]:
    return [DOCS / "DESIGN-NOTES.md", *sorted((DOCS / "decisions").glob("*.md"))]


def prose_docs() -> list[Path]:
    """The hand-written docs (docs/report/ is a generated example report)."""
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md")), *sorted((DOCS / "decisions").glob("*.md"))]


def diary_marks(text: str) -> list[str]:
    return [m.group(0) for pattern in (ISSUE_REF, DATE, PERIOD) for m in pattern.finditer(text)]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*$", text, re.M)}


def test_diary_marks_are_recognized() -> None:
    """The patterns catch what a diary writes and pass what a decision record writes."""
    assert diary_marks("Since session 19 (2026-12-02, issue 16, #45) ... later that day") == [
        "issue 16", "#45", "2026-12-02", "session 19", "later that day"]
    assert diary_marks("a job's session (`setsid`); the first wave of 16 trials; Friedman's 1 MiB; "
                       "trial 48; `jobs_by_state_backend`; &#10;") == []


def test_decision_records_stay_short() -> None:
    lines = sum(len(path.read_text().splitlines()) for path in decision_records())
    assert lines <= NOTES_MAX_LINES, (
        f"docs/DESIGN-NOTES.md (+ docs/decisions/) has {lines} lines, over {NOTES_MAX_LINES}: merge what "
        "later work replaced (keep the decision in force, its supersedes line), and move figures that "
        "change to docs/performance.md")


def test_decision_records_keep_no_diary() -> None:
    found = {path.relative_to(ROOT).as_posix(): marks for path in decision_records()
             if (marks := diary_marks(path.read_text()))}
    assert not found, f"dates of work, issue numbers or periods of work in the decision records: {found}"


def test_no_doc_cites_an_issue_or_a_period_of_work() -> None:
    """Beyond the decision records, docs may hold dates that are versions (MCP's protocol) and
    names with numbers (Friedman #1), but never an issue's number or a period of work."""
    found = {path.relative_to(ROOT).as_posix(): marks for path in prose_docs()
             if (marks := [m.group(0) for p in (ISSUE_REF, PERIOD) for m in p.finditer(path.read_text())
                           if not m.group(0).startswith("#")])}
    assert not found, f"issue numbers or periods of work in the docs: {found}"


def test_links_between_docs_lead_somewhere() -> None:
    broken = []
    for path in prose_docs():
        text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            if not dest.exists():
                broken.append(f"{path.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{path.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "links between docs that lead nowhere:\n" + "\n".join(broken)
