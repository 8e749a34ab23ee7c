"""How the ``autoresearch`` process ends (autoresearch/cli/__init__.py ``entry``): after the command,
its output flushed and its exit handlers run, without the interpreter's teardown (~20 ms of a
command's start-to-end); the normal way when a thread is still running."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

ENTRY = """
import atexit, sys, threading, time
class Loud:
    def __del__(self):
        sys.stderr.write("torn down\\n")
keep = Loud()  # freed by the interpreter's teardown, which prints
atexit.register(lambda: sys.stdout.write("\\nexit handler ran\\n"))
def until_main_ends():
    while threading.main_thread().is_alive():
        time.sleep(0.01)
if sys.argv[1] == "thread":  # alive when the command returns (not a daemon: the interpreter waits for it)
    threading.Thread(target=until_main_ends).start()
sys.argv = ["autoresearch", *sys.argv[2:]]
from autoresearch.cli import entry
entry()
"""


def run(mode: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", ENTRY, mode, *args], capture_output=True, text=True, timeout=60)


def test_a_command_ends_after_its_exit_handlers_without_the_teardown(home: Path) -> None:
    proc = run("plain", "list", "--json")
    assert proc.returncode == 0, proc.stderr
    listing, _, handler = proc.stdout.rpartition("\nexit handler ran")
    assert json.loads(listing) is not None and handler == "\n"  # the command's output whole, then the handler's
    assert "torn down" not in proc.stderr


def test_a_command_that_leaves_a_thread_running_exits_the_normal_way(home: Path) -> None:
    proc = run("thread", "list", "--json")
    assert proc.returncode == 0, proc.stderr
    assert "exit handler ran" in proc.stdout and "torn down" in proc.stderr


def test_a_command_ends_with_the_status_and_output_of_the_normal_way(home: Path) -> None:
    """A refusal, a usage error, --version: what each prints and its status, as when the process
    exits the normal way (a thread running), with and without the teardown."""
    for args in (("status", "424242"), ("status", "--no-such-flag"), ("--version",), ("list",)):
        fast, normal = run("plain", *args), run("thread", *args)
        assert "torn down" not in fast.stderr and "torn down" in normal.stderr
        assert (fast.returncode, fast.stdout, fast.stderr) == \
            (normal.returncode, normal.stdout, normal.stderr.replace("torn down\n", "")), args
    assert run("plain", "status", "424242").returncode == 2  # (a refusal of what was asked: 2, as ever)


def test_what_commands_ending_this_way_wrote_is_whole_for_the_next_one(home: Path) -> None:
    """Their ledger connection is never closed (no checkpoint at exit): what they committed is in
    the WAL file, which the next reader of the ledger reads."""
    cli = [sys.executable, "-m", "autoresearch.cli"]
    ids = [subprocess.run([*cli, "submit", "--name", f"j{i}", "--", "true"], capture_output=True, text=True,
                          timeout=60, check=True).stdout.strip() for i in range(3)]
    listed = json.loads(subprocess.run([*cli, "list", "--json"], capture_output=True, text=True, timeout=60,
                                       check=True).stdout)
    rows = listed["jobs"] if isinstance(listed, dict) else listed
    assert sorted(str(r["id"]) for r in rows) == sorted(ids)
    with sqlite3.connect(home / "ledger.db") as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
