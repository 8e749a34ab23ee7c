"""The runtime on a real Slurm (the kit's cluster): preemption and resume, cancel, slurmctld
restarted mid-run, a submitter killed between sbatch and its record, cordon = drain."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from autoresearch.api import Api
from autoresearch.backends._slurm import SlurmBackend
from tests.conftest import wait_for, wait_state

PY = sys.executable

# Counts steps into AUTORESEARCH_CHECKPOINT_DIR; on SIGTERM it saves and exits 0 (as a good trial does).
RESUMABLE = textwrap.dedent("""\
    import os, pathlib, signal, sys, time
    ck = pathlib.Path(os.environ["AUTORESEARCH_CHECKPOINT_DIR"]) / "step"
    step = int(ck.read_text()) if ck.exists() else 0
    print(f"resumed at {step}", flush=True)
    def term(*_):
        ck.write_text(str(step)); print(f"checkpointed at {step}", flush=True); sys.exit(0)
    signal.signal(signal.SIGTERM, term)
    while step < int(sys.argv[1]):
        step += 1; ck.write_text(str(step)); time.sleep(0.1)
    print(f"done at {step}", flush=True)
""")


@pytest.fixture
def sapi(home: Path, slurm: Any) -> Api:
    return Api(home, SlurmBackend(conf=slurm.conf))


def _attempt_names(api: Any, job_id: int) -> list[str]:
    rows = api._ledger.query("SELECT n, external_id FROM attempts WHERE job_id=? ORDER BY n", (job_id,))
    return [SlurmBackend.job_name(f"{job_id}.{r['n']}", r["external_id"]) for r in rows]


def test_a_job_runs_in_slurm_with_the_gpus_it_asked_for(sapi: Api, slurm: Any, tmp_path: Path) -> None:
    view = sapi.submit({"command": [PY, "-c", "import os; print('gpus', os.environ['CUDA_VISIBLE_DEVICES'])"],
                        "gpus": 2, "cpus": 1, "memory": "256M", "timeout": "5m", "workdir": str(tmp_path)})
    done = wait_state(sapi, view.id, ("succeeded", "failed"), timeout=60)
    assert done.state == "succeeded", done
    assert "gpus 0,1" in sapi.logs(view.id).text
    [name] = _attempt_names(sapi, view.id)
    assert name.startswith(f"ar-{view.id}.1-") and len(slurm.jobs_named(name)) == 1  # the key travels in the name
    node = next(n for n in sapi.nodes() if n.backend == "slurm")
    assert node.gpus == 4 and node.state == "healthy"


def test_best_effort_preempted_by_slurm_resumes_from_its_checkpoint(sapi: Api, slurm: Any, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(RESUMABLE)
    low = sapi.submit({"command": [PY, "train.py", "60"], "priority": "best-effort", "gpus": 4, "checkpoint": True,
                       "workdir": str(tmp_path), "grace": 5})
    wait_for(lambda: "resumed at 0" in sapi.logs(low.id).text, timeout=60)
    wait_for(lambda: _step(tmp_path, sapi, low.id) >= 3, timeout=30)
    high = sapi.submit({"command": ["sleep", "1"], "gpus": 4, "workdir": str(tmp_path)})  # `high` preempts `low`

    done = wait_state(sapi, low.id, ("succeeded", "failed"), timeout=90)
    assert done.state == "succeeded", done
    first, second = done.attempt_list[0], done.attempt_list[1]
    assert first.end_reason == "preempted" and "Slurm" in (first.detail or ""), first  # not a success: it exited 0
    resumed = int(sapi.logs(low.id, attempt=2).text.split("resumed at ")[1].split()[0])
    assert resumed >= 3 and second.end_reason == "exit" and len(done.attempt_list) == 2
    assert sapi._ledger.one("SELECT retries_used FROM jobs WHERE id=?", (low.id,))[0] == 0  # a preemption is free
    assert wait_state(sapi, high.id, ("succeeded", "failed")).state == "succeeded"
    # Slurm's requeued copy of attempt 1 was cancelled and never ran the program again.
    name = _attempt_names(sapi, low.id)[0]
    assert [line.split()[1] for line in slurm.jobs_named(name)] == ["CANCELLED"]
    assert sapi.logs(low.id, attempt=1).text.count("resumed at") == 1


def _step(tmp_path: Path, api: Any, job_id: int) -> int:
    found = list((api._ledger.home / "jobs" / str(job_id)).glob("checkpoint/step"))
    try:
        return int(found[0].read_text()) if found else 0
    except ValueError:
        return 0


def test_cancel_stops_the_slurm_job_with_sigterm(sapi: Api, slurm: Any, tmp_path: Path) -> None:
    script = "import signal,sys,time\nsignal.signal(signal.SIGTERM, lambda *a: (print('bye', flush=True), sys.exit(3)))\n" \
             "print('up', flush=True)\ntime.sleep(120)"
    view = sapi.submit({"command": [PY, "-c", script], "workdir": str(tmp_path)})
    wait_for(lambda: "up" in sapi.logs(view.id).text, timeout=60)
    sapi.cancel([view.id])
    done = wait_state(sapi, view.id, "cancelled", timeout=30)
    assert done.attempt_list[0].end_reason == "cancelled" and "bye" in sapi.logs(view.id).text
    name = _attempt_names(sapi, view.id)[0]
    wait_for(lambda: all(line.split()[1] != "RUNNING" for line in slurm.jobs_named(name)), timeout=30)


def test_slurmctld_restarted_mid_run_loses_nothing_and_starts_nothing_twice(home: Path, slurm: Any,
                                                                             tmp_path: Path) -> None:
    api = Api(home, SlurmBackend(conf=slurm.conf, command_timeout=3))
    running = api.submit({"command": ["/bin/sh", "-c", "echo start; sleep 8; echo end"], "workdir": str(tmp_path)})
    wait_state(api, running.id, "running", timeout=60)
    ctld = slurm.dir / "run" / "slurmctld.pid"
    pid = int(ctld.read_text().split()[0])
    os.kill(pid, signal.SIGTERM)
    wait_for(lambda: not ctld.exists() or not _alive(pid), timeout=30)
    time.sleep(2.5)  # longer than a pass trusts Slurm's last answer without asking again (ping)
    try:
        assert api.status(running.id).state == "running"  # unknown is not lost
        queued = api.submit({"command": ["echo", "later"], "workdir": str(tmp_path)})  # accepted; waits for Slurm
        assert api.status(queued.id).state == "queued" and api.status(queued.id).attempts == 0
    finally:
        subprocess.run(["slurmctld", "-f", slurm.conf], env={**os.environ, "SLURM_CONF": slurm.conf}, check=True,
                       timeout=30)
    for job in (running, queued):
        assert wait_state(api, job.id, ("succeeded", "failed"), timeout=90).state == "succeeded"
        view = api.status(job.id)
        assert view.attempts == 1, view
        [name] = _attempt_names(api, job.id)
        assert len(slurm.jobs_named(name)) == 1
    assert api.logs(running.id).text.count("start") == 1


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


DIE_AFTER_SBATCH = textwrap.dedent("""\
    import os, signal, sys
    from autoresearch.api import Api
    from autoresearch.backends._slurm import SlurmBackend

    class DiesAfterSbatch(SlurmBackend):
        def _submitted(self, run_dir, job_id):
            print(job_id, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)  # between Slurm's answer and our record of it

    Api(sys.argv[1], DiesAfterSbatch(conf=sys.argv[2])).submit(
        {"command": ["/bin/sh", "-c", "echo ran >> " + sys.argv[3]], "workdir": sys.argv[4]})
""")


def test_a_submitter_killed_after_sbatch_is_adopted_not_resubmitted(home: Path, slurm: Any, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    died = subprocess.run([PY, "-c", DIE_AFTER_SBATCH, str(home), slurm.conf, str(marker), str(tmp_path)],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert died.returncode == -signal.SIGKILL, died.stderr
    slurm_id = died.stdout.split()[0]
    api = Api(home, SlurmBackend(conf=slurm.conf))
    job = api.status()[0]  # type: ignore[index]
    assert wait_state(api, job.id, ("succeeded", "failed"), timeout=60).state == "succeeded"
    assert api.status(job.id).attempts == 1
    [name] = _attempt_names(api, job.id)
    assert [line.split()[0] for line in slurm.jobs_named(name)] == [slurm_id]  # that job, adopted
    assert marker.read_text() == "ran\n"


def test_cordon_drains_the_slurm_node_and_uncordon_resumes_it(sapi: Api, slurm: Any) -> None:
    node = next(n for n in sapi.nodes() if n.backend == "slurm").name
    try:
        view = sapi.cordon(node, "bad gpu 3")
        assert view.state == "cordoned" and "bad gpu 3" in view.reason
        assert "drain" in slurm.run("sinfo", "-h", "-n", node, "-o", "%T %E")
        again = next(n for n in sapi.nodes() if n.name == node)  # a later pass reads Slurm's word back
        assert again.state == "cordoned" and "bad gpu 3" in again.reason
    finally:
        sapi.cordon(node, undo=True)
    assert next(n for n in sapi.nodes() if n.name == node).state == "healthy"
    assert "drain" not in slurm.run("sinfo", "-h", "-n", node, "-o", "%T")


def test_an_sbatch_that_timed_out_but_was_submitted_is_found_and_run_once(slurm: Any, tmp_path: Path) -> None:
    from autoresearch.backends import LaunchRequest

    backend = SlurmBackend(conf=slurm.conf, command_timeout=2)
    request = LaunchRequest(key="unknown.1", argv=["/bin/sh", "-c", "echo ran"], env=dict(os.environ),
                            workdir=str(tmp_path), log_path=str(tmp_path / "a.log"), run_dir=str(tmp_path / "a"))
    ctld = int((slurm.dir / "run" / "slurmctld.pid").read_text().split()[0])
    os.kill(ctld, signal.SIGSTOP)  # slurmctld takes the request into its socket but answers nobody
    try:
        ext = backend.start(request)  # sbatch times out: submitted or not, nobody knows yet
    finally:
        os.kill(ctld, signal.SIGCONT)
    assert (tmp_path / "a" / "submit_unknown").exists()
    status = wait_for(lambda: (s := backend.poll(ext)).ended and s, timeout=60)
    assert status.exit_code == 0 and (tmp_path / "a.log").read_text() == "ran\n"
    assert len(slurm.jobs_named(SlurmBackend.job_name("unknown.1", str(tmp_path / "a")))) == 1


def test_a_users_own_scancel_is_a_cancel_not_the_machines_fault(sapi: Api, slurm: Any, tmp_path: Path) -> None:
    """scancel by the user (sacct: CANCELLED by <uid>) is recorded cancelled, never infra, never resubmitted.
    Before, it read as 'killed by SIGTERM that autoresearch did not send': infra, and the job ran again."""
    view = sapi.submit({"command": [PY, "-c", "import time; print('up', flush=True); time.sleep(120)"],
                        "workdir": str(tmp_path)})
    wait_for(lambda: "up" in sapi.logs(view.id).text, timeout=60)
    run_dir = sapi._ledger.one("SELECT external_id FROM attempts WHERE job_id=?", (view.id,))["external_id"]
    slurm_id = (Path(run_dir) / "slurm_job_id").read_text().strip()
    subprocess.run(["scancel", slurm_id], check=True, capture_output=True, timeout=30)

    done = wait_state(sapi, view.id, ("cancelled", "failed", "succeeded"), timeout=60)
    assert done.state == "cancelled" and done.attempts == 1, done
    attempt = done.attempt_list[0]
    assert attempt.end_reason == "cancelled" and "scancel" in (attempt.detail or "")
    assert sapi._ledger.one("SELECT COUNT(*) FROM events WHERE kind='finding' AND data LIKE '%infra_failure%'")[0] == 0


def test_status_shows_slurms_node_gpus_and_why_it_holds_a_job(sapi: Api, slurm: Any, tmp_path: Path) -> None:
    from autoresearch.cli._render import _state

    hog = slurm.run("sbatch", "--parsable", "-o", "/dev/null", "--gres=gpu:4", "--wrap", "sleep 300").strip()
    wait_for(lambda: "RUNNING" in slurm.run("squeue", "-h", "-j", hog, "-o", "%T"), timeout=60)
    job = sapi.submit({"command": ["sleep", "300"], "gpus": 2, "cpus": 1, "memory": "64M",
                       "workdir": str(tmp_path)}).id
    # (Slurm's reason is None until its scheduler has looked at the job: "PENDING" alone, then its reason)
    held = wait_for(lambda: (v := sapi.status(job)).engine_state.startswith("PENDING, ") and v, timeout=60)
    assert held.state == "starting" and held.engine_state == "PENDING, Resources"
    assert _state(held)[0] == "queued (engine: PENDING, Resources)"  # not "starting"
    slurm.run("scancel", hog)
    view = wait_state(sapi, job, "running", timeout=60)
    view = wait_for(lambda: (v := sapi.status(job)).attempt_list[0].node and v, timeout=30)  # type: ignore[union-attr]
    node = next(n for n in sapi.nodes() if n.backend == "slurm").name
    assert view.attempt_list[0].node == node and view.attempt_list[0].gpus == ["0", "1"]  # Slurm's own placement
    assert view.engine_state == "" and _state(view)[0] == "running"
    sapi.cancel([job])
