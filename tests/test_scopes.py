"""The suite's xdist split (tests/_scopes.py) survives a worker that dies mid-test: the run ends,
the test it died in is reported failed once, and every other test runs once."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CRASHING = """
import os, signal, time
import pytest

@pytest.mark.parametrize("i", range(8))
def test_before(i):
    time.sleep(0.1)

def test_dies():
    os.kill(os.getpid(), signal.SIG{sig})

@pytest.mark.parametrize("i", range(8))
def test_after(i):
    time.sleep(0.1)
"""


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SEGV", "KILL"])
def test_a_dead_worker_ends_its_test_not_the_run(tmp_path: Path, sig: str) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "conftest.py").write_text("from tests._scopes import pytest_xdist_make_scheduler  # noqa: F401\n")
    (tmp_path / "test_dies.py").write_text(CRASHING.replace("{sig}", sig))
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    try:
        proc = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "-rA", "-p", "no:cacheprovider", str(tmp_path)],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90)
    except subprocess.TimeoutExpired as e:  # xdist's own remove_node: the run never ends
        pytest.fail(f"the run did not end after a worker died:\n{(e.stdout or b'')[-3000:]!r}")
    out = proc.stdout
    assert proc.returncode == 1, out[-3000:]
    assert re.search(r"\b1 failed, 16 passed\b", out), out[-3000:]
    assert out.count("FAILED test_dies.py::test_dies") == 1, out[-3000:]  # not run again on each replacement
    for name in [f"test_before[{i}]" for i in range(8)] + [f"test_after[{i}]" for i in range(8)]:
        assert out.count(f"PASSED test_dies.py::{name}") == 1, (name, out[-3000:])
