"""The Kubernetes backend (kind ``kubernetes``): one batch/v1 Job per attempt, Kueue schedules.

Built from the documented interfaces (the batch/v1 Job and core/v1 Pod APIs, Kueue's
``kueue.x-k8s.io/queue-name`` and ``kueue.x-k8s.io/priority-class`` labels), tested against a
fake API server that runs each pod's command as a local process (``tests/fakes/k8s_api.py``)
and refuses what the published schema of its version refuses (``tests/fakes/k8s_schema.py``);
not yet exercised against a live cluster. Options that would make every Job invalid (a node
selector or priority class that is no label, a name prefix no Service name may start with)
are refused at load. The Job itself is ``_k8s_job.py``, reading its state
``_k8s_status.py``, the requests (through lightkube, the ``[kubernetes]`` extra, imported on the first API
call) and their configuration (api/token/CA, kubeconfig, in-cluster) ``_k8s_api.py``.

* At most once (issue 9 item 4): the Job's name comes from the attempt key, so a start that
  is repeated (a submitter killed between the API's create and the ledger's write) finds
  the Job (409 AlreadyExists) and adopts it instead of running the attempt twice.
* State from the Job's conditions and its pods' statuses: exit code from the container;
  ``activeDeadlineSeconds`` passed -> ``timed_out``; OOMKilled -> SIGKILL (the runtime calls it
  infra, "out of memory?"); evicted, preempted by Kueue, an image that cannot be pulled ->
  ``lost`` with the engine's reason (infra, retried as a new attempt, the old Job deleted).
* Logs through the pod log API (rank 0's pod for a gang job; the API has no byte offset,
  so ``limitBytes`` reads up to ``offset + max_bytes``). A pod's log and status vanish with
  the pod, so once an attempt has ended the backend keeps both in ``state_dir`` (default
  ``$AUTORESEARCH_HOME/backends/kubernetes``); ``poll`` stays stable after the Job is gone.
* ``stop``: delete the Job (propagationPolicy Background; the garbage collector deletes its pods
  with their own ``terminationGracePeriodSeconds``, the attempt's grace), and a pod directly only
  when ``stop``'s grace is shorter: the kubelet sends SIGTERM once, then SIGKILL after the grace.
  Three requests when the grace is the attempt's: the Job and its pods read once (the poll that
  decides whether it still runs, whose pod list also says their graces), and the Job's delete.
* ``places = False``: Kubernetes (with Kueue) schedules; ``nodes()`` is empty.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from pathlib import Path
from typing import Any

from autoresearch.backends import _k8s_job as manifest
from autoresearch.backends._base import AttemptStatus, Backend, Capabilities, LaunchRequest, NodeInfo
from autoresearch.backends._k8s_api import KIT_HINT, ApiError, Client, connection
from autoresearch.backends._k8s_status import STARTED, index, interpret, job_annotations
from autoresearch.backends._supervisor import read_json
from autoresearch.errors import AuthError, AutoresearchError, BackendError, SpecError

_LOG_CAP = 1 << 40
POINTER = "kubernetes.json"  # in the attempt's run dir: which Job it is


class KubernetesBackend(Backend):
    name = "kubernetes"
    capabilities = Capabilities(gpus=True, preemption=True, multi_node=True, containers=True, places=False,
                                shared_fs=False, secrets=True)

    def __init__(self, api: str = "", namespace: str = "", token: str = "", token_file: str = "", ca_file: str = "",
                 insecure: bool = False, kubeconfig: str = "", context: str = "", queue: str = "autoresearch",
                 priority_classes: dict[str, str] | None = None, image: str = "", service_account: str = "",
                 node_selector: dict[str, str] | None = None, name_prefix: str = "ar", state_dir: str = "",
                 timeout: float = 10.0, ttl_after_finished: int | None = None) -> None:
        classes = dict(manifest.DEFAULT_PRIORITY_CLASSES)  # keyed by spec.PRIORITIES (spec imports pydantic)
        priorities = tuple(classes)
        if priority_classes is not None:
            if not isinstance(priority_classes, dict) or any(k not in priorities for k in priority_classes):
                raise SpecError("kubernetes option priority_classes must map autoresearch priorities to "
                                f"WorkloadPriorityClass names, got {str(priority_classes)[:120]!r}",
                                hint=f"keys among {', '.join(priorities)}, e.g. {{critical: autoresearch-critical}}")
            classes.update({k: str(v) for k, v in priority_classes.items()})
            for klass in classes.values():  # a Job label's value, and a WorkloadPriorityClass's name
                if not manifest.label_value_ok(klass) or manifest.dns_name(klass, 63) != klass:
                    raise SpecError(f"kubernetes option priority_classes: {klass[:80]!r} is not a "
                                    "WorkloadPriorityClass name the API accepts as a label value",
                                    hint="lower-case letters, digits and '-', at most 63 characters, "
                                         "e.g. autoresearch-critical")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or not 0 < timeout <= 600:
            raise SpecError(f"kubernetes option timeout must be seconds in (0, 600], got {timeout!r}",
                            hint="leave it out for 10 s")
        for what, value in (("namespace", namespace), ("queue", queue), ("name_prefix", name_prefix)):
            if value and manifest.dns_name(str(value), 63) != value:
                raise SpecError(f"kubernetes option {what} {str(value)[:80]!r} is not a DNS-1123 name",
                                hint="lower-case letters, digits and '-', at most 63 characters")
        if name_prefix and not name_prefix[0].isalpha():  # a gang's headless Service takes the Job's name (DNS-1035)
            raise SpecError(f"kubernetes option name_prefix {name_prefix[:80]!r} must start with a letter",
                            hint="a gang job's Service is named like its Job, and Service names start with a "
                                 "letter; e.g. name_prefix: ar")
        texts = dict(api=api, token=token, token_file=token_file, ca_file=ca_file, kubeconfig=kubeconfig,
                     context=context, image=image, service_account=service_account, state_dir=state_dir)
        for what, value in texts.items():
            if not isinstance(value, str) or "\0" in value:
                raise SpecError(f"kubernetes option {what} must be text, got {str(value)[:80]!r}",
                                hint=f"write {what}: as a string")
        if node_selector is not None and not (isinstance(node_selector, dict) and all(
                isinstance(v, (str, int, bool)) for v in node_selector.values())):
            raise SpecError(f"kubernetes option node_selector must map labels to values, got {str(node_selector)[:80]!r}",
                            hint="e.g. node_selector: {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}")
        for key, value in (node_selector or {}).items():
            if not manifest.label_key_ok(str(key)) or not manifest.label_value_ok(str(value)):
                raise SpecError(f"kubernetes option node_selector: {str(key)[:80]!r}: {str(value)[:80]!r} is not a "
                                "node label the API accepts",
                                hint="keys are [prefix/]name, values at most 63 letters, digits, '-', '_' or '.', "
                                     "starting and ending alphanumeric, e.g. {nvidia.com/gpu.product: "
                                     "NVIDIA-H100-80GB-HBM3}")
        if ttl_after_finished is not None and (isinstance(ttl_after_finished, bool) or not isinstance(
                ttl_after_finished, int) or not 0 <= ttl_after_finished <= 2**31 - 1):
            raise SpecError(f"kubernetes option ttl_after_finished must be whole seconds >= 0, "
                            f"got {ttl_after_finished!r}", hint="e.g. ttl_after_finished: 86400, or leave it out")
        self._options: dict[str, Any] = dict(api=api, token=token, token_file=token_file, ca_file=ca_file,
                                             insecure=insecure is True, kubeconfig=kubeconfig, context=context)
        self._namespace, self.queue, self.priority_classes = namespace, queue, classes
        self.image, self.service_account = image, service_account
        self.node_selector = {str(k): str(v) for k, v in (node_selector or {}).items()}
        self.prefix, self.timeout, self.ttl = name_prefix or "ar", float(timeout), ttl_after_finished
        home = os.environ.get("AUTORESEARCH_HOME") or str(Path.home() / ".autoresearch")
        self.state_dir = Path(state_dir or Path(home) / "backends" / "kubernetes").expanduser()
        self._client: Client | None = None

    # -- plumbing -------------------------------------------------------------------------

    @property
    def api(self) -> Client:
        if self._client is None:
            client = Client(connection(**self._options), timeout=self.timeout)
            self._namespace = self._namespace or client.namespace or "autoresearch"
            self._client = client
        return self._client

    @property
    def namespace(self) -> str:
        self.api  # noqa: B018 - resolves the namespace from the kubeconfig when not given
        return self._namespace

    def _split(self, external_id: str) -> tuple[str, str]:
        if os.path.isabs(str(external_id)):  # the run dir: the launcher died before recording the Job's id
            pointer = _load(Path(external_id) / POINTER) or {}
            if not pointer.get("external_id"):
                raise _NeverCreated(f"no Job was recorded for run dir {str(external_id)[:200]!r}",
                                    hint="the launcher died before it reached the API; the attempt is retried")
            external_id = str(pointer["external_id"])
        ns, _, name = str(external_id).partition("/")
        if not ns or not name or manifest.dns_name(ns, 63) != ns or manifest.dns_name(name, 63) != name:
            raise BackendError(f"{str(external_id)[:120]!r} is not a kubernetes attempt id (NAMESPACE/JOB)",
                               hint="the ledger's external id of a kubernetes attempt names its Job")
        return ns, name

    def _file(self, ns: str, name: str, suffix: str) -> Path:
        return self.state_dir / ns / f"{name}{suffix}"

    def _write(self, path: Path, data: bytes) -> None:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_bytes(data)
        os.replace(tmp, path)

    def _pods(self, ns: str, name: str) -> list[dict[str, Any]]:
        return sorted(self.api.pods(ns, {manifest.LABEL: name}), key=index)

    def _job(self, ns: str, name: str) -> dict[str, Any] | None:
        try:
            return self.api.get_job(ns, name)
        except ApiError as err:
            if err.status == 404:
                return None
            raise BackendError(f"reading Job {ns}/{name} failed: {err.message}", hint=KIT_HINT) from None

    def _delete(self, ns: str, name: str, grace: int | None, pod: bool = False) -> None:
        try:
            (self.api.delete_pod if pod else self.api.delete_job)(ns, name, grace)
        except ApiError as err:
            if err.status != 404:
                raise BackendError(f"deleting {'Pod' if pod else 'Job'} {ns}/{name} failed: {err.message}",
                                   hint=KIT_HINT) from None

    # -- the contract ---------------------------------------------------------------------

    def check(self, spec: Any) -> None:
        """Also refused at submit, not as failed attempts: no image anywhere, a mount the pod
        cannot have, no API server configured (no network call here)."""
        super().check(spec)
        if not (str(getattr(spec, "image", "") or "") or self.image):
            raise SpecError("the kubernetes backend needs a container image for the job",
                            hint="set image: in the job spec or plan, or the backend option image: (a default)")
        mounts = getattr(spec, "mounts", None)
        manifest.volumes(dict(mounts) if isinstance(mounts, dict) else {})
        self.api  # noqa: B018 - resolves api/token/kubeconfig: a SpecError with a hint when there is none

    def nodes(self) -> list[NodeInfo]:
        return []  # Kubernetes places pods; `kubectl get nodes` shows them

    def probe(self) -> None:
        try:
            self.api.version()
        except ApiError as err:
            raise BackendError(f"the Kubernetes API server at {self.api.server} answered /version with "
                               f"{err.status}: {err.message}", hint=KIT_HINT) from None

    def start(self, request: LaunchRequest) -> str:
        ns, owner = self.namespace, manifest.owner_of(request.env)
        name = manifest.job_name(request.key, self.prefix, owner)
        if self._file(ns, name, ".end.json").exists():
            return f"{ns}/{name}"  # ended and forgotten by the engine: still the same attempt
        # Write-ahead (invariant 1): the run dir names the Job before the Job exists, so a launcher
        # killed between the create and the ledger's write is found, not launched again.
        self._write(Path(request.run_dir) / POINTER, json.dumps({"external_id": f"{ns}/{name}"}).encode())
        body = manifest.job_manifest(request, name, owner, queue=self.queue, priority_classes=self.priority_classes,
                                     image=self.image, service_account=self.service_account,
                                     node_selector=self.node_selector, ttl_after_finished=self.ttl)
        if request.nodes > 1:
            _gang_env(body, name, int(request.nodes))
        try:
            created = self.api.create_job(ns, body)
        except AuthError:
            raise
        except BackendError:
            # No answer (a timeout, a dropped connection): the API may have made the Job anyway.
            # Ask; if it is there it is this attempt. If the API stays silent the launch fails, and
            # release() deletes the Job of that name once the ledger has ended the attempt.
            created = self._job(ns, name) or {}
            if not created:
                raise
            self._check_ours(created, request.key, owner, ns, name)
        except ApiError as err:
            if err.status != 409:
                raise BackendError(f"the Kubernetes API rejected Job {ns}/{name}: {err.message}",
                                   hint="fix what the API names (image, resources, quota), or see "
                                        "backends/kubernetes/README.md; kubectl auth can-i create jobs "
                                        f"-n {ns}") from None
            created = self._job(ns, name) or {}
            self._check_ours(created, request.key, owner, ns, name)
        if request.nodes > 1:
            self._headless_service(ns, name, created)
        return f"{ns}/{name}"

    @staticmethod
    def _check_ours(job: dict[str, Any], key: str, owner: str, ns: str, name: str) -> None:
        notes = job_annotations(job)
        if notes.get(manifest.ANNOTATION) != key or notes.get(manifest.OWNER) != owner:
            raise BackendError(f"Job {ns}/{name} exists but is not attempt {key} of this home",
                               hint=f"delete it (kubectl -n {ns} delete job {name}) or set name_prefix")

    def _headless_service(self, ns: str, name: str, job: dict[str, Any]) -> None:
        """Stable DNS for a gang's pods (``<job>-<index>.<job>``), deleted with the Job (owner reference)."""
        uid = (job.get("metadata") or {}).get("uid")
        service = manifest.service_manifest(name, str(uid) if uid else None)
        with contextlib.suppress(ApiError):  # 409: made by the first start; anything else: the gang still runs
            self.api.create_service(ns, service)

    def poll(self, external_id: str) -> AttemptStatus:
        try:
            ns, name = self._split(external_id)
        except _NeverCreated as err:  # launches and passes hold the pass lock: nobody is creating it now
            return AttemptStatus("lost", ended_at=time.time(), detail=err.message)
        return self._poll(ns, name)[0]

    def _poll(self, ns: str, name: str) -> tuple[AttemptStatus, list[dict[str, Any]]]:
        """:meth:`poll` of Job ``ns/name``, and the pods it read for it ([] when its ending was kept)."""
        ended = _load(self._file(ns, name, ".end.json"))
        if ended is not None:
            return AttemptStatus(**ended), []
        stopped = self._file(ns, name, ".stop.json").exists()
        job, pods = self._job(ns, name), self._pods(ns, name)
        status, kill = interpret(job, pods, stopped, ns, name)
        if job is not None and status.state == "running" and STARTED not in job_annotations(job):
            with contextlib.suppress(ApiError):
                self.api.annotate_job(ns, name, {STARTED: str(int(time.time()))})
        if kill:  # ended for us, not for the engine (evicted, preempted, unpullable): never let it run again
            self._delete(ns, name, None)
        if status.ended:
            self._remember(ns, name, status, pods)
        return status, pods

    def _remember(self, ns: str, name: str, status: AttemptStatus, pods: list[dict[str, Any]]) -> None:
        """Keep the ending and the whole log (streamed to disk) before the pod can vanish."""
        path = self._file(ns, name, ".log")
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        kept = False
        if pods:
            pod_name = str((pods[0].get("metadata") or {}).get("name", ""))
            with contextlib.suppress(ApiError, BackendError), tmp.open("wb") as sink:
                self.api.pod_log(ns, pod_name, manifest.CONTAINER, sink=sink)
                kept = True
        if kept:
            os.replace(tmp, path)
        else:
            tmp.unlink(missing_ok=True)
            if not path.exists():
                self._write(path, b"")
        fields = {k: getattr(status, k) for k in AttemptStatus.__dataclass_fields__}
        self._write(self._file(ns, name, ".end.json"), json.dumps(fields).encode())

    def _pod_log(self, ns: str, pod: dict[str, Any], limit: int | None) -> bytes:
        try:
            return self.api.pod_log(ns, str((pod.get("metadata") or {}).get("name", "")), manifest.CONTAINER, limit)
        except ApiError as err:
            if err.status in (400, 404):  # not started yet, or gone
                return b""
            raise

    def read_log(self, external_id: str, offset: int = 0, max_bytes: int = 1 << 20) -> bytes:
        try:
            ns, name = self._split(external_id)
        except _NeverCreated:
            return b""
        offset, max_bytes = max(0, int(offset)), max(0, int(max_bytes))
        cached = self._file(ns, name, ".log")
        if self._file(ns, name, ".end.json").exists() and cached.exists():
            with cached.open("rb") as f:
                f.seek(offset)
                return f.read(max(0, min(max_bytes, cached.stat().st_size - offset)))
        pods = self._pods(ns, name)
        if not pods:
            return b""
        data = self._pod_log(ns, pods[0], min(offset + max_bytes, _LOG_CAP))
        return data[offset: offset + max_bytes]

    def log_size(self, external_id: str) -> int:
        try:
            ns, name = self._split(external_id)
        except _NeverCreated:
            return 0
        cached = self._file(ns, name, ".log")
        if self._file(ns, name, ".end.json").exists() and cached.exists():
            return cached.stat().st_size
        return len(self.read_log(external_id, 0, _LOG_CAP))

    def stop(self, external_id: str, grace: float | None = None) -> None:
        try:
            ns, name = self._split(external_id)
        except _NeverCreated:
            return  # nothing reached the engine
        status, pods = self._poll(ns, name)  # (its pods, as the look that decided: not listed again)
        if status.ended:
            return  # over already (stop is idempotent): the ending stays its own
        seconds = None if grace is None else max(0, int(math.ceil(grace)))
        self._write(self._file(ns, name, ".stop.json"), json.dumps({"at": time.time(), "grace": seconds}).encode())
        self._delete(ns, name, seconds)  # (its pods that exist later are the garbage collector's, with their grace)
        for pod in pods:  # the pods too when our grace is shorter than what the garbage collector would use
            if seconds is None or seconds >= _grace_of(pod):
                continue  # a repeated delete cannot lengthen a grace; asking again gains nothing
            self._delete(ns, str((pod.get("metadata") or {}).get("name", "")), seconds, pod=True)

    def release(self, external_id: str) -> None:
        """The ledger has recorded the attempt's ending (kept in ``state_dir``): the Job goes. Also
        when the ending was "could not start" (the create timed out, yet the Job may exist): an
        attempt the ledger calls ended must not run beside its retry."""
        with contextlib.suppress(AutoresearchError):
            ns, name = self._split(external_id)
            self._delete(ns, name, 0)


class _NeverCreated(BackendError):
    """A run dir without a Job pointer: the launch died before the API call."""


GANG_PORT = 29500  # torchrun's default: each pod has its own network namespace, so it is free there


def _gang_env(body: dict[str, Any], name: str, nodes: int) -> None:
    """Rank and rendezvous of a gang (the torchrun contract, one pod per member): RANK = NODE_RANK =
    the pod's completion index, rank 0's pod (stable DNS through the headless Service) the master.
    They replace what the launching host set for them (its MASTER_ADDR and port mean nothing in a pod)."""
    container = body["spec"]["template"]["spec"]["containers"][0]
    index = {"fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}
    gang: list[dict[str, Any]] = [
        {"name": "AUTORESEARCH_NODES", "value": str(nodes)},
        {"name": "WORLD_SIZE", "value": str(nodes)},
        {"name": "MASTER_ADDR", "value": f"{name}-0.{name}"},
        {"name": "MASTER_PORT", "value": str(GANG_PORT)},
        {"name": "RANK", "valueFrom": index},
        {"name": "NODE_RANK", "valueFrom": index},
        {"name": "LOCAL_RANK", "value": "0"},
        {"name": "LOCAL_WORLD_SIZE", "value": "1"},
    ]
    names = {entry["name"] for entry in gang}
    container["env"] = [e for e in container.get("env") or [] if e.get("name") not in names] + gang


def _grace_of(pod: dict[str, Any]) -> int:
    """The grace a pod gets when deleted now: the one its deletion already has, else its spec's (default 30)."""
    meta, spec = pod.get("metadata"), pod.get("spec")
    for value in ((meta if isinstance(meta, dict) else {}).get("deletionGracePeriodSeconds"),
                  (spec if isinstance(spec, dict) else {}).get("terminationGracePeriodSeconds"), 30):
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return 30


def _load(path: Path) -> dict[str, Any] | None:
    return read_json(str(path))  # no links, no FIFOs, no garbage
