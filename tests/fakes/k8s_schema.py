"""What a Kubernetes API server accepts: the published OpenAPI schema (``kubernetes-validate``,
strict: no unknown fields) plus the checks the server makes that the schema leaves as "string"
(object names, labels, env names, quantities). Used by the schema tests and by the fake API
server (tests/fakes/k8s_api.py), which answers 422 Invalid to whatever this refuses.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import jsonschema

try:
    import kubernetes_validate
except ImportError:  # an optional test dependency: `pip install -e .[kubernetes]`
    kubernetes_validate = None

# The Kubernetes versions the backend supports: every manifest validates against each.
VERSIONS = ("1.29.0", "1.30.0", "1.31.0", "1.32.0", "1.33.0", "1.34.0", "1.35.0")
MISSING = "kubernetes-validate is not installed (pip install -e '.[kubernetes]'; .ci/run does it)"

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")  # RFC 1123, at most 63
_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")  # Service names: a letter first
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")  # before RelaxedEnvironmentVariableValidation
_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$")


def _label_key(key: str) -> bool:
    prefix, slash, name = key.rpartition("/")
    if slash and not (0 < len(prefix) <= 253 and _SUBDOMAIN.fullmatch(prefix)):
        return False
    return len(name) <= 63 and bool(_LABEL_NAME.fullmatch(name))


def _labels(where: str, labels: Any) -> list[str]:
    out = []
    for key, value in (labels or {}).items():
        if not _label_key(str(key)):
            out.append(f"{where}: Invalid value: {key!r}: not a qualified label key")
        if not isinstance(value, str) or (value and not (len(value) <= 63 and _LABEL_NAME.fullmatch(value))):
            out.append(f"{where}: Invalid value: {value!r}: not a label value (63 characters, alphanumeric ends)")
    return out


def _api_rules(body: dict[str, Any]) -> list[str]:
    out: list[str] = []
    kind, meta = body.get("kind"), body.get("metadata") or {}
    if kind not in ("Job", "Service"):
        return out
    name = str(meta.get("name", ""))
    pattern = _DNS_1035 if kind == "Service" else _DNS_LABEL if kind == "Job" else _SUBDOMAIN
    if len(name) > 63 or not pattern.fullmatch(name):
        out.append(f"metadata.name: Invalid value: {name!r}")
    out += _labels("metadata.labels", meta.get("labels"))
    if kind == "Service":
        out += _labels("spec.selector", (body.get("spec") or {}).get("selector"))
    if kind != "Job":
        return out
    template = body["spec"]["template"]
    out += _labels("spec.template.metadata.labels", (template.get("metadata") or {}).get("labels"))
    pod = template["spec"]
    out += _labels("spec.template.spec.nodeSelector", pod.get("nodeSelector"))
    if "subdomain" in pod and not _DNS_LABEL.fullmatch(str(pod["subdomain"])):
        out.append(f"spec.template.spec.subdomain: Invalid value: {pod['subdomain']!r}")
    volumes = {v["name"] for v in pod.get("volumes", [])}
    for volume in pod.get("volumes", []):
        if not _DNS_LABEL.fullmatch(volume["name"]):
            out.append(f"spec.template.spec.volumes: Invalid value: {volume['name']!r}")
    for container in pod["containers"]:
        if not _DNS_LABEL.fullmatch(container["name"]):
            out.append(f"containers.name: Invalid value: {container['name']!r}")
        names = [e["name"] for e in container.get("env", [])]
        for env in names:
            if not _ENV_NAME.fullmatch(env):
                out.append(f"containers.env.name: Invalid value: {env!r}: a valid environment variable name")
        if len(names) != len(set(names)):
            out.append("containers.env: duplicate names (the later one silently wins)")
        paths = [m["mountPath"] for m in container.get("volumeMounts", [])]
        if len(paths) != len(set(paths)):
            out.append("containers.volumeMounts.mountPath: Invalid value: must be unique")
        for mount in container.get("volumeMounts", []):
            if mount["name"] not in volumes:
                out.append(f"containers.volumeMounts.name: Not found: {mount['name']!r}")
        for group in ("limits", "requests"):
            for resource, value in (container.get("resources", {}).get(group) or {}).items():
                if not _QUANTITY.fullmatch(str(value)):
                    out.append(f"resources.{group}[{resource}]: Invalid value: {value!r}")
    return out


def problems(body: Any, version: str = VERSIONS[1], delete: bool = False) -> list[str]:
    """What an API server of ``version`` would refuse in ``body`` (empty: it accepts it);
    ``delete``: the body of a DELETE (DeleteOptions, whose kind and apiVersion may be left out)."""
    if kubernetes_validate is None:
        raise RuntimeError(MISSING)
    if not isinstance(body, dict):
        return ["the body is not an object"]
    if not delete and not (isinstance(body.get("kind"), str) and isinstance(body.get("apiVersion"), str)):
        return ["kind and apiVersion: Required value"]
    try:
        if delete or body.get("kind") == "DeleteOptions":
            _delete_options(body, version)
        else:
            kubernetes_validate.validate(copy.deepcopy(body), version, strict=True)
    except (kubernetes_validate.ValidationError, jsonschema.ValidationError) as err:
        path = ".".join(str(p) for p in err.path)
        return [f"{path}: {err.message}"]
    return _api_rules(body)


def _delete_options(body: dict[str, Any], version: str) -> None:
    """DeleteOptions' schema is the meta group's (``deleteoptions-meta-v1.json``), which
    ``kubernetes_validate.validate`` cannot find from the body's ``apiVersion: v1``."""
    from kubernetes_validate import utils
    from referencing import Registry, Resource

    folder = f"kubernetes-json-schema/v{utils.major_minor(version)}.0-local-strict"
    schema = utils.schema_contents(f"{folder}/deleteoptions-meta-v1.json", version)
    defs = utils.schema_contents(f"{folder}/_definitions.json", version)
    registry = Resource.from_contents(defs) @ (Resource.from_contents(schema) @ Registry())
    jsonschema.validators.Draft202012Validator(schema, registry=registry).validate(body)
