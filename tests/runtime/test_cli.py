"""The `autoresearch` command as a user runs it: real subprocesses, exit codes, output."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_for

CLI = [sys.executable, "-m", "autoresearch.cli"]


def cli(*args: str, check: bool = True, **kw: Any) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(f"autoresearch {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
    return proc


def status(job: str) -> dict[str, Any]:
    return json.loads(cli("status", job, "--json").stdout)


def test_submit_prints_id_and_json(home: Path) -> None:
    assert cli("submit", "--", "true").stdout.strip() == "1"
    out = json.loads(cli("submit", "--json", "--name", "two", "--", "true").stdout)
    # queued: the pass daemon held the pass (recording job 1's ending) and was poked to place it next
    assert out["id"] == 2 and out["state"] in ("queued", "starting", "running", "succeeded")
    wait_for(lambda: status("2")["state"] == "succeeded", timeout=30)


def test_job_outlives_the_cli_that_started_it(home: Path, tmp_path: Path) -> None:
    marker = tmp_path / "done"
    job = cli("submit", "--", "/bin/sh", "-c", f"sleep 1; touch {marker}").stdout.strip()
    # the CLI process has exited; nobody polls: the detached supervisor still finishes the job
    wait_for(marker.exists, timeout=60)
    wait_for(lambda: status(job)["state"] == "succeeded")


def test_two_clis_submitting_at_once(home: Path, tmp_path: Path) -> None:
    out = tmp_path / "seen"
    out.mkdir()
    cmd = f'echo "$CUDA_VISIBLE_DEVICES $(date +%s.%N)" > {out}/$AUTORESEARCH_JOB_ID; sleep 0.3; date +%s.%N >> {out}/$AUTORESEARCH_JOB_ID'
    procs = [subprocess.Popen([*CLI, "submit", "--gpus", "1", "--json", "--", "/bin/sh", "-c", cmd],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(6)]
    ids = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 0, stderr
        ids.append(json.loads(stdout)["id"])
    assert sorted(ids) == list(range(1, 7))
    wait_for(lambda: all(status(str(i))["state"] == "succeeded" for i in ids), timeout=40, interval=0.3)
    spans: dict[str, list[tuple[float, float]]] = {}
    for i in ids:
        first, end = (out / str(i)).read_text().split("\n")[:2]
        slot, start = first.split()
        spans.setdefault(slot, []).append((float(start), float(end)))
    assert set(spans) == {"0", "1"}
    for intervals in spans.values():  # one slot never ran two attempts at once
        intervals.sort()
        assert all(a[1] <= b[0] for a, b in zip(intervals, intervals[1:], strict=False))


def test_logs_follow_until_the_job_ends(home: Path) -> None:
    job = cli("submit", "--", sys.executable, "-c",
              "import time\nfor i in range(5): print('line', i, flush=True); time.sleep(0.2)").stdout.strip()
    proc = cli("logs", job, "-f")
    assert [f"line {i}" for i in range(5)] == proc.stdout.split("\n")[:5]
    assert status(job)["state"] == "succeeded"


def test_logs_tail_and_metrics_json(home: Path) -> None:
    job = cli("submit", "--", sys.executable, "-c", "for i in range(50): print(f'loss={1/(i+1)}')").stdout.strip()
    wait_for(lambda: status(job)["state"] == "succeeded")
    tail = cli("logs", job, "--tail", "2").stdout.strip().splitlines()
    assert tail == ["loss=0.02040816326530612", "loss=0.02"]
    metrics = json.loads(cli("metrics", job, "--json").stdout)
    assert metrics[0]["name"] == "loss" and metrics[0]["count"] == 50 and metrics[0]["best"] == 0.02


def test_status_shows_attempts_table(home: Path) -> None:
    job = cli("submit", "--gpus", "1", "--", "/bin/sh", "-c", "exit 2").stdout.strip()
    wait_for(lambda: status(job)["state"] == "failed")
    text = cli("status", job, env={**os.environ, "COLUMNS": "200"}).stdout
    assert "failed" in text and "exit" in text and "REASON" in text and "PEAK MB" in text


def test_list_filters_and_pages(home: Path) -> None:
    for i in range(3):
        cli("submit", "--experiment", "e1" if i < 2 else "e2", "--", "true")
    page = json.loads(cli("list", "--experiment", "e1", "--limit", "1", "--json").stdout)
    assert [j["id"] for j in page["jobs"]] == [2] and page["next_cursor"] == 2
    page = json.loads(cli("list", "--experiment", "e1", "--cursor", "2", "--json").stdout)
    assert [j["id"] for j in page["jobs"]] == [1] and page["next_cursor"] is None


def test_list_says_how_a_job_without_an_exit_code_ended(home: Path) -> None:
    job = cli("submit", "--", "sleep", "60").stdout.strip()
    cli("cancel", job)
    wait_for(lambda: status(job)["state"] == "cancelled")
    done = cli("submit", "--wait", "--", "sh", "-c", "exit 3", check=False)
    assert done.returncode == 3
    table = cli("list", env={**os.environ, "COLUMNS": "200"}).stdout
    assert "None" not in table and " cancelled " in table.split("\n", 3)[-1] and "3 (exit)" in table


def test_nodes_and_cordon(home: Path) -> None:
    cluster = json.loads(cli("nodes", "--json").stdout)
    assert cluster["gpus_total"] == 2 and cluster["nodes"][0]["state"] == "healthy"
    name = cluster["nodes"][0]["name"]
    cli("cordon", name, "--reason", "thermal")
    job = cli("submit", "--", "true").stdout.strip()
    time.sleep(0.3)
    assert status(job)["state"] == "queued"
    cluster = json.loads(cli("nodes", "--json").stdout)
    assert cluster["cordoned"] == [f"{name}: thermal"]
    cli("uncordon", name)
    wait_for(lambda: status(job)["state"] == "succeeded")
    said = cli("cordon", name).stdout  # no reason given: the line says the state once, then why
    assert said.split() == [name, "cordoned", "by", "hand"] and said.count("cordon") == 1, said
    cli("uncordon", name)


BAD = [
    (["submit", "--gpus", "-1", "--", "true"], 2, "gpus"),
    (["submit", "--priority", "urgent", "--", "true"], 2, "critical"),
    (["submit", "--"], 2, "no command"),
    (["submit", "--workdir", "/nope/missing", "--", "true"], 2, "workdir"),
    (["submit", "--gpus", "3", "--", "true"], 2, "has 2"),
    (["submit", "--timeout", "soon", "--", "true"], 2, "duration"),
    (["status", "999"], 2, "autoresearch list"),
    (["logs", "abc"], 2, "autoresearch list"),
]


@pytest.mark.parametrize(("args", "code", "needle"), BAD, ids=[" ".join(b[0]) for b in BAD])
def test_bad_input_is_one_line_with_hint(home: Path, args: list[str], code: int, needle: str) -> None:
    proc = cli(*args, check=False)
    assert proc.returncode == code
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith("error: ") and lines[1].startswith("hint: ") and len(lines) == 2
    assert needle in proc.stderr
    if (home / "ledger.db").exists():
        with sqlite3.connect(home / "ledger.db") as db:
            assert db.execute("SELECT COUNT(*) FROM jobs").fetchone()[0] == 0  # nothing half-written


def test_corrupt_ledger(home: Path) -> None:
    home.mkdir(parents=True)
    (home / "ledger.db").write_bytes(b"this is not sqlite" * 100)
    proc = cli("status", check=False)
    assert proc.returncode == 1 and "corrupt" in proc.stderr and "doctor --move-aside" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert "Traceback" in cli("--debug", "status", check=False).stderr


def test_locked_ledger(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cli("submit", "--", "true")
    holder = sqlite3.connect(home / "ledger.db", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        env = {**os.environ, "AUTORESEARCH_LEDGER_TIMEOUT": "0.5"}
        proc = cli("submit", "--", "true", check=False, env=env)
    finally:
        holder.execute("ROLLBACK")
    assert proc.returncode == 1 and "locked" in proc.stderr and "hint:" in proc.stderr
    assert "Traceback" not in proc.stderr
