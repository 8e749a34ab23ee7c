"""Bad input on the Slurm backend: refused at submit with Slurm's own words and a hint, nothing recorded."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from autoresearch.api import Api
from autoresearch.backends import LaunchRequest, get_backend
from autoresearch.backends._slurm import SlurmBackend
from autoresearch.errors import BackendError, CapacityError, SpecError
from tests.conftest import wait_state

PY = sys.executable


def _job(**spec: Any) -> dict[str, Any]:
    return {"command": ["true"], "workdir": os.getcwd(), **spec}


def test_more_gpus_than_the_partition_has_is_refused_at_submit(home: Path, slurm: Any) -> None:
    api = Api(home, SlurmBackend(conf=slurm.conf))
    with pytest.raises(CapacityError) as err:
        api.submit(_job(gpus=8))
    assert "partition 'high'" in err.value.message and "gpus 8 (its largest node has 4)" in err.value.message
    assert "priority_partitions" in err.value.hint
    with pytest.raises(CapacityError, match="partition 'low'.*nodes 3 \\(it has 1\\)"):
        api.submit(_job(priority="best-effort", nodes=3))
    assert api.list_jobs().jobs == []


def test_a_partition_slurm_does_not_have_is_refused_and_the_real_ones_listed(home: Path, slurm: Any) -> None:
    api = Api(home, SlurmBackend(conf=slurm.conf, priority_partitions={"best-effort": "scavenger"}))
    with pytest.raises(SpecError, match="Slurm has no partition 'scavenger'.*it has: high, low"):
        api.submit(_job(priority="best-effort"))
    assert api.list_jobs().jobs == []


def test_sbatch_refusal_carries_slurms_message_and_a_hint(home: Path, slurm: Any, tmp_path: Path) -> None:
    backend = SlurmBackend(conf=slurm.conf, sbatch_args=["--constraint=nosuchfeature"])
    request = LaunchRequest(key="refused.1", argv=["true"], env=dict(os.environ), workdir=str(tmp_path),
                            log_path=str(tmp_path / "a.log"), run_dir=str(tmp_path / "a"))
    with pytest.raises(BackendError) as err:
        backend.start(request)
    assert err.value.message.startswith("sbatch refused the job: ") and "feature" in err.value.message.lower()
    assert "job.sbatch" in err.value.hint
    api = Api(home, backend)  # through the runtime: the attempt ends with that text, retried as infra, then fails
    view = wait_state(api, api.submit(_job(max_retries=0)).id, "failed", timeout=30)
    assert "sbatch refused the job" in (view.attempt_list[0].detail or "")


def _dead_conf(slurm: Any, tmp_path: Path) -> str:
    text = Path(slurm.conf).read_text()
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    conf = tmp_path / "slurm.conf"
    conf.write_text(re.sub(r"SlurmctldPort=\d+", f"SlurmctldPort={port}", text))
    return str(conf)


def test_an_engine_that_does_not_answer_names_its_address_and_the_kit(home: Path, slurm: Any, tmp_path: Path) -> None:
    conf = _dead_conf(slurm, tmp_path)
    backend = SlurmBackend(conf=conf, command_timeout=5)
    with pytest.raises(BackendError) as err:
        backend.probe()
    port = re.search(r"SlurmctldPort=(\d+)", Path(conf).read_text()).group(1)  # type: ignore[union-attr]
    assert f":{port}" in err.value.message and "kit.py start" in err.value.hint
    api = Api(home, backend)
    with pytest.raises(BackendError):
        api.submit(_job())
    assert api.list_jobs().jobs == []
    cli = subprocess.run([PY, "-m", "autoresearch.cli", "submit", "--", "true"], capture_output=True, text=True,
                         timeout=60, cwd=tmp_path, env={**os.environ, "PYTHONPATH": os.getcwd(),
                                                        "AUTORESEARCH_BACKEND": "slurm", "SLURM_CONF": conf})
    assert cli.returncode == 1 and "hint:" in cli.stderr and "kit.py start" in cli.stderr, cli.stderr
    assert "Traceback" not in cli.stderr


def test_profile_options_are_checked() -> None:
    with pytest.raises(SpecError, match="unknown containers 'docker'"):
        SlurmBackend(containers="docker")
    with pytest.raises(SpecError, match="one short line"):
        SlurmBackend(partition="gpu\n#SBATCH --uid=0")
    with pytest.raises(SpecError) as err:
        get_backend("slurm", partiton="gpu")
    assert "did you mean 'partition'" in err.value.hint
    with pytest.raises(SpecError, match="command_timeout"):
        SlurmBackend(command_timeout=float("nan"))
    with pytest.raises(SpecError, match="cannot run containers"):
        SlurmBackend().check(type("Spec", (), {"image": "nvcr.io/nvidia/pytorch:24.01"})())


def _request(tmp_path: Path, **kw: Any) -> LaunchRequest:
    return LaunchRequest(key="7.2", argv=["python", "train.py"], env={}, workdir=str(tmp_path),
                         log_path=str(tmp_path / "log"), run_dir=str(tmp_path / "run"), **kw)


def test_the_sbatch_flags_carry_the_request_and_the_profile(tmp_path: Path) -> None:
    backend = SlurmBackend(account="ml", priority_qos={"critical": "urgent"}, gres="gpu:a100")
    flags = backend.flags(_request(tmp_path, gpus=2, cpus=3.5, memory=2048, timeout=90, grace=30, nodes=2,
                                   priority="critical"), "ar-7.2-x")
    for flag in ("--job-name=ar-7.2-x", "--comment=autoresearch-attempt-7.2", f"--output={tmp_path / 'log'}",
                 "--gres=gpu:a100:2", "--cpus-per-task=4", "--mem=2048M", "--time=3", "--nodes=2",
                 "--ntasks-per-node=1", "--requeue", "--signal=B:TERM@30", "--qos=urgent", "--account=ml",
                 f"--chdir={tmp_path}", "--export=ALL"):
        assert flag in flags, flag
    assert not any(f.startswith("--partition") for f in flags)  # critical goes to the cluster's default
    low = backend.flags(_request(tmp_path, priority="best-effort"), "n")
    assert "--partition=low" in low and not any(f.startswith(("--gres", "--time", "--mem")) for f in low)


@pytest.mark.parametrize(("containers", "expected"), [
    ("pyxis", ["srun", "--nodes=1", "--ntasks-per-node=1", "--container-image=img:1"]),
    ("apptainer", ["apptainer", "exec", "--nv", "--pwd"]),
])
def test_images_run_through_pyxis_or_apptainer(tmp_path: Path, containers: str, expected: list[str]) -> None:
    backend = SlurmBackend(containers=containers)
    assert backend.capabilities.containers and not SlurmBackend.capabilities.containers
    argv = backend._container(["python", "train.py"], _request(tmp_path, image="img:1", mounts={"/data": "/scratch/d"}))
    assert argv[:len(expected)] == expected and argv[-2:] == ["python", "train.py"]
    assert ("--container-mounts=/scratch/d:/data" in argv) if containers == "pyxis" else ("/scratch/d:/data" in argv)


@pytest.mark.parametrize("garbage", ['{"state": "running", "exit_code": "0"}', '{"state": "exited", "exit_code": 1e400}',
                                     "[1, 2]", "not json", '{"state": "exited", "signal": true, "detail": 7}'])
def test_a_forged_ending_in_the_run_dir_reads_as_an_ending_never_an_error(tmp_path: Path, garbage: str) -> None:
    (tmp_path / "ending.json").write_text(garbage)
    (tmp_path / "request.json").write_text("{}")
    os.utime(tmp_path / "request.json", (0, 0))  # written long ago, and no Slurm job was ever recorded
    status = SlurmBackend(command_timeout=2).poll(str(tmp_path))  # no Slurm asked: nothing to submit, long gone
    assert status.ended and (status.exit_code is None or isinstance(status.exit_code, int))
    assert status.signal is None or isinstance(status.signal, int)


def test_an_engines_node_words_become_our_node_states() -> None:
    from autoresearch.backends import NodeInfo
    from autoresearch.engine.runtime import engine_node_state

    assert engine_node_state(NodeInfo("n1", state="idle")) == ("healthy", "")
    assert engine_node_state(NodeInfo("n1", state="mixed")) == ("healthy", "")
    assert engine_node_state(NodeInfo("ray-n1", state="alive")) == ("healthy", "")  # Ray's word, not "down"
    assert engine_node_state(NodeInfo("n1", state="drained", reason="bad gpu")) == (
        "cordoned", "the engine says drained: bad gpu")
    assert engine_node_state(NodeInfo("n1", state="draining"))[0] == "cordoned"
    assert engine_node_state(NodeInfo("n1", state="down*", reason="Not responding"))[0] == "down"


def test_the_stop_backstop_waits_for_the_jobs_own_grace_period(slurm: Any, tmp_path: Path) -> None:
    import json
    import time

    from tests.conftest import wait_for

    backend = SlurmBackend(conf=slurm.conf)
    ready = tmp_path / "ready"  # (the program ignores SIGTERM from here on: a stop before that would end it)
    ignores_term = ("import pathlib, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                    "pathlib.Path(sys.argv[1]).write_text('x'); time.sleep(120)")
    request = LaunchRequest(key="grace.1", argv=[PY, "-c", ignores_term, str(ready)], env=dict(os.environ),
                            workdir=str(tmp_path), log_path=str(tmp_path / "a.log"), run_dir=str(tmp_path / "a"),
                            grace=120.0)
    ext = backend.start(request)
    wait_for(lambda: backend.poll(ext).state == "running" and ready.exists(), timeout=60)
    # A stop asked 40 s ago without a grace of its own: the job's 120 s still run, no hard scancel yet.
    (tmp_path / "a" / "stop.json").write_text(json.dumps({"requested_at": time.time() - 40}))
    assert backend.poll(ext).state == "running"
    job_id = (tmp_path / "a" / "slurm_job_id").read_text()
    time.sleep(1.5)
    assert "RUNNING" in slurm.run("squeue", "-h", "-j", job_id, "-o", "%T")


def test_a_stop_before_wrap_py_has_started_is_graceful_and_keeps_the_programs_exit(slurm: Any, tmp_path: Path) -> None:
    """The fast start runs the program before wrap.py's Python has started (and written state.json):
    a stop in that window is still a graceful one (SIGTERM, then the grace), and its ending is
    wrap.py's record (the program's own exit 0 from its handler), not Slurm's CANCELLED read as a kill.
    (Seen under CI's load: the conformance suite's graceful program ended with no exit code.)"""
    import shlex
    import time

    from tests.conftest import wait_for

    slow = tmp_path / "slow-python"  # wrap.py's interpreter, 3 s late: the window, every time
    slow.write_text(f"#!/bin/sh\nsleep 3\nexec {shlex.quote(PY)} \"$@\"\n")
    slow.chmod(0o755)
    backend = SlurmBackend(conf=slurm.conf, python=str(slow))
    graceful = ("import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *a: (print('got TERM', flush=True), "
                "sys.exit(0)))\nprint('ready', flush=True)\ntime.sleep(60)")
    request = LaunchRequest(key="early.1", argv=[PY, "-c", graceful], env=dict(os.environ), workdir=str(tmp_path),
                            log_path=str(tmp_path / "a.log"), run_dir=str(tmp_path / "a"), grace=5.0)
    ext = backend.start(request)
    wait_for(lambda: b"ready" in backend.read_log(ext), timeout=60)
    assert not (tmp_path / "a" / "state.json").exists()  # wrap.py has not started yet
    backend.stop(ext)
    deadline = time.monotonic() + 60
    while not (status := backend.poll(ext)).ended:
        assert time.monotonic() < deadline, status
        time.sleep(0.1)
    assert status.stopped and status.exit_code == 0 and status.signal is None, status
    assert b"got TERM" in backend.read_log(ext)


def test_a_node_that_cannot_read_the_run_dir_fails_the_attempt_never_fakes_a_success(slurm: Any, tmp_path: Path) -> None:
    from tests.conftest import wait_for

    backend = SlurmBackend(conf=slurm.conf, sbatch_args=["--hold"])  # held until the run dir is "unshared"
    request = LaunchRequest(key="unshared.1", argv=["/bin/sh", "-c", "sleep 2; echo ran"], env=dict(os.environ),
                            workdir=str(tmp_path), log_path=str(tmp_path / "a.log"), run_dir=str(tmp_path / "a"))
    ext = backend.start(request)
    (tmp_path / "a" / "request.json").write_text("{}")  # what a node without the shared filesystem would see
    (tmp_path / "a" / "run.sh").unlink()  # (nor this: the program is started from it)
    slurm.run("scontrol", "release", (tmp_path / "a" / "slurm_job_id").read_text())
    status = wait_for(lambda: (s := backend.poll(ext)).ended and s, timeout=60)
    assert status.state == "lost" and "ran" not in (tmp_path / "a.log").read_text()
    assert "cannot read" in (tmp_path / "a.log").read_text()


def test_a_fresh_processs_first_submit_asks_slurm_three_things(home: Path, slurm: Any, tmp_path: Path) -> None:
    """Is slurmctld up, what partitions and nodes it has (one sinfo for both), sbatch: nothing more
    on the path of a CLI's submit (each call is a client's start: 20-60 ms here)."""
    backend = SlurmBackend(conf=slurm.conf)
    asked: list[str] = []
    run = backend.cli.run

    def recorded(argv: list[str], *args: Any, **kwargs: Any) -> str:
        asked.append(" ".join(argv[:2]))
        return run(argv, *args, **kwargs)

    backend.cli.run = recorded  # type: ignore[method-assign]
    Api(home, backend).submit({"command": "true", "shell": True, "workdir": str(tmp_path)})
    assert [a.split()[0] for a in asked] == ["scontrol", "sinfo", "sbatch"], asked
    assert backend.nodes() and [a.split()[0] for a in asked].count("sinfo") == 1  # the pass's nodes: the same answer


def test_our_cancel_of_a_job_that_ran_waits_for_wrap_pys_record(tmp_path: Path) -> None:
    """Slurm says CANCELLED (our stop's scancel) before wrap.py, signalled too, has written how the
    program ended: that is read as still ending, for Slurm's KillWait at the most, never as a kill
    of its own making; a job cancelled in the queue (no batch host) ends at once."""
    import json
    import time

    from autoresearch.backends._base import AttemptStatus
    from autoresearch.backends._slurm import STOP_BACKSTOP_S

    backend = SlurmBackend(command_timeout=2)
    run_dir = tmp_path / "a"
    run_dir.mkdir()
    (run_dir / "stop.json").write_text(json.dumps({"requested_at": time.time()}))
    unknown = AttemptStatus("starting")
    ran = {"job_state": "CANCELLED", "batch_host": "vm", "nodes": "vm", "end_time": int(time.time())}
    assert backend._judge(str(run_dir), 7, ran, None, unknown).state == "running"
    (run_dir / "exit.json").write_text(json.dumps({"exit_code": 0, "signal": None, "stopped": True}))
    done = backend._judge(str(run_dir), 7, ran, None, unknown)
    assert (done.state, done.exit_code, done.stopped) == ("exited", 0, True)
    other = tmp_path / "b"
    other.mkdir()
    (other / "stop.json").write_text(json.dumps({"requested_at": time.time()}))
    late = {**ran, "end_time": {"set": True, "number": int(time.time() - STOP_BACKSTOP_S - 1)}}
    gone = backend._judge(str(other), 8, late, None, unknown)
    assert (gone.state, gone.signal, gone.stopped) == ("exited", 9, True)
    queued_dir = tmp_path / "c"
    queued_dir.mkdir()
    (queued_dir / "stop.json").write_text(json.dumps({"requested_at": time.time()}))
    queued = backend._judge(str(queued_dir), 9, {**ran, "batch_host": "", "nodes": ""}, None, unknown)
    assert (queued.state, queued.stopped) == ("exited", True)
