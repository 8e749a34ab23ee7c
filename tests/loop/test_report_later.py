"""The loop's command returns with its answer; the report is a detached helper's work.

``autoresearch plan.yaml`` used to draw five figures (matplotlib's import), write report.html and sync
the whole mirror in the foreground after its last trial: tens of seconds of a short loop's wall. Now
the summary is printed at once and :mod:`autoresearch.loop.report_later` writes the report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from autoresearch.loop import report_later
from autoresearch.loop._mlflow_runs import RunMaker
from tests.conftest import wait_for

PLAN = """\
name: later
objective: {metric: loss}
trial: {command: "%s -c \\"print('loss: {x}')\\"", gpus: 0}
space: {x: {choices: [0.3, 0.1, 0.2]}}
proposer: grid
budget: {trials: 3, parallel: 3}
"""

# What the command's own process must never import to give its answer (each takes seconds here).
HEAVY = ("matplotlib", "mlflow", "optuna", "pandas", "scipy", "sklearn")

PROBE = """\
import json, sys
from autoresearch.cli import main
code = main(sys.argv[1:])
sys.stdout.flush()
print(json.dumps(sorted(m for m in %r if m in sys.modules)), file=sys.stderr)
raise SystemExit(code)
"""


def _cli(work: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", PROBE % (HEAVY,), *args], capture_output=True, text=True,
                          cwd=work, stdin=subprocess.DEVNULL, timeout=300)


def test_the_command_returns_without_the_report_and_a_helper_writes_it(home: Path, tmp_path: Path) -> None:
    (tmp_path / "plan.yaml").write_text(PLAN % sys.executable)
    out = _cli(tmp_path, str(tmp_path / "plan.yaml"), "--json")
    assert out.returncode == 0, out.stderr
    view = json.loads(out.stdout)
    assert view["best_params"] == {"x": 0.1} and view["report_state"] == "writing"
    assert json.loads(out.stderr.strip().splitlines()[-1]) == []  # no plot, no mlflow in the command itself

    done = wait_for(lambda: (s := report_later.state(home, "later")) and s["state"] == "done" and s, timeout=180)
    report = Path(view["report_dir"])
    assert done["dir"] == str(report)
    assert {"summary.md", "report.html", "best_vs_trials.png"} <= set(os.listdir(report))
    assert "**Best:** trial" in (report / "summary.md").read_text()
    assert oct((home / "loops" / "later" / report_later.STATE_FILE).stat().st_mode & 0o777) == "0o600"

    from autoresearch.api import Api

    api = Api(home)
    status, _ = api.loop_status("later")
    assert status.report_state == "done" and status.report_dir == str(report)


def test_with_tracking_on_the_helper_asks_the_mirror_for_the_upload(home: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "plan.yaml").write_text(PLAN % sys.executable)
    assert _cli(tmp_path, str(tmp_path / "plan.yaml"), "--json", "--no-report").returncode == 0
    monkeypatch.setenv("AUTORESEARCH_TRACKING", "on")  # (the loop tests' default is off)
    done = report_later.write(home, "later")  # the helper's work, in this process
    assert done["state"] == "done"

    from autoresearch.store.ledger import Ledger

    row = Ledger(home).one("SELECT payload, done_at FROM tracking_outbox WHERE kind='report'")
    assert row is not None and json.loads(row["payload"]) == {"dir": done["dir"]}  # the syncer sends it


def test_a_helper_that_died_reads_interrupted_and_report_writes_it_again(home: Path, tmp_path: Path) -> None:
    (tmp_path / "plan.yaml").write_text(PLAN % sys.executable)
    out = _cli(tmp_path, str(tmp_path / "plan.yaml"), "--json", "--no-report")
    assert out.returncode == 0, out.stderr
    assert report_later.state(home, "later") is None  # never asked for
    loop_dir = home / "loops" / "later"
    loop_dir.mkdir(parents=True, exist_ok=True)
    report_later._write_state(loop_dir, state="writing", pid=2**22 + 7)  # killed -9 while it wrote
    assert report_later.state(home, "later")["state"] == "interrupted"
    assert "autoresearch report later" in (report_later.describe(home, "later") or "")

    rep = subprocess.run([sys.executable, "-m", "autoresearch.cli", "report", "later", "--json"],
                         capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert rep.returncode == 0, rep.stderr
    assert (loop_dir / "report" / "summary.md").is_file()


@pytest.mark.parametrize("content", [b"", b"\x00\xff" * 10, b"[1, 2]", b'{"state": "weird"}', b'{"state": NaN}',
                                     b"{" * 100_000, b'{"state": "done", "at": "x"}' + b" " * 70_000])
def test_a_state_file_of_garbage_reads_as_never_asked(home: Path, content: bytes) -> None:
    loop_dir = home / "loops" / "g"
    loop_dir.mkdir(parents=True)
    (loop_dir / report_later.STATE_FILE).write_bytes(content)
    assert report_later.state(home, "g") is None
    assert report_later.describe(home, "g") is None


def test_a_helper_for_a_removed_home_makes_nothing(tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    assert report_later.write(gone, "x")["state"] == "failed"
    assert not gone.exists()


def test_the_loops_end_does_not_wait_for_the_run_maker(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Closing the run maker while it imports mlflow (seconds) returns at once; the helper ends by
    itself once its input is closed. It used to hold the loop's end up to 10 s."""
    from autoresearch.store.ledger import Ledger

    Ledger(home)
    maker = RunMaker(home)
    asked: dict[str, Any] = {}
    import threading

    thread = threading.Thread(target=lambda: asked.setdefault("runs", maker.ask([])), daemon=True)
    thread.start()
    wait_for(lambda: maker.proc is not None, timeout=30, interval=0.005)
    proc = maker.proc
    assert proc is not None
    t0 = time.monotonic()
    maker.close()
    assert time.monotonic() - t0 < 5  # it held the loop's end up to 10 s; slack for a loaded machine
    wait_for(lambda: proc.poll() is not None, timeout=120)  # it leaves by itself (reaped by close's thread)


@pytest.mark.parametrize("name", ["..", "../../etc", "a/b", "", "x" * 65, "<b>", "-x", "\x00"])
def test_a_name_no_loop_can_have_reads_nothing_and_writes_nothing(home: Path, name: str) -> None:
    home.mkdir(parents=True)
    (home / "report.state").write_text('{"state": "done"}')  # what `..` would reach from loops/
    assert report_later.state(home, name) is None and report_later.describe(home, name) is None
    assert report_later.wait(home, name, timeout_s=1) is None
    assert report_later.write(home, name)["state"] == "failed"
    assert sorted(p.name for p in home.iterdir()) == ["report.state"]


def test_the_helper_starts_after_the_answer_is_out(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """The helper's start (an interpreter, matplotlib's import: seconds of CPU) used to come before the
    command printed its answer, and took the cores that answer's last work needed (at the end of a
    5,000-trial loop, the JSON's conversion and print ran at half speed beside it)."""
    from autoresearch.backends import _supervisor
    from autoresearch.cli import main

    seen: list[tuple[list[str], str, Any]] = []

    def spawn(argv: list[str], *args: Any, **kwargs: Any) -> int:
        if "autoresearch.loop.report_later" in argv:  # (not the runtime's own helpers)
            seen.append((argv, capsys.readouterr().out, report_later.state(home, "later")))  # what was out by then
        return 0

    monkeypatch.setattr(_supervisor, "spawn_detached", spawn)
    (tmp_path / "plan.yaml").write_text(PLAN % sys.executable)
    monkeypatch.chdir(tmp_path)
    assert main([str(tmp_path / "plan.yaml"), "--json"]) == 0
    (argv, printed, asked), = seen
    assert argv[-3:] == ["autoresearch.loop.report_later", str(home.absolute()), "later"]
    view = json.loads(printed)  # the whole answer was out before the helper was started
    assert view["report_state"] == "writing" and view["best_params"] == {"x": 0.1}
    assert asked is not None and asked["state"] == "pending"  # asked for first: a kill in between is `interrupted`
