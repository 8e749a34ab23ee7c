"""A loopback fake of the Kubernetes API server, with a Job controller and a kubelet that run
each pod's container command as a real local process.

The backend (``autoresearch/backends/kubernetes.py``) talks to it over HTTP on 127.0.0.1, so
BackendConformance's ``/bin/sh`` and python programs really run: their exit codes, signals
and logs are real. Objects are built from the recorded shapes in ``recorded/k8s_*.json``
(the API reference's Job and Pod); errors are ``Status`` objects like the API's.

Implemented: ``GET /version``; Jobs: create (201, 409 AlreadyExists, 422 Invalid), get,
merge-patch (annotations, ``spec.suspend``), delete (DeleteOptions; Background propagation
deletes the pods); Pods: list by ``labelSelector=k=v``, delete with ``gracePeriodSeconds``
(SIGTERM once, SIGKILL after the grace; a repeat only shortens it), ``/log`` with ``limitBytes``; Services: create.
``activeDeadlineSeconds`` fails the Job with ``DeadlineExceeded``; ``backoffLimit`` 0 fails it
on the first failed pod (``BackoffLimitExceeded``); an Indexed Job runs ``completions`` pods.

Every created object and DeleteOptions body is checked as a real server of ``version`` would
(``k8s_schema.problems``: the published schema, strict, and the server's name, label, env and
quantity rules) and answered 422 Invalid when refused, where ``kubernetes-validate`` is installed.

Faults: ``token`` (401 without it), ``forbid`` (403), ``reject`` (the next create answers 422
with that message), ``drop_create_answer`` (the next create is made but never answered), ``evict(pod)``, ``suspend(job)`` (what Kueue does to preempt).
A deleted pod stays visible ``linger`` seconds after its process ended, as a terminated pod
stays until the kubelet and the Job controller have let it go.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import threading
import time
import uuid
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from tests.fakes.k8s_schema import kubernetes_validate, problems

RECORDED = Path(__file__).parent / "recorded"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _shape(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((RECORDED / f"{name}.json").read_text())
    data.pop("_source", None)
    return data


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


class Pod:
    def __init__(self, server: FakeKubernetes, job: dict[str, Any], index: int, log_dir: Path) -> None:
        self.server, self.job = server, job
        meta = job["metadata"]
        self.name = f"{meta['name']}-{index}-{uuid.uuid4().hex[:5]}"
        self.index = index
        self.log = log_dir / f"{self.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.ended_at: float | None = None
        self.deleting = False
        self.kill_at: float | None = None  # monotonic time of the SIGKILL once deletion began
        self.timer: threading.Timer | None = None
        self.obj = _shape("k8s_pod")
        m = self.obj["metadata"]
        labels = {**job["spec"]["template"]["metadata"].get("labels", {}), "job-name": meta["name"],
                  "batch.kubernetes.io/job-name": meta["name"], "controller-uid": meta["uid"],
                  "batch.kubernetes.io/controller-uid": meta["uid"]}
        annotations = {}
        if job["spec"].get("completionMode") == "Indexed":
            labels["batch.kubernetes.io/job-completion-index"] = str(index)
            annotations["batch.kubernetes.io/job-completion-index"] = str(index)
        m.update(name=self.name, generateName=f"{meta['name']}-{index}-", namespace=meta["namespace"],
                 uid=str(uuid.uuid4()), creationTimestamp=_now(), labels=labels, annotations=annotations)
        m["ownerReferences"][0].update(name=meta["name"], uid=meta["uid"])
        self.obj["spec"] = copy.deepcopy(job["spec"]["template"]["spec"])
        self.obj["spec"]["nodeName"] = "fake-node-1"
        container = self.obj["spec"]["containers"][0]
        self.obj["status"]["containerStatuses"] = [{
            "name": container["name"], "image": container.get("image", ""), "imageID": "", "ready": False,
            "restartCount": 0, "started": False, "state": {"waiting": {"reason": "ContainerCreating"}},
            "lastState": {}}]

    @property
    def phase(self) -> str:
        return str(self.obj["status"]["phase"])

    def run(self) -> None:
        container = self.obj["spec"]["containers"][0]
        env = dict(os.environ)
        for item in container.get("env", []):
            if "value" in item:
                env[item["name"]] = item["value"]
            elif "secretKeyRef" in item.get("valueFrom", {}):  # a Secret of the Job's namespace
                ref = item["valueFrom"]["secretKeyRef"]
                value = self.server.secrets.get((self.job["metadata"]["namespace"], ref["name"]), {}).get(ref["key"])
                if value is None:
                    self.obj["status"]["containerStatuses"][0]["state"] = {"waiting": {
                        "reason": "CreateContainerConfigError", "message": f'secret "{ref["name"]}" not found'}}
                    return
                env[item["name"]] = value
            elif "valueFrom" in item:  # fieldRef on the completion index annotation
                env[item["name"]] = str(self.index)
        if container.get("image") == self.server.unpullable:
            self.obj["status"]["containerStatuses"][0]["state"] = {"waiting": {
                "reason": "ImagePullBackOff", "message": f'Back-off pulling image "{container["image"]}"'}}
            return
        self.log.parent.mkdir(parents=True, exist_ok=True)
        out = self.log.open("wb")
        started = _now()
        try:
            self.proc = subprocess.Popen(container["command"], cwd=container.get("workingDir") or None, env=env,
                                         stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        except OSError as err:  # what containerd reports when the entrypoint cannot be exec'd
            out.close()
            self._finish({"exitCode": 128, "reason": "StartError", "startedAt": started, "finishedAt": _now(),
                          "message": f"exec: {err.strerror}: {container['command'][0]}"})
            return
        out.close()
        st = self.obj["status"]
        st.update(phase="Running", startTime=started, conditions=[{"type": "Ready", "status": "True"}])
        st["containerStatuses"][0].update(ready=True, started=True, state={"running": {"startedAt": started}},
                                          containerID=f"containerd://{uuid.uuid4().hex}")
        threading.Thread(target=self._wait, daemon=True).start()

    def _wait(self) -> None:
        assert self.proc is not None
        code = self.proc.wait()
        term: dict[str, Any] = {"startedAt": self.obj["status"].get("startTime"), "finishedAt": _now()}
        if code < 0:  # the runtime reports a death by signal N as exit code 128 + N
            term.update(exitCode=128 - code, reason="Error")
            if -code == signal.SIGKILL and self.server.oom_next:
                term["reason"] = "OOMKilled"
        else:
            term.update(exitCode=code, reason="Completed" if code == 0 else "Error")
        with self.server.lock:
            self._finish(term)

    def _finish(self, term: dict[str, Any]) -> None:
        st = self.obj["status"]
        st["phase"] = "Succeeded" if term["exitCode"] == 0 else "Failed"
        st["containerStatuses"][0].update(ready=False, started=False, state={"terminated": term})
        self.ended_at = time.monotonic()

    def kill(self, grace: int) -> None:
        """Graceful deletion: SIGTERM now, SIGKILL after ``grace`` seconds. A repeated delete of a
        terminating pod only ever shortens its grace (the API server keeps the smaller
        ``deletionGracePeriodSeconds``) and never signals it again: the kubelet and containerd send
        the stop signal once, a shorter grace only brings the SIGKILL forward."""
        grace = max(0, int(grace))
        deadline = time.monotonic() + grace
        if self.deleting:
            if self.kill_at is not None and deadline >= self.kill_at:
                return  # the same or a longer grace: nothing changes
            self.obj["metadata"]["deletionGracePeriodSeconds"] = grace
        else:
            self.deleting = True
            self.obj["metadata"].update(deletionTimestamp=_now(), deletionGracePeriodSeconds=grace)
        first = self.kill_at is None
        self.kill_at = deadline
        proc = self.proc
        if proc is None or proc.poll() is not None:
            if self.ended_at is None:
                self._finish({"exitCode": 137, "reason": "ContainerStatusUnknown", "finishedAt": _now()})
            return
        if self.timer is not None:
            self.timer.cancel()
        if grace <= 0:
            with_signal(proc, signal.SIGKILL)
            return
        if first:
            with_signal(proc, signal.SIGTERM)
        self.timer = threading.Timer(grace, with_signal, (proc, signal.SIGKILL))
        self.timer.daemon = True
        self.timer.start()


def with_signal(proc: subprocess.Popen[bytes], sig: int) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


class FakeKubernetes:
    """``with FakeKubernetes(tmp_path) as k8s: KubernetesBackend(api=k8s.url, ...)``."""

    def __init__(self, root: Path, token: str = "", linger: float = 30.0, version: str = "1.30.0") -> None:
        self.root, self.token, self.linger, self.version = Path(root), token, linger, version
        self.lock = threading.RLock()
        self.jobs: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods: dict[tuple[str, str], Pod] = {}
        self.services: dict[tuple[str, str], dict[str, Any]] = {}
        self.secrets: dict[tuple[str, str], dict[str, str]] = {}  # (namespace, Secret) -> key -> value
        self.requests: list[tuple[str, str, Any]] = []  # (method, path, body) of every call
        self.forbid = False
        self.reject = ""
        self.unpullable = ""
        self.oom_next = False
        self.drop_create_answer = False
        self.creates = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._ticker = threading.Thread(target=self._tick_forever, daemon=True)
        self._stop = threading.Event()

    def __enter__(self) -> FakeKubernetes:
        self._thread.start()
        self._ticker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()
        with self.lock:
            for pod in self.pods.values():
                if pod.proc is not None:
                    with_signal(pod.proc, signal.SIGKILL)

    # -- faults and test views -------------------------------------------------------------

    def suspend(self, namespace: str, name: str) -> None:
        """What Kueue does to preempt a workload: ``spec.suspend = true``, its pods deleted."""
        with self.lock:
            job = self.jobs[(namespace, name)]
            job["spec"]["suspend"] = True
            self._delete_pods(namespace, name, None)

    def evict(self, pod_name: str, namespace: str = "default") -> None:
        with self.lock:
            pod = self.pods[(namespace, pod_name)]
            if pod.proc is not None:
                with_signal(pod.proc, signal.SIGKILL)
            pod.obj["status"].update(phase="Failed", reason="Evicted",
                                     message="The node was low on resource: memory.")

    def pods_of(self, namespace: str, job: str) -> list[Pod]:
        with self.lock:
            return [p for (ns, _), p in self.pods.items() if ns == namespace and p.job["metadata"]["name"] == job]

    # -- the controllers ---------------------------------------------------------------------

    def _tick_forever(self) -> None:
        while not self._stop.wait(0.05):
            with self.lock:
                self._tick()

    def _tick(self) -> None:
        now = time.monotonic()
        for key, pod in list(self.pods.items()):  # the kubelet lets a deleted pod go once it ended
            if pod.deleting and pod.ended_at is not None and now - pod.ended_at > self.linger:
                del self.pods[key]
        for (_ns, _name), job in self.jobs.items():
            spec, st = job["spec"], job["status"]
            if spec.get("suspend") or any(c["type"] in ("Complete", "Failed") for c in st.get("conditions", [])):
                continue
            pods = [p for p in self.pods.values() if p.job is job]
            deadline = spec.get("activeDeadlineSeconds")
            if deadline and "_started" in job and now - job["_started"] > deadline:
                self._fail(job, pods, "DeadlineExceeded", "Job was active longer than specified deadline")
                continue
            failed = [p for p in pods if p.phase == "Failed"]
            if failed:
                self._fail(job, pods, "BackoffLimitExceeded", "Job has reached the specified backoff limit")
                continue
            if len([p for p in pods if p.phase == "Succeeded"]) >= spec.get("completions", 1):
                self._conditions(job, "Complete", "", "")
            self._status(job, pods)

    def _fail(self, job: dict[str, Any], pods: list[Pod], reason: str, message: str) -> None:
        for pod in pods:
            if pod.phase not in ("Succeeded", "Failed"):
                pod.kill(int(pod.obj["spec"].get("terminationGracePeriodSeconds", 30)))
        if all(p.phase in ("Succeeded", "Failed") for p in pods):  # terminal only once its pods are
            self._conditions(job, "Failed", reason, message)
        else:
            self._conditions(job, "FailureTarget", reason, message)
        self._status(job, pods)

    @staticmethod
    def _conditions(job: dict[str, Any], kind: str, reason: str, message: str) -> None:
        conds = job["status"].setdefault("conditions", [])
        if not any(c["type"] == kind for c in conds):
            conds.append({"type": kind, "status": "True", "reason": reason, "message": message,
                          "lastProbeTime": _now(), "lastTransitionTime": _now()})
            if kind in ("Complete", "Failed"):
                job["status"]["completionTime" if kind == "Complete" else "_failedAt"] = _now()

    @staticmethod
    def _status(job: dict[str, Any], pods: list[Pod]) -> None:
        st = job["status"]
        st["active"] = len([p for p in pods if p.phase in ("Pending", "Running")])
        st["succeeded"] = len([p for p in pods if p.phase == "Succeeded"])
        st["failed"] = len([p for p in pods if p.phase == "Failed"])
        st["ready"] = len([p for p in pods if p.phase == "Running"])
        st["terminating"] = len([p for p in pods if p.deleting and p.ended_at is None])
        if job["spec"].get("completionMode") == "Indexed":
            st["completedIndexes"] = ",".join(str(p.index) for p in pods if p.phase == "Succeeded")
        for key in [k for k, v in st.items() if v in (0, "")]:
            del st[key]  # the API leaves zero counters out

    def _start_pods(self, job: dict[str, Any]) -> None:
        job["_started"] = time.monotonic()
        job["status"]["startTime"] = _now()
        for index in range(int(job["spec"].get("parallelism", 1))):
            pod = Pod(self, job, index, self.root / "pods")
            self.pods[(job["metadata"]["namespace"], pod.name)] = pod
            pod.run()

    def _delete_pods(self, ns: str, job_name: str, grace: int | None) -> None:
        for pod in self.pods.values():
            if pod.job["metadata"]["namespace"] == ns and pod.job["metadata"]["name"] == job_name:
                pod.kill(grace if grace is not None else int(pod.obj["spec"].get("terminationGracePeriodSeconds", 30)))

    # -- HTTP ----------------------------------------------------------------------------------

    def handle(self, method: str, path: str, query: dict[str, str], body: Any) -> tuple[int, Any]:
        if method == "DELETE" and body is None and ({"gracePeriodSeconds", "propagationPolicy"} & set(query)):
            body = {"kind": "DeleteOptions", "apiVersion": "v1"}  # the API takes DeleteOptions as query parameters too
            if "propagationPolicy" in query:
                body["propagationPolicy"] = query["propagationPolicy"]
            if "gracePeriodSeconds" in query:
                body["gracePeriodSeconds"] = int(query["gracePeriodSeconds"]) if query["gracePeriodSeconds"].isdigit() \
                    else query["gracePeriodSeconds"]
        self.requests.append((method, path, body))
        parts = path.strip("/").split("/")
        if path == "/version":
            major, minor, _ = self.version.split(".")
            return 200, {"major": major, "minor": minor, "gitVersion": f"v{self.version}", "platform": "linux/amd64"}
        if self.forbid:
            return 403, status(403, "Forbidden", f'jobs.batch is forbidden: User "system:serviceaccount:ns:x" '
                                                 f'cannot {method.lower()} resource at {path}')
        if method in ("POST", "DELETE") and isinstance(body, dict) and body and kubernetes_validate is not None:
            refused = problems(body, self.version, delete=method == "DELETE")  # the published schema and the server's own checks
            if refused:
                kind, name = body.get("kind", "Object"), (body.get("metadata") or {}).get("name", "")
                return 422, status(422, "Invalid", f'{kind} "{name}" is invalid: {"; ".join(refused)[:2000]}')
        with self.lock:
            if parts[:3] == ["apis", "batch", "v1"] and len(parts) >= 6 and parts[5] == "jobs":
                return self._jobs(method, parts[4], parts[6] if len(parts) > 6 else "", body)
            if parts[:2] == ["api", "v1"] and len(parts) >= 5 and parts[4] == "pods":
                return self._pods(method, parts[3], parts[5:], query, body)
            if parts[:2] == ["api", "v1"] and len(parts) >= 5 and parts[4] == "services" and method == "POST":
                key = (parts[3], body["metadata"]["name"])
                if key in self.services:
                    return 409, status(409, "AlreadyExists", f'services "{key[1]}" already exists')
                self.services[key] = body
                return 201, body
        return 404, status(404, "NotFound", "the server could not find the requested resource")

    def _jobs(self, method: str, ns: str, name: str, body: Any) -> tuple[int, Any]:
        if method == "POST":
            name = str(((body or {}).get("metadata") or {}).get("name") or "")
            if self.reject:
                message, self.reject = self.reject, ""
                return 422, status(422, "Invalid", f'Job.batch "{name}" is invalid: {message}')
            containers = (((body.get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers") or []
            if not containers or not containers[0].get("image"):
                return 422, status(422, "Invalid", f'Job.batch "{name}" is invalid: '
                                                   "spec.template.spec.containers[0].image: Required value")
            if (ns, name) in self.jobs:
                return 409, status(409, "AlreadyExists", f'jobs.batch "{name}" already exists')
            job = _shape("k8s_job")
            job["metadata"].update(copy.deepcopy(body["metadata"]), namespace=ns, uid=str(uuid.uuid4()),
                                   creationTimestamp=_now())
            job["spec"].update(copy.deepcopy(body["spec"]))
            job["spec"]["selector"]["matchLabels"]["batch.kubernetes.io/controller-uid"] = job["metadata"]["uid"]
            self.jobs[(ns, name)] = job
            self.creates += 1
            if not job["spec"].get("suspend"):
                self._start_pods(job)
            return 201, self._public(job)
        job = self.jobs.get((ns, name))
        if job is None:
            return 404, status(404, "NotFound", f'jobs.batch "{name}" not found')
        if method == "GET":
            return 200, self._public(job)
        if method == "PATCH":
            annotations = ((body or {}).get("metadata") or {}).get("annotations") or {}
            job["metadata"].setdefault("annotations", {}).update(annotations)
            return 200, self._public(job)
        if method == "DELETE":
            del self.jobs[(ns, name)]
            if (body or {}).get("propagationPolicy", "Background") != "Orphan":
                self._delete_pods(ns, name, None)  # the garbage collector: each pod with its own grace
            return 200, status(200, "", "") | {"status": "Success"}
        return 405, status(405, "MethodNotAllowed", method)

    def _pods(self, method: str, ns: str, rest: list[str], query: dict[str, str], body: Any) -> tuple[int, Any]:
        if not rest and method == "GET":
            key, _, value = query.get("labelSelector", "").partition("=")
            items = [p.obj for (pns, _), p in self.pods.items()
                     if pns == ns and (not key or p.obj["metadata"]["labels"].get(key) == value)]
            return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": copy.deepcopy(items)}
        pod = self.pods.get((ns, rest[0])) if rest else None
        if pod is None:
            return 404, status(404, "NotFound", f'pods "{rest[0] if rest else ""}" not found')
        if len(rest) == 2 and rest[1] == "log" and method == "GET":
            if not pod.log.exists():
                return 400, status(400, "BadRequest", f'container "main" in pod "{pod.name}" is waiting to start: '
                                                      "ContainerCreating")
            data = pod.log.read_bytes()
            limit = query.get("limitBytes")
            return 200, data[: int(limit)] if limit else data
        if method == "DELETE":
            grace = (body or {}).get("gracePeriodSeconds", query.get("gracePeriodSeconds"))
            pod.kill(int(grace) if grace is not None else int(pod.obj["spec"].get("terminationGracePeriodSeconds", 30)))
            return 200, copy.deepcopy(pod.obj)
        return 405, status(405, "MethodNotAllowed", method)

    @staticmethod
    def _public(job: dict[str, Any]) -> dict[str, Any]:
        out = copy.deepcopy(job)
        out["status"] = {k: v for k, v in out["status"].items() if not k.startswith("_")}
        out.pop("_started", None)
        return out

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _serve(self, method: str) -> None:
                url = urlparse(self.path)
                query = {k: v[-1] for k, v in parse_qs(url.query).items()}
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                if method == "POST" and url.path.endswith("/jobs") and fake.drop_create_answer:
                    fake.drop_create_answer = False
                    fake.handle(method, url.path, query, json.loads(raw))
                    self.close_connection = True  # made, but the client never hears so (a timeout, a reset)
                    return
                if fake.token and self.headers.get("Authorization") != f"Bearer {fake.token}":
                    code, payload = 401, status(401, "Unauthorized", "Unauthorized")
                else:
                    try:
                        body = json.loads(raw) if raw else None
                    except ValueError:
                        body = None
                    code, payload = fake.handle(method, url.path, query, body)
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "text/plain" if isinstance(payload, bytes) else "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802 - the http.server API
                self._serve("GET")

            def do_POST(self) -> None:  # noqa: N802
                self._serve("POST")

            def do_PATCH(self) -> None:  # noqa: N802
                self._serve("PATCH")

            def do_DELETE(self) -> None:  # noqa: N802
                self._serve("DELETE")

        return Handler
