"""The databricks backend through Databricks' SDK, against a local fake of the REST endpoints
(tests/fakes/databricks_api.py) that decodes every payload with the SDK's own types and runs each
run's script as a real local process."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("databricks.sdk", reason="databricks-sdk is not installed (pip install -e '.[test]')")

from autoresearch.api import Api  # noqa: E402
from autoresearch.backends import Backend, LaunchRequest, get_backend  # noqa: E402
from autoresearch.backends.databricks import PRIORITY_CLASSES, DatabricksBackend  # noqa: E402
from autoresearch.engine.spec import PRIORITIES  # noqa: E402
from autoresearch.errors import AuthError, BackendError, SpecError  # noqa: E402
from autoresearch.testing.backends import BackendConformance  # noqa: E402
from tests.conftest import wait_for, wait_state  # noqa: E402
from tests.fakes.databricks_api import FakeDatabricks  # noqa: E402


@pytest.fixture
def dbx(tmp_path: Path) -> Iterator[FakeDatabricks]:
    with FakeDatabricks(tmp_path / "workspace") as server:
        yield server


def _backend(dbx: FakeDatabricks, tmp_path: Path, **options: Any) -> DatabricksBackend:
    backend = get_backend("databricks", **{"host": dbx.url, "token": dbx.token, "state_dir": str(tmp_path / "state"),
                                           "timeout": 10, **options})
    assert isinstance(backend, DatabricksBackend)
    return backend


def _request(tmp_path: Path, key: str = "3.1", argv: list[str] | None = None, **kw: Any) -> LaunchRequest:
    return LaunchRequest(key=key, argv=argv or ["/bin/sh", "-c", "echo hi"], env={"AUTORESEARCH_HOME": "/h", "A": "x y"},
                         workdir=str(tmp_path), log_path=str(tmp_path / "a.log"), run_dir=str(tmp_path / f"run-{key}"),
                         **kw)


class TestDatabricksBackend(BackendConformance):
    @pytest.fixture
    def backend(self, dbx: FakeDatabricks, tmp_path: Path) -> Backend:
        return _backend(dbx, tmp_path)

    def fresh(self, backend: Backend) -> Backend:
        assert isinstance(backend, DatabricksBackend)
        return DatabricksBackend(host=backend.host, token=backend.token, state_dir=str(backend.state_dir))

    def test_env_and_workdir(self, backend: Backend, launch: Any, tmp_path: Path) -> None:
        # No shared filesystem: the node runs in a copy of the workdir shipped with the run, not at its path.
        from autoresearch.backends.fake import Script

        (tmp_path / "shipped.txt").write_text("the code\n")
        ext, _ = launch(["/bin/sh", "-c", 'echo "$CONFORMANCE_VAR $(cat shipped.txt) $(pwd)"'], Script(exit_code=0),
                        env={"CONFORMANCE_VAR": "hello"})
        self.wait_end(backend, ext)
        said = backend.read_log(ext).decode()
        assert said.startswith("hello the code /") and f" {tmp_path}\n" not in said


def _wait(backend: DatabricksBackend, run: str) -> Any:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status = backend.poll(run)
        if status.ended:
            return status
        time.sleep(0.1)
    raise AssertionError("did not end")


def test_the_request_is_the_sdks_ai_runtime_task_and_the_code_is_shipped(dbx: FakeDatabricks, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('trained')\n")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "big").write_bytes(b"x" * 100)
    backend = _backend(dbx, tmp_path, accelerator_type="GPU_8xH100", pool_id="pool-7", experiment="/Shared/sweeps")
    request = _request(tmp_path, argv=[sys.executable, "train.py"], gpus=8, nodes=2, priority="best-effort",
                       timeout=600, grace=30, image="main.ml.trainer:v3",
                       mounts={"/data": "uc:/Volumes/main/ml/datasets/imagenet"})
    run = backend.start(request)
    (submit,) = dbx.submits()
    assert submit["idempotency_token"].endswith("-3.1") and submit["run_name"] == "autoresearch 3.1"
    (task,) = submit["tasks"]
    air = task["ai_runtime_task"]
    assert task["max_retries"] == 0 and air["experiment"] == "/Shared/sweeps"
    assert air["priority_class"] == "BEST_EFFORT" and air["unity_catalog_image_path"] == "main.ml.trainer:v3"
    (deployment,) = air["deployments"]
    assert deployment["compute"] == {"accelerator_type": "GPU_8xH100", "accelerator_count": 16,
                                     "provisioned_capacity_id": "pool-7"}
    assert deployment["command_path"].startswith("/Users/me@example.com/.autoresearch/")  # the caller's own folder
    script = dbx.file(deployment["command_path"]).read_text()
    assert "export A='x y'" in script and "ln -sfn /Volumes/main/ml/datasets/imagenet /data" in script
    assert f"timeout -s TERM -k 30 600 {sys.executable} train.py" in script
    assert f"cd {tmp_path}" not in script and str(tmp_path) not in script.split("tar -xzf")[0].split("code=")[-1]
    archives = list(dbx.root.rglob("*.tar.gz"))
    assert len(archives) == 1
    import tarfile

    with tarfile.open(archives[0]) as tar:
        assert "train.py" in tar.getnames() and not any(n.startswith(".git") for n in tar.getnames())
    assert "trained" in wait_for(lambda: backend.read_log(run) if _wait(backend, run) else b"").decode()


def test_priority_classes_are_the_sdks_and_need_a_pool(dbx: FakeDatabricks, tmp_path: Path) -> None:
    assert set(PRIORITY_CLASSES) == set(PRIORITIES)
    task = _backend(dbx, tmp_path).task(_request(tmp_path, priority="critical"), "/s.sh")
    assert "priority_class" not in task["ai_runtime_task"]
    # Before: critical mapped to CRITICAL, which the SDK's AiRuntimeTaskPriorityClass does not have.
    pooled = _backend(dbx, tmp_path, pool_id="p").task(_request(tmp_path, priority="critical"), "/s.sh")
    assert pooled["ai_runtime_task"]["priority_class"] == "NORMAL"
    with pytest.raises(SpecError, match="BEST_EFFORT"):
        DatabricksBackend(priority_classes={"critical": "CRITICAL"})


@pytest.mark.parametrize(("kind", "gpus", "nodes", "count"), [
    ("GPU_8xH100", 8, 2, 16), ("GPU_8xH100", 1, 1, 8), ("GPU_8xH100", 0, 3, 24), ("GPU_1xA10", 1, 4, 4)])
def test_the_accelerator_count_is_whole_nodes_of_the_type(dbx: FakeDatabricks, tmp_path: Path, kind: str, gpus: int,
                                                          nodes: int, count: int) -> None:
    task = _backend(dbx, tmp_path, accelerator_type=kind).task(_request(tmp_path, gpus=gpus, nodes=nodes), "/s.sh")
    assert task["ai_runtime_task"]["deployments"][0]["compute"]["accelerator_count"] == count


def test_more_gpus_per_node_than_the_type_has_is_refused_at_submit_with_a_hint(dbx: FakeDatabricks, home: Path,
                                                                              tmp_path: Path) -> None:
    # Before: num_accelerators = gpus x nodes = 16 on GPU_8xH100 (two nodes of 8, not 16 per node).
    api = Api(backend=_backend(dbx, tmp_path, accelerator_type="GPU_8xH100"))
    with pytest.raises(SpecError) as err:
        api.submit({"command": ["true"], "workdir": str(tmp_path), "gpus": 16})
    assert "16 GPUs per node" in err.value.message and "GPU_8xH100 has 8" in err.value.message
    assert "nodes: 2 with gpus: 8" in err.value.hint
    assert api.list_jobs().jobs == [] and dbx.submits() == []


def test_an_accelerator_type_the_sdk_does_not_know_is_refused(dbx: FakeDatabricks, tmp_path: Path) -> None:
    with pytest.raises(SpecError) as err:
        _backend(dbx, tmp_path, accelerator_type="GPU_8xH200").start(_request(tmp_path))
    assert "GPU_8xH100" in err.value.hint and dbx.submits() == []


def test_the_same_key_submits_once_even_from_another_process(dbx: FakeDatabricks, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    request = _request(tmp_path, argv=["/bin/sh", "-c", f"echo x >> {marker}"])
    first = _backend(dbx, tmp_path).start(request)
    (Path(request.run_dir) / "databricks.json").unlink()  # nothing on this side remembers the run id…
    second = _backend(dbx, tmp_path / "other").start(request)  # …yet the idempotency token finds the run
    assert first == second
    status = _wait(_backend(dbx, tmp_path), first)
    assert status.exit_code == 0 and marker.read_text() == "x\n"
    assert len(dbx.runs) == 1


KILLED_AFTER_SUBMIT = textwrap.dedent("""\
    import os, sys
    from autoresearch.api import Api
    from autoresearch.backends.databricks import DatabricksBackend
    from autoresearch.store.jobstore import JobStore

    JobStore.set_external_id = lambda *a, **k: os._exit(9)  # dies after the submit, before the ledger has the id
    Api(backend=DatabricksBackend(host=sys.argv[1], token=sys.argv[2])).submit(
        {"command": [sys.executable, "-c", "print('loss: 0.5')"], "workdir": sys.argv[3]})
""")


def test_a_submitter_killed_after_the_submit_is_adopted_not_rerun(dbx: FakeDatabricks, home: Path,
                                                                  tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", KILLED_AFTER_SUBMIT, dbx.url, dbx.token, str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 9, done.stderr
    # The worst case: the run id never reached the pointer either (killed inside the submit's answer).
    (pointer,) = list(home.glob("jobs/1/attempt-1/databricks.json"))
    pointer.write_text(json.dumps({k: v for k, v in json.loads(pointer.read_text()).items() if k != "run_id"}))
    api = Api(backend=DatabricksBackend(host=dbx.url, token=dbx.token))
    api._runtime.tick()
    view = wait_state(api, 1, "succeeded", timeout=60)
    assert view.attempts == 1 and len(dbx.runs) == 1
    assert "loss: 0.5" in api.logs(1).text and api.metrics(1)


def test_no_sdk_or_no_login_is_said_with_how_to_fix_it(dbx: FakeDatabricks, home: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(AuthError) as err:
        _backend(dbx, tmp_path, token="expired").start(_request(tmp_path))
    assert "Invalid access token" in err.value.message and "databricks auth login" in err.value.hint
    dbx.forbid = True
    with pytest.raises(AuthError):
        _backend(dbx, tmp_path).probe()
    monkeypatch.setitem(sys.modules, "databricks.sdk.service", None)  # as if databricks-sdk were not installed
    with pytest.raises(SpecError) as err:  # (the setup's to fix, as every missing extra: tests/backends/test_extras.py)
        Api(backend=_backend(dbx, tmp_path)).submit({"command": ["true"], "workdir": str(tmp_path)})
    assert "databricks-sdk" in err.value.message and "autoresearch[databricks]" in err.value.hint


def test_a_workdir_too_big_for_the_workspace_names_code_volume(dbx: FakeDatabricks, tmp_path: Path) -> None:
    import os

    (tmp_path / "weights.bin").write_bytes(os.urandom(11 << 20))
    with pytest.raises(SpecError) as err:
        _backend(dbx, tmp_path).start(_request(tmp_path))
    assert "more than 10 MB" in err.value.message and "code_volume" in err.value.hint


def test_a_workdir_link_is_shipped_as_a_link_never_followed(dbx: FakeDatabricks, tmp_path: Path) -> None:
    (tmp_path / "secret-elsewhere").symlink_to("/etc/passwd")
    backend = _backend(dbx, tmp_path)
    run = backend.start(_request(tmp_path, argv=["/bin/sh", "-c", "ls -l secret-elsewhere | cut -c1"]))
    assert _wait(backend, run).exit_code == 0
    import tarfile

    with tarfile.open(next(dbx.root.rglob("*.tar.gz"))) as tar:
        assert tar.getmember("secret-elsewhere").issym()
    assert backend.read_log(run) == b"l\n"


@pytest.mark.parametrize("request_kw", [{"image": "docker.io/library/pytorch latest"}, {"mounts": {"/d": "/etc"}},
                                        {"mounts": {"/d": "uc:/Volumes/a/b"}}, {"mounts": {"rel": "uc:/Volumes/a/b/c"}},
                                        {"mounts": {"/d": "uc:/Volumes/a/b/c/../../x"}}])
def test_bad_images_and_mounts_are_refused(dbx: FakeDatabricks, tmp_path: Path, request_kw: dict[str, Any]) -> None:
    with pytest.raises(SpecError):
        _backend(dbx, tmp_path).start(_request(tmp_path, **request_kw))
    assert dbx.submits() == []


@pytest.mark.parametrize("options", [{"accelerator_type": "H100"}, {"timeout": -1}, {"timeout": True},
                                     {"pool_id": 3}, {"workspace_dir": "relative"}, {"workspace_dir": "/a/../b"},
                                     {"code_volume": "/tmp/x"}, {"host": "a\nb"},
                                     {"priority_classes": {"critical": "URGENT"}}, {"priority_classes": {"x": "NORMAL"}}])
def test_bad_options_are_refused(options: dict[str, Any]) -> None:
    with pytest.raises(SpecError):
        DatabricksBackend(**options)


def test_garbage_run_ids_never_reach_the_api(dbx: FakeDatabricks, tmp_path: Path) -> None:
    for bad in ("", "; rm -rf /", "a b", "x" * 200, "--profile", "12a"):
        with pytest.raises(BackendError):
            _backend(dbx, tmp_path).poll(bad)
    assert dbx.requests == []


def test_a_job_databricks_cannot_run_is_refused_at_submit(dbx: FakeDatabricks, home: Path, tmp_path: Path) -> None:
    api = Api(backend=_backend(dbx, tmp_path))
    for spec, words in (({"image": "nvcr.io/nvidia/pytorch:24.05 py3"}, "Unity Catalog image"),
                        ({"mounts": {"/d": "pvc:claim"}}, "Unity Catalog volume")):
        with pytest.raises(SpecError) as err:
            api.submit({"command": ["true"], "workdir": str(tmp_path), **spec})
        assert words in err.value.render()
    assert dbx.requests == [] and api.list_jobs().jobs == []


def test_an_unknown_state_is_never_taken_for_an_ending() -> None:
    from autoresearch.backends.databricks import _answer, _interpret

    assert _interpret({"state": "WARMING_UP_GPUS"}, None).state == "running"
    assert _interpret({"state": {"life_cycle_state": "TERMINATED", "result_state": "SUCCESS"}}, None).exit_code == 0
    assert _interpret({"status": "FAILED"}, None).exit_code == 1
    failed = _interpret({"state": "FAILED", "exit_code": 137}, 60)
    assert failed.timed_out and failed.signal == 9  # `timeout -k` killed it after the grace
    # Before: TERMINATING and CANCELING were taken for the ending, while the command still ran.
    assert not _interpret({"state": "TERMINATING"}, None).ended
    assert not _interpret(_answer({"status": {"state": "TERMINATING"}}), None).ended
    cancelled = _interpret({"state": "CANCELED"}, None)
    assert cancelled.stopped and cancelled.signal == 15
    assert _interpret({"state": "PREEMPTED", "state_message": "pool reclaimed"}, None).state == "lost"
    assert _interpret({"state": 7, "exit_code": True}, None).state == "starting"  # garbage: not an ending
    lost = _answer({"status": {"state": "TERMINATED", "termination_details": {"code": "X", "type": "CLOUD_FAILURE"}}})
    assert _interpret(lost, None).state == "lost"
    assert _interpret(_answer({"status": {"state": "QUEUED"}}), None).state == "starting"


def test_exit_codes_come_from_the_scripts_last_line_and_leave_the_log(dbx: FakeDatabricks, tmp_path: Path) -> None:
    backend = _backend(dbx, tmp_path)
    run = backend.start(_request(tmp_path, argv=["/bin/sh", "-c", "echo autoresearch-exit: 0; echo out; exit 5"]))
    assert _wait(backend, run).exit_code == 5
    assert backend.read_log(run) == b"autoresearch-exit: 0\nout\n"  # a line the job prints itself stays


def test_release_cancels_a_run_the_ledger_never_saw_end(dbx: FakeDatabricks, tmp_path: Path) -> None:
    backend = _backend(dbx, tmp_path)
    request = _request(tmp_path, argv=["/bin/sh", "-c", "sleep 60"])
    run = backend.start(request)
    backend.release(request.run_dir)
    status = _wait(backend, run)
    assert status.stopped


def test_code_goes_to_a_volume_with_code_volume_and_each_content_once(dbx: FakeDatabricks, tmp_path: Path) -> None:
    code = tmp_path / "code"  # nothing else in it: the same content for both attempts
    code.mkdir()
    (code / "t.py").write_text("print('from the volume')\n")
    backend = _backend(dbx, tmp_path, code_volume="/Volumes/main/ml/code")
    runs = [backend.start(LaunchRequest(key=f"4.{i}", argv=[sys.executable, "t.py"], env={}, workdir=str(code),
                                        log_path="", run_dir=str(tmp_path / f"run-{i}"))) for i in (1, 2)]
    assert [_wait(backend, run).exit_code for run in runs] == [0, 0]
    assert backend.read_log(runs[1]) == b"from the volume\n"
    puts = [p for m, p, _ in dbx.requests if m == "PUT"]
    assert len(puts) == 1 and puts[0].startswith("/api/2.0/fs/files/Volumes/main/ml/code/autoresearch-code/")
    (script,) = {dbx.file(s["tasks"][0]["ai_runtime_task"]["deployments"][0]["command_path"]).read_text().split(
        "code=")[1].split("\n")[0] for s in dbx.submits()}
    assert '"${AUTORESEARCH_DATABRICKS_ROOT:-}"/Volumes/main/ml/code/autoresearch-code/' in script


def test_the_same_workdir_is_the_same_archive_at_any_second(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The archive names itself by its content: gzip's header time must not make two archives of one
    workdir differ (two attempts started a second apart uploaded the same code twice)."""
    from autoresearch.backends import databricks

    (tmp_path / "t.py").write_text("print('x')\n")
    first = databricks._archive(str(tmp_path), 1 << 20)
    monkeypatch.setattr(time, "time", lambda: 2_000_000_000.0)  # another second (gzip stamps time.time())
    assert databricks._archive(str(tmp_path), 1 << 20) == first
