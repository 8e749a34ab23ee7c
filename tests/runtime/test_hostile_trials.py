"""One bad trial never stops everyone (issue 14, items 1 and 7).

Each reproduction runs a real job that writes something hostile (a step past SQLite's
INTEGER, non-numbers, non-JSON, invalid UTF-8, deep nesting, a giant line), crashes, or
cannot start, and then checks what every user of the home would notice: the job ends
sanely, the warning is visible in ``status`` (CLI, ``--json``, MCP), the pass goes on, the
next job still starts, and ``status``/``list``/``nodes`` exit 0 with no traceback.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_for, wait_state

PY = sys.executable
CLI = [sys.executable, "-m", "autoresearch.cli"]


def submit(api: Any, command: list[str] | str, **spec: Any) -> int:
    spec.setdefault("workdir", os.getcwd())
    return int(api.submit({"command": command, **spec}).id)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr + proc.stdout, (args, proc.stdout, proc.stderr)
    return proc


# The CLI's ``main`` on each argv in turn, in one fresh interpreter (one start, not one per
# command): each command's exit code, stdout and stderr, a traceback included if one escaped.
CLI_EACH = """
import contextlib, io, json, sys, traceback
from autoresearch.cli import main
done = []
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exit:
            code = exit.code
        except BaseException:
            traceback.print_exc()
            code = "raised"
    done.append([argv, code, out.getvalue(), err.getvalue()])
print(json.dumps(done))
"""


def cli_each(*commands: list[str]) -> None:
    """Each command exits 0 with no traceback, as ``cli`` checks (run by ``main`` in one interpreter)."""
    proc = subprocess.run([PY, "-c", CLI_EACH, json.dumps(commands)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, (commands, proc.stdout, proc.stderr)
    for args, code, out, err in json.loads(proc.stdout):
        assert code == 0 and "Traceback" not in err + out, (args, code, out, err)


def assert_home_still_works(api: Any, hostile: int) -> dict[str, Any]:
    """Another job starts and ends; the read commands work; returns the hostile job's ``status --json``."""
    other = submit(api, ["/bin/sh", "-c", "echo loss=1"], name="bystander")
    assert wait_state(api, other, "succeeded").attempts == 1
    assert [m.name for m in api.metrics(other)] == ["loss"]
    cli_each(["status", str(hostile)], ["list"], ["nodes"], ["status"])
    return dict(json.loads(cli("status", str(hostile), "--json").stdout))


def metrics_writer(lines: str) -> list[str]:
    """A job that appends ``lines`` (a Python expression: a list of bytes) to its metrics file, then one good line."""
    script = ("import os, sys\n"
              f"lines = {lines}\n"
              "with open(os.environ['AUTORESEARCH_METRICS_FILE'], 'ab') as f:\n"
              "    for line in lines: f.write(line + b'\\n')\n"
              "    f.write(b'{\"step\": 5, \"metrics\": {\"good\": 0.5}}\\n')\n")
    return [PY, "-c", script]


BAD_METRICS_FILES = {  # each as the bytes a trial writes
    "string value": r"""[b'{"metrics": {"loss": "abc"}}']""",
    "metrics a list": r"""[b'{"metrics": [1]}']""",
    "step not a number": r"""[b'{"step": "x", "metrics": {"loss": 1}}']""",
    "step past int64": r"""[b'{"step": 10000000000000000000, "metrics": {"loss": 1}}']""",
    "step 1e19": r"""[b'{"step": 1e19, "metrics": {"loss": 1}}']""",
    "not an object": r"""[b'[1]', b'"text"', b'5', b'null']""",
    "not json": r"""[b'loss=1 but not json']""",
    "invalid utf-8": r"""[b'{"metrics": {"lo\xff\xfess": "\xff"}}']""",
    "lone surrogate name": r"""[b'{"metrics": {"\\ud800": 1}}']""",
    "deep nesting": r"""[b'{"metrics": ' + b'[' * 200_000]""",
    "giant line": r"""[b'{"metrics": {"loss": "' + b'x' * (5 << 20) + b'"}}']""",
}


@pytest.mark.parametrize("lines", BAD_METRICS_FILES.values(), ids=list(BAD_METRICS_FILES))
def test_a_bad_metrics_file_drops_with_one_warning(api: Any, lines: str) -> None:
    job = submit(api, metrics_writer(lines))
    view = wait_state(api, job, "succeeded")
    assert view.attempts == 1
    assert [(m.name, m.step, m.last) for m in api.metrics(job)] == [("good", 5, 0.5)]
    assert len(view.warnings) == 1 and "attempt 1: dropped" in view.warnings[0], view.warnings
    shown = assert_home_still_works(api, job)
    assert shown["warnings"] == view.warnings
    assert "warning: attempt 1: dropped" in cli("status", str(job)).stdout.replace("\n", " ")


def test_a_log_line_with_a_huge_step_is_dropped(api: Any) -> None:
    job = submit(api, ["/bin/sh", "-c", "echo step=1e19 loss=0.5; echo step=2 loss=0.25; echo 'step=1e30'"])
    view = wait_state(api, job, "succeeded")
    assert [(m.name, m.step, m.last) for m in api.metrics(job)] == [("loss", 2, 0.25)]
    assert len(view.warnings) == 1 and "dropped 2 " in view.warnings[0] and "1e+19" in view.warnings[0]
    assert assert_home_still_works(api, job)["state"] == "succeeded"


def test_report_refuses_a_huge_step_without_crashing_the_trial(api: Any) -> None:
    script = ("from autoresearch import report\n"
              "report(step=10**19, val_loss=1)\n"
              "report(step=float('nan'), val_loss=1)\n"
              "report(step=1, val_loss='abc', ok=2)\n"
              "report(step=2, val_loss=0.5, big=10**400)\n"
              "print('trial finished')\n")
    job = submit(api, [PY, "-c", script])
    view = wait_state(api, job, "succeeded")
    by_name = {m.name: (m.step, m.last) for m in api.metrics(job)}
    assert by_name == {"val_loss": (2, 0.5), "ok": (1, 2.0), "big": (2, None)}
    log = api.logs(job).text
    assert "trial finished" in log and "autoresearch.report: step=10000000000000000000" in log
    assert "metric 'val_loss' must be a number" in log
    assert view.warnings == []  # the trial's side refused them: nothing bad reached the ledger
    assert_home_still_works(api, job)


def test_warnings_are_one_per_attempt_however_many_bad_lines(api: Any) -> None:
    script = metrics_writer(r"""[b'{"metrics": {"loss": "abc"}}'] * 500 + [b'step=1e19 loss=1'] * 10""")
    script[-1] += "print('step=1e19 loss=1\\n' * 300)\n"
    job = submit(api, script)
    view = wait_state(api, job, "succeeded")
    assert len(view.warnings) == 1 and "dropped 810 " in view.warnings[0], view.warnings
    rows = api._ledger.query("SELECT COUNT(*) AS n FROM events WHERE job_id=? AND kind='metrics_dropped'", (job,))
    assert rows[0]["n"] == 1


@pytest.mark.parametrize("sig", ["SIGSEGV", "SIGABRT", "SIGBUS", "SIGFPE"])
def test_a_crashing_program_is_a_user_failure_not_retried(api: Any, sig: str) -> None:
    job = submit(api, [PY, "-c", f"import os, signal; os.kill(os.getpid(), signal.{sig})"])
    view = wait_state(api, job, "failed")
    number = int(getattr(__import__("signal"), sig))
    assert view.attempts == 1 and view.end_reason == "exit" and view.failure_class == "user"
    assert view.attempt_list[0].signal == number
    assert view.attempt_list[0].detail == f"crashed with {sig} (signal {number})"
    assert_home_still_works(api, job)


def test_a_crash_is_retried_when_its_shell_code_is_listed(api: Any) -> None:
    # 128 + 11: what a shell reports for a segfaulted child, so the same list works either way.
    job = submit(api, [PY, "-c", "import os; os.kill(os.getpid(), 11)"], retry_on_exit_codes=[139], max_retries=1)
    view = wait_state(api, job, "failed")
    assert view.attempts == 2 and [a.end_reason for a in view.attempt_list] == ["exit", "exit"]


def test_a_checkpoint_that_cannot_be_made_ends_the_job(api: Any, tmp_path: Path) -> None:
    blocker = submit(api, ["sleep", "30"], gpus=2)
    wait_state(api, blocker, "running")
    job = submit(api, ["true"], gpus=1, checkpoint=str(tmp_path / "ck" / "sub"), max_retries=1)
    assert api.status(job).state == "queued"
    (tmp_path / "ck").write_text("a file where the checkpoint's parent should be")
    api.cancel([blocker])
    view = wait_state(api, job, "failed")
    assert view.end_reason == "infra" and view.attempts == 2
    detail = view.attempt_list[-1].detail or ""
    assert "could not start: cannot create the checkpoint directory" in detail and "is not a directory" in detail
    assert_home_still_works(api, job)


def test_submit_refuses_a_checkpoint_under_a_file(home: Path) -> None:
    proc = subprocess.run([*CLI, "submit", "--checkpoint", "/etc/hostname/sub", "--", "true"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "/etc/hostname is not a directory" in proc.stderr and "hint:" in proc.stderr


def test_a_pass_that_fails_on_one_job_goes_on_with_the_others(api: Any, home: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from autoresearch.engine import guard

    broken = submit(api, ["sleep", "60"], gpus=1)  # long enough to outlive a slow, loaded pass
    wait_state(api, broken, "running")
    # The trial overwrites its own supervisor's exit record with a shape nothing expects.
    (home / "jobs" / str(broken) / "attempt-1" / "exit.json").write_text('{"exit_code": [1], "signal": {"x": 1}}')
    shown = assert_home_still_works(api, broken)  # the pass skipped it and placed the next job
    assert shown["state"] == "running"
    assert any("autoresearch failed" in w and "reconcile" in w for w in shown["warnings"]), shown["warnings"]
    # A job every pass fails on is not left running forever: after enough failures it is ended.
    monkeypatch.setattr(guard, "GIVE_UP_AFTER", 3)
    monkeypatch.setattr(guard, "GIVE_UP_S", 0.0)
    view = wait_state(api, broken, "failed")
    assert view.end_reason == "infra" and "gave up on it" in (view.attempt_list[0].detail or "")
    assert_home_still_works(api, broken)
    # The forged exit record hides the attempt from stop(); end its process group ourselves.
    state = json.loads((home / "jobs" / str(broken) / "attempt-1" / "state.json").read_text())
    with contextlib.suppress(ProcessLookupError):
        os.killpg(int(state["pgid"]), signal.SIGKILL)


def test_mcp_status_shows_the_warnings(api: Any, tmp_path: Path) -> None:
    import anyio

    from autoresearch.tools.server import build_server
    from tests.tools.conftest import connect

    job = submit(api, metrics_writer(BAD_METRICS_FILES["string value"]))
    wait_state(api, job, "succeeded")

    async def status() -> Any:
        async with connect(build_server(api, root=tmp_path)) as client:
            return await client.call_tool("status", {"job_id": job})

    result = anyio.run(status)
    assert not result.is_error
    warnings = result.structured_content["job"]["warnings"]
    assert len(warnings) == 1 and "value 'abc' is not a number" in warnings[0]


def test_ingestion_is_not_blocked_by_a_line_without_newline(api: Any) -> None:
    job = submit(api, [PY, "-c", "import sys; sys.stdout.write('x' * (5 << 20)); print(); print('loss=0.5')"])
    wait_state(api, job, "succeeded")
    wait_for(lambda: [(m.name, m.last) for m in api.metrics(job)] == [("loss", 0.5)])


@pytest.mark.parametrize(("trick", "reason"), [
    ("mkfifo \"$F\"", "not a regular file"),  # reading it would block every pass forever
    ("ln -s /dev/zero \"$F\"", "cannot be opened"),  # an endless file, through a link
])
def test_a_metrics_file_that_is_not_a_file_is_not_read(api: Any, trick: str, reason: str) -> None:
    job = submit(api, ["/bin/sh", "-c", f'F="$AUTORESEARCH_METRICS_FILE"; rm -f "$F"; {trick}; echo loss=1'])

    def ended() -> dict[str, Any] | None:  # through the CLI, with a timeout: a hung pass fails, not hangs
        shown = dict(json.loads(cli("status", str(job), "--json").stdout))
        return shown if shown["state"] == "succeeded" else None

    shown = wait_for(ended, timeout=30, interval=0.3)
    assert len(shown["warnings"]) == 1 and reason in shown["warnings"][0], shown["warnings"]
    assert [(m.name, m.last) for m in api.metrics(job)] == [("loss", 1.0)]
    assert_home_still_works(api, job)


@pytest.mark.parametrize("name", ["attempt-$AUTORESEARCH_ATTEMPT.log", "attempt-$AUTORESEARCH_ATTEMPT/exit.json"])
def test_a_job_that_replaces_its_files_with_a_fifo_does_not_hang_the_passes(api: Any, name: str) -> None:
    log = f'"$AUTORESEARCH_HOME/jobs/$AUTORESEARCH_JOB_ID/{name}"'
    job = submit(api, ["/bin/sh", "-c", f"rm -f {log}; mkfifo {log}; sleep 2; echo done"])

    def ended() -> dict[str, Any] | None:  # through the CLI, with a timeout: a hung pass fails, not hangs
        shown = dict(json.loads(cli("status", str(job), "--json").stdout))
        return shown if shown["state"] == "succeeded" else None

    wait_for(ended, timeout=30, interval=0.3)
    assert api.logs(job).text in ("", "done\n") and api.metrics(job) == []
    assert_home_still_works(api, job)


def test_a_loop_of_hostile_trials_runs_to_its_end(api: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from autoresearch.loop.controller import Controller
    from autoresearch.loop.plan import parse_plan

    monkeypatch.setenv("AUTORESEARCH_TRACKING", "off")
    (tmp_path / "trial.py").write_text(
        "import os, sys\n"
        "from autoresearch import report\n"
        "x = float(sys.argv[1])\n"
        "print('step=1e19 loss=0.5')\n"
        "with open(os.environ['AUTORESEARCH_METRICS_FILE'], 'a') as f:\n"
        "    f.write('{\"metrics\": {\"loss\": \"abc\"}}\\n{\"step\": 1e19, \"metrics\": {\"loss\": 1}}\\n[1]\\n')\n"
        "report(step=10**19, loss=0.0)\n"
        "report(step=1, loss=x)\n")
    plan = parse_plan({"name": "hostile", "objective": {"metric": "loss"},
                       "trial": {"command": f"{PY} trial.py {{x}}", "grace": 1},
                       "space": {"x": [1.0, 2.0, 3.0]}, "proposer": {"kind": "grid"},
                       "budget": {"trials": 3, "parallel": 2}}, base_dir=tmp_path)
    view = Controller(plan, runtime=api._runtime).run()
    assert view.counts == {"succeeded": 3}
    objectives = sorted(r["objective"] for r in api._ledger.query("SELECT objective FROM trials"))
    assert objectives == [1.0, 2.0, 3.0]
    for row in api._ledger.query("SELECT job_id FROM trials"):
        assert len(api.status(row["job_id"]).warnings) == 1
