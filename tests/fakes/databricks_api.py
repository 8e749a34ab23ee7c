"""A loopback fake of the Databricks REST endpoints the databricks backend calls through the SDK,
which decodes every payload with the SDK's own types and runs each run's script as a real local
process.

Endpoints: ``GET /api/2.0/preview/scim/v2/Me``; workspace ``mkdirs`` and ``import`` (base64, at
most 10 MB); ``PUT /api/2.0/fs/files/Volumes/...`` (the Files API); Jobs ``runs/submit``,
``runs/get``, ``runs/get-output``, ``runs/cancel`` (API 2.2). A submit is checked as the service
would: top-level and task fields the SDK knows and nothing else (``SubmitTask.from_dict(t).as_dict()
== t``), one AI Runtime deployment, an accelerator type and priority class from the SDK's enums,
``accelerator_count`` a positive multiple of the type's GPUs per node, a priority class only with
a pool, a ``command_path`` that was uploaded; a repeated ``idempotency_token`` returns the same run.
Workspace files live under ``root/Workspace``, volumes under ``root/Volumes``; a run's script
sees them through ``AUTORESEARCH_DATABRICKS_ROOT=root``. ``{{secrets/SCOPE/KEY}}`` variables are
resolved from ``secrets``. A cancel sends SIGTERM to the script's first process (as a container
runtime does), SIGKILL to all of the run's processes after ``grace``. Faults: ``token`` (401 for any other), ``forbid`` (403).
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

from databricks.sdk.service import jobs

SUBMIT_FIELDS = {"run_name", "idempotency_token", "tasks", "timeout_seconds", "environment_variables",
                 "environments", "git_source", "access_control_list", "budget_policy_id", "queue", "run_as",
                 "health", "notification_settings", "email_notifications", "webhook_notifications",
                 "usage_policy_id", "performance_target", "duration_target"}


def error(code: int, kind: str, message: str) -> tuple[int, dict[str, Any]]:
    return code, {"error_code": kind, "message": message}


class Run:
    def __init__(self, run_id: int, body: dict[str, Any], proc: subprocess.Popen[bytes], log: Path) -> None:
        self.run_id, self.body, self.proc, self.log = run_id, body, proc, log
        self.cancelled = False
        self.started = time.time()

    def as_run(self) -> dict[str, Any]:
        code = self.proc.poll()
        if code is None:
            life, status = ("TERMINATING" if self.cancelled else "RUNNING"), {"state": "RUNNING"}
            state: dict[str, Any] = {"life_cycle_state": life, "state_message": ""}
            if self.cancelled:
                status = {"state": "TERMINATING"}
        elif self.cancelled:
            state = {"life_cycle_state": "TERMINATED", "result_state": "CANCELED", "state_message": "cancelled"}
            status = {"state": "TERMINATED", "termination_details": {"code": "USER_CANCELED", "type": "SUCCESS",
                                                                     "message": "Run cancelled by the user"}}
        elif code == 0:
            state = {"life_cycle_state": "TERMINATED", "result_state": "SUCCESS", "state_message": ""}
            status = {"state": "TERMINATED", "termination_details": {"code": "SUCCESS", "type": "SUCCESS"}}
        else:
            state = {"life_cycle_state": "TERMINATED", "result_state": "FAILED",
                     "state_message": f"Command exited with code {code}"}
            status = {"state": "TERMINATED", "termination_details": {
                "code": "RUN_EXECUTION_ERROR", "type": "CLIENT_ERROR", "message": f"exited with code {code}"}}
        return {"run_id": self.run_id, "run_name": self.body.get("run_name", ""), "state": state, "status": status,
                "tasks": [{"task_key": "main", "run_id": self.run_id * 10, "state": state, "status": status}]}


class FakeDatabricks:
    """``with FakeDatabricks(tmp_path) as dbx: DatabricksBackend(host=dbx.url, token=dbx.token, ...)``."""

    def __init__(self, root: Path, token: str = "dapi-test", grace: float = 2.0) -> None:
        self.root, self.token, self.grace = Path(root), token, grace
        self.root.mkdir(parents=True, exist_ok=True)
        self.lock = threading.RLock()
        self.runs: dict[int, Run] = {}
        self.tokens: dict[str, int] = {}
        self.secrets: dict[str, str] = {}
        self.requests: list[tuple[str, str, Any]] = []
        self.forbid = False
        self._next = 1000
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> FakeDatabricks:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        for run in self.runs.values():
            if run.proc.poll() is None:
                os.killpg(run.proc.pid, signal.SIGKILL)
                run.proc.wait()

    def submits(self) -> list[dict[str, Any]]:
        return [b for m, p, b in self.requests if p.endswith("/jobs/runs/submit")]

    def file(self, path: str) -> Path:
        """Where a workspace (``/...``) or volume (``/Volumes/...``) path is stored."""
        inside = path if path.startswith("/Volumes/") else "/Workspace" + path
        target = (self.root / inside.lstrip("/")).resolve()
        if not str(target).startswith(str(self.root.resolve()) + os.sep):
            raise ValueError(f"{path!r} escapes the workspace")
        return target

    # -- the endpoints -------------------------------------------------------------------------

    def handle(self, method: str, path: str, query: dict[str, str], body: Any, raw: bytes,
               auth: str) -> tuple[int, Any]:
        self.requests.append((method, path, body))
        if path.startswith("/.well-known/"):
            return error(404, "NOT_FOUND", "no host metadata")  # the SDK asks; an older workspace has none
        if auth != f"Bearer {self.token}":
            return error(401, "UNAUTHENTICATED", "Invalid access token.")
        if self.forbid:
            return error(403, "PERMISSION_DENIED", "User does not have permission to run jobs.")
        if path == "/api/2.0/preview/scim/v2/Me":
            return 200, {"id": "1", "userName": "me@example.com"}
        if path == "/api/2.0/workspace/mkdirs" and method == "POST":
            self.file(body["path"]).mkdir(parents=True, exist_ok=True)
            return 200, {}
        if path == "/api/2.0/workspace/import" and method == "POST":
            data = body.pop("_content", None)  # multipart (the SDK's upload), else JSON with base64
            data = base64.b64decode(body.get("content", "")) if data is None else data
            if len(data) > 10 << 20:
                return error(400, "MAX_NOTEBOOK_SIZE_EXCEEDED", "File size imported is greater than 10 MB")
            target = self.file(body["path"])
            if target.exists() and not body.get("overwrite"):
                return error(400, "RESOURCE_ALREADY_EXISTS", f"{body['path']} already exists")
            if not target.parent.is_dir():
                return error(404, "RESOURCE_DOES_NOT_EXIST", f"The parent folder of {body['path']} does not exist")
            target.write_bytes(data)
            return 200, {}
        if path.startswith("/api/2.0/fs/files/Volumes/") and method == "PUT":
            target = self.file(unquote(path[len("/api/2.0/fs/files"):]))
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(raw)
            return 204, None
        if path == "/api/2.2/jobs/runs/submit" and method == "POST":
            return self._submit(body)
        if path == "/api/2.2/jobs/runs/get" and method == "GET":
            run = self.runs.get(int(query.get("run_id", "0")))
            return (200, run.as_run()) if run else error(400, "INVALID_PARAMETER_VALUE", "Run does not exist")
        if path == "/api/2.2/jobs/runs/get-output" and method == "GET":
            run = self.runs.get(int(query.get("run_id", "0")) // 10)
            if run is None:
                return error(400, "INVALID_PARAMETER_VALUE", "Run does not exist")
            return 200, {"logs": run.log.read_bytes().decode("utf-8", "replace") if run.log.exists() else "",
                         "logs_truncated": False, "metadata": run.as_run()}
        if path == "/api/2.2/jobs/runs/cancel" and method == "POST":
            run = self.runs.get(int(body.get("run_id", 0)))
            if run is None:
                return error(400, "INVALID_PARAMETER_VALUE", "Run does not exist")
            self._cancel(run)
            return 200, {}
        return error(404, "ENDPOINT_NOT_FOUND", f"No API found for '{method} {path}'")

    def _submit(self, body: dict[str, Any]) -> tuple[int, Any]:
        unknown = set(body) - SUBMIT_FIELDS
        if unknown:
            return error(400, "INVALID_PARAMETER_VALUE", f"Unknown fields {sorted(unknown)}")
        tasks = body.get("tasks") or []
        if len(tasks) != 1:
            return error(400, "INVALID_PARAMETER_VALUE", "one task")
        task = tasks[0]
        if jobs.SubmitTask.from_dict(task).as_dict() != task:
            return error(400, "INVALID_PARAMETER_VALUE", f"task fields the API does not know: {task}")
        air = task.get("ai_runtime_task")
        if not air or len(air.get("deployments") or []) != 1:
            return error(400, "INVALID_PARAMETER_VALUE", "an ai_runtime_task with exactly one deployment")
        compute = air["deployments"][0]["compute"]
        try:
            kind = jobs.ComputeSpecAcceleratorType(compute["accelerator_type"])
            if "priority_class" in air:
                jobs.AiRuntimeTaskPriorityClass(air["priority_class"])
        except (KeyError, ValueError) as err:
            return error(400, "INVALID_PARAMETER_VALUE", f"not a known value: {err}")
        per_node = int(re.match(r"GPU_(\d+)x", kind.value).group(1))  # type: ignore[union-attr]
        count = compute.get("accelerator_count")
        if not isinstance(count, int) or count <= 0 or count % per_node:
            return error(400, "INVALID_PARAMETER_VALUE", f"accelerator_count {count} is not a positive multiple "
                                                         f"of {per_node} ({kind.value})")
        if "priority_class" in air and not compute.get("provisioned_capacity_id"):
            return error(400, "INVALID_PARAMETER_VALUE", "priority_class needs a GPU pool")
        script = self.file(air["deployments"][0].get("command_path", "/missing"))
        if not script.is_file():
            return error(400, "RESOURCE_DOES_NOT_EXIST", "command_path does not exist")
        variables: dict[str, str] = {}
        for entry in body.get("environment_variables") or []:
            jobs.JobEnvironmentVariables.from_dict(entry)
            if entry["environment_variables_key"] == task.get("environment_variables_key"):
                variables.update((entry.get("spec") or {}).get("variables") or {})
        with self.lock:
            token = body.get("idempotency_token")
            if token and token in self.tokens:
                return 200, {"run_id": self.tokens[token]}
            self._next += 1
            run_id = self._next
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "AUTORESEARCH_DATABRICKS_ROOT": str(self.root)}
            for name, value in variables.items():
                ref = re.fullmatch(r"\{\{secrets/([^/]+)/([^}]+)\}\}", value)
                env[name] = self.secrets.get(f"{ref.group(1)}/{ref.group(2)}", "") if ref else value
            log = self.root / "runs" / f"{run_id}.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            with open(log, "wb") as out:
                proc = subprocess.Popen(["/bin/bash", str(script)], stdin=subprocess.DEVNULL, stdout=out,
                                        stderr=subprocess.STDOUT, env=env, cwd=str(self.root),
                                        start_new_session=True)
            self.runs[run_id] = Run(run_id, body, proc, log)
            if token:
                self.tokens[token] = run_id
        return 200, {"run_id": run_id}

    def _cancel(self, run: Run) -> None:
        if run.proc.poll() is not None or run.cancelled:
            return
        run.cancelled = True
        with _suppress():  # the script's first process only, as a container runtime signals PID 1
            os.kill(run.proc.pid, signal.SIGTERM)

        def later() -> None:
            try:
                run.proc.wait(timeout=self.grace)
            except subprocess.TimeoutExpired:
                with _suppress():
                    os.killpg(run.proc.pid, signal.SIGKILL)
        threading.Thread(target=later, daemon=True).start()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _do(self, method: str) -> None:
                url = urlparse(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body: Any = None
                kind = self.headers.get("Content-Type") or "application/json"
                if raw and kind.startswith("multipart/form-data"):
                    body = _form(kind, raw)
                elif raw and "json" in kind:
                    try:
                        body = json.loads(raw)
                    except ValueError:
                        body = None
                query = {k: v[-1] for k, v in parse_qs(url.query).items()}
                code, answer = fake.handle(method, url.path, query, body if body is not None else {}, raw,
                                           self.headers.get("Authorization") or "")
                data = json.dumps(answer).encode() if answer is not None else b""
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802
                self._do("GET")

            def do_POST(self) -> None:  # noqa: N802
                self._do("POST")

            def do_PUT(self) -> None:  # noqa: N802
                self._do("PUT")

        return Handler


def _form(content_type: str, raw: bytes) -> dict[str, Any]:
    """A multipart/form-data body: its text fields, and the ``content`` file as ``_content`` bytes."""
    from email.parser import BytesParser
    from email.policy import HTTP

    message = BytesParser(policy=HTTP).parsebytes(f"Content-Type: {content_type}\r\n\r\n".encode() + raw)
    out: dict[str, Any] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        data = part.get_payload(decode=True) or b""
        if name == "content":
            out["_content"] = data
        elif isinstance(name, str):
            value = data.decode()
            out[name] = value == "true" if name == "overwrite" else value
    return out


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return exc[0] is not None and issubclass(exc[0], OSError)  # type: ignore[arg-type]
