"""The batch/v1 Job one attempt becomes (``backends/kubernetes.py``): a pure function, tested alone.

* Name: ``<prefix>-<attempt key>`` made DNS-1123-safe and deterministic, so a restarted
  submitter finds the Job it created before it could record it (issue 9 item 4).
* Kueue: labels ``kueue.x-k8s.io/queue-name`` (the LocalQueue) and
  ``kueue.x-k8s.io/priority-class`` (a WorkloadPriorityClass per autoresearch priority,
  ``backends/kubernetes/kueue.yaml``).
* Gang jobs (``nodes > 1``): an Indexed Job, ``parallelism = completions = nodes``; Kueue admits
  all pods or none. Rank 0's log is the attempt's log.
* ``activeDeadlineSeconds`` from the timeout, ``terminationGracePeriodSeconds`` from the grace,
  ``backoffLimit: 0`` (the runtime retries, as a new attempt), ``restartPolicy: Never``.
* Mounts (target -> source): ``pvc:CLAIM[/sub/path]`` a PersistentVolumeClaim, ``host:/path`` or
  an absolute path a hostPath volume, ``emptydir:`` a scratch volume.
"""

from __future__ import annotations

import hashlib
import math
import re
from typing import Any

from autoresearch.backends._env import sent_env
from autoresearch.errors import SpecError

ANNOTATION = "autoresearch.io/attempt-key"
OWNER = "autoresearch.io/owner"  # which autoresearch home made the Job (a hash of its path)
LABEL = "autoresearch.io/attempt"  # on the Job and its pods: the Job's name
CONTAINER = "main"
DEFAULT_PRIORITY_CLASSES = {"critical": "autoresearch-critical", "normal": "autoresearch-normal",
                            "best-effort": "autoresearch-best-effort"}
# Host facts that mean nothing inside an image (a container has its own PATH and HOME).
HOST_ONLY_ENV = frozenset({"PATH", "HOME", "HOSTNAME", "PWD", "OLDPWD", "SHLVL", "_", "TMPDIR", "LD_LIBRARY_PATH"})
_NOT_DNS = re.compile(r"[^a-z0-9-]+")
_SECRET_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")  # a DNS subdomain
_SECRET_KEY = re.compile(r"^(?!\.{1,2}$)[-._a-zA-Z0-9]{1,253}$")
_MAX_NAME = 52  # Indexed Jobs' pod hostnames add "-<index>" and must stay a 63-character label
# What the API server checks of labels beyond the published schema (which says only "string"):
# a value is empty or a 63-character name; a key is an optional DNS-subdomain prefix and '/' and a name.
_LABEL_NAME = re.compile(r"^(?=.{1,63}$)[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def label_value_ok(value: str) -> bool:
    return value == "" or bool(_LABEL_NAME.fullmatch(value))


def label_key_ok(key: str) -> bool:
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _SECRET_NAME.fullmatch(prefix)):
        return False
    return bool(_LABEL_NAME.fullmatch(name))


def dns_name(text: str, limit: int = _MAX_NAME) -> str:
    """``text`` as a DNS-1123 label: lower case, ``[a-z0-9-]``, alphanumeric at both ends, at most
    ``limit`` characters (a long one keeps a hash of the whole so two names never merge)."""
    name = _NOT_DNS.sub("-", text.lower()).strip("-") or "x"
    if len(name) > limit:
        digest = hashlib.sha256(text.encode()).hexdigest()[:8]
        name = name[: limit - 9].rstrip("-") + "-" + digest
    return name


def owner_of(env: dict[str, str]) -> str:
    return hashlib.sha256(env.get("AUTORESEARCH_HOME", "").encode()).hexdigest()[:8]


def job_name(key: str, prefix: str, owner: str) -> str:
    """Deterministic per (home, attempt key): two homes sharing a namespace never collide."""
    return dns_name(f"{prefix}-{owner}-{key}")


def job_manifest(request: Any, name: str, owner: str, *, queue: str = "", priority_classes: dict[str, str] | None = None,
                 image: str = "", service_account: str = "", node_selector: dict[str, str] | None = None,
                 ttl_after_finished: int | None = None) -> dict[str, Any]:
    """The Job for ``request`` (a :class:`~autoresearch.backends.LaunchRequest`)."""
    nodes = max(1, int(request.nodes))
    priority = str(getattr(request, "priority", "normal") or "normal")
    labels = {LABEL: name}
    if queue:
        labels["kueue.x-k8s.io/queue-name"] = queue
        klass = (priority_classes or DEFAULT_PRIORITY_CLASSES).get(priority)
        if klass:
            labels["kueue.x-k8s.io/priority-class"] = klass
    image = request.image or image
    if not image:
        raise SpecError("the kubernetes backend needs a container image for the job",
                        hint="set image: in the job spec or plan, or the backend option image: (a default)")
    asked = set(getattr(request, "job_env", ()) or ())
    env = {k: v for k, v in sent_env(request).items() if k not in HOST_ONLY_ENV or k in asked}
    secrets = dict(getattr(request, "secret_env", None) or {})
    container: dict[str, Any] = {
        "name": CONTAINER, "image": image, "command": list(request.argv), "workingDir": request.workdir,
        "env": [{"name": k, "value": v} for k, v in sorted(env.items()) if k not in secrets]
        + [secret_ref(k, ref) for k, ref in sorted(secrets.items())],
        "resources": _resources(request),
    }
    vols, mounts = volumes(request.mounts)
    if mounts:
        container["volumeMounts"] = mounts
    pod: dict[str, Any] = {
        "restartPolicy": "Never", "containers": [container],
        "terminationGracePeriodSeconds": int(math.ceil(max(0.0, float(request.grace)))),
    }
    if vols:
        pod["volumes"] = vols
    if service_account:
        pod["serviceAccountName"] = service_account
    if node_selector:
        pod["nodeSelector"] = dict(node_selector)
    if nodes > 1:
        pod["subdomain"] = name  # stable hostnames <name>-<index>.<name> (needs a headless Service of that name)
    spec: dict[str, Any] = {"backoffLimit": 0, "template": {"metadata": {"labels": dict(labels)}, "spec": pod}}
    if nodes > 1:
        spec.update(completionMode="Indexed", completions=nodes, parallelism=nodes)
    if request.timeout:
        spec["activeDeadlineSeconds"] = max(1, int(math.ceil(float(request.timeout))))
    if ttl_after_finished is not None:
        spec["ttlSecondsAfterFinished"] = int(ttl_after_finished)
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "labels": labels, "annotations": {ANNOTATION: request.key, OWNER: owner}},
        "spec": spec,
    }


def service_manifest(name: str, job_uid: str | None) -> dict[str, Any]:
    """The headless Service of a gang's Job: stable DNS for its pods (``<job>-<index>.<job>``),
    deleted with the Job (an owner reference to it, once the API has given the Job its uid)."""
    meta: dict[str, Any] = {"name": name, "labels": {LABEL: name}}
    if job_uid:
        meta["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": job_uid}]
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta,
            "spec": {"clusterIP": "None", "selector": {LABEL: name}}}


def secret_ref(name: str, ref: str) -> dict[str, Any]:
    """``NAME`` from key ``KEY`` of the Secret ``SECRET`` (``ref`` = ``SECRET/KEY``) in the Job's namespace:
    the value stays in the cluster, the manifest names it only."""
    secret, _, key = ref.partition("/")
    if not _SECRET_NAME.fullmatch(secret) or not _SECRET_KEY.fullmatch(key):
        raise SpecError(f"secret_env {name}: {ref[:80]!r} is not a Kubernetes Secret and key",
                        hint="write SECRET/KEY: a Secret's name (lower-case letters, digits, '-', '.') and one "
                             "of its keys, e.g. HF_TOKEN: hf-creds/token (kubectl create secret generic hf-creds "
                             "--from-literal=token=...)")
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


def _resources(request: Any) -> dict[str, Any]:
    limits: dict[str, str] = {}
    requests: dict[str, str] = {}
    gpus = int(getattr(request, "gpus", 0) or 0)
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    cpus = float(getattr(request, "cpus", 0) or 0)
    if cpus:
        requests["cpu"] = f"{int(math.ceil(cpus * 1000))}m"
    memory = int(getattr(request, "memory", 0) or 0)
    if memory:
        requests["memory"] = limits["memory"] = f"{memory}Mi"
    out: dict[str, Any] = {}
    if limits:
        out["limits"] = limits
    if requests:
        out["requests"] = requests
    return out


def volumes(mounts: dict[str, str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    made: list[dict[str, Any]] = []
    points: list[dict[str, Any]] = []
    for i, (target, source) in enumerate(sorted(mounts.items())):
        if not target.startswith("/") or ".." in target.split("/"):
            raise SpecError(f"mount target {target!r} must be an absolute path inside the container without '..'",
                            hint="write mounts as /data: pvc:CLAIM")
        volume: dict[str, Any] = {"name": f"m{i}"}
        point: dict[str, Any] = {"name": f"m{i}", "mountPath": target}
        scheme, _, rest = source.partition(":")
        if scheme == "pvc" and rest:
            claim, _, sub = rest.partition("/")
            if claim != dns_name(claim, 253):
                raise SpecError(f"mount source {source!r}: {claim!r} is not a PersistentVolumeClaim name",
                                hint="claim names are lower-case letters, digits and '-'")
            volume["persistentVolumeClaim"] = {"claimName": claim}
            if sub:
                point["subPath"] = sub
        elif scheme == "host" and rest.startswith("/"):
            volume["hostPath"] = {"path": rest}
        elif source.startswith("/"):
            volume["hostPath"] = {"path": source}
        elif scheme == "emptydir":
            volume["emptyDir"] = {}
        else:
            raise SpecError(f"mount source {source!r} is not one the kubernetes backend knows",
                            hint="use pvc:CLAIM[/sub/path], host:/path or emptydir:")
        made.append(volume)
        points.append(point)
    return made, points
