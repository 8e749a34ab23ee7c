"""A corpus of malformed plans (tests/loop/corpus/bad_plans/*.yaml): each one is refused by
the loader with one PlanError naming the problem, and by the real CLI with exit code 2, no
traceback and no loop row. The first line of each file is ``# expect: <substring of the error>``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from autoresearch.errors import PlanError
from autoresearch.loop.plan import load_plan

CORPUS = Path(__file__).parent / "corpus" / "bad_plans"
PLANS = sorted(CORPUS.glob("*.yaml"))
# Run through the real CLI too (a subprocess each: a few, not all).
CLI_CASES = ("invalid_utf8", "unclosed_quote", "nan_bound", "backend_option", "empty_command", "memory_lots",
             "memory_negative", "timeout_nan", "typo_comand")


def expected(path: Path) -> str:
    first = path.read_bytes().split(b"\n", 1)[0].decode()
    assert first.startswith("# expect: "), f"{path.name} must start with '# expect: <substring>'"
    return first.removeprefix("# expect: ")


def test_the_corpus_is_there() -> None:
    assert len(PLANS) >= 20
    assert {f"{name}.yaml" for name in CLI_CASES} <= {p.name for p in PLANS}


@pytest.mark.parametrize("path", PLANS, ids=[p.stem for p in PLANS])
def test_bad_plan_is_one_plan_error(path: Path) -> None:
    with pytest.raises(PlanError) as info:
        load_plan(path)
    err = info.value
    assert expected(path) in err.message
    assert err.hint
    assert "\n" not in err.message


@pytest.mark.parametrize("name", CLI_CASES)
def test_cli_refuses_bad_plan_before_the_loop_exists(name: str, home: Path) -> None:
    path = CORPUS / f"{name}.yaml"
    out = subprocess.run([sys.executable, "-m", "autoresearch.cli", "run", str(path), "--no-report"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert out.stderr.startswith("error: ") and expected(path) in out.stderr and "\nhint: " in out.stderr
    ledger = home / "ledger.db"
    if ledger.exists():
        import sqlite3

        with sqlite3.connect(ledger) as conn:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if "loops" in tables:
                assert conn.execute("SELECT COUNT(*) FROM loops").fetchone()[0] == 0
