"""Everything under the home is private (docs/security.md): directories 0700, files 0600, the MLflow
store (mlflow.db, its WAL files), mlartifacts/, loop reports and jobs/ included, whatever the umask."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from autoresearch.util._private import tighten

PLAN = """\
name: private
objective: {metric: loss}
trial:
  command: python -c "print('loss:', {x})"
space:
  x: {low: 0.0, high: 1.0}
proposer: {kind: random, seed: 1}
budget: {trials: 2, parallel: 2}
early_stop: {kind: asha, min_steps: 1, reduction_factor: 2}
"""


def loose(home: Path) -> list[str]:
    """Paths under ``home`` (itself included) that its group or others may read, write or enter."""
    found = []
    for path in [home, *home.rglob("*")]:
        st = path.lstat()
        if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o077:
            found.append(f"{stat.S_IMODE(st.st_mode):o} {path.relative_to(home)}")
    return found


@pytest.mark.slow  # a loop, its report and an MLflow sync: ~10 s of imports on this machine
def test_a_job_a_loop_its_report_and_the_mlflow_mirror_leave_nothing_readable_by_others(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (tmp_path / "plan.yaml").write_text(PLAN)
    env = {**os.environ, "AUTORESEARCH_HOME": str(home), "AUTORESEARCH_GPUS": "2"}
    for name in ("MLFLOW_TRACKING_URI", "AUTORESEARCH_TRACKING", "AUTORESEARCH_SYNC", "AUTORESEARCH_BACKEND"):
        env.pop(name, None)

    def cli(*args: str) -> None:
        done = subprocess.run([sys.executable, "-m", "autoresearch.cli", *args], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=300,
                              preexec_fn=lambda: os.umask(0o022))  # the usual umask: our files must not follow it
        assert done.returncode == 0, done.stdout + done.stderr

    cli("submit", "--wait", "--", sys.executable, "-c", "print('loss: 1')")
    cli("run", "plan.yaml")
    # the command returns before its report (a background helper writes it): wait for it, however loaded
    from autoresearch.loop import report_later

    assert (report_later.wait(home, "private", timeout_s=300) or {}).get("state") == "done"
    cli("sync")
    assert (home / "mlflow.db").exists() and (home / "loops" / "private" / "report" / "summary.md").exists()
    assert any((home / "mlartifacts").rglob("*.log"))  # the attempts' logs were mirrored
    assert (home / "loops" / "private" / "verdicts").is_dir()  # (early stopping at rungs: the trials' answers)
    assert loose(home) == []


def test_tighten_never_follows_a_link_and_keeps_the_owners_bits(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "a").mkdir(parents=True)
    (tree / "a" / "run.sh").write_text("#!/bin/sh\n")
    (tree / "a" / "run.sh").chmod(0o755)
    (tree / "a").chmod(0o755)
    victim = tmp_path / "victim"
    victim.write_text("not ours to change")
    victim.chmod(0o644)
    (tree / "a" / "link").symlink_to(victim)
    outside = tmp_path / "outside"
    outside.mkdir()
    outside.chmod(0o755)
    (tree / "dirlink").symlink_to(outside, target_is_directory=True)
    tighten(tree)
    assert stat.S_IMODE((tree / "a").stat().st_mode) == 0o700
    assert stat.S_IMODE((tree / "a" / "run.sh").stat().st_mode) == 0o700  # still runnable by its owner
    assert stat.S_IMODE(victim.stat().st_mode) == 0o644
    assert stat.S_IMODE(outside.stat().st_mode) == 0o755  # the linked folder is untouched too
