"""The kubernetes backend's promises beyond the shared contract: at most once per attempt key
(also across a submitter killed between the API's create and the ledger's write), Kueue
labels and priority classes, indexed gang Jobs, the engine's faults, and actionable errors."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from autoresearch.api import Api
from autoresearch.backends import LaunchRequest
from autoresearch.backends._k8s_job import dns_name, job_manifest
from autoresearch.backends.kubernetes import KubernetesBackend
from autoresearch.errors import AuthError, BackendError, SpecError
from tests.conftest import wait_state
from tests.fakes.k8s_api import FakeKubernetes


@pytest.fixture
def k8s(tmp_path: Path):
    with FakeKubernetes(tmp_path / "cluster") as server:
        yield server


def _backend(k8s: FakeKubernetes, tmp_path: Path, **options: Any) -> KubernetesBackend:
    return KubernetesBackend(**{"api": k8s.url, "namespace": "default", "image": "python:3.11",
                                "state_dir": str(tmp_path / "state"), **options})


def _request(tmp_path: Path, key: str = "7.1", argv: list[str] | None = None, **kw: Any) -> LaunchRequest:
    return LaunchRequest(key=key, argv=argv or ["/bin/sh", "-c", "echo hi"], env={"AUTORESEARCH_HOME": "/h"},
                         workdir=str(tmp_path), log_path=str(tmp_path / "a.log"), run_dir=str(tmp_path / f"run-{key}"),
                         **kw)


def _wait(backend: KubernetesBackend, ext: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = backend.poll(ext)
        if status.ended:
            return status
        time.sleep(0.05)
    raise AssertionError(f"{ext} did not end")


# -- at most once ---------------------------------------------------------------------------


def test_the_same_key_from_two_backends_creates_one_job(k8s: FakeKubernetes, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    request = _request(tmp_path, argv=["/bin/sh", "-c", f"echo x >> {marker}"])
    first = _backend(k8s, tmp_path).start(request)
    second = _backend(k8s, tmp_path / "elsewhere").start(request)  # another process, no shared memory
    assert first == second
    assert k8s.creates == 1
    _wait(_backend(k8s, tmp_path), first)
    assert marker.read_text() == "x\n"


def test_a_job_of_that_name_from_another_home_is_not_adopted(k8s: FakeKubernetes, tmp_path: Path) -> None:
    backend = _backend(k8s, tmp_path)
    ext = backend.start(_request(tmp_path))
    name = ext.split("/")[1]
    job = k8s.jobs[("default", name)]
    job["metadata"]["annotations"]["autoresearch.io/attempt-key"] = "somebody-else"
    with pytest.raises(BackendError) as err:
        _backend(k8s, tmp_path / "b").start(_request(tmp_path))
    assert "is not attempt 7.1" in err.value.message and "kubectl -n default delete job" in err.value.hint


KILLED_AFTER_CREATE = textwrap.dedent("""\
    import os, sys
    from autoresearch.api import Api
    from autoresearch.backends.kubernetes import KubernetesBackend
    from autoresearch.store.jobstore import JobStore

    JobStore.set_external_id = lambda *a, **k: os._exit(9)  # dies after the Job exists, before the ledger knows
    backend = KubernetesBackend(api=sys.argv[1], namespace="default")
    Api(backend=backend).submit({"command": [sys.executable, "-c", "print('loss: 0.25')"], "workdir": sys.argv[2],
                                 "image": "python:3.11"})
""")


def test_a_submitter_killed_between_create_and_ledger_write_is_adopted_not_rerun(
        k8s: FakeKubernetes, home: Path, tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", KILLED_AFTER_CREATE, k8s.url, str(tmp_path)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 9, done.stderr
    assert k8s.creates == 1
    api = Api(backend=KubernetesBackend(api=k8s.url, namespace="default"))
    api._runtime.tick()
    view = wait_state(api, 1, "succeeded", timeout=60)
    assert view.attempts == 1 and k8s.creates == 1  # the Job made before the crash is the attempt
    assert "loss: 0.25" in api.logs(1).text
    assert api.metrics(1)  # metrics from the log's name: value lines, read through the pod log API


def test_a_create_whose_answer_was_lost_adopts_the_job_it_made(k8s: FakeKubernetes, home: Path,
                                                                tmp_path: Path) -> None:
    k8s.drop_create_answer = True
    marker = tmp_path / "ran"
    api = Api(backend=_backend(k8s, tmp_path))
    api.submit({"command": ["/bin/sh", "-c", f"echo x >> {marker}"], "workdir": str(tmp_path), "image": "i"})
    view = wait_state(api, 1, "succeeded", timeout=60)
    assert view.attempts == 1 and k8s.creates == 1 and marker.read_text() == "x\n"


def test_an_attempt_ended_as_could_not_start_has_its_job_deleted(k8s: FakeKubernetes, tmp_path: Path) -> None:
    backend = _backend(k8s, tmp_path)
    request = _request(tmp_path, argv=["/bin/sh", "-c", "sleep 60"])
    ext = backend.start(request)
    backend.release(request.run_dir)  # the ledger ended it (the launch raised) and only knows the run dir
    assert tuple(ext.split("/")) not in k8s.jobs
    assert all(p.deleting for p in k8s.pods_of("default", ext.split("/")[1]))


# -- the Job: Kueue, gangs, resources ------------------------------------------------------------


def test_kueue_labels_and_priority_classes(tmp_path: Path) -> None:
    for priority, klass in (("critical", "autoresearch-critical"), ("normal", "autoresearch-normal"),
                            ("best-effort", "autoresearch-best-effort")):
        job = job_manifest(_request(tmp_path, priority=priority, gpus=2, cpus=1.5, memory=4096, timeout=90.2,
                                    grace=7.5, image="img:1"), "ar-x", "own", queue="team-a")
        labels = job["metadata"]["labels"]
        assert labels["kueue.x-k8s.io/queue-name"] == "team-a"
        assert labels["kueue.x-k8s.io/priority-class"] == klass
        assert job["spec"]["template"]["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == klass
        spec, pod = job["spec"], job["spec"]["template"]["spec"]
        assert spec["backoffLimit"] == 0 and spec["activeDeadlineSeconds"] == 91
        assert pod["terminationGracePeriodSeconds"] == 8 and pod["restartPolicy"] == "Never"
        resources = pod["containers"][0]["resources"]
        assert resources["limits"] == {"nvidia.com/gpu": "2", "memory": "4096Mi"}
        assert resources["requests"] == {"cpu": "1500m", "memory": "4096Mi"}
        assert pod["containers"][0]["image"] == "img:1"
    mapped = job_manifest(_request(tmp_path, priority="critical", image="i"), "ar-x", "o", queue="q",
                          priority_classes={"critical": "prod-high"})
    assert mapped["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "prod-high"
    plain = job_manifest(_request(tmp_path, image="i"), "ar-x", "o", queue="")
    assert not any(k.startswith("kueue.x-k8s.io") for k in plain["metadata"]["labels"])


def test_gang_jobs_are_indexed_with_one_pod_per_node(k8s: FakeKubernetes, tmp_path: Path) -> None:
    backend = _backend(k8s, tmp_path)
    ext = backend.start(_request(tmp_path, key="9.1", nodes=3, gpus=8,
                                 argv=["/bin/sh", "-c", "echo rank=$NODE_RANK of $WORLD_SIZE at $MASTER_ADDR"]))
    job = k8s.jobs[tuple(ext.split("/"))]  # type: ignore[index]
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 3
    assert job["spec"]["template"]["spec"]["subdomain"] == ext.split("/")[1]
    assert ("default", ext.split("/")[1]) in k8s.services  # the headless Service for <job>-<index>.<job>
    status = _wait(backend, ext)
    assert status.exit_code == 0
    assert len(k8s.pods_of("default", ext.split("/")[1])) == 3
    log = backend.read_log(ext)
    assert log.startswith(b"rank=0 of 3 at " + ext.split("/")[1].encode() + b"-0.")  # rank 0's log


def test_gang_pods_get_the_whole_torchrun_contract_once(k8s: FakeKubernetes, tmp_path: Path) -> None:
    backend = _backend(k8s, tmp_path)
    launcher = {"AUTORESEARCH_HOME": "/h", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "41234", "RANK": "0"}
    ext = backend.start(dataclasses.replace(_request(tmp_path, key="9.3", nodes=2), env=launcher))
    name = ext.split("/")[1]
    env = k8s.jobs[tuple(ext.split("/"))]["spec"]["template"]["spec"]["containers"][0]["env"]  # type: ignore[index]
    names = [e["name"] for e in env]
    assert len(names) == len(set(names))  # the launching host's MASTER_ADDR and port are replaced, not doubled
    by_name = {e["name"]: e for e in env}
    index = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    for rank in ("RANK", "NODE_RANK"):
        assert by_name[rank]["valueFrom"]["fieldRef"]["fieldPath"] == index
    assert {k: by_name[k].get("value") for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "LOCAL_RANK",
                                                  "LOCAL_WORLD_SIZE")} == {
        "MASTER_ADDR": f"{name}-0.{name}", "MASTER_PORT": "29500", "WORLD_SIZE": "2", "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1"}


def test_a_failed_rank_fails_the_gang_with_its_exit_code(k8s: FakeKubernetes, tmp_path: Path) -> None:
    backend = _backend(k8s, tmp_path)
    ext = backend.start(_request(tmp_path, key="9.2", nodes=2,
                                 argv=["/bin/sh", "-c", 'if [ "$NODE_RANK" = 1 ]; then exit 5; fi; sleep 60']))
    status = _wait(backend, ext)
    assert status.exit_code == 5  # rank 1's code; rank 0 was stopped by the Job controller


def test_job_names_are_dns_labels_and_deterministic() -> None:
    assert dns_name("AR-Home.12.1") == "ar-home-12-1"
    long = dns_name("x" * 300)
    assert len(long) <= 52 and long == dns_name("x" * 300) and long != dns_name("x" * 299)
    assert dns_name("../../etc") == "etc"
    assert dns_name("<script>") == "script"


def test_mounts_become_volumes_and_bad_ones_are_refused(tmp_path: Path) -> None:
    job = job_manifest(_request(tmp_path, image="i", mounts={"/data": "pvc:datasets/imagenet", "/scratch": "emptydir:",
                                                                 "/host": "host:/mnt/fast"}), "n", "o")
    pod = job["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert volumes[mounts["/data"]["name"]]["persistentVolumeClaim"] == {"claimName": "datasets"}
    assert mounts["/data"]["subPath"] == "imagenet"
    assert volumes[mounts["/scratch"]["name"]]["emptyDir"] == {}
    assert volumes[mounts["/host"]["name"]]["hostPath"] == {"path": "/mnt/fast"}
    for bad in ({"relative": "pvc:x"}, {"/a/../b": "pvc:x"}, {"/a": "s3://bucket"}, {"/a": "pvc:Bad_Name"}):
        with pytest.raises(SpecError):
            job_manifest(_request(tmp_path, image="i", mounts=bad), "n", "o")


def test_a_job_mounting_a_claim_is_submitted_and_nothing_is_linked_on_the_host(
        k8s: FakeKubernetes, home: Path, tmp_path: Path) -> None:
    api = Api(backend=_backend(k8s, tmp_path))
    target = tmp_path / "not-on-this-host"
    api.submit({"command": ["true"], "workdir": str(tmp_path), "image": "i", "mounts": {str(target): "pvc:datasets"}})
    wait_state(api, 1, "succeeded", timeout=60)
    (job,) = [body for method, path, body in k8s.requests if method == "POST" and path.endswith("/jobs")]
    assert not k8s.jobs  # released once the ending was recorded
    assert job["spec"]["template"]["spec"]["volumes"] == [{"name": "m0", "persistentVolumeClaim": {"claimName": "datasets"}}]
    assert not target.exists() and not target.is_symlink()  # the local backend's link is not made for an engine


def test_the_local_backend_refuses_an_engine_volume(api: Any, tmp_path: Path) -> None:
    with pytest.raises(SpecError) as err:
        api.submit({"command": ["true"], "workdir": str(tmp_path), "mounts": {"/data": "pvc:datasets"}})
    assert "host paths only" in err.value.message and "kubernetes" in err.value.hint


def test_host_only_environment_stays_on_the_host(tmp_path: Path) -> None:
    request = _request(tmp_path, image="i")
    request.env.update(PATH="/usr/host/bin", HOME="/home/me", MY_SETTING="1")
    env = {e["name"] for e in job_manifest(request, "n", "o")["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert "MY_SETTING" in env and "PATH" not in env and "HOME" not in env


# -- stop: one SIGTERM, then SIGKILL after the grace ----------------------------------------------

# Prints TERM on each SIGTERM; exits 0 a second after the first one when ``exit`` is set, else
# keeps running (SIGKILL ends it).
COUNT_TERMS = textwrap.dedent("""\
    import signal, sys, time
    seen = []
    def term(*_):
        seen.append(time.monotonic())
        print("TERM", flush=True)
    signal.signal(signal.SIGTERM, term)
    print("ready", flush=True)
    while not (seen and sys.argv[1] == "exit" and time.monotonic() - seen[0] > 1.0):
        time.sleep(0.05)
""")


def _ready(backend: KubernetesBackend, ext: str) -> None:
    deadline = time.monotonic() + 30
    while b"ready" not in backend.read_log(ext):
        assert time.monotonic() < deadline, "the program never started"
        time.sleep(0.05)


@pytest.mark.parametrize("stop_grace", [None, 5.0])
def test_stop_sends_one_sigterm_and_the_program_exit_is_its_own(k8s: FakeKubernetes, tmp_path: Path,
                                                               stop_grace: float | None) -> None:
    """Deleting the Job and then its pods with the same grace must not signal the program twice
    (a second SIGTERM during its exit killed it: 'signal 15' instead of its exit 0)."""
    backend = _backend(k8s, tmp_path)
    ext = backend.start(_request(tmp_path, argv=[sys.executable, "-c", COUNT_TERMS, "exit"], grace=5.0))
    _ready(backend, ext)
    backend.stop(ext, stop_grace)
    status = _wait(backend, ext)
    assert status.stopped and status.exit_code == 0 and status.signal is None, status
    assert backend.read_log(ext).count(b"TERM") == 1
    # the garbage collector deletes the pod with this grace already: no second delete is asked for
    assert not [r for r in k8s.requests if r[0] == "DELETE" and "/pods/" in r[1]]


def test_a_stop_reads_the_job_and_its_pods_once(k8s: FakeKubernetes, tmp_path: Path) -> None:
    """A stop asks three things: the Job and its pods (the poll that says it still runs, whose pod list
    also gives their graces: not listed a second time) and the Job's delete (its pods go with it)."""
    backend = _backend(k8s, tmp_path)
    ext = backend.start(_request(tmp_path, argv=[sys.executable, "-c", COUNT_TERMS, "exit"], grace=5.0))
    _ready(backend, ext)
    backend.poll(ext)  # (it has been seen running: the started-at annotation is written)
    k8s.requests.clear()
    backend.stop(ext, 5.0)
    sent = [(method, "job" if "/jobs/" in path else "pods" if path.split("?")[0].endswith("/pods") else path)
            for method, path, _ in k8s.requests]
    assert sent == [("GET", "job"), ("GET", "pods"), ("DELETE", "job")], k8s.requests
    assert _wait(backend, ext).stopped


def test_a_shorter_stop_grace_still_kills_without_a_second_sigterm(k8s: FakeKubernetes, tmp_path: Path) -> None:
    backend = _backend(k8s, tmp_path)
    ext = backend.start(_request(tmp_path, argv=[sys.executable, "-c", COUNT_TERMS, "stay"], grace=120.0))
    _ready(backend, ext)
    t0 = time.monotonic()
    backend.stop(ext, 1.0)
    status = _wait(backend, ext, timeout=60)
    assert status.stopped and status.signal == 9 and time.monotonic() - t0 < 60, status
    assert backend.read_log(ext).count(b"TERM") == 1
    assert [r[2]["gracePeriodSeconds"] for r in k8s.requests if r[0] == "DELETE" and "/pods/" in r[1]] == [1]


def test_fake_a_repeated_pod_delete_only_shortens_the_grace(k8s: FakeKubernetes, tmp_path: Path) -> None:
    """As the API server and kubelet do: the smaller deletionGracePeriodSeconds wins, the stop signal is sent once."""
    backend = _backend(k8s, tmp_path)
    ext = backend.start(_request(tmp_path, argv=[sys.executable, "-c", COUNT_TERMS, "stay"], grace=120.0))
    _ready(backend, ext)
    (pod,) = k8s.pods_of("default", ext.split("/")[1])
    path = f"/api/v1/namespaces/default/pods/{pod.name}"
    for grace in (60, 90, 60):
        assert k8s.handle("DELETE", path, {}, {"gracePeriodSeconds": grace})[0] == 200
    assert pod.obj["metadata"]["deletionGracePeriodSeconds"] == 60
    time.sleep(0.5)
    assert pod.proc is not None and pod.proc.poll() is None  # 60 s of grace left: still running
    k8s.handle("DELETE", path, {}, {"gracePeriodSeconds": 0})
    assert pod.proc.wait(timeout=30) == -9
    assert pod.log.read_bytes().count(b"TERM") == 1


# -- the engine's faults -------------------------------------------------------------------------


def test_preemption_by_kueue_ends_the_attempt_as_lost_and_deletes_the_job(k8s: FakeKubernetes, tmp_path: Path) -> None:
    backend = _backend(k8s, tmp_path)
    ext = backend.start(_request(tmp_path, argv=["/bin/sh", "-c", "echo up; sleep 60"]))
    deadline = time.monotonic() + 30
    while backend.poll(ext).state != "running":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    k8s.suspend(*ext.split("/"))
    status = _wait(backend, ext)
    assert status.state == "lost" and "preempted" in status.detail
    assert tuple(ext.split("/")) not in k8s.jobs  # Kueue must not resume it beside the retry


def test_an_evicted_pod_is_lost_not_an_exit(k8s: FakeKubernetes, tmp_path: Path) -> None:
    backend = _backend(k8s, tmp_path)
    ext = backend.start(_request(tmp_path, argv=["/bin/sh", "-c", "echo up; sleep 60"]))
    deadline = time.monotonic() + 30
    while backend.poll(ext).state != "running":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    k8s.evict(k8s.pods_of("default", ext.split("/")[1])[0].name)
    status = _wait(backend, ext)
    assert status.state == "lost" and "Evicted" in status.detail


def test_oom_killed_is_a_sigkill_with_the_reason(k8s: FakeKubernetes, tmp_path: Path) -> None:
    k8s.oom_next = True
    backend = _backend(k8s, tmp_path)
    ext = backend.start(_request(tmp_path, argv=["/bin/sh", "-c", "kill -9 $$"]))
    status = _wait(backend, ext)
    assert status.signal == 9 and "OOMKilled" in status.detail


def test_an_image_that_cannot_be_pulled_ends_the_attempt(k8s: FakeKubernetes, tmp_path: Path) -> None:
    k8s.unpullable = "nope:latest"
    backend = _backend(k8s, tmp_path)
    ext = backend.start(_request(tmp_path, image="nope:latest"))
    status = _wait(backend, ext)
    assert status.state == "lost" and "ImagePullBackOff" in status.detail and "nope:latest" in status.detail


def test_the_ending_survives_the_job_and_its_pods(k8s: FakeKubernetes, tmp_path: Path) -> None:
    backend = _backend(k8s, tmp_path)
    ext = backend.start(_request(tmp_path, argv=["/bin/sh", "-c", "echo kept; exit 3"]))
    first = _wait(backend, ext)
    backend.release(ext)  # the runtime recorded it: the Job is deleted
    k8s.pods.clear()
    assert tuple(ext.split("/")) not in k8s.jobs
    again = _backend(k8s, tmp_path)
    assert again.poll(ext) == first and again.read_log(ext) == b"kept\n"


# -- bad input --------------------------------------------------------------------------------------


def test_unreachable_api_names_the_address(tmp_path: Path) -> None:
    backend = KubernetesBackend(api="http://127.0.0.1:9", namespace="default", image="i", timeout=2)
    with pytest.raises(BackendError) as err:
        backend.probe()
    assert "http://127.0.0.1:9" in err.value.message and "backends/kubernetes/README.md" in err.value.hint


def test_a_wrong_token_says_so(tmp_path: Path) -> None:
    with FakeKubernetes(tmp_path / "c", token="right") as k8s:
        with pytest.raises(AuthError) as err:
            _backend(k8s, tmp_path, token="wrong").start(_request(tmp_path))
        assert "401" in err.value.message and "token" in err.value.hint
        assert _backend(k8s, tmp_path, token="right").start(_request(tmp_path))


def test_forbidden_names_the_rbac_fix(k8s: FakeKubernetes, tmp_path: Path) -> None:
    k8s.forbid = True
    with pytest.raises(AuthError) as err:
        _backend(k8s, tmp_path).start(_request(tmp_path))
    assert "forbids" in err.value.message and "Role" in err.value.hint


def test_a_rejected_job_carries_the_apis_message(k8s: FakeKubernetes, tmp_path: Path) -> None:
    k8s.reject = 'spec.template.spec.containers[0].resources.limits[nvidia.com/gpu]: Invalid value: "-1"'
    with pytest.raises(BackendError) as err:
        _backend(k8s, tmp_path).start(_request(tmp_path))
    assert "nvidia.com/gpu" in err.value.message and "kubectl auth can-i" in err.value.hint


@pytest.mark.parametrize("options", [{"namespace": "Bad_NS"}, {"queue": "../x"}, {"timeout": float("nan")},
                                     {"priority_classes": {"urgent": "x"}}, {"priority_classes": "critical"},
                                     {"node_selector": "gpu"}, {"node_selector": {"a": [1]}},
                                     {"ttl_after_finished": -1}, {"ttl_after_finished": "1d"}, {"image": 7},
                                     {"token_file": ["a"]}, {"timeout": True}])
def test_bad_options_are_refused(options: dict[str, Any]) -> None:
    with pytest.raises(SpecError):
        KubernetesBackend(api="http://127.0.0.1:1", **options)


def test_garbage_external_ids_are_refused_not_requested(k8s: FakeKubernetes, tmp_path: Path) -> None:
    backend = _backend(k8s, tmp_path)
    for bad in ("", "nojob", "default/../../etc", "UPPER/x", "a/b/c"):
        with pytest.raises(BackendError):
            backend.poll(bad)
    assert not k8s.requests


def test_no_image_anywhere_is_a_spec_error(k8s: FakeKubernetes, tmp_path: Path) -> None:
    with pytest.raises(SpecError) as err:
        _backend(k8s, tmp_path, image="").start(_request(tmp_path))
    assert "image" in err.value.hint


def test_what_no_attempt_could_run_is_refused_at_submit(k8s: FakeKubernetes, home: Path, tmp_path: Path) -> None:
    api = Api(backend=_backend(k8s, tmp_path, image=""))
    for spec, words in (({}, "needs a container image"), ({"image": "i", "mounts": {"/d": "nfs:server"}}, "pvc:CLAIM")):
        with pytest.raises(SpecError) as err:
            api.submit({"command": ["true"], "workdir": str(tmp_path), **spec})
        assert words in err.value.render()
    assert not k8s.requests and api.list_jobs().jobs == []  # nothing recorded, nothing sent


def test_no_api_server_configured_is_refused_at_submit(home: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    api = Api(backend=KubernetesBackend(image="i"))
    with pytest.raises(SpecError) as err:
        api.submit({"command": ["true"], "workdir": str(tmp_path)})
    assert "no API server" in err.value.message and "kubeconfig" in err.value.hint


def test_a_kubeconfig_gives_server_token_and_namespace(k8s: FakeKubernetes, tmp_path: Path) -> None:
    import base64

    import yaml

    k8s.token = "from-kubeconfig"
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "dev",
              "clusters": [{"name": "c", "cluster": {"server": k8s.url}}],
              "users": [{"name": "u", "user": {"token": "from-kubeconfig",
                                               "client-key-data": base64.b64encode(b"secret key").decode()}}],
              "contexts": [{"name": "dev", "context": {"cluster": "c", "user": "u", "namespace": "team-a"}},
                           {"name": "other", "context": {"cluster": "c", "user": "nobody"}}]}
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    backend = KubernetesBackend(kubeconfig=str(path), image="i", state_dir=str(tmp_path / "s"))
    ext = backend.start(_request(tmp_path))
    assert ext.startswith("team-a/") and ("team-a", ext.split("/")[1]) in k8s.jobs
    assert backend.api.server == k8s.url  # the key's -data is lightkube's to write and load (no cert: not sent)
    with pytest.raises(SpecError) as err:
        KubernetesBackend(kubeconfig=str(path), context="other", image="i").probe()
    assert "no user 'nobody'" in err.value.message
    path.write_text("- just\n- a list\n")
    with pytest.raises(SpecError):
        KubernetesBackend(kubeconfig=str(path), image="i").probe()


# -- the client (lightkube, the [kubernetes] extra) ------------------------------------------

READ_ENDED = """
import sys
from autoresearch.backends.kubernetes import KubernetesBackend
backend = KubernetesBackend(api=sys.argv[1], image="i", state_dir=sys.argv[2])
status, log = backend.poll(sys.argv[3]), backend.read_log(sys.argv[3])
assert status.ended and status.exit_code == 0 and log == b"hi\\n", (status, log)
before = sorted(m for m in ("lightkube", "httpx2", "httpx") if m in sys.modules)
backend.probe()
after = sorted(m for m in ("lightkube", "httpx2") if m in sys.modules)
print(before, after)
"""


def test_an_ended_attempt_is_read_without_importing_the_client(k8s: FakeKubernetes, tmp_path: Path) -> None:
    """Invariant 7: the status and log of an ended attempt come from state_dir; lightkube (~0.5 s
    of imports) is loaded by the first API call only. The check can fail: a probe loads it."""
    backend = _backend(k8s, tmp_path)
    ext = backend.start(_request(tmp_path))
    _wait(backend, ext)
    out = subprocess.run([sys.executable, "-c", READ_ENDED, k8s.url, str(backend.state_dir), ext],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0] == "[] ['httpx2', 'lightkube']"


def test_without_lightkube_the_backend_refuses_with_the_extra_to_install(
        k8s: FakeKubernetes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "lightkube", None)  # import lightkube -> ImportError
    backend = _backend(k8s, tmp_path)
    with pytest.raises(SpecError) as err:
        backend.start(_request(tmp_path))
    assert "lightkube" in err.value.message and "autoresearch[kubernetes]" in err.value.hint
    assert not k8s.requests


def test_a_garbled_pod_name_is_never_put_in_a_request_path(k8s: FakeKubernetes, tmp_path: Path) -> None:
    """Names from the API's answers go into paths unescaped by lightkube: one that is no object
    name is a pod that is not there (no request to '../jobs/x' or 'p?limitBytes=')."""
    backend = _backend(k8s, tmp_path)
    backend.probe()
    k8s.requests.clear()
    for bad in ("../../apis/batch/v1/namespaces/default/jobs/x", "p?limitBytes=1", "", "UPPER", "a" * 300):
        assert backend._pod_log("default", {"metadata": {"name": bad}}, None) == b""
        backend._delete("default", bad, 0, pod=True)
    assert k8s.requests == []


def test_delete_options_reach_the_api_as_query_parameters(k8s: FakeKubernetes, tmp_path: Path) -> None:
    """lightkube sends DeleteOptions as query parameters (which the API takes as it takes a body):
    a Job is deleted with Background propagation, its pods then by the garbage collector."""
    backend = _backend(k8s, tmp_path)
    ext = backend.start(_request(tmp_path, argv=["/bin/sh", "-c", "sleep 30"]))
    backend.release(ext)
    deletes = [body for method, path, body in k8s.requests if method == "DELETE" and "/jobs/" in path]
    assert deletes == [{"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background",
                        "gracePeriodSeconds": 0}]
    assert ("default", ext.split("/")[1]) not in k8s.jobs


@pytest.mark.parametrize("answer", [b"not json", b'{"kind": "Job", "metadata": 5}', b"[1, 2]", b"\xff\xfe" * 1000])
def test_an_answer_that_is_no_kubernetes_object_is_a_backend_error(tmp_path: Path, answer: bytes) -> None:
    """Untrusted input: a server (or a proxy) that answers garbage as JSON is a BackendError naming it."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Garbage(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 - the http.server API
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Garbage)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        backend = KubernetesBackend(api=f"http://127.0.0.1:{server.server_address[1]}", namespace="default",
                                    image="i", state_dir=str(tmp_path / "s"))
        with pytest.raises(BackendError) as err:
            backend.poll("default/ar-x-1")
        assert "not a Kubernetes object" in err.value.message
    finally:
        server.shutdown()
        server.server_close()
