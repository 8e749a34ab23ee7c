"""Jobs on real processes through the facade: the behaviour a user sees."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_for, wait_state

PY = sys.executable


def submit(api: Any, command: list[str] | str, **spec: Any) -> int:
    spec.setdefault("workdir", os.getcwd())
    return int(api.submit({"command": command, **spec}).id)


def test_success_logs_and_metrics(api: Any) -> None:
    script = ("from autoresearch import report\n"
              "for step in range(3): report(step=step, loss=1.0 / (step + 1))\n"
              "print('val_bpb:          0.997900')\nprint('done')")
    job = submit(api, [PY, "-c", script], name="train")
    view = wait_state(api, job, "succeeded")
    assert view.attempt_list[0].end_reason == "exit" and view.attempt_list[0].exit_code == 0
    assert "done" in api.logs(job).text
    by_name = {m.name: m for m in api.metrics(job, series=True)}
    assert by_name["loss"].last == pytest.approx(1 / 3) and by_name["loss"].count == 3
    assert by_name["loss"].series == [(0, 1.0), (1, 0.5), (2, pytest.approx(1 / 3))]
    assert by_name["val_bpb"].last == pytest.approx(0.9979)


def test_user_failure_is_not_retried(api: Any) -> None:
    job = submit(api, ["/bin/sh", "-c", "echo 'Traceback: boom' >&2; exit 3"])
    view = wait_state(api, job, "failed")
    assert (view.attempts, view.exit_code, view.end_reason) == (1, 3, "exit")
    assert view.failure_class == "user" and "boom" in (view.log_excerpt or "")


def test_retry_on_exit_codes(api: Any) -> None:
    job = submit(api, ["/bin/sh", "-c", "exit 75"], retry_on_exit_codes=[75], max_retries=2)
    view = wait_state(api, job, "failed")
    assert view.attempts == 3


def test_timeout_kills_after_grace(api: Any) -> None:
    script = "import signal,time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(60)"
    job = submit(api, [PY, "-c", script], timeout=1, grace=0.5)
    view = wait_state(api, job, "failed", timeout=60)
    assert view.end_reason == "timeout" and view.attempts == 1


def test_cancel_running_and_queued(api: Any) -> None:
    running = submit(api, ["sleep", "60"], gpus=2)
    wait_state(api, running, "running")
    queued = submit(api, ["sleep", "60"], gpus=2)
    assert api.status(queued).state == "queued"
    views = {v.id: v for v in api.cancel([running, queued])}
    assert views[queued].state == "cancelled"
    view = wait_state(api, running, "cancelled", timeout=60)
    assert view.attempt_list[-1].end_reason == "cancelled"


def test_gpu_slots_are_exclusive_and_exported(api: Any, tmp_path: Path) -> None:
    """Two slots, four jobs in two pairs: each pair runs at once (each job holds its slot until its
    gate opens) and gets both slots, one each. (Counting slots over all four, without holding the
    second pair, failed when a job of it ended before the other started: the same free slot twice.)"""
    out = tmp_path / "gpus"
    out.mkdir()

    def holding(gate: Path) -> list[str]:
        return ["/bin/sh", "-c", f'echo "$CUDA_VISIBLE_DEVICES" > {out}/$AUTORESEARCH_JOB_ID; '
                                 f'while [ ! -e {gate} ]; do sleep 0.05; done']

    first, second = tmp_path / "first", tmp_path / "second"
    jobs = [submit(api, holding(first), gpus=1) for _ in range(2)] + \
           [submit(api, holding(second), gpus=1) for _ in range(2)]
    assert sum(api.status(j).state != "queued" for j in jobs) == 2  # two slots, two running

    def slots(pair: list[int]) -> list[str]:
        wait_for(lambda: all((out / str(j)).exists() and (out / str(j)).read_text().strip() for j in pair), 20)
        return sorted((out / str(j)).read_text().strip() for j in pair)

    assert slots(jobs[:2]) == ["0", "1"]
    assert all(api.status(j).state == "queued" for j in jobs[2:])
    first.touch()
    assert slots(jobs[2:]) == ["0", "1"]  # both running at once: one slot each
    second.touch()
    for j in jobs:
        wait_state(api, j, "succeeded")


def test_preemption_requeues_and_resumes_from_checkpoint(api: Any) -> None:
    trial = (
        "import os, signal, sys, time\n"
        "ckpt = os.path.join(os.environ['AUTORESEARCH_CHECKPOINT_DIR'], 'step')\n"
        "start = int(open(ckpt).read()) if os.path.exists(ckpt) else 0\n"
        "print('resumed from', start, flush=True)\n"
        "step = start\n"
        "def save(*_):\n"
        "    open(ckpt, 'w').write(str(step)); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, save)\n"
        "while step < start + 100 and not (start and step >= start + 2):\n"
        "    step += 1; time.sleep(0.1)\n"
    )
    low = submit(api, [PY, "-c", trial], gpus=2, priority="best-effort", checkpoint=True)
    wait_for(lambda: "resumed from 0" in api.logs(low).text)
    time.sleep(0.4)
    high = submit(api, ["sleep", "0.5"], gpus=2, priority="critical")
    wait_state(api, high, "succeeded", timeout=60)
    view = wait_state(api, low, "succeeded", timeout=30)
    assert [a.end_reason for a in view.attempt_list] == ["preempted", "exit"]
    resumed = api.logs(low, attempt=2).text
    assert "resumed from" in resumed and "resumed from 0" not in resumed
    high_view = api.status(high)
    assert high_view.started_at >= view.attempt_list[0].ended_at - 0.05  # never shared the GPUs


def test_signal_we_did_not_send_is_infra_and_retried(api: Any) -> None:
    job = submit(api, ["/bin/sh", "-c", 'if [ "$AUTORESEARCH_ATTEMPT" = 1 ]; then kill -9 $$; fi; echo ok'])
    view = wait_state(api, job, "succeeded")
    assert [a.end_reason for a in view.attempt_list] == ["infra", "exit"]
    assert "SIGKILL" in (view.attempt_list[0].detail or "")


def test_lost_supervisor_is_infra_and_retried(api: Any, home: Path) -> None:
    job = submit(api, ["sleep", "30"], max_retries=1)
    wait_state(api, job, "running")
    state = json.loads((home / "jobs" / str(job) / "attempt-1" / "state.json").read_text())
    os.kill(state["supervisor_pid"], signal.SIGKILL)
    view = wait_for(lambda: (v := api.status(job)).attempts == 2 and v, timeout=60)
    assert view.attempt_list[0].end_reason == "infra" and "supervisor" in view.attempt_list[0].detail
    wait_for(lambda: not _alive(state["pid"]))  # the orphaned command was ended too
    api.cancel([job])


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_queue_drains_with_nobody_watching(api: Any) -> None:
    first = submit(api, ["sleep", "0.3"], gpus=2)
    second = submit(api, ["sleep", "0.1"], gpus=2)
    # no status() calls (they would run a pass): only the finishing supervisor can start `second`
    row = wait_for(lambda: (r := api._ledger.one("SELECT state FROM jobs WHERE id=?", (second,)))["state"]
                   == "succeeded" and r, timeout=20)
    assert row and api.status(first, refresh=False).state == "succeeded"


def test_watcher_hears_endings_and_replaces_the_hook(api: Any, home: Path) -> None:
    with api._runtime.watch() as watcher:
        job = submit(api, ["true"])
        assert watcher.wait(10.0), "the supervisor should poke the listening watcher"
        assert not (home / "jobs" / str(job) / "attempt-1" / "on_exit.log").exists()  # no hook process ran
        api._runtime.tick()
        assert api.status(job, refresh=False).state == "succeeded"
    job = submit(api, ["true"])  # nobody listens any more: the supervisor runs the pass itself
    wait_for(lambda: api.status(job, refresh=False).state == "succeeded")


def test_attempt_that_ends_before_the_stop_keeps_its_success(api: Any, home: Path) -> None:
    with api._runtime.watch() as watcher:  # no on-exit pass: the test decides when the pass runs
        job = submit(api, ["true"])
        assert watcher.wait(10.0)
        # a preemption decided just as it finished: the stop arrives too late to matter
        with api._ledger.tx() as c:
            c.execute("UPDATE attempts SET stop_reason='preempted' WHERE job_id=?", (job,))
        api._runtime.tick()
    view = api.status(job, refresh=False)
    assert view.state == "succeeded" and view.attempts == 1 and view.attempt_list[0].end_reason == "exit"


def test_a_job_submitted_from_a_trial_does_not_inherit_its_ids(api: Any, monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    for name, value in (("AUTORESEARCH_JOB_ID", "99"), ("MLFLOW_RUN_ID", "parent-run"),
                        ("AUTORESEARCH_CHECKPOINT_DIR", str(tmp_path)), ("AUTORESEARCH_TRIAL_ID", "7")):
        monkeypatch.setenv(name, value)  # as inside a running trial
    job = submit(api, ["/bin/sh", "-c", 'echo "job=$AUTORESEARCH_JOB_ID run=${MLFLOW_RUN_ID:-none} '
                                         'ckpt=${AUTORESEARCH_CHECKPOINT_DIR:-none} trial=${AUTORESEARCH_TRIAL_ID:-none}"'])
    wait_state(api, job, "succeeded")
    assert f"job={job} run=none ckpt=none trial=none" in api.logs(job).text
