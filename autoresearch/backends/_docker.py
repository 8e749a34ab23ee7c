"""The Docker backend: one container per attempt, on this host's Docker engine (``kind: docker``).

Built on the ``docker`` CLI's documented interface; tested against a real engine (a private
``dockerd`` that backends/docker/kit.py starts, tests/backends/test_docker_engine.py) and,
for the exact command lines, a fake CLI that records them (tests/fakes/bin/docker).

* ``start``: ``docker run -d --name ar-<key>-<h> --label autoresearch.key=<key> --gpus
  '"device=0,1"' --mount ... -w workdir -e NAME ... image argv``. Our scheduler places
  GPUs (``places``), so ``--gpus`` names the slots it chose. The values of ``-e`` travel in
  the CLI's environment, never on its command line (``ps`` shows argv). The workdir, the
  job's directory (metrics file, log) and the checkpoint directory are bind-mounted at the
  same paths, so the attempt's ``AUTORESEARCH_*`` paths hold inside the container; a
  spec's ``mounts`` become ``--mount "type=bind","source=...","target=..."`` (quoted CSV: a
  path with ``:`` or ``,`` stays one path, where ``-v`` would split it). The container runs as the submitting
  user (``--user uid:gid``) so what it writes stays the user's.
* At most once per key: ``request.json`` in the run dir is created with O_EXCL first, and
  a container already there (``docker run`` refuses its name; ``docker ps -a --filter label=...
  --filter name=...`` then finds it) is adopted, never run again.
* State from ``docker inspect``; the first ending seen is kept in ``final.json`` (it never
  changes, and survives ``docker rm``). Logs: a detached waiter (``_docker_wait``) streams
  ``docker logs -f`` into the attempt's log file and, at the end, runs the pass (on_exit)
  like the local supervisor; once ended the full ``docker logs`` replaces that file.
* ``stop``: ``docker stop -t grace`` in the background (it blocks for the grace period).
  Timeouts are enforced by ``poll`` (the waiter polls too).

The external id is the run dir (as on the local backend), so any process can poll it.
Bind mounts name this host's paths: a remote engine (``host:``) needs them on its host too.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import subprocess
import sys
import time
from datetime import datetime
from typing import Any

from autoresearch.backends._base import AttemptStatus, Backend, Capabilities, LaunchRequest, NodeInfo
from autoresearch.backends._supervisor import temp_path
from autoresearch.errors import BackendError, SpecError

IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,511}$")  # a reference: never an option ("--privileged")
START_GRACE_S = 15.0  # a request with no container after this long never started
REQUEST, FINAL, STOP, TIMED_OUT, LOG_DONE = "request.json", "final.json", "stop.json", "timed_out", "log.complete"
# Variables of the launching host that mean nothing inside an image (its own PATH, HOME, ...).
_HOST_ONLY = frozenset({"PATH", "HOME", "USER", "LOGNAME", "SHELL", "PWD", "OLDPWD", "HOSTNAME", "TERM", "TMPDIR",
                        "LD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV", "CUDA_VISIBLE_DEVICES", "SHLVL", "_"})
_children: list[subprocess.Popen[bytes]] = []


class DockerBackend(Backend):
    name = "docker"
    capabilities = Capabilities(gpus=True, preemption=True, multi_node=False, containers=True, logs_follow=True,
                                places=True, shared_fs=False)  # the container cannot see the host's metrics file

    def __init__(self, image: str = "", docker: str = "docker", host: str | None = None, node_name: str | None = None,
                 gpus: int | None = None, user: str | None = None, network: str | None = None,
                 pull: str | None = None, run_args: list[str] | None = None, timeout: float = 30.0,
                 keep: bool = False) -> None:
        """``image``: the default image of a job that names none; ``docker``: the CLI; ``host``:
        DOCKER_HOST; ``gpus``: GPU slots (default: NVML / AUTORESEARCH_GPUS, as the local backend);
        ``user``: ``uid:gid`` (default the caller's); ``network``, ``pull`` (missing | always |
        never), ``run_args``: more ``docker run`` options; ``timeout``: seconds per CLI call;
        ``keep``: leave ended containers (default: removed once the ledger recorded the ending)."""
        for key, value in (("image", image), ("docker", docker), ("host", host), ("node_name", node_name),
                           ("user", user), ("network", network), ("pull", pull)):
            if value is not None and (not isinstance(value, str) or "\0" in value or "\n" in value):
                raise SpecError(f"docker backend: {key} must be one line of text, got {value!r:.60}",
                                hint=f"write {key}: <text> in the profile")
        if image and not IMAGE.match(image):
            raise SpecError(f"docker backend: image {image[:80]!r} is not an image reference",
                            hint="e.g. image: python:3.11-slim or registry.example.com/team/train:v3")
        if pull not in (None, "missing", "always", "never"):
            raise SpecError(f"docker backend: pull {pull!r} is not missing, always or never", hint="e.g. pull: missing")
        if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, int) or not 0 <= gpus <= 4096):
            raise SpecError(f"docker backend: gpus must be a count 0..4096, got {gpus!r:.60}", hint="e.g. gpus: 2")
        if run_args is not None and not (isinstance(run_args, list) and all(isinstance(a, str) for a in run_args)):
            raise SpecError("docker backend: run_args must be a list of strings", hint='e.g. run_args: ["--shm-size=8g"]')
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= 3600:
            raise SpecError(f"docker backend: timeout must be 0..3600 seconds, got {timeout!r:.60}", hint="e.g. timeout: 30")
        self.image, self.docker, self.host, self.gpus = image, docker, host, gpus
        self.node_name = node_name or f"docker@{os.uname().nodename or 'localhost'}"  # (gethostname's)
        self.user = user if user is not None else f"{os.getuid()}:{os.getgid()}"
        self.network, self.pull, self.run_args, self.timeout, self.keep = network, pull, run_args or [], timeout, keep
        self.options = {"image": image, "docker": docker, "host": host, "node_name": node_name, "gpus": gpus,
                        "user": user, "network": network, "pull": pull, "run_args": run_args, "timeout": timeout,
                        "keep": keep}

    # -- the CLI ------------------------------------------------------------------------------

    def _cli(self, *args: str, env: dict[str, str] | None = None, check: bool = True,
             timeout: float | None = None) -> subprocess.CompletedProcess[bytes]:
        full = {**os.environ, **(env or {})}
        if self.host:
            full["DOCKER_HOST"] = self.host
        try:
            done = subprocess.run([self.docker, *args], env=full, stdin=subprocess.DEVNULL, capture_output=True,
                                  timeout=timeout or self.timeout, check=False)
        except FileNotFoundError:
            raise BackendError(f"the docker CLI ({self.docker!r}) is not installed here",
                               hint="install Docker (docs.docker.com/engine/install), or set docker: in the profile "
                                    "to the CLI's path") from None
        except subprocess.TimeoutExpired:
            raise BackendError(f"the docker engine at {self._where()} did not answer `docker {args[0]}` within "
                               f"{timeout or self.timeout:g}s", hint="is dockerd up? `systemctl status docker`") from None
        if check and done.returncode != 0:
            raise BackendError(f"docker {args[0]} failed: {_text(done.stderr) or f'exit {done.returncode}'}",
                               hint=f"the engine at {self._where()} said so; check `docker info`")
        return done

    def _where(self) -> str:
        return self.host or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"

    def probe(self) -> None:
        done = self._cli("version", "--format", "{{.Server.Version}}", check=False, timeout=min(self.timeout, 10))
        if done.returncode != 0:
            raise BackendError(f"the docker engine at {self._where()} does not answer: {_text(done.stderr)}",
                               hint="start it (`sudo systemctl start docker`), or set host: in the profile; "
                                    "your user needs access to its socket (the docker group)")

    # -- the contract ---------------------------------------------------------------------------

    def check(self, spec: Any) -> None:
        super().check(spec)
        image = str(getattr(spec, "image", "") or "")
        if not (image or self.image):
            raise SpecError(f"the {self.name} backend runs every job in a container, and this one names no image",
                            hint="give image: (--image python:3.11-slim), or image: in the backend's profile")
        if image and not IMAGE.match(image):
            raise SpecError(f"image {image[:80]!r} is not an image reference",
                            hint="name one like python:3.11-slim or registry.example.com/team/train:v3")

    def nodes(self) -> list[NodeInfo]:
        from autoresearch.backends._local import _memory_mb, local_gpu_ids

        ids = tuple(str(i) for i in range(self.gpus)) if self.gpus is not None else local_gpu_ids()
        return [NodeInfo(self.node_name, ids, float(os.cpu_count() or 1), _memory_mb())]

    def start(self, request: LaunchRequest) -> str:
        if request.nodes > 1:
            raise BackendError("the docker backend runs single-node jobs", hint="use nodes: 1")
        image = request.image or self.image
        if not IMAGE.match(image):  # checked at submit too: never an option on docker's command line
            raise BackendError(f"no usable image for a container ({image[:80]!r})",
                               hint="give the job image:, or the profile image:")
        run_dir = request.run_dir
        name = container_name(request.key, run_dir)
        os.makedirs(run_dir, mode=0o700, exist_ok=True)
        os.makedirs(os.path.dirname(request.log_path), mode=0o700, exist_ok=True)
        try:  # O_EXCL: one launch per key, whoever races (write-ahead: the name before the run)
            fd = os.open(os.path.join(run_dir, REQUEST), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return run_dir
        with os.fdopen(fd, "w") as f:
            json.dump({"key": request.key, "name": name, "created_at": time.time(), "log_path": request.log_path,
                       "timeout": request.timeout, "grace": request.grace, "on_exit": request.on_exit,
                       "wake_fifo": request.wake_fifo, "options": self.options, "ledger": request.ledger}, f)
        # request.json was just created, so this run dir never started a container: no `docker ps` first
        # (~40 ms before every start). A container of this name from elsewhere (a run dir made again) makes
        # `docker run` fail on the name; it is then found and adopted, never run twice.
        argv, env = self.run_argv(request, name, image)
        done = self._cli(*argv, env=env, check=False, timeout=max(self.timeout, 600.0))  # may pull the image
        if done.returncode != 0 and not self._find(request.key, name):
                raise BackendError(f"docker run failed: {_text(done.stderr) or f'exit {done.returncode}'}",
                                   hint=f"check the image {image!r} exists and `docker run` works on this host")
        self._waiter(run_dir)
        return run_dir

    def run_argv(self, request: LaunchRequest, name: str, image: str) -> tuple[list[str], dict[str, str]]:
        """The ``docker run`` arguments and the CLI's extra environment (the ``-e`` values)."""
        argv = ["run", "-d", "--name", name, "--label", f"autoresearch.key={request.key}",
                "--label", f"autoresearch.run_dir={request.run_dir}"]
        if request.gpu_ids:
            argv += ["--gpus", '"device=' + ",".join(request.gpu_ids) + '"']
        if request.cpus > 0:  # what the job reserves becomes the container's limit
            argv += ["--cpus", f"{request.cpus:g}"]
        if request.memory > 0:
            argv += ["--memory", f"{request.memory}m"]
        if self.user:
            argv += ["--user", self.user]
        if self.network:
            argv += ["--network", self.network]
        if self.pull:
            argv += ["--pull", self.pull]
        env = {k: v for k, v in request.env.items()
               if k and "=" not in k and k not in _HOST_ONLY
               and (os.environ.get(k) != v or k.startswith(("AUTORESEARCH_", "MLFLOW_")))}
        env.pop("AUTORESEARCH_HOME", None)  # the home is not mounted: a trial finds nothing there
        binds: dict[str, str] = {request.workdir: request.workdir, os.path.dirname(request.log_path):
                                 os.path.dirname(request.log_path)}
        for key in ("AUTORESEARCH_METRICS_FILE", "AUTORESEARCH_CHECKPOINT_DIR"):
            path = env.get(key)
            if path:
                folder = path if key.endswith("_DIR") else os.path.dirname(path)
                binds[folder] = folder
        binds.update({target: source for target, source in request.mounts.items()})
        for target, source in binds.items():
            argv += ["--mount", bind_mount(source, target)]
        argv += ["-w", request.workdir]
        for key in sorted(env):
            argv += ["-e", key]  # the value comes from the CLI's environment, off the command line
        argv += [*self.run_args, image, *request.argv]
        return argv, env

    def _find(self, key: str, name: str) -> bool:
        done = self._cli("ps", "-a", "--filter", f"label=autoresearch.key={key}", "--filter", f"name=^{name}$",
                         "--format", "{{.Names}}")
        return name in _text(done.stdout).split()

    def _waiter(self, run_dir: str) -> None:
        _reap()
        with open(os.devnull, "rb") as null_in, open(os.path.join(run_dir, "waiter.log"), "ab") as out:
            _children.append(subprocess.Popen(
                [sys.executable, "-m", "autoresearch.backends._docker_wait", run_dir], stdin=null_in, stdout=out,
                stderr=subprocess.STDOUT, cwd=run_dir, start_new_session=True))

    def poll(self, external_id: str) -> AttemptStatus:
        final = _read_json(os.path.join(external_id, FINAL))
        if final is not None:
            return AttemptStatus(**final)
        req = _read_json(os.path.join(external_id, REQUEST))
        if req is None:
            return AttemptStatus("lost", ended_at=time.time(), detail="the container was never started")
        done = self._cli("inspect", "--type", "container", "--format", "{{json .State}}", req["name"], check=False)
        if done.returncode != 0:
            if "no such" not in _text(done.stderr).lower():
                raise BackendError(f"docker inspect failed: {_text(done.stderr)}", hint="check `docker info`")
            if time.time() - float(req.get("created_at") or 0) < START_GRACE_S:
                return AttemptStatus("starting")
            return AttemptStatus("lost", ended_at=time.time(), detail=f"container {req['name']} is gone")
        state = json.loads(done.stdout)
        started = _ts(state.get("StartedAt"))
        stopped = os.path.exists(os.path.join(external_id, STOP))
        timed_out = os.path.exists(os.path.join(external_id, TIMED_OUT))
        status = state.get("Status")
        if status in ("running", "paused", "restarting"):
            timeout = req.get("timeout")
            if timeout and started and time.time() - started > float(timeout) and not (stopped or timed_out):
                open(os.path.join(external_id, TIMED_OUT), "w").close()  # before the stop: its ending is the timeout's
                self.stop(external_id, float(req.get("grace") or 10.0))
            return AttemptStatus("running", started_at=started)
        if status == "created" and not state.get("ExitCode"):
            return AttemptStatus("starting")
        code = int(state.get("ExitCode") or 0)
        signal = None
        if state.get("OOMKilled"):
            code, signal = 0, 9
        elif (stopped or timed_out) and 128 < code <= 128 + 64:
            code, signal = 0, code - 128  # docker reports a death by signal N as 128+N
        detail = str(state.get("Error") or "")[:500] + (" (out of memory)" if state.get("OOMKilled") else "")
        result = {"state": "exited", "exit_code": None if signal else code, "signal": signal, "timed_out": timed_out,
                  "stopped": stopped or timed_out, "started_at": started, "ended_at": _ts(state.get("FinishedAt"))
                  or time.time(), "detail": detail.strip()}
        _write_json(os.path.join(external_id, FINAL), result)
        return AttemptStatus(**result)  # type: ignore[arg-type]

    def read_log(self, external_id: str, offset: int = 0, max_bytes: int = 1 << 20) -> bytes:
        req = _read_json(os.path.join(external_id, REQUEST))
        if req is None:
            return b""
        path = str(req["log_path"])
        if os.path.exists(os.path.join(external_id, FINAL)) and not os.path.exists(os.path.join(external_id, LOG_DONE)):
            self._save_log(req["name"], path, external_id)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            fd = -1
        if fd < 0:  # no waiter streams it: ask the engine
            done = self._cli("logs", req["name"], check=False)
            return (done.stdout + done.stderr)[offset:offset + max_bytes] if done.returncode == 0 else b""
        with os.fdopen(fd, "rb") as f:
            f.seek(offset)
            return f.read(max_bytes)

    def _save_log(self, name: str, path: str, run_dir: str) -> None:
        """The ended container's whole log replaces the streamed copy (atomically: a waiter may still write)."""
        done = self._cli("logs", name, check=False)
        if done.returncode != 0:
            return  # removed already: the streamed copy is all there is
        tmp = temp_path(path)
        with open(tmp, "wb") as f:
            f.write(done.stdout + done.stderr)
        os.replace(tmp, path)
        open(os.path.join(run_dir, LOG_DONE), "w").close()

    def log_size(self, external_id: str) -> int:
        req = _read_json(os.path.join(external_id, REQUEST))
        if req is None:
            return 0
        self.read_log(external_id, 0, 0)  # an ended container's whole log lands in the file first
        try:
            return os.path.getsize(str(req["log_path"]))
        except OSError:
            return len(self.read_log(external_id, 0, 1 << 30))

    def stop(self, external_id: str, grace: float | None = None) -> None:
        req = _read_json(os.path.join(external_id, REQUEST))
        if req is None or os.path.exists(os.path.join(external_id, FINAL)):
            return  # never started, or over
        wait = req.get("grace") if grace is None else grace
        with contextlib.suppress(FileExistsError):
            _write_json(os.path.join(external_id, STOP), {"requested_at": time.time()}, exclusive=True)
        _reap()
        env = {**os.environ, **({"DOCKER_HOST": self.host} if self.host else {})}
        with contextlib.suppress(OSError):  # `docker stop` blocks for the grace period: not us
            _children.append(subprocess.Popen(
                [self.docker, "stop", "-t", str(math.ceil(float(wait or 0))), req["name"]], env=env,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))

    def release(self, external_id: str) -> None:
        with contextlib.suppress(OSError):
            open(os.path.join(external_id, "reaped"), "w").close()  # the waiter's acknowledgement (as local's)
        req = _read_json(os.path.join(external_id, REQUEST))
        if req is None or self.keep:
            return
        self.read_log(external_id, 0, 0)  # keep the whole log before the container goes
        with contextlib.suppress(BackendError):
            self._cli("rm", "-f", req["name"], check=False)


def bind_mount(source: str, target: str) -> str:
    """``--mount``'s value for a bind mount: CSV fields, each quoted (a ``"`` doubled), so a path with
    ``:`` or ``,`` stays one path (``-v src:dst`` splits at every ``:``: "invalid mode")."""
    fields = ("type=bind", f"source={source}", f"target={target}")
    return ",".join('"' + field.replace('"', '""') + '"' for field in fields)


def container_name(key: str, run_dir: str) -> str:
    """``ar-<key>-<8 hex of the run dir>``: readable, and distinct across homes sharing an engine."""
    safe = "".join(c if c.isalnum() or c in "_.-" else "-" for c in key)[:64]
    return f"ar-{safe}-{_sha1(run_dir.encode()).hexdigest()[:8]}"


def _sha1(data: bytes) -> Any:
    """SHA-1 from CPython's own small module: hashlib loads OpenSSL and makes a constructor of each of its
    algorithms (~4 ms of every CLI submit's start here, 0.5 ms for _sha1); the same digest."""
    try:
        from _sha1 import sha1  # type: ignore[import-not-found, unused-ignore]
    except ImportError:  # (an interpreter built without it)
        from hashlib import sha1
    return sha1(data)


def _ts(value: Any) -> float | None:
    """Docker's RFC 3339 time (nanoseconds, 'Z'); None for its zero time."""
    if not isinstance(value, str) or value.startswith("0001-"):
        return None
    text = value.replace("Z", "+00:00")
    head, dot, rest = text.partition(".")
    if dot:
        digits = "".join(c for c in rest if c.isdigit())
        text = f"{head}.{digits[:6]}{rest[len(digits):]}"
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace").strip()[:500]


def _read_json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _write_json(path: str, value: Any, exclusive: bool = False) -> None:
    if exclusive:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(value, f)
        return
    tmp = temp_path(path)
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(value, f)
    os.replace(tmp, path)


def _reap() -> None:
    for child in list(_children):
        if child.poll() is not None:
            _children.remove(child)
