"""The Databricks AI Runtime backend (kind ``databricks``): one AIR workload per attempt.

Built from the documented interfaces and tested against recorded command lines with a fake
``databricks`` executable (``tests/fakes/databricks_cli.py``); not yet exercised against a
live workspace. What was used:

* ``databricks air run -f workload.yaml --idempotency-key K``, ``air get RUN``, ``air logs RUN``,
  ``air cancel RUN``, ``air list`` (the AIR CLI as summarized in the project's ANCHORS.md);
  ``-o json`` and ``--profile`` are the Databricks CLI's global flags.
* The workload YAML (docs.databricks.com .../ai-runtime/connecting/cli/yaml-config):
  ``experiment_name``, ``compute`` (``accelerator_type``, ``num_accelerators`` = GPUs per node x
  nodes, ``pool_id``, ``priority_class`` BEST_EFFORT|NORMAL|CRITICAL, which needs ``pool_id``),
  ``environment`` (``version``, or ``unity_catalog_image: <catalog>.<schema>.<image>:<tag>``, the
  custom container), ``command`` (one shell string), ``max_retries`` (0: the runtime retries).
* Not documented where we looked: the JSON ``air run``/``air get`` print. The parser accepts the
  run id as ``run_id``/``id``/``workload_id`` and the state as ``state``/``status``/
  ``life_cycle_state``/``result_state`` (a string or ``{"state": ...}``), the exit code as
  ``exit_code`` when present; see backends/databricks/README.md.

At most once (issue 9 item 4): the attempt key becomes the idempotency key, and the workload
file and key are written to the run dir before ``air run``; a launcher killed before the
ledger had the run id is adopted by re-sending the same key (Databricks returns the run it
already made). A timeout is ``timeout -k GRACE T`` around the command (exit 124/137 = timed
out); environment variables are exported by the command; mounts are links to Unity Catalog
volume paths (``uc:/Volumes/<catalog>/<schema>/<volume>[/path]``). ``cancel`` uses the engine's
own grace period (the CLI takes none). ``places = False``: Databricks schedules.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any

from autoresearch.backends._base import AttemptStatus, Backend, Capabilities, LaunchRequest, NodeInfo
from autoresearch.backends._env import sent_env
from autoresearch.backends._k8s_job import HOST_ONLY_ENV, owner_of
from autoresearch.backends._supervisor import read_json
from autoresearch.errors import AuthError, BackendError, SpecError

PRIORITY_CLASSES = {"critical": "CRITICAL", "normal": "NORMAL", "best-effort": "BEST_EFFORT"}
POINTER = "databricks.json"
INSTALL_HINT = ("install the Databricks CLI (https://docs.databricks.com/dev-tools/cli/install.html) and log in "
                "(databricks auth login --host https://<workspace>), or set the backend option cli")
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")  # never a flag
_UC_IMAGE = re.compile(r"^[\w-]+\.[\w-]+\.[\w-]+(:[\w.-]+)?$")
_UC_VOLUME = re.compile(r"^/Volumes/[^/\0]+/[^/\0]+/[^/\0]+(/[^\0]*)?$")
_STARTING = {"PENDING", "QUEUED", "SUBMITTED", "STARTING", "PROVISIONING", "SCHEDULED", "WAITING", "BLOCKED",
             "WAITING_FOR_RETRY", "CREATED"}
_OK = {"SUCCEEDED", "SUCCESS", "COMPLETED", "FINISHED"}
_CANCELLED = {"CANCELED", "CANCELLED", "KILLED", "CANCELING", "CANCELLING", "TERMINATING"}
_FAILED = {"FAILED", "ERROR", "TIMEDOUT", "TIMED_OUT"}
_LOST = {"INTERNAL_ERROR", "PREEMPTED", "LOST", "SKIPPED", "EVICTED"}
_LOG_CAP = 1 << 40
_SECRET_PART = re.compile(r"^(?!\.{1,2}$)[A-Za-z0-9._-]{1,128}$")


def secret_ref(name: str, ref: str) -> str:
    """``{{secrets/SCOPE/KEY}}`` for ``ref`` = ``SCOPE/KEY``: Databricks resolves it on the node."""
    scope, _, key = ref.partition("/")
    if not _SECRET_PART.fullmatch(scope) or not _SECRET_PART.fullmatch(key):
        raise SpecError(f"secret_env {name}: {ref[:80]!r} is not a Databricks secret scope and key",
                        hint="write SCOPE/KEY (letters, digits, '-', '_', '.'; at most 128 each), e.g. "
                             "HF_TOKEN: ml-team/hf-token (databricks secrets put-secret ml-team hf-token)")
    return "{{secrets/" + scope + "/" + key + "}}"


class DatabricksBackend(Backend):
    name = "databricks"
    capabilities = Capabilities(gpus=True, preemption=True, multi_node=True, containers=True, places=False,
                                shared_fs=False, secrets=True)

    def __init__(self, accelerator_type: str = "GPU_1xA10", pool_id: str = "", experiment: str = "autoresearch",
                 environment_version: str | int = "", profile: str = "", cli: str = "databricks",
                 state_dir: str = "", timeout: float = 60.0, priority_classes: dict[str, str] | None = None) -> None:
        priorities = tuple(PRIORITY_CLASSES)  # spec.PRIORITIES (spec imports pydantic: not on a status read)
        texts = dict(accelerator_type=accelerator_type, pool_id=pool_id, experiment=experiment, profile=profile,
                     cli=cli, state_dir=state_dir)
        for what, value in texts.items():
            if not isinstance(value, str) or "\0" in value:
                raise SpecError(f"databricks option {what} must be text, got {str(value)[:80]!r}",
                                hint=f"write {what}: as a string")
        if isinstance(environment_version, bool) or not isinstance(environment_version, (str, int)):
            raise SpecError(f"databricks option environment_version must be a number or a name, got "
                            f"{str(environment_version)[:80]!r}", hint="e.g. environment_version: 6")
        if not re.fullmatch(r"GPU_\d+x[\w-]+", str(accelerator_type)):
            raise SpecError(f"databricks option accelerator_type {str(accelerator_type)[:80]!r} is not GPU_<n>x<model>",
                            hint="use the exact value from the workspace, e.g. GPU_8xH100 or GPU_1xA10")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or not 0 < timeout <= 600:
            raise SpecError(f"databricks option timeout must be seconds in (0, 600], got {timeout!r}",
                            hint="leave it out for 60 s")
        classes = dict(PRIORITY_CLASSES)
        if priority_classes is not None:
            if not isinstance(priority_classes, dict) or any(k not in priorities for k in priority_classes) or any(
                    str(v) not in PRIORITY_CLASSES.values() for v in priority_classes.values()):
                raise SpecError(f"databricks option priority_classes {str(priority_classes)[:120]!r} is not a map of "
                                "autoresearch priorities to BEST_EFFORT|NORMAL|CRITICAL",
                                hint="e.g. {normal: BEST_EFFORT}")
            classes.update({k: str(v) for k, v in priority_classes.items()})
        try:
            self.cli = shlex.split(str(cli))
        except ValueError as err:
            raise SpecError(f"databricks option cli {str(cli)[:80]!r}: {err}", hint="a path to the databricks CLI") from None
        if not self.cli:
            raise SpecError("databricks option cli is empty", hint=INSTALL_HINT)
        self.accelerator_type, self.pool_id, self.experiment = str(accelerator_type), str(pool_id), str(experiment)
        self.environment_version, self.profile, self.timeout = environment_version, str(profile), float(timeout)
        self.priority_classes = classes
        home = os.environ.get("AUTORESEARCH_HOME") or str(Path.home() / ".autoresearch")
        self.state_dir = Path(state_dir or Path(home) / "backends" / "databricks").expanduser()

    # -- the CLI ------------------------------------------------------------------------------

    def _cli(self, *args: str, json_out: bool = False) -> str:
        argv = [*self.cli, *(["--profile", self.profile] if self.profile else []), "air", *args,
                *(["-o", "json"] if json_out else [])]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise BackendError(f"the databricks CLI {self.cli[0]!r} is not installed or not on PATH",
                               hint=INSTALL_HINT) from None
        except subprocess.TimeoutExpired:
            raise BackendError(f"`databricks air {args[0]}` did not answer within {self.timeout:g} s",
                               hint="check the workspace is reachable (databricks auth describe)") from None
        if done.returncode != 0:
            said = " ".join((done.stderr or done.stdout).strip().splitlines()[-3:])[:400] or f"exit {done.returncode}"
            if re.search(r"401|403|unauthori[sz]ed|authenticat|credentials|invalid access token|permission",
                         said, re.I):
                raise AuthError(f"Databricks refused `air {args[0]}`: {said}",
                                hint="log in again (databricks auth login --host https://<workspace>) or pick the "
                                     "right profile (backend option profile)")
            raise BackendError(f"Databricks rejected `air {args[0]}`: {said}",
                               hint="fix what Databricks names (accelerator_type, pool_id, image); "
                                    "see backends/databricks/README.md")
        return done.stdout

    def _json(self, *args: str) -> dict[str, Any]:
        out = self._cli(*args, json_out=True)
        try:
            data = json.loads(out)
        except ValueError:
            raise BackendError(f"`databricks air {args[0]}` printed no JSON: {out[:200]!r}",
                               hint="upgrade the Databricks CLI to one with the air commands") from None
        if not isinstance(data, dict):
            raise BackendError(f"`databricks air {args[0]}` printed {type(data).__name__}, not an object",
                               hint="upgrade the Databricks CLI")
        return data

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
        re-sending its idempotency key: Databricks answers with the run it already made."""
        if os.path.isabs(str(external_id)):
            pointer = _load(Path(external_id) / POINTER)
            if not pointer or not pointer.get("key"):
                raise _NeverSubmitted(f"no workload was recorded for run dir {str(external_id)[:200]!r}",
                                      hint="the launcher died before it reached Databricks; the attempt is retried")
            if pointer.get("run_id"):
                return str(pointer["run_id"])
            return self._submit(Path(external_id), str(pointer["key"]), pointer.get("timeout"))
        if not _RUN_ID.match(str(external_id)):
            raise BackendError(f"{str(external_id)[:120]!r} is not a Databricks run id",
                               hint="the ledger's external id of a databricks attempt is its AIR run id")
        return str(external_id)

    # -- the contract -----------------------------------------------------------------------

    def check(self, spec: Any) -> None:
        """Also refused at submit: no CLI, an image that is not a Unity Catalog image, a mount that
        is not a Unity Catalog volume path."""
        super().check(spec)
        import shutil

        if shutil.which(self.cli[0]) is None:  # not a network call: a missing CLI fails every attempt
            raise BackendError(f"the databricks CLI {self.cli[0]!r} is not installed or not on PATH",
                               hint=INSTALL_HINT)
        mounts = getattr(spec, "mounts", None)
        probe = LaunchRequest(key="check", argv=["true"], env={}, workdir="/", log_path="", run_dir="",
                              image=str(getattr(spec, "image", "") or ""),
                              mounts=dict(mounts) if isinstance(mounts, dict) else {})
        self.workload(probe)

    def nodes(self) -> list[NodeInfo]:
        return []

    def probe(self) -> None:
        self._cli("list", json_out=True)

    def start(self, request: LaunchRequest) -> str:
        workload = self.workload(request)
        key = f"autoresearch-{owner_of(request.env)}-{request.key}"[:64]
        run_dir = Path(request.run_dir)
        pointer = _load(run_dir / POINTER)
        if pointer and pointer.get("run_id"):
            return str(pointer["run_id"])
        import yaml  # only on a launch

        self._write(run_dir / "workload.yaml", yaml.safe_dump(workload, sort_keys=False).encode())
        self._write(run_dir / POINTER, json.dumps({"key": key, "timeout": request.timeout}).encode())
        return self._submit(run_dir, key, request.timeout)

    def _submit(self, run_dir: Path, key: str, timeout: Any) -> str:
        data = self._json("run", "-f", str(run_dir / "workload.yaml"), "--idempotency-key", key)
        run = str(data.get("run_id") or data.get("id") or data.get("workload_id") or "")
        if not _RUN_ID.match(run):
            raise BackendError(f"`databricks air run` printed no run id: {json.dumps(data)[:200]}",
                               hint="upgrade the Databricks CLI")
        self._write(self._file(run, ".json"), json.dumps({"timeout": timeout}).encode())
        self._write(run_dir / POINTER, json.dumps({"key": key, "timeout": timeout, "run_id": run}).encode())
        return run

    def workload(self, request: LaunchRequest) -> dict[str, Any]:
        """The workload YAML (as a mapping) for ``request``."""
        compute: dict[str, Any] = {"accelerator_type": self.accelerator_type,
                                   "num_accelerators": max(1, int(request.gpus)) * max(1, int(request.nodes))}
        if self.pool_id:
            compute["pool_id"] = self.pool_id
            compute["priority_class"] = self.priority_classes.get(request.priority, "NORMAL")
        environment: dict[str, Any] = {}
        if request.image:
            if not _UC_IMAGE.match(request.image):
                raise SpecError(f"image {request.image[:80]!r} is not a Unity Catalog image",
                                hint="Databricks runs custom containers registered in Unity Catalog: "
                                     "image: <catalog>.<schema>.<image>:<tag>")
            environment["unity_catalog_image"] = request.image
        elif self.environment_version != "":
            environment["version"] = self.environment_version
        out: dict[str, Any] = {"experiment_name": self.experiment, "compute": compute}
        if environment:
            out["environment"] = environment
        secrets = {name: secret_ref(name, ref) for name, ref in sorted(request.secret_env.items())}
        if secrets:  # resolved by Databricks on the node: the workload names the secret, never its value
            out["env_variables"] = secrets
        out.update(command=self.command(request), max_retries=0)
        return out

    @staticmethod
    def command(request: LaunchRequest) -> str:
        asked = set(request.job_env)
        lines = [f"export {k}={shlex.quote(v)}" for k, v in sorted(sent_env(request).items())
                 if (k not in HOST_ONLY_ENV or k in asked) and k not in request.secret_env
                 and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k)]
        for target, source in sorted(request.mounts.items()):
            path = source[3:] if source.startswith("uc:") else ""
            if not _UC_VOLUME.match(path) or ".." in path.split("/") or not target.startswith("/") \
                    or ".." in target.split("/"):
                raise SpecError(f"mount {target!r}: {source!r} is not a Unity Catalog volume path",
                                hint="mount /abs/target: uc:/Volumes/<catalog>/<schema>/<volume>[/path]")
            lines.append(f"mkdir -p {shlex.quote(os.path.dirname(target))} && ln -sfn {shlex.quote(path)} "
                         f"{shlex.quote(target)}")
        lines.append(f"cd {shlex.quote(request.workdir)} || exit 1")
        argv = shlex.join(request.argv)
        if request.timeout:
            grace = max(1, int(math.ceil(request.grace)))
            argv = f"timeout -s TERM -k {grace} {max(1, int(math.ceil(request.timeout)))} {argv}"
        lines.append(f"exec {argv}")
        return "\n".join(lines)

    def poll(self, external_id: str) -> AttemptStatus:
        try:
            run = self._run_id(external_id)
        except _NeverSubmitted as err:  # launches and passes hold the pass lock: nobody submits it now
            return AttemptStatus("lost", ended_at=time.time(), detail=err.message)
        ended = _load(self._file(run, ".end.json"))
        if ended is not None:
            return AttemptStatus(**ended)
        status = _interpret(self._json("get", run), (_load(self._file(run, ".json")) or {}).get("timeout"))
        if status.ended:
            with contextlib.suppress(BackendError):
                self._write(self._file(run, ".log"), self._cli("logs", run).encode())
            fields = {k: getattr(status, k) for k in AttemptStatus.__dataclass_fields__}
            self._write(self._file(run, ".end.json"), json.dumps(fields).encode())
        return status

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
        return self._cli("logs", run).encode()[offset: offset + max_bytes]

    def log_size(self, external_id: str) -> int:
        try:
            run = self._run_id(external_id)
        except _NeverSubmitted:
            return 0
        cached = self._file(run, ".log")
        if self._file(run, ".end.json").exists() and cached.exists():
            return cached.stat().st_size
        return len(self._cli("logs", run).encode())

    def stop(self, external_id: str, grace: float | None = None) -> None:
        try:
            run = self._run_id(external_id)
        except _NeverSubmitted:
            return
        if self._file(run, ".end.json").exists():
            return  # over already (stop is idempotent): the ending stays its own
        # Detached, so stop() never waits on a network round trip; what the CLI says is kept beside the run.
        log = self._file(run, ".cancel.log")
        log.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        argv = [*self.cli, *(["--profile", self.profile] if self.profile else []), "air", "cancel", run]
        with log.open("ab") as out:
            try:
                subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
            except OSError:
                raise BackendError(f"the databricks CLI {self.cli[0]!r} cannot be run", hint=INSTALL_HINT) from None


    def release(self, external_id: str) -> None:
        """The ledger has ended the attempt; a run it never saw end (its launch raised after
        ``air run`` made it) is cancelled so that it never runs beside the retry."""
        with contextlib.suppress(BackendError):
            known = _load(Path(external_id) / POINTER) if os.path.isabs(str(external_id)) else {"run_id": external_id}
            run = str((known or {}).get("run_id") or "")
            if _RUN_ID.match(run) and not self._file(run, ".end.json").exists():
                self.stop(run)


class _NeverSubmitted(BackendError):
    """A run dir without a workload key: the launch died before ``air run``."""


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
    if word == "RUNNING":
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
