"""The databricks backend against a fake `databricks` CLI that records its command lines and
runs each workload's command as a real local process."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from autoresearch.api import Api
from autoresearch.backends import Backend, LaunchRequest, get_backend
from autoresearch.backends.databricks import PRIORITY_CLASSES, DatabricksBackend
from autoresearch.errors import AuthError, BackendError, SpecError
from autoresearch.spec import PRIORITIES
from autoresearch.testing.backends import BackendConformance
from tests.conftest import wait_for, wait_state

FAKE = Path(__file__).resolve().parent.parent / "fakes" / "databricks_cli.py"
CLI = f"{sys.executable} {FAKE}"


@pytest.fixture
def fake_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "workspace"
    monkeypatch.setenv("FAKE_DATABRICKS_HOME", str(home))
    monkeypatch.setenv("FAKE_DATABRICKS_GRACE", "2")
    return home


def _backend(tmp_path: Path, **options: Any) -> DatabricksBackend:
    backend = get_backend("databricks", **{"cli": CLI, "state_dir": str(tmp_path / "state"), **options})
    assert isinstance(backend, DatabricksBackend)
    return backend


def _calls(fake_home: Path) -> list[list[str]]:
    return [json.loads(line) for line in (fake_home / "calls.jsonl").read_text().splitlines()]


def _request(tmp_path: Path, key: str = "3.1", argv: list[str] | None = None, **kw: Any) -> LaunchRequest:
    return LaunchRequest(key=key, argv=argv or ["/bin/sh", "-c", "echo hi"], env={"AUTORESEARCH_HOME": "/h", "A": "x y"},
                         workdir=str(tmp_path), log_path=str(tmp_path / "a.log"), run_dir=str(tmp_path / f"run-{key}"),
                         **kw)


class TestDatabricksBackend(BackendConformance):
    @pytest.fixture
    def backend(self, fake_home: Path, tmp_path: Path) -> Backend:
        return _backend(tmp_path)

    def fresh(self, backend: Backend) -> Backend:
        assert isinstance(backend, DatabricksBackend)
        return DatabricksBackend(cli=CLI, state_dir=str(backend.state_dir))


def test_workload_yaml_and_the_recorded_command_lines(fake_home: Path, tmp_path: Path) -> None:
    backend = _backend(tmp_path, accelerator_type="GPU_8xH100", pool_id="pool-7", profile="research",
                       experiment="/Shared/sweeps")
    request = _request(tmp_path, gpus=8, nodes=2, priority="best-effort", timeout=600, grace=30,
                       image="main.ml.trainer:v3", mounts={"/data": "uc:/Volumes/main/ml/datasets/imagenet"})
    run = backend.start(request)
    workload = yaml.safe_load((Path(request.run_dir) / "workload.yaml").read_text())
    assert workload["experiment_name"] == "/Shared/sweeps"
    assert workload["compute"] == {"accelerator_type": "GPU_8xH100", "num_accelerators": 16, "pool_id": "pool-7",
                                   "priority_class": "BEST_EFFORT"}
    assert workload["environment"] == {"unity_catalog_image": "main.ml.trainer:v3"}
    assert workload["max_retries"] == 0
    assert "export A='x y'" in workload["command"]
    assert "ln -sfn /Volumes/main/ml/datasets/imagenet /data" in workload["command"]
    assert workload["command"].endswith("exec timeout -s TERM -k 30 600 /bin/sh -c 'echo hi'")
    key = [c for c in _calls(fake_home) if "run" in c][0]
    assert key[:4] == ["--profile", "research", "air", "run"]
    assert key[key.index("--idempotency-key") + 1].endswith("-3.1") and key[-2:] == ["-o", "json"]
    backend.stop(run)  # the cancel is sent detached: stop() never waits on the network
    wait_for(lambda: ["--profile", "research", "air", "cancel", run] in _calls(fake_home))


def test_priority_needs_a_pool(fake_home: Path, tmp_path: Path) -> None:
    assert set(PRIORITY_CLASSES) == set(PRIORITIES)
    workload = _backend(tmp_path).workload(_request(tmp_path, priority="critical"))
    assert "priority_class" not in workload["compute"] and workload["compute"]["num_accelerators"] == 1
    mapped = _backend(tmp_path, pool_id="p", priority_classes={"critical": "NORMAL"}).workload(
        _request(tmp_path, priority="critical"))
    assert mapped["compute"]["priority_class"] == "NORMAL"


def test_the_same_key_submits_once_even_from_another_process(fake_home: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    request = _request(tmp_path, argv=["/bin/sh", "-c", f"echo x >> {marker}"])
    first = _backend(tmp_path).start(request)
    (Path(request.run_dir) / "databricks.json").unlink()  # nothing on this side remembers the run id…
    second = _backend(tmp_path / "other").start(request)  # …yet the idempotency key finds the run
    assert first == second
    status = _wait(_backend(tmp_path), first)
    assert status.exit_code == 0 and marker.read_text() == "x\n"
    assert len(list((fake_home / "runs").iterdir())) == 1


KILLED_AFTER_RUN = textwrap.dedent("""\
    import os, sys
    from autoresearch.api import Api
    from autoresearch.backends.databricks import PRIORITY_CLASSES, DatabricksBackend
    from autoresearch.jobstore import JobStore

    JobStore.set_external_id = lambda *a, **k: os._exit(9)  # dies after `air run`, before the ledger has the id
    Api(backend=DatabricksBackend(cli=sys.argv[1])).submit(
        {"command": [sys.executable, "-c", "print('loss: 0.5')"], "workdir": sys.argv[2]})
""")


def test_a_submitter_killed_after_air_run_is_adopted_not_rerun(fake_home: Path, home: Path, tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", KILLED_AFTER_RUN, CLI, str(tmp_path)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 9, done.stderr
    # The worst case: the run id never reached the pointer either (killed inside `air run`'s answer).
    (pointer,) = list(home.glob("jobs/1/attempt-1/databricks.json"))
    pointer.write_text(json.dumps({k: v for k, v in json.loads(pointer.read_text()).items() if k != "run_id"}))
    api = Api(backend=DatabricksBackend(cli=CLI))
    api._runtime.tick()
    view = wait_state(api, 1, "succeeded", timeout=60)
    assert view.attempts == 1 and len(list((fake_home / "runs").iterdir())) == 1
    assert "loss: 0.5" in api.logs(1).text and api.metrics(1)


def _wait(backend: DatabricksBackend, run: str) -> Any:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status = backend.poll(run)
        if status.ended:
            return status
        time.sleep(0.1)
    raise AssertionError("did not end")


def test_missing_cli_names_it_and_how_to_install(home: Path, tmp_path: Path) -> None:
    with pytest.raises(BackendError) as err:
        _backend(tmp_path, cli="/nonexistent/databricks").probe()
    assert "/nonexistent/databricks" in err.value.message and "install the Databricks CLI" in err.value.hint
    api = Api(backend=_backend(tmp_path, cli="/nonexistent/databricks"))
    with pytest.raises(BackendError) as err:  # at submit, not as attempts that fail one by one
        api.submit({"command": ["true"], "workdir": str(tmp_path)})
    assert "not installed" in err.value.message and api.list_jobs().jobs == []


def test_an_expired_login_is_an_auth_error(fake_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_DATABRICKS_FAIL", "auth")
    with pytest.raises(AuthError) as err:
        _backend(tmp_path).start(_request(tmp_path))
    assert "cannot configure default credentials" in err.value.message and "databricks auth login" in err.value.hint


def test_a_rejected_workload_carries_databricks_message(fake_home: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_DATABRICKS_FAIL", "reject:accelerator_type GPU_8xH200 is not available in this workspace")
    with pytest.raises(BackendError) as err:
        _backend(tmp_path, accelerator_type="GPU_8xH200").start(_request(tmp_path))
    assert "GPU_8xH200 is not available" in err.value.message and "accelerator_type" in err.value.hint


@pytest.mark.parametrize("request_kw", [{"image": "docker.io/pytorch:latest"}, {"mounts": {"/d": "/etc"}},
                                        {"mounts": {"/d": "uc:/Volumes/a/b"}}, {"mounts": {"rel": "uc:/Volumes/a/b/c"}},
                                        {"mounts": {"/d": "uc:/Volumes/a/b/c/../../x"}}])
def test_bad_images_and_mounts_are_refused(fake_home: Path, tmp_path: Path, request_kw: dict[str, Any]) -> None:
    with pytest.raises(SpecError):
        _backend(tmp_path).start(_request(tmp_path, **request_kw))
    assert not (fake_home / "runs").exists()


@pytest.mark.parametrize("options", [{"accelerator_type": "H100"}, {"timeout": -1}, {"cli": ""}, {"timeout": True},
                                     {"pool_id": 3}, {"environment_version": [6]}, {"cli": "'unclosed"},
                                     {"priority_classes": {"critical": "URGENT"}}, {"priority_classes": {"x": "NORMAL"}}])
def test_bad_options_are_refused(options: dict[str, Any]) -> None:
    with pytest.raises(SpecError):
        DatabricksBackend(**options)


def test_garbage_run_ids_never_reach_the_cli(fake_home: Path, tmp_path: Path) -> None:
    for bad in ("", "; rm -rf /", "a b", "x" * 200, "--profile"):
        with pytest.raises(BackendError):
            _backend(tmp_path).poll(bad)
    assert not (fake_home / "calls.jsonl").exists()


def test_a_job_databricks_cannot_run_is_refused_at_submit(fake_home: Path, home: Path, tmp_path: Path) -> None:
    api = Api(backend=_backend(tmp_path))
    for spec, words in (({"image": "nvcr.io/nvidia/pytorch:24.05-py3"}, "Unity Catalog image"),
                        ({"mounts": {"/d": "pvc:claim"}}, "Unity Catalog volume")):
        with pytest.raises(SpecError) as err:
            api.submit({"command": ["true"], "workdir": str(tmp_path), **spec})
        assert words in err.value.render()
    assert not (fake_home / "calls.jsonl").exists() and api.list_jobs().jobs == []


def test_an_unknown_state_is_never_taken_for_an_ending() -> None:
    from autoresearch.backends.databricks import _interpret

    assert _interpret({"state": "WARMING_UP_GPUS"}, None).state == "running"
    assert _interpret({"state": {"life_cycle_state": "TERMINATED", "result_state": "SUCCESS"}}, None).exit_code == 0
    assert _interpret({"status": "FAILED"}, None).exit_code == 1
    failed = _interpret({"state": "FAILED", "exit_code": 137}, 60)
    assert failed.timed_out and failed.signal == 9  # `timeout -k` killed it after the grace
    cancelled = _interpret({"state": "CANCELED"}, None)
    assert cancelled.stopped and cancelled.signal == 15
    assert _interpret({"state": "PREEMPTED", "state_message": "pool reclaimed"}, None).state == "lost"
    assert _interpret({"state": 7, "exit_code": True}, None).state == "starting"  # garbage: not an ending


def test_release_cancels_a_run_the_ledger_never_saw_end(fake_home: Path, tmp_path: Path) -> None:
    backend = _backend(tmp_path)
    request = _request(tmp_path, argv=["/bin/sh", "-c", "sleep 60"])
    run = backend.start(request)
    backend.release(request.run_dir)
    status = _wait(backend, run)
    assert status.stopped
