"""backends/kubernetes/: the manifests a cluster admin applies parse, hold the expected kinds,
and match what the backend sends (queue, priority classes, the API calls its Role allows)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import yaml

from autoresearch.backends import LaunchRequest
from autoresearch.backends._k8s_job import DEFAULT_PRIORITY_CLASSES
from autoresearch.backends.kubernetes import KubernetesBackend
from autoresearch.engine.spec import PRIORITIES
from tests.fakes.k8s_api import FakeKubernetes

KIT = Path(__file__).resolve().parents[2] / "backends" / "kubernetes"


def _objects(name: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((KIT / name).read_text()) if doc]


def test_manifests_parse_with_the_expected_kinds() -> None:
    kinds = sorted(o["kind"] for o in _objects("namespace.yaml"))
    assert kinds == ["Namespace", "Role", "RoleBinding", "ServiceAccount"]
    kueue = _objects("kueue.yaml")
    assert sorted({o["kind"] for o in kueue}) == ["ClusterQueue", "LocalQueue", "ResourceFlavor",
                                                   "WorkloadPriorityClass"]
    assert all(o["apiVersion"] == "kueue.x-k8s.io/v1beta1" for o in kueue)


def test_a_priority_class_for_every_autoresearch_priority_in_rank_order() -> None:
    classes = {o["metadata"]["name"]: o["value"] for o in _objects("kueue.yaml") if o["kind"] == "WorkloadPriorityClass"}
    assert set(classes) == {DEFAULT_PRIORITY_CLASSES[p] for p in PRIORITIES}
    values = [classes[DEFAULT_PRIORITY_CLASSES[p]] for p in PRIORITIES]  # PRIORITIES: highest first
    assert values == sorted(values, reverse=True) and len(set(values)) == len(values)


def test_the_default_queue_exists_and_feeds_a_preempting_cluster_queue() -> None:
    objects = {(o["kind"], o["metadata"]["name"]): o for o in _objects("kueue.yaml")}
    namespace = next(o for o in _objects("namespace.yaml") if o["kind"] == "Namespace")["metadata"]["name"]
    local = objects[("LocalQueue", KubernetesBackend(api="http://x").queue)]
    assert local["metadata"]["namespace"] == namespace
    cluster = objects[("ClusterQueue", local["spec"]["clusterQueue"])]
    assert cluster["spec"]["preemption"]["withinClusterQueue"] == "LowerPriority"
    group = cluster["spec"]["resourceGroups"][0]
    assert "nvidia.com/gpu" in group["coveredResources"]
    assert ("ResourceFlavor", group["flavors"][0]["name"]) in objects


def test_the_role_allows_every_call_the_backend_makes(tmp_path: Path) -> None:
    role = next(o for o in _objects("namespace.yaml") if o["kind"] == "Role")
    allowed = {(group, resource, verb) for rule in role["rules"] for group in rule["apiGroups"]
               for resource in rule["resources"] for verb in rule["verbs"]}
    with FakeKubernetes(tmp_path / "cluster") as k8s:
        backend = KubernetesBackend(api=k8s.url, namespace="autoresearch", image="i", state_dir=str(tmp_path / "s"))
        request = LaunchRequest(key="1.1", argv=["/bin/sh", "-c", "echo up; sleep 30"], env={}, workdir=str(tmp_path),
                                log_path="", run_dir=str(tmp_path / "run"), nodes=2)
        ext = backend.start(request)
        deadline = time.monotonic() + 30
        while backend.poll(ext).state != "running" or b"up" not in backend.read_log(ext):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        backend.stop(ext, 1)
        while not backend.poll(ext).ended:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        backend.release(ext)
        calls = {_rbac(method, path) for method, path, _ in k8s.requests}
    verbs = {verb for _, _, verb in calls}
    assert {"create", "get", "list", "patch", "delete"} <= verbs  # the cycle above exercised them all
    assert calls <= allowed, f"the Role lacks {sorted(calls - allowed)}"


def _rbac(method: str, path: str) -> tuple[str, str, str]:
    parts = path.strip("/").split("/")
    group = "" if parts[0] == "api" else parts[1]
    rest = parts[parts.index("namespaces") + 2:]
    resource = rest[0] + ("/" + rest[2] if len(rest) > 2 else "")
    verb = {"POST": "create", "PATCH": "patch", "DELETE": "delete"}.get(method, "get" if len(rest) > 1 else "list")
    return group, resource, verb
