"""The Databricks AI Runtime backend (kind ``databricks``): one AI Runtime run per attempt.

Speaks to the workspace through Databricks' own SDK (``databricks-sdk``, an optional dependency:
``pip install 'autoresearch[databricks]'``): the request is built from its types
(``SubmitTask`` with an ``AiRuntimeTask``: ``DeploymentSpec``, ``ComputeSpec``, the enums of
accelerator types and priority classes), so what the SDK cannot express is refused here, not by
the workspace. Tested against a local HTTP fake of the REST endpoints that decodes every payload
with the SDK's own types (``tests/fakes/databricks_api.py``); not yet exercised against a live
workspace. What each attempt does:

* The code is shipped: the attempt's workdir as a tar.gz (symlinks kept as links, ``.git`` and
  ``__pycache__`` left out), content-addressed, through the workspace files API (at most 10 MB,
  under ``workspace_dir``, by default the caller's ``/Users/<name>/.autoresearch``) or, with ``code_volume``, the Files API into a Unity Catalog volume
  (at most 1 GB). A script (``command_path``) unpacks it into a fresh folder on each node, goes
  there and runs the command; no path of the submitter's machine is used on the node.
* ``jobs.submit(run_name, idempotency_token=<attempt key>, tasks=[SubmitTask(ai_runtime_task=...)])``:
  the key makes a repeated submit (a submitter killed before the ledger had the run id) return
  the run already made. ``compute.accelerator_count`` is the accelerator type's GPUs per node x
  nodes, checked against what the job asks per node (a clear error with a hint).
* State from ``jobs.get_run`` (``status``, else the legacy ``state``); logs from
  ``jobs.get_run_output`` of the task's run; ``jobs.cancel_run`` to stop (the engine's grace).
  The exit code travels as the script's last log line (``autoresearch-exit: N``), taken out of
  the log the user reads. A timeout is ``timeout -k GRACE T`` in the script (124/137: timed out).
* Secrets (``secret_env``) are the task's environment variables as ``{{secrets/SCOPE/KEY}}``
  references, resolved by Databricks; everything else the job sends is exported by the script.
* ``places = False``: Databricks schedules.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import math
import os
import re
import shlex
import tarfile
import time
from pathlib import Path
from typing import Any

from autoresearch.backends._base import AttemptStatus, Backend, Capabilities, LaunchRequest, NodeInfo
from autoresearch.backends._env import sent_env
from autoresearch.backends._k8s_job import HOST_ONLY_ENV, owner_of
from autoresearch.backends._supervisor import read_json
from autoresearch.errors import AuthError, BackendError, SpecError

# The SDK's AiRuntimeTaskPriorityClass has BEST_EFFORT and NORMAL only: critical work runs NORMAL.
PRIORITY_CLASSES = {"critical": "NORMAL", "normal": "NORMAL", "best-effort": "BEST_EFFORT"}
AIR_PRIORITIES = ("BEST_EFFORT", "NORMAL")
POINTER = "databricks.json"
EXIT_MARK = "autoresearch-exit: "
INSTALL_HINT = ("pip install 'autoresearch[databricks]' (Databricks' SDK), and log in: databricks auth login "
                "--host https://<workspace>, or set the backend options host and token")
WORKSPACE_LIMIT = 10 << 20  # the workspace import API's limit
VOLUME_LIMIT = 1 << 30
_RUN_ID = re.compile(r"^[0-9]{1,19}$")  # a Jobs run id
_UC_IMAGE = re.compile(r"^[\w-]+\.[\w-]+\.[\w-]+(:[\w.-]+)?$")
_DOCKER_IMAGE = re.compile(r"^[a-z0-9][a-z0-9._-]*(/[a-z0-9][a-z0-9._-]*)+(:[\w.-]+)?$")
_UC_VOLUME = re.compile(r"^/Volumes/[^/\0]+/[^/\0]+/[^/\0]+(/[^\0]*)?$")
_WORKSPACE_DIR = re.compile(r"^/[^\0\n]{1,400}$")
_ACCELERATOR = re.compile(r"^GPU_(\d+)x[\w-]+$")
_STARTING = {"PENDING", "QUEUED", "SUBMITTED", "STARTING", "PROVISIONING", "SCHEDULED", "WAITING", "BLOCKED",
             "WAITING_FOR_RETRY", "CREATED"}
_OK = {"SUCCEEDED", "SUCCESS", "COMPLETED", "FINISHED"}
_CANCELLED = {"CANCELED", "CANCELLED", "KILLED", "USER_CANCELED"}
_ENDING = {"CANCELING", "CANCELLING", "TERMINATING"}  # still running: the ending is when it is over
_FAILED = {"FAILED", "ERROR", "TIMEDOUT", "TIMED_OUT"}
_LOST = {"INTERNAL_ERROR", "PREEMPTED", "LOST", "SKIPPED", "EVICTED", "CLOUD_FAILURE"}
_SKIP = {".git", "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache"}
_SECRET_PART = re.compile(r"^(?!\.{1,2}$)[A-Za-z0-9._-]{1,128}$")


def secret_ref(name: str, ref: str) -> str:
    """``{{secrets/SCOPE/KEY}}`` for ``ref`` = ``SCOPE/KEY``: Databricks resolves it on the node."""
    scope, _, key = ref.partition("/")
    if not _SECRET_PART.fullmatch(scope) or not _SECRET_PART.fullmatch(key):
        raise SpecError(f"secret_env {name}: {ref[:80]!r} is not a Databricks secret scope and key",
                        hint="write SCOPE/KEY (letters, digits, '-', '_', '.'; at most 128 each), e.g. "
                             "HF_TOKEN: ml-team/hf-token (databricks secrets put-secret ml-team hf-token)")
    return "{{secrets/" + scope + "/" + key + "}}"


def _sdk() -> Any:
    try:
        from databricks.sdk.service import jobs
    except ImportError:
        # A SpecError, as every missing extra (lightkube, ray): the setup's to fix, so an attempt is refused,
        # never retried as the machine's fault (runtime._start).
        raise SpecError("the databricks backend needs Databricks' SDK (databricks-sdk), which is not installed",
                        hint=INSTALL_HINT) from None
    return jobs


class DatabricksBackend(Backend):
    name = "databricks"
    capabilities = Capabilities(gpus=True, preemption=True, multi_node=True, containers=True, places=False,
                                shared_fs=False, secrets=True)

    def __init__(self, accelerator_type: str = "GPU_1xA10", pool_id: str = "", experiment: str = "autoresearch",
                 host: str = "", token: str = "", profile: str = "", workspace_dir: str = "",
                 code_volume: str = "", state_dir: str = "", timeout: float = 60.0,
                 priority_classes: dict[str, str] | None = None) -> None:
        priorities = tuple(PRIORITY_CLASSES)  # spec.PRIORITIES (spec imports pydantic: not on a status read)
        texts = dict(accelerator_type=accelerator_type, pool_id=pool_id, experiment=experiment, host=host,
                     token=token, profile=profile, workspace_dir=workspace_dir, code_volume=code_volume,
                     state_dir=state_dir)
        for what, value in texts.items():
            if not isinstance(value, str) or "\0" in value or "\n" in value:
                raise SpecError(f"databricks option {what} must be one line of text, got {str(value)[:80]!r}",
                                hint=f"write {what}: as a string")
        if not _ACCELERATOR.fullmatch(accelerator_type):
            raise SpecError(f"databricks option accelerator_type {accelerator_type[:80]!r} is not GPU_<n>x<model>",
                            hint="use the exact value from the workspace, e.g. GPU_8xH100 or GPU_1xA10")
        if workspace_dir and (not _WORKSPACE_DIR.fullmatch(workspace_dir) or ".." in workspace_dir.split("/")):
            raise SpecError(f"databricks option workspace_dir {workspace_dir[:80]!r} is not a workspace folder",
                            hint="an absolute workspace path, e.g. /Users/me@example.com/autoresearch")
        if code_volume and (not _UC_VOLUME.fullmatch(code_volume) or ".." in code_volume.split("/")):
            raise SpecError(f"databricks option code_volume {code_volume[:80]!r} is not a Unity Catalog volume path",
                            hint="/Volumes/<catalog>/<schema>/<volume>[/folder]")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or not 0 < timeout <= 600:
            raise SpecError(f"databricks option timeout must be seconds in (0, 600], got {timeout!r}",
                            hint="leave it out for 60 s")
        classes = dict(PRIORITY_CLASSES)
        if priority_classes is not None:
            if not isinstance(priority_classes, dict) or any(k not in priorities for k in priority_classes) or any(
                    str(v) not in AIR_PRIORITIES for v in priority_classes.values()):
                raise SpecError(f"databricks option priority_classes {str(priority_classes)[:120]!r} is not a map of "
                                "autoresearch priorities to BEST_EFFORT|NORMAL (the SDK's AiRuntimeTaskPriorityClass)",
                                hint="e.g. {normal: BEST_EFFORT}")
            classes.update({k: str(v) for k, v in priority_classes.items()})
        self.accelerator_type, self.pool_id, self.experiment = accelerator_type, pool_id, experiment
        self.per_node = int(_ACCELERATOR.fullmatch(accelerator_type).group(1))  # type: ignore[union-attr]
        self.host, self.token, self.profile, self.timeout = host, token, profile, float(timeout)
        self.workspace_dir, self.code_volume = workspace_dir.rstrip("/"), code_volume.rstrip("/")
        self.priority_classes = classes
        home = os.environ.get("AUTORESEARCH_HOME") or str(Path.home() / ".autoresearch")
        self.state_dir = Path(state_dir or Path(home) / "backends" / "databricks").expanduser()
        self._client: Any = None

    # -- the SDK ------------------------------------------------------------------------------

    @property
    def client(self) -> Any:
        if self._client is None:
            _sdk()
            from databricks.sdk import WorkspaceClient
            from databricks.sdk.config import Config

            options: dict[str, Any] = {"http_timeout_seconds": self.timeout,
                                       "retry_timeout_seconds": max(1, int(self.timeout))}
            for key in ("host", "token", "profile"):
                if getattr(self, key):
                    options[key] = getattr(self, key)
            try:
                self._client = WorkspaceClient(config=Config(**options))
            except Exception as err:  # the SDK's ValueError on no or half a configuration
                raise AuthError(f"no Databricks workspace is configured: {str(err)[:300]}", hint=INSTALL_HINT) from None
        return self._client

    def _call(self, what: str, fn: Any, *args: Any, **kw: Any) -> Any:
        from databricks.sdk.errors import DatabricksError, PermissionDenied, Unauthenticated

        try:
            return fn(*args, **kw)
        except (Unauthenticated, PermissionDenied) as err:
            raise AuthError(f"Databricks refused {what}: {str(err)[:300]}",
                            hint="log in again (databricks auth login --host https://<workspace>), or check the "
                                 "token and its permissions") from None
        except DatabricksError as err:
            raise BackendError(f"Databricks rejected {what}: {str(err)[:400]}",
                               hint="fix what Databricks names (accelerator_type, pool_id, image); "
                                    "see backends/databricks/README.md") from None
        except (OSError, ValueError, TimeoutError) as err:
            raise BackendError(f"{what} did not reach Databricks: {str(err)[:300]}",
                               hint="check the workspace is reachable (databricks auth describe)") from None

    # -- files --------------------------------------------------------------------------------

    def _file(self, run: str, suffix: str) -> Path:
        return self.state_dir / f"{run}{suffix}"

    @staticmethod
    def _write(path: Path, data: bytes) -> None:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_bytes(data)
        os.replace(tmp, path)

    def _run_id(self, external_id: str) -> str:
        """The run id; a run dir (the launcher died before the ledger had the id) is resolved by
        submitting its request again: its idempotency token makes Databricks answer with the run it made."""
        if os.path.isabs(str(external_id)):
            pointer = _load(Path(external_id) / POINTER)
            if not pointer or not pointer.get("key"):
                raise _NeverSubmitted(f"no run was recorded for run dir {str(external_id)[:200]!r}",
                                      hint="the launcher died before it reached Databricks; the attempt is retried")
            if pointer.get("run_id"):
                return str(pointer["run_id"])
            return self._submit(Path(external_id), pointer)
        if not _RUN_ID.match(str(external_id)):
            raise BackendError(f"{str(external_id)[:120]!r} is not a Databricks run id",
                               hint="the ledger's external id of a databricks attempt is its Jobs run id")
        return str(external_id)

    # -- the contract -----------------------------------------------------------------------

    def check(self, spec: Any) -> None:
        """Also refused at submit: no SDK, an image Databricks cannot run, a mount that is not a
        Unity Catalog volume, more GPUs per node than the accelerator type has."""
        super().check(spec)
        _sdk()
        mounts = getattr(spec, "mounts", None)
        probe = LaunchRequest(key="check", argv=["true"], env={}, workdir="/", log_path="", run_dir="",
                              image=str(getattr(spec, "image", "") or ""), gpus=int(getattr(spec, "gpus", 0) or 0),
                              nodes=int(getattr(spec, "nodes", 1) or 1),
                              mounts=dict(mounts) if isinstance(mounts, dict) else {},
                              secret_env=dict(getattr(spec, "secret_env", None) or {}))
        self.task(probe, "/check.sh")

    def nodes(self) -> list[NodeInfo]:
        return []

    def probe(self) -> None:
        self._call("the current user", self.client.current_user.me)

    def accelerators(self, request: LaunchRequest) -> int:
        """``accelerator_count``: whole nodes of the accelerator type, checked against the job's GPUs per node."""
        gpus, nodes = int(request.gpus), max(1, int(request.nodes))
        if gpus > self.per_node:
            fits = [f"nodes: {math.ceil(gpus * nodes / self.per_node)} with gpus: {self.per_node}"] \
                if (gpus * nodes) % self.per_node == 0 else []
            raise SpecError(f"the job asks {gpus} GPUs per node, and {self.accelerator_type} has {self.per_node} "
                            "per node", hint=f"ask gpus: {self.per_node} or fewer per node"
                            + (f" (e.g. {fits[0]})" if fits else "") + ", or a profile whose accelerator_type "
                            "has more GPUs per node (GPU_8xH100)")
        return self.per_node * nodes

    def start(self, request: LaunchRequest) -> str:
        run_dir = Path(request.run_dir)
        pointer = _load(run_dir / POINTER)
        if pointer and pointer.get("run_id"):
            return str(pointer["run_id"])
        owner = owner_of(request.env)
        key = f"autoresearch-{owner}-{request.key}"[:64]
        base = f"{self._folder()}/{owner}/{_safe(request.key)}"
        code = self._ship_code(request.workdir, owner)
        script = base + "/run.sh"
        self._upload(script, self.script(request, code).encode())
        task = self.task(request, script)
        pointer = {"key": key, "timeout": request.timeout, "task": task, "run_name": f"autoresearch {request.key}"}
        self._write(run_dir / POINTER, json.dumps(pointer).encode())  # write-ahead: the request before the submit
        return self._submit(run_dir, pointer)

    def _submit(self, run_dir: Path, pointer: dict[str, Any]) -> str:
        jobs = _sdk()
        task = jobs.SubmitTask.from_dict(pointer["task"])
        variables = pointer["task"].get("_variables")
        extra: dict[str, Any] = {}
        if variables:
            extra["environment_variables"] = [jobs.JobEnvironmentVariables(
                "autoresearch", spec=jobs.JobEnvironmentVariablesSpec(variables=variables))]
        waiter = self._call("the run's submission", self.client.jobs.submit, run_name=pointer["run_name"],
                            idempotency_token=pointer["key"], tasks=[task], **extra)
        bound = waiter.bind() if hasattr(waiter, "bind") else {}
        run = str(bound.get("run_id") or getattr(getattr(waiter, "response", None), "run_id", "") or "")
        if not _RUN_ID.match(run):
            raise BackendError(f"Databricks answered the submission without a run id ({run[:40]!r})",
                               hint="upgrade databricks-sdk")
        self._write(self._file(run, ".json"), json.dumps({"timeout": pointer.get("timeout")}).encode())
        self._write(run_dir / POINTER, json.dumps({**pointer, "run_id": run}).encode())
        return run

    def task(self, request: LaunchRequest, command_path: str) -> dict[str, Any]:
        """The ``SubmitTask`` for ``request`` as the SDK serializes it (built from the SDK's types:
        an accelerator type or priority class the SDK does not know is refused here)."""
        jobs = _sdk()
        try:
            accelerator = jobs.ComputeSpecAcceleratorType(self.accelerator_type)
        except ValueError:
            known = ", ".join(t.value for t in jobs.ComputeSpecAcceleratorType)
            raise SpecError(f"databricks option accelerator_type {self.accelerator_type!r} is not one Databricks' "
                            "SDK knows", hint=f"one of {known}") from None
        compute = jobs.ComputeSpec(accelerator_type=accelerator, accelerator_count=self.accelerators(request),
                                   provisioned_capacity_id=self.pool_id or None)
        air = jobs.AiRuntimeTask(experiment=self.experiment, deployments=[jobs.DeploymentSpec(
            compute=compute, command_path=command_path, name="main")])
        if self.pool_id:  # a priority class is refused on on-demand capacity
            air.priority_class = jobs.AiRuntimeTaskPriorityClass(self.priority_classes.get(request.priority, "NORMAL"))
        if request.image:
            if _UC_IMAGE.match(request.image):
                air.unity_catalog_image_path = request.image
            elif _DOCKER_IMAGE.match(request.image):
                air.docker_image_url = request.image
            else:
                raise SpecError(f"image {request.image[:80]!r} is neither a Unity Catalog image nor "
                                "<organization>/<repository>:<tag>",
                                hint="Databricks runs custom containers registered in Unity Catalog "
                                     "(<catalog>.<schema>.<image>:<tag>) or from a registry (org/repo:tag)")
        for target, source in sorted(request.mounts.items()):
            _volume_of(target, source)
        task = jobs.SubmitTask(task_key="main", ai_runtime_task=air, max_retries=0)
        out: dict[str, Any] = task.as_dict()
        secrets = {name: secret_ref(name, ref) for name, ref in sorted(request.secret_env.items())}
        if secrets:  # resolved by Databricks on the node: the request names the secret, never its value
            out["environment_variables_key"] = "autoresearch"
            out["_variables"] = secrets
        return out

    def script(self, request: LaunchRequest, code: str) -> str:
        """The script each node runs (``command_path``): the job's variables, its mounts as links to
        Unity Catalog volume paths, the shipped code unpacked, the command, its exit code as the last line."""
        asked = set(request.job_env)
        lines = ["#!/bin/bash", "# autoresearch attempt " + request.key.replace("\n", " ")]
        lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(sent_env(request).items())
                  if (k not in HOST_ONLY_ENV or k in asked) and k not in request.secret_env
                  and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k)]
        for target, source in sorted(request.mounts.items()):
            path = _volume_of(target, source)
            lines.append(f"mkdir -p {shlex.quote(os.path.dirname(target))} && ln -sfn {shlex.quote(path)} "
                         f"{shlex.quote(target)}")
        # On the node workspace files are under /Workspace; AUTORESEARCH_DATABRICKS_ROOT is empty there.
        where = code if code.startswith("/Volumes/") else "/Workspace" + code
        lines.append(f'code="${{AUTORESEARCH_DATABRICKS_ROOT:-}}"{shlex.quote(where)}')
        lines.append('dir=$(mktemp -d) && tar -xzf "$code" -C "$dir" && cd "$dir" || exit 1')
        argv = shlex.join(request.argv)
        if request.timeout:
            grace = max(1, int(math.ceil(request.grace)))
            argv = f"timeout -s TERM -k {grace} {max(1, int(math.ceil(request.timeout)))} {argv}"
        # In the background with a trap, so that a cancel's TERM (sent to the first process, as container
        # runtimes do) reaches the command and the shell outlives it to say its exit code; the second
        # `wait` returns the command's own status once the trap has interrupted the first.
        lines += [f"{argv} &", "child=$!", """trap 'kill -TERM "$child" 2>/dev/null' TERM""",
                  'wait "$child"; rc=$?', 'if [ "$rc" -gt 128 ]; then wait "$child"; rc=$?; fi',
                  f'echo "{EXIT_MARK}$rc"', 'exit "$rc"']
        return "\n".join(lines) + "\n"

    def _folder(self) -> str:
        """``workspace_dir``, by default the caller's own home folder (``/Users/<name>/.autoresearch``):
        the code and scripts are not for every user of the workspace to read, as ``/Shared`` is."""
        if not self.workspace_dir:
            me = self._call("the current user", self.client.current_user.me)
            name = str(getattr(me, "user_name", "") or "")
            if not name or "/" in name or "\0" in name or name in (".", ".."):
                raise BackendError(f"Databricks named the current user {name[:80]!r}: no home folder to use",
                                   hint="set workspace_dir: in the profile, e.g. /Users/me@example.com/autoresearch")
            self.workspace_dir = f"/Users/{name}/.autoresearch"
        return self.workspace_dir

    def _ship_code(self, workdir: str, owner: str) -> str:
        """Upload the workdir's archive (once per content); return its path in the workspace or volume."""
        data = _archive(workdir, VOLUME_LIMIT if self.code_volume else WORKSPACE_LIMIT)
        digest = hashlib.sha256(data).hexdigest()[:20]
        if self.code_volume:
            path = f"{self.code_volume}/autoresearch-code/{owner}/{digest}.tar.gz"
        else:
            path = f"{self._folder()}/{owner}/code/{digest}.tar.gz"
        marker = self.state_dir / "shipped" / hashlib.sha256(f"{self.host}|{self.profile}|{path}".encode()).hexdigest()
        if not marker.exists():
            self._upload(path, data)
            self._write(marker, b"")
        return path

    def _upload(self, path: str, data: bytes) -> None:
        if path.startswith("/Volumes/"):
            self._call(f"the upload of {path}", self.client.files.upload, path, io.BytesIO(data), overwrite=True)
            return
        from databricks.sdk.service.workspace import ImportFormat

        self._call(f"the folder {os.path.dirname(path)}", self.client.workspace.mkdirs, os.path.dirname(path))
        self._call(f"the upload of {path}", self.client.workspace.upload, path, data, format=ImportFormat.AUTO,
                   overwrite=True)

    def poll(self, external_id: str) -> AttemptStatus:
        try:
            run = self._run_id(external_id)
        except _NeverSubmitted as err:  # launches and passes hold the pass lock: nobody submits it now
            return AttemptStatus("lost", ended_at=time.time(), detail=err.message)
        ended = _load(self._file(run, ".end.json"))
        if ended is not None:
            return AttemptStatus(**ended)
        got = self._call(f"run {run}", self.client.jobs.get_run, int(run))
        answer = _answer(got.as_dict() if hasattr(got, "as_dict") else {})
        timeout = (_load(self._file(run, ".json")) or {}).get("timeout")
        if _interpret(answer, timeout).ended:
            log = self._output(run, got)
            code = _exit_code(log)
            if code is not None:
                answer["exit_code"] = code
            self._write(self._file(run, ".log"), _strip_mark(log))
        status = _interpret(answer, timeout)
        if status.ended:
            fields = {k: getattr(status, k) for k in AttemptStatus.__dataclass_fields__}
            self._write(self._file(run, ".end.json"), json.dumps(fields).encode())
        return status

    def _output(self, run: str, got: Any = None) -> bytes:
        """The task run's output (its stdout and stderr), b"" while there is none."""
        from databricks.sdk.errors import DatabricksError

        try:
            got = got if got is not None else self.client.jobs.get_run(int(run))
            tasks = list(getattr(got, "tasks", None) or [])
            task_run = getattr(tasks[0], "run_id", None) if tasks else None
            out = self.client.jobs.get_run_output(int(task_run or run))
        except (DatabricksError, OSError, ValueError):
            return b""
        return str(getattr(out, "logs", "") or "").encode()

    def read_log(self, external_id: str, offset: int = 0, max_bytes: int = 1 << 20) -> bytes:
        try:
            run = self._run_id(external_id)
        except _NeverSubmitted:
            return b""
        offset, max_bytes = max(0, int(offset)), max(0, int(max_bytes))
        cached = self._file(run, ".log")
        if self._file(run, ".end.json").exists() and cached.exists():
            with cached.open("rb") as f:
                f.seek(offset)
                return f.read(max(0, min(max_bytes, cached.stat().st_size - offset)))
        return _strip_mark(self._output(run))[offset: offset + max_bytes]

    def log_size(self, external_id: str) -> int:
        try:
            run = self._run_id(external_id)
        except _NeverSubmitted:
            return 0
        cached = self._file(run, ".log")
        if self._file(run, ".end.json").exists() and cached.exists():
            return cached.stat().st_size
        return len(_strip_mark(self._output(run)))

    def stop(self, external_id: str, grace: float | None = None) -> None:
        try:
            run = self._run_id(external_id)
        except _NeverSubmitted:
            return
        if self._file(run, ".end.json").exists():
            return  # over already (stop is idempotent): the ending stays its own
        # cancel_run returns at once (a waiter we do not wait on): the engine's own grace applies.
        self._call(f"the cancel of run {run}", self.client.jobs.cancel_run, int(run))

    def release(self, external_id: str) -> None:
        """The ledger has ended the attempt; a run it never saw end (its launch raised after the
        submit made it) is cancelled so that it never runs beside the retry."""
        with contextlib.suppress(BackendError):
            known = _load(Path(external_id) / POINTER) if os.path.isabs(str(external_id)) else {"run_id": external_id}
            run = str((known or {}).get("run_id") or "")
            if _RUN_ID.match(run) and not self._file(run, ".end.json").exists():
                self.stop(run)


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in text)[:80].strip(".") or "x"


def _volume_of(target: str, source: str) -> str:
    path = source[3:] if source.startswith("uc:") else ""
    if not _UC_VOLUME.match(path) or ".." in path.split("/") or not target.startswith("/") \
            or ".." in target.split("/"):
        raise SpecError(f"mount {target!r}: {source!r} is not a Unity Catalog volume path",
                        hint="mount /abs/target: uc:/Volumes/<catalog>/<schema>/<volume>[/path]")
    return path


def _archive(workdir: str, limit: int) -> bytes:
    """The workdir as a deterministic tar.gz (links kept as links, never followed); refused over ``limit``."""
    buf = io.BytesIO()
    total = 0
    # gzip's header holds a time: mtime=0, so the same content is the same archive (and name) at any second
    with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=6, mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w") as tar:
        for root, dirs, files in os.walk(workdir):
            dirs[:] = sorted(d for d in dirs if d not in _SKIP)
            for name in sorted(files):
                full = os.path.join(root, name)
                try:
                    info = tar.gettarinfo(full, arcname=os.path.relpath(full, workdir))
                except OSError:
                    continue  # vanished, or unreadable
                if not (info.isfile() or info.issym()):
                    continue  # no FIFOs, devices or sockets
                info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
                total += info.size
                if total > limit:
                    raise SpecError(f"the workdir {workdir[:120]!r} holds more than {limit >> 20} MB to ship",
                                    hint="set code_volume: /Volumes/<catalog>/<schema>/<volume> (up to 1 GB), or "
                                         "run from a folder with only the code (data goes in mounts)")
                if info.isfile():
                    with open(full, "rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
    return buf.getvalue()


def _exit_code(log: bytes) -> int | None:
    tail = log[-200:].decode("utf-8", "replace").rstrip("\n").rsplit("\n", 1)[-1]
    if tail.startswith(EXIT_MARK) and tail[len(EXIT_MARK):].isdigit():
        return int(tail[len(EXIT_MARK):])
    return None


def _strip_mark(log: bytes) -> bytes:
    body, _, last = log.rstrip(b"\n").rpartition(b"\n")
    if last.startswith(EXIT_MARK.encode()):
        return body + b"\n" if body else b""
    return log


def _answer(run: dict[str, Any]) -> dict[str, Any]:
    """A Jobs ``Run`` (as the SDK serializes it) as the words :func:`_interpret` reads."""
    status, state = run.get("status") or {}, run.get("state") or {}
    word = ""
    if status.get("state") == "TERMINATED":
        details = status.get("termination_details") or {}
        code, kind = str(details.get("code") or ""), str(details.get("type") or "")
        word = ("SUCCEEDED" if code == "SUCCESS" else "CANCELED" if code in ("CANCELED", "USER_CANCELED")
                else "TIMEDOUT" if "TIMEOUT" in code or "TIMED_OUT" in code
                else "INTERNAL_ERROR" if kind in ("INTERNAL_ERROR", "CLOUD_FAILURE") else "FAILED")
        message = details.get("message") or state.get("state_message") or ""
    elif status.get("state"):
        word, message = str(status["state"]), state.get("state_message") or ""
    else:
        word = str(state.get("result_state") or state.get("life_cycle_state") or "")
        message = state.get("state_message") or ""
    return {"state": word, "state_message": message}


class _NeverSubmitted(BackendError):
    """A run dir without a request: the launch died before the submit."""


def _load(path: Path) -> dict[str, Any] | None:
    return read_json(str(path))  # no links, no FIFOs, no garbage


def _word(data: dict[str, Any]) -> str:
    for key in ("result_state", "state", "status", "life_cycle_state"):
        value = data.get(key)
        if isinstance(value, dict):
            value = value.get("result_state") or value.get("state") or value.get("life_cycle_state")
        if isinstance(value, str) and value:
            return value.upper()
    return ""


def _interpret(data: dict[str, Any], timeout: Any) -> AttemptStatus:
    word = _word(data)
    message = str(data.get("state_message") or data.get("message") or "")[:300]
    raw = data.get("exit_code")
    code = raw if isinstance(raw, int) and not isinstance(raw, bool) else None
    if word in _STARTING or not word:
        return AttemptStatus("starting")
    if word == "RUNNING" or word in _ENDING:
        return AttemptStatus("running")
    if word not in _OK | _CANCELLED | _LOST | _FAILED:
        # A state this backend does not know: never call it an ending (a retry beside a run that
        # goes on would run the attempt twice); the job's timeout or a cancel still ends it.
        return AttemptStatus("running", detail=f"unknown Databricks state {word[:40]!r}")
    if word in _LOST:
        return AttemptStatus("lost", ended_at=time.time(), detail=f"Databricks: {word.lower()}: {message}".strip())
    stopped = word in _CANCELLED
    timed_out = word in ("TIMEDOUT", "TIMED_OUT") or (bool(timeout) and code in (124, 137))
    signal = None
    if code is not None and 128 < code <= 192 and (stopped or timed_out):
        signal, code = code - 128, None
    if word in _OK:
        code = 0 if code is None else code
    elif code is None and signal is None and not stopped:
        code = 1  # FAILED without an exit code
    if stopped and code is None and signal is None:
        signal = 15
    detail = "" if word in _OK else f"Databricks: {word.lower()}{': ' + message if message else ''}"
    return AttemptStatus("exited", exit_code=code, signal=signal, timed_out=timed_out, stopped=stopped,
                         ended_at=time.time(), detail=detail)
