"""Every manifest the kubernetes backend makes, checked against the published Kubernetes schema
(``kubernetes-validate``, strict) for each version we support (tests/fakes/k8s_schema.VERSIONS:
1.29 to 1.35), plus what the API server checks beyond it (names, labels, env names, quantities)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoresearch.backends import LaunchRequest
from autoresearch.backends import _k8s_job as manifest
from autoresearch.backends.kubernetes import KubernetesBackend, _gang_env
from autoresearch.errors import SpecError
from tests.fakes.k8s_schema import MISSING, VERSIONS, kubernetes_validate, problems

pytestmark = pytest.mark.skipif(kubernetes_validate is None, reason=MISSING)


def request(**kw: Any) -> LaunchRequest:
    base: dict[str, Any] = dict(key="12.1", argv=["python", "train.py", "--lr", "0.1"],
                                env={"AUTORESEARCH_HOME": "/h", "AUTORESEARCH_JOB_ID": "12", "LR": "0.1"},
                                workdir="/work", log_path="/h/jobs/12/attempt-1.log", run_dir="/h/jobs/12/attempt-1",
                                image="python:3.11", job_env=("LR",))
    return LaunchRequest(**{**base, **kw})


def job(req: LaunchRequest, **options: Any) -> dict[str, Any]:
    name = manifest.job_name(req.key, "ar", manifest.owner_of(req.env))
    body = manifest.job_manifest(req, name, manifest.owner_of(req.env), **options)
    if req.nodes > 1:
        _gang_env(body, name, req.nodes)
    return body


FULL = dict(gpus=8, cpus=12.5, memory=65536, timeout=3600.25, grace=30.0, priority="critical",
            mounts={"/data": "pvc:datasets/imagenet", "/scratch": "emptydir:", "/models": "host:/srv/models",
                    "/cache": "/var/cache/hf"}, secret_env={"HF_TOKEN": "hf-creds/token"})
MANIFESTS: dict[str, Any] = {
    "job": lambda: job(request()),
    "job, every option": lambda: job(request(**FULL), queue="team-a", service_account="trainer",
                                     node_selector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                                     ttl_after_finished=86400),
    "kueue labels, each priority": lambda: [job(request(priority=p), queue="autoresearch")
                                            for p in ("critical", "normal", "best-effort")],
    "indexed job (gang)": lambda: job(request(nodes=4, **FULL), queue="autoresearch"),
    "headless service": lambda: manifest.service_manifest("ar-0a1b2c3d-12-1", "7c9e6679-7425-40de-944b-e07fc1f90ae7"),
    "headless service, no uid yet": lambda: manifest.service_manifest("ar-0a1b2c3d-12-1", None),
    "delete options": lambda: [{"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"},
                               {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background",
                                "gracePeriodSeconds": 3}],
}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("what", sorted(MANIFESTS))
def test_every_manifest_is_valid_for_every_supported_version(what: str, version: str) -> None:
    made = MANIFESTS[what]()
    for body in made if isinstance(made, list) else [made]:
        assert problems(body, version, delete=body["kind"] == "DeleteOptions") == [], body


def test_the_gang_job_is_indexed_and_its_service_selects_its_pods() -> None:
    body = job(request(nodes=3), queue="q")
    service = manifest.service_manifest(body["metadata"]["name"], "u")
    assert body["spec"]["completionMode"] == "Indexed" and body["spec"]["parallelism"] == 3
    assert body["spec"]["template"]["spec"]["subdomain"] == service["metadata"]["name"]
    pod_labels = body["spec"]["template"]["metadata"]["labels"]
    assert all(pod_labels[k] == v for k, v in service["spec"]["selector"].items())
    assert body["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "q"
    assert body["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "autoresearch-normal"


@pytest.mark.parametrize(("change", "words"), [
    (lambda b: b["spec"]["template"]["spec"].update(bogus=1), "bogus"),  # strict: no unknown fields
    (lambda b: b["spec"]["template"]["spec"]["containers"][0]["env"].append({"name": "N", "value": 3}), "string"),
    (lambda b: b["spec"].update(completions="3"), "integer"),
    (lambda b: b["metadata"]["labels"].update({"kueue.x-k8s.io/priority-class": "Not Ok"}), "label value"),
    (lambda b: b["spec"]["template"]["spec"].update(nodeSelector={"a b": "c"}), "label key"),
    (lambda b: b["spec"]["template"]["spec"]["containers"][0]["env"].append({"name": "A=B", "value": ""}),
     "environment variable"),
    (lambda b: b["metadata"].update(name="x" * 64), "metadata.name"),
])
def test_the_checker_refuses_what_a_server_refuses(change: Any, words: str) -> None:
    body = copy.deepcopy(job(request(), queue="q"))
    change(body)
    found = problems(body)
    assert found and words in " ".join(found)


def test_a_service_name_must_start_with_a_letter() -> None:
    assert problems(manifest.service_manifest("1-ar-x", None)) != []
    assert problems(manifest.service_manifest("ar-x", None)) == []


@pytest.mark.parametrize(("options", "words"), [
    ({"node_selector": {"gpu type": "h100"}}, "node_selector"),
    ({"node_selector": {"nvidia.com/gpu.product": "NVIDIA H100"}}, "node_selector"),
    ({"node_selector": {"a": "x" * 64}}, "node_selector"),
    ({"priority_classes": {"critical": "Urgent Work"}}, "priority_classes"),
    ({"priority_classes": {"critical": "p" * 64}}, "priority_classes"),
    ({"name_prefix": "1ar"}, "name_prefix"),
])
def test_options_the_api_would_refuse_at_every_start_are_refused_at_load(options: dict[str, Any], words: str,
                                                                        tmp_path: Path) -> None:
    # Before: accepted, and every attempt's Job (or a gang's Service) was refused by the API server.
    with pytest.raises(SpecError) as err:
        KubernetesBackend(api="http://127.0.0.1:1", namespace="default", state_dir=str(tmp_path), **options)
    assert words in err.value.message and err.value.hint


_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=200)


@settings(max_examples=60, deadline=None)
@given(key=st.text(min_size=1, max_size=300).filter(lambda k: "\0" not in k), argv=st.lists(_text, min_size=1, max_size=4),
       value=_text, timeout=st.one_of(st.none(), st.floats(0.001, 1e9)), grace=st.floats(0, 1e6),
       nodes=st.integers(1, 64), gpus=st.integers(0, 1024), memory=st.integers(0, 2**40))
def test_any_request_makes_a_valid_job(key: str, argv: list[str], value: str, timeout: float | None, grace: float,
                                       nodes: int, gpus: int, memory: int) -> None:
    req = request(key=key, argv=argv, env={"AUTORESEARCH_HOME": "/h", "LR": value}, timeout=timeout, grace=grace,
                  nodes=nodes, gpus=gpus, memory=memory)
    body = job(req, queue="autoresearch")
    assert problems(body, VERSIONS[-1]) == []
    if nodes > 1:
        assert problems(manifest.service_manifest(body["metadata"]["name"], None), VERSIONS[-1]) == []
