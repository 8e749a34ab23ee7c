"""A process killed between recording an attempt and starting it (kill -9 of a loop controller
or a CLI mid-submit) leaves an attempt without a run dir: the next pass ends it as lost and
retries the job, instead of failing on the missing directory in every pass."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from tests.conftest import wait_state

KILLED_MID_LAUNCH = textwrap.dedent("""\
    import os, sys
    from autoresearch.api import Api
    from autoresearch.backends._local import LocalBackend

    LocalBackend.start = lambda self, request: os._exit(9)  # dies after the attempt row, before the run dir
    Api().submit({"command": ["true"], "workdir": sys.argv[1]})
""")


def test_an_attempt_whose_launcher_died_before_its_run_dir_is_retried(api: Any, home: Path, tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", KILLED_MID_LAUNCH, str(tmp_path)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 9, done.stderr
    attempt = api._ledger.one("SELECT * FROM attempts")
    assert attempt["state"] == "starting" and not Path(attempt["external_id"]).exists()

    api._runtime.tick()  # (today: FileNotFoundError here, in every pass after)

    view = wait_state(api, 1, "succeeded")
    assert view.attempts == 2
    ended = api._ledger.one("SELECT state, end_reason FROM attempts WHERE n=1")
    assert ended["state"] == "ended" and ended["end_reason"] == "infra"


KILLED_MID_BATCH = textwrap.dedent("""\
    import os, sys
    from autoresearch.engine import jobs
    from autoresearch.api import Api
    from autoresearch.backends._local import LocalBackend

    real, started = LocalBackend.start, []

    def start(self, request):  # the pass recorded all three attempts first; it dies after starting one
        if started:
            os._exit(9)
        started.append(1)
        return real(self, request)

    LocalBackend.start = start
    api = Api()
    jobs.submit_many(api._runtime, [{"command": ["true"], "workdir": sys.argv[1]}] * int(sys.argv[2]))
""")


def test_a_launcher_killed_mid_batch_starts_each_job_once_and_retries_the_unstarted(api: Any, home: Path,
                                                                                   tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", KILLED_MID_BATCH, str(tmp_path), "3"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 9, done.stderr
    states = [r["state"] for r in api._ledger.query("SELECT state FROM attempts ORDER BY job_id")]
    # the first was handed to its supervisor, which may have recorded it running (or ended) by now; the
    # two never started stay as the dead launcher left them
    assert states[0] in ("starting", "running", "ended") and states[1:] == ["starting"] * 2, states

    api._runtime.tick()

    for job in (1, 2, 3):
        wait_state(api, job, "succeeded")
    attempts = {r["job_id"]: r["n"] for r in api._ledger.query("SELECT job_id, MAX(n) AS n FROM attempts GROUP BY job_id")}
    assert attempts == {1: 1, 2: 2, 3: 2}  # the started one ran once; the two never started were retried


def test_a_launcher_killed_mid_batch_does_not_cordon_the_node(api: Any, home: Path, tmp_path: Path) -> None:
    """Attempts whose launcher died before their supervisor started are the launcher's loss, not the
    machine's: four of them at once (more than health's cordon_after: 3) must not cordon the only node,
    or every job waits forever (a controller killed mid-launch did exactly that)."""
    done = subprocess.run([sys.executable, "-c", KILLED_MID_BATCH, str(tmp_path), "5"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 9, done.stderr

    api._runtime.tick()

    for job in range(1, 6):
        wait_state(api, job, "succeeded")
    assert [r["state"] for r in api._ledger.query("SELECT state FROM nodes")] == ["healthy"]


KILLED_AFTER_THE_HAND_OFF = textwrap.dedent("""\
    import os, sys
    from autoresearch.api import Api
    from autoresearch.backends import _local

    real = _local.sup.launch

    def launch(request):  # the supervisor has its request; the launcher dies before it records request.json
        real(request)
        os._exit(9)

    _local.sup.launch = launch
    Api().submit({"command": ["/bin/sh", "-c", f"echo ran >> {sys.argv[1]}/ran; echo said so"], "workdir": sys.argv[1]})
""")


def test_a_launcher_killed_after_its_supervisor_had_the_request_runs_the_attempt_once(
        api: Any, home: Path, tmp_path: Path) -> None:
    """request.json is written once the supervisor has its request (its creation no longer delays the
    command): a launcher that dies in between leaves an attempt that runs, once, and is not lost."""
    done = subprocess.run([sys.executable, "-c", KILLED_AFTER_THE_HAND_OFF, str(tmp_path)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 9, done.stderr
    attempt = api._ledger.one("SELECT * FROM attempts")
    assert not (Path(attempt["external_id"]) / "request.json").exists()

    view = wait_state(api, 1, "succeeded")
    assert view.attempts == 1
    assert (tmp_path / "ran").read_text() == "ran\n"
    assert "said so" in api.logs(1).text  # (its log found where the runtime puts it, with no request.json)
