"""The Ray backend: each attempt is a Ray job, through the Jobs REST API of the head's dashboard.

Ray schedules (``places=False``): the runtime admits jobs in priority order up to what the
cluster holds (``scheduler.admit``) and Ray places them. Ray has no preemption, so
best-effort jobs are refused at submit (``Backend.check``). The attempt's files are not
readable here (``shared_fs=False``): logs come through the API, and ``report()`` prints
marked lines that the runtime reads from that log (``autoresearch/engine/ingest.py``).

Plain HTTP (``urllib``), not the ``ray`` package: a status read polls attempts, and importing
``ray.job_submission`` takes one to three seconds (invariant 7). The API is the one
``JobSubmissionClient`` speaks: ``POST /api/jobs/``, ``GET /api/jobs/{id}``, ``.../logs``,
``.../stop``. Except with ``upload: true``: a start then goes through Ray's own
``JobSubmissionClient``, which packages the job's workdir (and any local ``py_modules`` of the
profile's ``runtime_env``) as Ray does, honouring ``.gitignore``/``.rayignore`` and its size
limit, uploads it to the head (``/api/packages/``) and submits the job with the package's URI as
``working_dir``: a cluster that cannot see this disk gets the code. A workdir that cannot be
packaged or uploaded (too big, unreadable, a path that is not there, no ``ray`` package here) is
the job's or the profile's error (``SpecError``: the attempt fails as the user's, not retried as
the machine's); the head not answering stays the machine's.

At most once (issue 9 item 4): the attempt's submission id is drawn once and written to its
``run_dir`` before ``submit_job``; a restarted runtime reads it back (the ledger holds the
run dir until the start returns) and finds the job on Ray, or learns Ray never had it. A
second submit of the same id is Ray's "already exists": the attempt is adopted, not rerun.

The entrypoint wraps the program in ``sh``: it marks where the program's output starts and
its exit status (Ray does not keep the status of a stopped job), traps SIGTERM so the status
is still written after a stop, and kills the program's process group if Ray's job supervisor
dies (a killed head leaves Ray's own entrypoints running). The grace period is Ray's
``RAY_JOB_STOP_WAIT_TIME_S``, set per job at submit (whole seconds, at least 1).
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import shlex
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from autoresearch.backends._base import AttemptStatus, Backend, Capabilities, LaunchRequest, NodeInfo
from autoresearch.backends._env import sent_env
from autoresearch.errors import BackendError, CapacityError, SpecError

DEFAULT_ADDRESS = "http://127.0.0.1:8265"
KIT_HINT = "start a local head with backends/ray/start.sh (backends/ray/README.md), or point address at yours"
SID_FILE = "ray-submission-id"
_START = "\x1e[autoresearch-start]\n"
_EXIT = re.compile(r"\x1e\[autoresearch-exit (\d{1,3})\]\n\Z")
# The program comes in the environment (so the entrypoint Ray echoes into the log is this one
# known line). A watchdog kills the program's group when Ray's job supervisor (our parent) dies;
# the trap keeps us alive after Ray's SIGTERM to write the status.
_WRAP = ('cd "$AUTORESEARCH_RAY_WORKDIR" || exit 2; eval "set -- $AUTORESEARCH_RAY_ARGV"; unset AUTORESEARCH_RAY_ARGV AUTORESEARCH_RAY_WORKDIR; p=$PPID; '
         '( while kill -0 "$p" 2>/dev/null; do sleep 1; done; kill -KILL 0 ) & w=$!; '
         "printf '\\036[autoresearch-start]\\n'; trap : TERM INT; \"$@\"; s=$?; kill \"$w\" 2>/dev/null; "
         "printf '\\036[autoresearch-exit %s]\\n' \"$s\"; exit \"$s\"")
ENTRYPOINT = "exec sh -c " + shlex.quote(_WRAP)
_REFUSALS = ("JOB_SUPERVISOR_ACTOR_START_FAILURE", "RUNTIME_ENV_SETUP_FAILURE")
_ERROR_LINE = re.compile(r"^\s*\w*(?:Error|Exception): (.+)$", re.MULTILINE)


class RayBackend(Backend):
    name = "ray"
    capabilities = Capabilities(gpus=True, preemption=False, multi_node=False, containers=False, logs_follow=False,
                                places=False, shared_fs=False)

    def __init__(self, address: str | None = None, upload: bool = False, timeout: float = 10.0,
                 runtime_env: dict[str, Any] | None = None) -> None:
        address = address or os.environ.get("RAY_ADDRESS") or DEFAULT_ADDRESS
        if not isinstance(address, str) or not re.match(r"^https?://[^\s/]+(:\d+)?/?$", address):
            raise SpecError(f"backend ray: address {str(address)[:100]!r} is not an http(s)://host:port URL",
                            hint=f"use the head's dashboard address, e.g. {DEFAULT_ADDRESS}")
        if runtime_env is not None and not isinstance(runtime_env, dict):
            raise SpecError("backend ray: runtime_env must be a mapping (Ray's runtime_env: pip, py_modules, ...)",
                            hint="e.g. runtime_env: {pip: [numpy]}")
        self.address = address.rstrip("/")
        self.upload = bool(upload)  # send the workdir as Ray's working_dir (a cluster that cannot see our disk)
        self.timeout = float(timeout) if isinstance(timeout, (int, float)) and 0 < timeout < 3600 else 10.0
        self.runtime_env = dict(runtime_env or {})
        self._ended: dict[str, AttemptStatus] = {}  # final answers, cached (they never change)
        self._node_names: dict[str, str] = {}  # Ray's node id -> our node name, as nodes() last read them
        self._ray_client: Any = None  # JobSubmissionClient, made on the first upload

    # -- HTTP -------------------------------------------------------------------------------

    def _call(self, method: str, path: str, body: Any = None, timeout: float | None = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.address + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout or self.timeout) as response:
                raw = response.read()
                return response.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as err:
            return err.code, err.read(1 << 16).decode("utf-8", "replace")
        except (urllib.error.URLError, OSError, ValueError) as err:
            reason = getattr(err, "reason", None) or err
            raise BackendError(f"the Ray Jobs API at {self.address} does not answer ({reason})",
                               hint=KIT_HINT) from None

    def probe(self) -> None:
        code, data = self._call("GET", "/api/version", timeout=min(self.timeout, 5.0))
        if code != 200 or not isinstance(data, dict) or "ray_version" not in data:
            raise BackendError(f"{self.address} answers, but not as a Ray dashboard (HTTP {code})", hint=KIT_HINT)

    # -- the contract -------------------------------------------------------------------------

    def nodes(self) -> list[NodeInfo]:
        """Ray's alive nodes; none when the head does not answer (the runtime then admits nothing)."""
        try:
            code, data = self._call("GET", "/api/v0/nodes?detail=1&limit=10000", timeout=min(self.timeout, 3.0))
        except BackendError:
            return []
        try:
            rows = data["data"]["result"]["result"] if code == 200 else []
        except (TypeError, KeyError):
            rows = []
        out = []
        for row in rows if isinstance(rows, list) else []:
            if not isinstance(row, dict) or row.get("state") != "ALIVE":
                continue
            res: dict[str, Any] = row["resources_total"] if isinstance(row.get("resources_total"), dict) else {}
            gpus = _count(res.get("GPU"))
            out.append(NodeInfo(name=f"ray-{str(row.get('node_name') or row.get('node_id'))[:100]}",
                                gpu_ids=tuple(str(i) for i in range(int(gpus))), cpus=_count(res.get("CPU")),
                                memory=int(_count(res.get("memory")) // (1 << 20)), state="alive",
                                labels={"ray_node_id": str(row.get("node_id", ""))[:64]}))
        self._node_names = {n.labels["ray_node_id"]: n.name for n in out if n.labels.get("ray_node_id")}
        return out

    def _node_of(self, info: dict[str, Any]) -> str | None:
        """The node a running job's driver runs on (Ray's ``driver_node_id``), by the name nodes() gives it."""
        node_id = info.get("driver_node_id")
        if not isinstance(node_id, str) or not node_id or len(node_id) > 64 or not node_id.isalnum():
            return None
        if node_id not in self._node_names:
            self.nodes()  # a node new since the last read (one call, then known)
        return self._node_names.get(node_id)

    def check(self, spec: Any) -> None:
        super().check(spec)
        gpus = int(getattr(spec, "gpus", 0) or 0)
        if gpus <= 0:
            return
        nodes = self.nodes()
        largest = max((len(n.gpu_ids) for n in nodes), default=None)
        if largest is not None and gpus > largest:
            raise CapacityError(f"asked for {gpus} GPU(s) but the largest node of the Ray cluster at "
                                f"{self.address} has {largest}",
                                hint=f"use gpus: {largest} or fewer, or add GPU nodes to the cluster")

    def start(self, request: LaunchRequest) -> str:
        sid = _submission_id(request)
        body: dict[str, Any] = {
            "entrypoint": ENTRYPOINT,
            "submission_id": sid,
            "runtime_env": self._runtime_env(request),
            "metadata": {"autoresearch_key": request.key[:200],
                         "autoresearch_timeout": "" if request.timeout is None else repr(float(request.timeout))},
            "entrypoint_num_cpus": request.cpus if request.cpus > 0 else 1,
        }
        if request.gpus:
            body["entrypoint_num_gpus"] = request.gpus
        if request.memory:
            body["entrypoint_memory"] = int(request.memory) << 20
        if self.upload:
            return self._submit_uploading(sid, body, request.key)
        try:
            code, data = self._call("POST", "/api/jobs/", body, timeout=max(self.timeout, 30.0))
        except BackendError:  # no answer: it may have been taken all the same; never submit it twice
            if self._call("GET", f"/api/jobs/{_quote(sid)}")[0] == 200:
                return sid
            raise
        if code == 200:
            return sid
        text = data if isinstance(data, str) else json.dumps(data)
        if "already exists" in text:  # submitted before a crash: adopt it, never run it again
            return sid
        raise BackendError(f"Ray rejected attempt {request.key}: {_ray_message(text)}",
                           hint="fix what Ray names (the job's resources, the backend's runtime_env), "
                                "or check the head's log (backends/ray/README.md)")

    def _client(self) -> Any:
        """Ray's JobSubmissionClient for this head (imported here only: ``upload: true``'s starts)."""
        if self._ray_client is None:
            try:
                from ray.job_submission import JobSubmissionClient
            except ImportError:
                raise SpecError("backend ray: upload: true packages the workdir with Ray's JobSubmissionClient, and "
                                "the ray package is not installed here",
                                hint="pip install 'ray[default]' (the head's version), or set upload: false and put the "
                                     "code where the cluster's nodes can read it") from None
            try:
                self._ray_client = JobSubmissionClient(self.address)
            except (ConnectionError, RuntimeError, OSError) as err:
                raise BackendError(f"the Ray Jobs API at {self.address} does not answer ({str(err)[:200]})",
                                   hint=KIT_HINT) from None
        return self._ray_client

    def _submit_uploading(self, sid: str, body: dict[str, Any], key: str) -> str:
        """Submit through Ray's client, which packages and uploads the working_dir (and local py_modules)."""
        client = self._client()
        args = {k: v for k, v in body.items() if k != "submission_id"}
        try:
            client.submit_job(submission_id=sid, **args)
        except (ValueError, TypeError, OSError) as err:  # packaging: Ray's size limit, a path, a file it cannot read
            if isinstance(err, ConnectionError):
                return self._unknown_submit(sid, err)
            raise SpecError(f"backend ray: could not package and upload the workdir of attempt {key}: "
                            f"{_ray_message(str(err))}",
                            hint="keep the workdir small (Ray's limit; .gitignore and .rayignore leave files out, "
                                 "or runtime_env: {excludes: [...]}), readable, and every runtime_env py_modules "
                                 "path present") from None
        except RuntimeError as err:
            text = str(err)
            if "already exists" in text:  # submitted before a crash: adopt it, never run it again
                return sid
            if "Package size" in text or "exceeds the maximum size" in text:  # the head's check of the upload
                raise SpecError(f"backend ray: the head refused the workdir's package for attempt {key}: "
                                f"{_ray_message(text)}", hint="keep the workdir under Ray's package size limit "
                                "(.gitignore, .rayignore, or runtime_env: {excludes: [...]})") from None
            raise BackendError(f"Ray rejected attempt {key}: {_ray_message(text)}",
                               hint="fix what Ray names (the job's resources, the backend's runtime_env), "
                                    "or check the head's log (backends/ray/README.md)") from None
        except Exception as err:  # noqa: BLE001 - requests' own errors (a dropped connection): maybe submitted
            return self._unknown_submit(sid, err)
        return sid

    def _unknown_submit(self, sid: str, err: BaseException) -> str:
        """No clear answer to a submit: Ray may have the job all the same; never submit it twice."""
        if self._call("GET", f"/api/jobs/{_quote(sid)}")[0] == 200:
            return sid
        raise BackendError(f"the Ray Jobs API at {self.address} did not take the job ({str(err)[:200]})",
                           hint=KIT_HINT) from None

    def _runtime_env(self, request: LaunchRequest) -> dict[str, Any]:
        # Only what the runtime or the job set: the head's own environment holds the rest, and
        # whatever is sent is shown on Ray's dashboard (no copy of the submitter's secrets).
        env = sent_env(request)
        env["AUTORESEARCH_RAY_ARGV"] = shlex.join(request.argv)
        env["AUTORESEARCH_RAY_WORKDIR"] = "." if self.upload else request.workdir
        grace = request.grace if math.isfinite(request.grace) else 10.0
        env["RAY_JOB_STOP_WAIT_TIME_S"] = str(int(min(max(math.ceil(grace), 1), 86400)))
        runtime_env = {**self.runtime_env, "env_vars": {**(self.runtime_env.get("env_vars") or {}), **env}}
        if self.upload:
            runtime_env["working_dir"] = request.workdir
        return runtime_env

    def poll(self, external_id: str) -> AttemptStatus:
        sid = self._sid(external_id)
        if sid is None:
            return AttemptStatus("lost", ended_at=time.time(), detail="never submitted to Ray (no submission id)")
        if sid in self._ended:
            return self._ended[sid]
        code, info = self._call("GET", f"/api/jobs/{_quote(sid)}")
        if code == 404:
            status = AttemptStatus("lost", ended_at=time.time(),
                                   detail=f"Ray has no job {sid} (its head restarted, or the submit never reached it)")
            self._ended[sid] = status
            return status
        if code != 200 or not isinstance(info, dict):
            raise BackendError(f"Ray answered HTTP {code} for job {sid}: {_ray_message(str(info))}", hint=KIT_HINT)
        state = info.get("status")
        started, ended = _seconds(info.get("start_time")), _seconds(info.get("end_time"))
        if state == "PENDING":  # Ray holds it (resources, its runtime_env being set up): say so, in Ray's words
            said = "".join(c for c in str(info.get("message") or "") if c.isprintable()).split(". ")[0][:120]
            return AttemptStatus("starting", detail=f"engine: PENDING, {said}" if said else "engine: PENDING")
        if state == "RUNNING":
            limit = _float((info.get("metadata") or {}).get("autoresearch_timeout"))
            if limit is not None and started is not None and time.time() - started > limit:
                self._call("POST", f"/api/jobs/{_quote(sid)}/stop")
            return AttemptStatus("running", started_at=started, node=self._node_of(info))
        if state not in ("SUCCEEDED", "FAILED", "STOPPED"):
            raise BackendError(f"Ray reports job {sid} in an unknown state {str(state)[:40]!r}", hint=KIT_HINT)
        status = self._ending(sid, info, started, ended)
        self._ended[sid] = status
        return status

    def _ending(self, sid: str, info: dict[str, Any], started: float | None, ended: float | None) -> AttemptStatus:
        state = info["status"]
        _, code = self._output(sid)
        if code is None and state != "STOPPED":
            code = info.get("driver_exit_code") if isinstance(info.get("driver_exit_code"), int) else None
        if code is None and state == "FAILED":  # Ray's side failed: it refused the job, or its supervisor died
            message = str(info.get("message") or "the job failed").split(" Full traceback")[0].replace("\n", " ")
            if str(info.get("error_type")) in _REFUSALS:  # maybe transient (a pip index): retried as infra
                return AttemptStatus("lost", started_at=started, ended_at=ended,
                                     detail=f"Ray rejected it: {message[:300]}; hint: fix what Ray names (the "
                                            "backend's runtime_env, the job's resources)")
            return AttemptStatus("lost", started_at=started, ended_at=ended, detail=f"Ray: {message[:300]}")
        stopped = state == "STOPPED"
        limit = _float((info.get("metadata") or {}).get("autoresearch_timeout"))
        timed_out = bool(stopped and limit is not None and started and ended and ended - started >= limit)
        # Ray's stop of a job we did not stop (runtime.classify: no stop reason recorded) is a person's
        # (`ray job stop`, the dashboard): a cancel, never retried.
        cancelled, why = stopped and not timed_out, "stopped through Ray (ray job stop), not by autoresearch"
        if code is None:  # stopped, and no status written: killed after the grace period
            return AttemptStatus("exited", signal=9, stopped=stopped, timed_out=timed_out, started_at=started,
                                 ended_at=ended, detail="stopped; killed after the grace period", cancelled=cancelled)
        if 128 < code <= 128 + 64:  # the shell's way of saying "killed by signal N"
            return AttemptStatus("exited", signal=code - 128, stopped=stopped, timed_out=timed_out,
                                 started_at=started, ended_at=ended, cancelled=cancelled, detail=why if cancelled else "")
        return AttemptStatus("exited", exit_code=code, stopped=stopped, timed_out=timed_out, started_at=started,
                             ended_at=ended, cancelled=cancelled, detail=why if cancelled else "")

    def _output(self, sid: str) -> tuple[bytes, int | None]:
        """The program's output (Ray's preamble and our exit mark cut off) and its exit status if written."""
        code, data = self._call("GET", f"/api/jobs/{_quote(sid)}/logs")
        if code == 404:
            return b"", None
        if code != 200 or not isinstance(data, dict) or not isinstance(data.get("logs"), str):
            raise BackendError(f"Ray answered HTTP {code} for the log of job {sid}", hint=KIT_HINT)
        text: str = data["logs"].replace(f"Running entrypoint for job {sid}: {ENTRYPOINT}\n", "", 1)
        begin = text.find(_START)
        if begin < 0:
            return b"", None
        text = text[begin + len(_START):]
        mark = _EXIT.search(text)
        status = None
        if mark:
            status, text = int(mark.group(1)), text[: mark.start()]
        return text.encode("utf-8", "replace"), status

    def read_log(self, external_id: str, offset: int = 0, max_bytes: int = 1 << 20) -> bytes:
        sid = self._sid(external_id)
        if sid is None:
            return b""
        out, _ = self._output(sid)
        offset = max(0, int(offset))
        return out[offset: offset + max(0, int(max_bytes))]

    def stop(self, external_id: str, grace: float | None = None) -> None:
        """Ray's stop: SIGTERM, then SIGKILL after the grace period given at submit (Ray takes it per job)."""
        sid = self._sid(external_id)
        if sid is None or sid in self._ended:
            return
        code, data = self._call("POST", f"/api/jobs/{_quote(sid)}/stop")
        if code not in (200, 404):
            raise BackendError(f"Ray refused to stop job {sid}: {_ray_message(str(data))}", hint=KIT_HINT)

    def release(self, external_id: str) -> None:
        sid = self._sid(external_id)
        if sid is not None:
            self._ended.pop(sid, None)

    def _sid(self, external_id: str) -> str | None:
        """The submission id: the external id itself, or (a start that crashed before the ledger
        recorded it) read from the run dir the ledger holds meanwhile."""
        if not external_id.startswith("/"):
            return external_id
        try:
            return (Path(external_id) / SID_FILE).read_text().strip() or None
        except OSError:
            return None


def _submission_id(request: LaunchRequest) -> str:
    """This attempt's submission id: drawn once, written (durably) before Ray ever hears of it."""
    run_dir = Path(request.run_dir)
    path = run_dir / SID_FILE
    try:
        existing = path.read_text().strip()
    except OSError:
        existing = ""
    if existing:
        return existing
    run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = re.sub(r"[^A-Za-z0-9_-]", "-", request.key)[:60]
    sid = f"autoresearch-{key}-{secrets.token_hex(6)}"  # the token: two homes never share an id
    tmp = run_dir / f".{SID_FILE}.tmp"
    with open(tmp, "w") as f:
        f.write(sid)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return sid


def _ray_message(text: str) -> str:
    """Ray's own words out of an error body (often a server traceback): its last error line."""
    found = _ERROR_LINE.findall(text)
    message = found[-1] if found else text.strip().splitlines()[-1] if text.strip() else "no message"
    return message.strip()[:300]


def _quote(sid: str) -> str:
    return urllib.parse.quote(sid, safe="")


def _count(raw: object) -> float:
    return float(raw) if isinstance(raw, (int, float)) and not isinstance(raw, bool) and math.isfinite(raw) and raw > 0 \
        else 0.0


def _float(raw: object) -> float | None:
    try:
        value = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) and value > 0 else None


def _seconds(ms: object) -> float | None:
    value = _float(ms)
    return value / 1000 if value is not None else None
