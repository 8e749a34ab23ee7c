"""The runtime on a real Ray head: metrics through the API log, cancel, at most once across a
crash between submit_job and the ledger's write, bad input, and the head killed mid-run.

The head-killing test restarts the session's head; it runs last in this module.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from autoresearch.api import Api
from autoresearch.backends.ray import RayBackend
from autoresearch.engine.runtime import Runtime
from autoresearch.errors import AutoresearchError, BackendError, CapacityError
from tests.conftest import wait_for, wait_state

from .conftest import RayHead

pytestmark = pytest.mark.slow

REPORTS = textwrap.dedent("""\
    from autoresearch import report
    for step in range(3):
        report(step=step, loss=1.0 / (step + 1))
    print("acc: 0.5")
    print("loss: 99")
    """)


def _ray_jobs(head: RayHead, key_part: str) -> list[dict[str, Any]]:
    import urllib.request

    with urllib.request.urlopen(f"{head.address}/api/jobs/", timeout=30) as response:
        jobs = json.loads(response.read())
    return [j for j in jobs if key_part in (j.get("submission_id") or "")]


def test_metrics_come_through_the_api_log_once(ray_env: RayHead, api: Api, tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text(REPORTS)
    job = api.submit({"command": [sys.executable, "t.py"], "workdir": str(tmp_path)}).id
    wait_state(api, job, "succeeded", timeout=90)
    for _ in range(3):  # more passes and reads never add a point twice
        api.tick()
        api.metrics(job)
    rows = api._ledger.query("SELECT name, step, value, source FROM metrics WHERE job_id=? ORDER BY name, step",
                             (job,))
    got = [(r["name"], r["step"], r["value"], r["source"]) for r in rows]
    assert got == [("acc", 0, 0.5, "log"), ("loss", 0, 1.0, "report"), ("loss", 0, 99.0, "log"),
                   ("loss", 1, 0.5, "report"), ("loss", 2, pytest.approx(1 / 3), "report")]
    # The reported loss wins over the printed one; the log a user reads has no marks of ours.
    assert {m.name: m.last for m in api.metrics(job)}["loss"] == pytest.approx(1 / 3)
    text = api.logs(job).text
    assert "acc: 0.5" in text and "\x1e" not in text and "Running entrypoint" not in text


def test_cancel_stops_the_ray_job(ray_env: RayHead, api: Api, tmp_path: Path) -> None:
    job = api.submit({"command": ["sleep", "120"], "workdir": str(tmp_path), "grace": 1}).id
    wait_state(api, job, "running", timeout=90)
    api.cancel([job])
    view = wait_state(api, job, "cancelled", timeout=60)
    assert view.state == "cancelled"
    ext = api._ledger.one("SELECT external_id FROM attempts WHERE job_id=?", (job,))["external_id"]
    assert [j["status"] for j in _ray_jobs(ray_env, ext)] == ["STOPPED"]


def test_a_users_own_ray_stop_is_a_cancel_not_the_machines_fault(ray_env: RayHead, api: Api, tmp_path: Path) -> None:
    """`ray job stop` by a person (not autoresearch) ends the job cancelled, never infra, never run again.
    Before, it read as 'killed by SIGTERM that autoresearch did not send': infra, and the job ran again."""
    import urllib.request

    job = api.submit({"command": ["sleep", "120"], "workdir": str(tmp_path), "grace": 1}).id
    wait_state(api, job, "running", timeout=90)
    ext = api._ledger.one("SELECT external_id FROM attempts WHERE job_id=?", (job,))["external_id"]
    [ray_job] = _ray_jobs(ray_env, ext)
    stop = urllib.request.Request(f"{ray_env.address}/api/jobs/{ray_job['submission_id']}/stop", method="POST")
    with urllib.request.urlopen(stop, timeout=30):
        pass
    view = wait_state(api, job, ("cancelled", "failed", "succeeded"), timeout=90)
    assert view.state == "cancelled" and view.attempts == 1, view
    assert view.attempt_list[0].end_reason == "cancelled"


CRASH_AFTER_SUBMIT = textwrap.dedent("""\
    import os, signal, sys
    from autoresearch.api import Api
    from autoresearch.backends import ray as R

    real = R.RayBackend.start
    def start(self, request):
        real(self, request)            # Ray has the job ...
        os.kill(os.getpid(), signal.SIGKILL)  # ... and the ledger never hears its id
    R.RayBackend.start = start
    Api(sys.argv[1]).submit({"command": ["/bin/sh", "-c", "echo ran >> " + sys.argv[2]], "workdir": sys.argv[3]})
    """)


def test_a_submitter_killed_after_submit_job_never_runs_the_attempt_twice(
        ray_env: RayHead, home: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    proc = subprocess.run([sys.executable, "-c", CRASH_AFTER_SUBMIT, str(home), str(marker), str(tmp_path)],
                          capture_output=True, timeout=120)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    api = Api(home)
    att = api._ledger.one("SELECT * FROM attempts")
    assert att["external_id"].startswith("/"), "the ledger still holds the run dir, not Ray's id"
    view = wait_state(api, att["job_id"], "succeeded", timeout=90)  # the next pass adopts the Ray job
    assert view.attempts == 1
    assert marker.read_text() == "ran\n"
    sid = (Path(att["external_id"]) / "ray-submission-id").read_text()
    assert len(_ray_jobs(ray_env, sid)) == 1
    # Starting the same attempt again (a retry of the crashed start) adopts it too.
    assert RayBackend(address=ray_env.address).start(_request(att, tmp_path)) == sid
    assert len(_ray_jobs(ray_env, sid)) == 1


def _request(att: Any, workdir: Path) -> Any:
    from autoresearch.backends import LaunchRequest

    return LaunchRequest(key=f"{att['job_id']}.{att['n']}", argv=["true"], env={}, workdir=str(workdir),
                         log_path=att["log_path"], run_dir=att["external_id"])


def test_ray_rejection_and_capacity_and_unreachable_head(ray_env: RayHead, api: Api, tmp_path: Path) -> None:
    with pytest.raises(CapacityError, match="largest node of the Ray cluster .* has 2"):
        api.submit({"command": ["true"], "workdir": str(tmp_path), "gpus": 3})
    with pytest.raises(AutoresearchError, match="cannot preempt"):
        api.submit({"command": ["true"], "workdir": str(tmp_path), "priority": "best-effort"})
    # Ray refuses what it cannot take (when it sets the job up): its own message, and a hint.
    bad = Api(api._ledger.home, backend=RayBackend(address=ray_env.address, runtime_env={"pip": 5}))
    job = bad.submit({"command": ["true"], "workdir": str(tmp_path), "max_retries": 0}).id
    wait_state(bad, job, "failed", timeout=90)
    detail = bad._ledger.one("SELECT detail FROM attempts WHERE job_id=?", (job,))["detail"]
    assert "Ray rejected it" in detail and "runtime_env['pip'] must be" in detail and "hint:" in detail
    # Nobody at the address: the error names it and how to start the kit.
    dead = RayBackend(address="http://127.0.0.1:9", timeout=2)
    with pytest.raises(BackendError) as err:
        dead.probe()
    assert "http://127.0.0.1:9" in err.value.message and "backends/ray/start.sh" in err.value.hint
    assert dead.nodes() == []


def test_garbage_options_are_refused(ray_env: RayHead) -> None:
    for options in ({"address": "not a url"}, {"address": "http://x:1/../../etc"}, {"runtime_env": "pip"}):
        with pytest.raises(AutoresearchError) as err:
            RayBackend(**options)  # type: ignore[arg-type]
        assert err.value.hint


RETRIED = textwrap.dedent("""\
    import os, sys, time
    open(sys.argv[1], "a").write("start %s\\n" % os.environ["AUTORESEARCH_ATTEMPT"])
    if os.environ["AUTORESEARCH_ATTEMPT"] == "1":
        time.sleep(300)
    open(sys.argv[1], "a").write("done\\n")
    """)


@pytest.mark.timeout(400)
def test_the_head_killed_mid_run_retries_once_it_is_back(ray_env: RayHead, api: Api, tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text(RETRIED)
    jobs = [api.submit({"command": [sys.executable, "t.py", str(tmp_path / f"m{i}")],
                        "workdir": str(tmp_path)}).id for i in range(2)]
    for i, job in enumerate(jobs):
        wait_for(lambda i=i: (tmp_path / f"m{i}").exists(), timeout=90)
        wait_state(api, job, "running", timeout=30)
    ray_env.stop(kill=True)  # kill -9 the head's whole process group
    try:
        for _ in range(3):  # passes while the head is away: nothing is lost, nothing relaunched
            Runtime(api._ledger.home).tick()
        assert [api.status(j).state for j in jobs] == ["running", "running"]
        assert api._ledger.one("SELECT COUNT(*) AS n FROM attempts")["n"] == 2
        # The watchdog of our entrypoint killed the programs Ray's supervisor left behind.
        wait_for(lambda: subprocess.run(["pgrep", "-f", f"t.py {tmp_path}"], capture_output=True).returncode == 1,
                 timeout=30)
    finally:
        ray_env.start()
    for i, job in enumerate(jobs):
        view = wait_state(api, job, "succeeded", timeout=120)
        assert view.attempts == 2
        assert (tmp_path / f"m{i}").read_text() == "start 1\nstart 2\ndone\n"
    first = api._ledger.query("SELECT end_reason FROM attempts WHERE n=1")
    assert [r["end_reason"] for r in first] == ["infra", "infra"]
    assert api._ledger.one("PRAGMA integrity_check")[0] == "ok"


def test_a_running_jobs_attempt_records_the_ray_node_its_driver_runs_on(ray_env: RayHead, api: Api,
                                                                        tmp_path: Path) -> None:
    go = tmp_path / "go"
    job = api.submit({"command": f"while [ ! -e {go} ]; do sleep 0.2; done", "shell": True,
                      "workdir": str(tmp_path)}).id
    names = {n.name for n in RayBackend(address=ray_env.address).nodes()}

    def placed() -> Any:
        attempts = api.status(job).attempt_list  # type: ignore[union-attr]
        return attempts and attempts[0].node in names and attempts[0]

    try:
        assert wait_for(placed, timeout=120).node.startswith("ray-")
    finally:
        go.write_text("")
    wait_state(api, job, "succeeded", timeout=90)
