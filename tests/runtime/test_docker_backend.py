"""The Docker backend passes the shared backend contract against a fake ``docker`` CLI
(tests/fakes/bin/docker: real processes, recorded command lines); no engine runs here."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from autoresearch.backends import Backend, LaunchRequest, get_backend
from autoresearch.backends._docker import DockerBackend, bind_mount
from autoresearch.errors import BackendError, SpecError
from autoresearch.testing.backends import BackendConformance

FAKES = Path(__file__).resolve().parents[1] / "fakes" / "bin"


@pytest.fixture
def fake_docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    state = tmp_path / "engine"
    state.mkdir()
    monkeypatch.setenv("FAKE_DOCKER_DIR", str(state))
    monkeypatch.setenv("PATH", f"{FAKES}{os.pathsep}{os.environ['PATH']}")
    return state


def calls(state: Path, verb: str | None = None) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (state / "calls.jsonl").read_text().splitlines()]
    return [r for r in rows if verb is None or r["argv"][0] == verb]


class TestDockerBackend(BackendConformance):
    @pytest.fixture
    def backend(self, home: object, fake_docker: Path) -> Backend:
        return get_backend("docker", image="python:3.11-slim")

    def fresh(self, backend: Backend) -> Backend:
        return DockerBackend()


def request(tmp_path: Path, **kw: Any) -> LaunchRequest:
    job_dir = tmp_path / "jobs" / "7"
    defaults: dict[str, Any] = dict(
        key="7.1", argv=[sys.executable, "-c", "print('hi')"], env={**os.environ, "LR": "0.1", "API_TOKEN": "s3cret",
                                                                    "AUTORESEARCH_METRICS_FILE": str(job_dir / "m.jsonl")},
        workdir=str(tmp_path), log_path=str(job_dir / "attempt-1.log"), run_dir=str(job_dir / "attempt-1"),
        gpu_ids=("0", "1"), image="pytorch/pytorch:2.3", mounts={"/data": str(tmp_path)})
    return LaunchRequest(**{**defaults, **kw})


def wait_end(backend: Backend, ext: str) -> Any:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status = backend.poll(ext)
        if status.ended:
            return status
        time.sleep(0.05)
    raise AssertionError("never ended")


def test_docker_run_names_the_key_the_gpus_mounts_workdir_and_keeps_values_off_the_command_line(
        home: Path, fake_docker: Path, tmp_path: Path) -> None:
    backend = DockerBackend(user="1000:1000")
    req = request(tmp_path)
    ext = backend.start(req)
    assert wait_end(backend, ext).exit_code == 0
    run = calls(fake_docker, "run")
    assert len(run) == 1
    argv = run[0]["argv"]
    name = argv[argv.index("--name") + 1]
    assert name.startswith("ar-7.1-")
    assert "autoresearch.key=7.1" in argv and argv[argv.index("--gpus") + 1] == '"device=0,1"'
    assert bind_mount(str(tmp_path), "/data") in argv  # a spec mount
    assert bind_mount(str(tmp_path / "jobs" / "7"), str(tmp_path / "jobs" / "7")) in argv  # the metrics file and log's folder
    assert argv[argv.index("-w") + 1] == str(tmp_path) and argv[argv.index("--user") + 1] == "1000:1000"
    assert argv[-4:] == ["pytorch/pytorch:2.3", sys.executable, "-c", "print('hi')"]
    assert "--cpus" not in argv and "--memory" not in argv  # nothing reserved: no limit
    assert "s3cret" not in " ".join(argv)  # -e NAME only: the value travels in the CLI's environment
    assert run[0]["env"]["API_TOKEN"] == "s3cret" and run[0]["env"]["LR"] == "0.1"
    assert "PATH" not in run[0]["env"] and "HOME" not in run[0]["env"]  # the host's own variables stay out
    # The ended container's whole log (`docker logs`) replaces the streamed copy; a `docker logs` that
    # failed (a CLI past its timeout on a loaded machine) leaves the streamed copy, tried again next read.
    deadline = time.monotonic() + 30
    while backend.read_log(ext) != b"hi\n" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert backend.read_log(ext) == b"hi\n"


def test_reserved_cpus_and_memory_become_the_containers_limits(home: Path, fake_docker: Path, tmp_path: Path) -> None:
    backend = DockerBackend()
    assert wait_end(backend, backend.start(request(tmp_path, cpus=2.5, memory=16384))).exit_code == 0
    argv = calls(fake_docker, "run")[0]["argv"]
    assert argv[argv.index("--cpus") + 1] == "2.5" and argv[argv.index("--memory") + 1] == "16384m"


def test_a_restart_between_docker_run_and_the_ledger_write_adopts_the_container(
        home: Path, fake_docker: Path, tmp_path: Path) -> None:
    backend = DockerBackend()
    req = request(tmp_path, argv=["/bin/sh", "-c", "echo once"])
    ext = backend.start(req)
    wait_end(backend, ext)
    os.remove(os.path.join(req.run_dir, "request.json"))  # the run dir's record is gone; the container is not
    assert DockerBackend().start(req) == ext
    assert len(calls(fake_docker, "run")) <= 2  # (a second `docker run` is refused: the name is taken)
    assert any("label=autoresearch.key=7.1" in c["argv"] for c in calls(fake_docker, "ps"))
    assert wait_end(DockerBackend(), ext).exit_code == 0 and DockerBackend().read_log(ext) == b"once\n"


def test_a_first_start_asks_docker_nothing_before_docker_run(home: Path, fake_docker: Path, tmp_path: Path) -> None:
    backend = DockerBackend()
    wait_end(backend, backend.start(request(tmp_path)))
    first = [c["argv"][0] for c in calls(fake_docker)][:1]
    assert first == ["run"] and not calls(fake_docker, "ps")


def test_stop_uses_docker_stop_with_the_grace_and_release_removes_the_container(
        home: Path, fake_docker: Path, tmp_path: Path) -> None:
    backend = DockerBackend()
    ext = backend.start(request(tmp_path, argv=["sleep", "30"], grace=2.5))
    backend.stop(ext)
    status = wait_end(backend, ext)
    assert status.stopped and status.signal == 15  # sleep dies of the SIGTERM: docker says 143
    assert calls(fake_docker, "stop")[0]["argv"][1:3] == ["-t", "3"]
    backend.release(ext)
    assert calls(fake_docker, "rm") and backend.poll(ext) == status  # the ending outlives the container


def test_an_image_is_required_and_local_refuses_one_naming_docker(home: Path, fake_docker: Path) -> None:
    from autoresearch.engine.spec import make_spec

    with pytest.raises(SpecError, match="names no image"):
        DockerBackend().check(make_spec({"command": ["true"]}))
    DockerBackend(image="python:3.11").check(make_spec({"command": ["true"]}))
    with pytest.raises(SpecError) as err:
        get_backend("local").check(make_spec({"command": ["true"], "image": "python:3.11"}))
    assert "docker" in err.value.hint


def test_probe_says_where_the_engine_is_and_how_to_start_it(home: Path, fake_docker: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    DockerBackend().probe()
    monkeypatch.setenv("FAKE_DOCKER_DOWN", "1")
    with pytest.raises(BackendError) as err:
        DockerBackend(host="tcp://10.0.0.9:2375").probe()
    assert "tcp://10.0.0.9:2375" in err.value.message and "start it" in err.value.hint
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(BackendError, match="not installed"):
        DockerBackend().probe()


@pytest.mark.parametrize("options", [{"gpus": -1}, {"gpus": "2"}, {"pull": "sometimes"}, {"run_args": "--rm"},
                                     {"timeout": float("nan")}, {"image": "a\nb"}, {"docker": 3}])
def test_bad_options_are_refused_with_a_hint(options: dict[str, Any]) -> None:
    with pytest.raises(SpecError) as err:
        DockerBackend(**options)
    assert err.value.hint


def test_a_docker_profile_runs_a_job_end_to_end_through_the_cli(home: Path, fake_docker: Path,
                                                                tmp_path: Path) -> None:
    from tests.conftest import wait_for
    from tests.runtime.test_cli import cli

    home.mkdir(parents=True, exist_ok=True)
    (home / "config.yaml").write_text("backends:\n  box: {kind: docker, image: 'python:3.11-slim', gpus: 2}\n")
    data = tmp_path / "data"
    data.mkdir()
    target = f"/ar-test-{os.getpid()}-{time.monotonic_ns()}"  # a path inside the container, none on the host
    job = cli("submit", "--backend", "box", "--gpus", "1", "--mount", f"{target}={data}", "--env", "LR=0.1", "--",
              sys.executable, "-c", "import os; print('loss: 0.5'); print('lr', os.environ['LR'])").stdout.strip()
    from autoresearch.api import Api

    # Reads that run no pass: the container's waiter runs the pass of `box` (on_exit) when it ends.
    wait_for(lambda: Api(home).status(job, refresh=False).state == "succeeded", timeout=60)  # type: ignore[union-attr]
    view = json.loads(cli("status", job, "--json").stdout)
    assert view["attempt_list"][0]["node"].startswith("docker@")
    assert "lr 0.1" in cli("logs", job).stdout
    assert json.loads(cli("metrics", job, "--json").stdout)[0]["last"] == 0.5
    argv = calls(fake_docker, "run")[0]["argv"]
    assert bind_mount(str(data), target) in argv and not os.path.lexists(target)  # a bind mount, no link on the host
    assert argv[argv.index("--gpus") + 1] == '"device=0"'
    wait_for(lambda: calls(fake_docker, "rm"))  # released once the ledger recorded the ending


def test_a_relative_mount_target_is_refused_for_containers(home: Path, fake_docker: Path, tmp_path: Path) -> None:
    from tests.runtime.test_cli import cli

    home.mkdir(parents=True, exist_ok=True)
    (home / "config.yaml").write_text("backends:\n  box: {kind: docker, image: 'python:3.11-slim'}\n")
    proc = cli("submit", "--backend", "box", "--mount", f"data={tmp_path}", "--", "true", check=False)
    assert proc.returncode == 2 and "absolute path inside the container" in proc.stderr


@pytest.mark.parametrize("image", ["--privileged", "-v/:/host", "python 3", "a\nb", "x" * 600])
def test_an_image_that_is_not_a_reference_is_refused(image: str, home: Path, fake_docker: Path,
                                                     tmp_path: Path) -> None:
    from autoresearch.engine.spec import JobSpec

    with pytest.raises(SpecError):
        DockerBackend(image="python:3.11").check(JobSpec.model_construct(command=["true"], image=image))
    with pytest.raises(BackendError):
        DockerBackend().start(request(tmp_path, image=image))
    assert not (fake_docker / "calls.jsonl").exists() or not calls(fake_docker, "run")


def test_a_submit_through_a_docker_profile_loads_no_openssl(home: Path, fake_docker: Path) -> None:
    """The container's name takes 8 hex of the run dir's SHA-1 from CPython's own _sha1: hashlib loads OpenSSL
    (_hashlib, ~4 ms of every CLI submit's start here) for the same digest. The name is as before (a running
    container is adopted by its name)."""
    import hashlib

    from autoresearch.backends._docker import container_name
    from tests.runtime.test_cli_imports import loaded

    assert container_name("12.1", "/h/jobs/12/1") == f"ar-12.1-{hashlib.sha1(b'/h/jobs/12/1').hexdigest()[:8]}"
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.yaml").write_text("backends:\n  box: {kind: docker, image: 'python:3.11-slim'}\n")
    watch = ("hashlib", "_hashlib")
    assert loaded("submit", "--backend", "box", "--", "true", watch=watch) == []


def test_a_waiter_leaves_once_the_engine_has_been_silent_for_a_while(
        tmp_path: Path, fake_docker: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An engine that stopped answering (stopped with containers still recorded) is not polled forever by
    their waiters: after GIVE_UP_S of failed answers in a row the waiter says so and exits (3), without
    running the ending's hook (nothing ended that it knows of); the passes still poll the engine."""
    import threading

    from autoresearch.backends import _docker_wait
    from autoresearch.backends._docker import REQUEST

    run_dir = tmp_path / "attempt-1"
    run_dir.mkdir()
    hook_ran = tmp_path / "hook-ran"
    (run_dir / REQUEST).write_text(json.dumps({
        "options": {}, "name": "ar-7-1", "log_path": str(tmp_path / "attempt-1.log"), "created_at": time.time() - 60,
        "timeout": None, "wake_fifo": None, "on_exit": [sys.executable, "-c", f"open({str(hook_ran)!r}, 'w')"]}))
    monkeypatch.setenv("FAKE_DOCKER_DOWN", "1")
    monkeypatch.setattr(_docker_wait, "GIVE_UP_S", 1.0, raising=False)
    out: list[int] = []
    waiter = threading.Thread(target=lambda: out.append(_docker_wait.main(str(run_dir))), daemon=True)
    waiter.start()
    waiter.join(timeout=30)
    assert not waiter.is_alive(), "the waiter still polls an engine that stopped answering"
    assert out == [3]
    assert not hook_ran.exists()
