"""``BackendConformance``: the contract every backend passes, ours and third parties'.

Subclass it in a test module and provide a ``backend`` fixture (and, if the engine
needs one, ``launch_env``)::

    from autoresearch.testing.backends import BackendConformance

    class TestMyBackend(BackendConformance):
        @pytest.fixture
        def backend(self, tmp_path):
            return MyBackend(...)

Each test launches small real processes (``/bin/sh``, ``python``) and checks only
what the contract in ``autoresearch/backends/_base.py`` promises.

A backend that runs nothing (the in-memory fake, ``autoresearch/backends/fake.py``)
passes the same tests through two driver hooks instead of skipping any: every launch
also says, as a :class:`~autoresearch.backends.fake.Script`, what its program does,
and :meth:`BackendConformance.prepare` hands that to the backend before ``start``
(process backends ignore it: the argv does it); :meth:`BackendConformance.fresh`
builds "another process's" instance (``type(backend)()`` by default).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from autoresearch.backends import AttemptStatus, Backend, LaunchRequest
from autoresearch.backends.fake import Script


class BackendConformance:
    """Contract tests. ``backend`` must be provided by the subclass."""

    timeout_s: float = 30.0

    @pytest.fixture
    def backend(self) -> Backend:  # pragma: no cover - subclasses override
        raise NotImplementedError("provide a `backend` fixture")

    @pytest.fixture
    def launch(self, backend: Backend, tmp_path: Path) -> Callable[..., tuple[str, LaunchRequest]]:
        counter = iter(range(1, 1_000_000))

        def _launch(argv: list[str], script: Script, **kw: Any) -> tuple[str, LaunchRequest]:
            n = next(counter)
            node = backend.nodes()[0] if backend.capabilities.places else None
            request = LaunchRequest(
                key=f"conf.{n}", argv=argv, env={**os.environ, **kw.pop("env", {})}, workdir=str(tmp_path),
                log_path=str(tmp_path / f"attempt-{n}.log"), run_dir=str(tmp_path / f"attempt-{n}"),
                node=node.name if node else None, **kw,
            )
            self.prepare(backend, request, script)
            return backend.start(request), request

        return _launch

    def prepare(self, backend: Backend, request: LaunchRequest, script: Script) -> None:
        """Driver hook: tell a backend that runs nothing what ``request``'s program does."""

    def fresh(self, backend: Backend) -> Backend:
        """Driver hook: the instance another process would build, sharing nothing in memory."""
        return type(backend)()

    def wait_end(self, backend: Backend, external_id: str) -> AttemptStatus:
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            status = backend.poll(external_id)
            if status.ended:
                return status
            time.sleep(0.05)
        raise AssertionError(f"attempt {external_id} did not end within {self.timeout_s}s")

    def test_declares_capabilities_and_nodes(self, backend: Backend) -> None:
        assert backend.name and backend.name != "?"
        if backend.capabilities.places:
            nodes = backend.nodes()
            assert nodes, "a backend that places attempts must report at least one node"
            assert len({n.name for n in nodes}) == len(nodes)

    def test_success_exit_code_and_log(self, backend: Backend, launch: Any) -> None:
        ext, _ = launch([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr)"],
                        Script(b"out\nerr\n", exit_code=0))
        status = self.wait_end(backend, ext)
        assert (status.state, status.exit_code, status.signal) == ("exited", 0, None)
        log = backend.read_log(ext)
        assert b"out\n" in log and b"err\n" in log

    def test_failure_exit_code(self, backend: Backend, launch: Any) -> None:
        ext, _ = launch(["/bin/sh", "-c", "exit 7"], Script(exit_code=7))
        assert self.wait_end(backend, ext).exit_code == 7

    def test_missing_program_fails_not_hangs(self, backend: Backend, launch: Any) -> None:
        ext, _ = launch(["/definitely/not/a/program"], Script(b"not found\n", exit_code=127))
        status = self.wait_end(backend, ext)
        assert status.exit_code not in (0, None) or status.state == "lost"

    def test_env_and_workdir(self, backend: Backend, launch: Any, tmp_path: Path) -> None:
        echo = Script(lambda r: f"{r.env['CONFORMANCE_VAR']} {r.workdir}\n".encode(), exit_code=0)
        ext, _ = launch(["/bin/sh", "-c", 'echo "$CONFORMANCE_VAR $(pwd)"'], echo, env={"CONFORMANCE_VAR": "hello"})
        self.wait_end(backend, ext)
        assert f"hello {tmp_path}".encode() in backend.read_log(ext)

    def test_read_log_from_offset(self, backend: Backend, launch: Any) -> None:
        ext, _ = launch(["/bin/sh", "-c", "printf 'abcdef\\nghij\\n'"], Script(b"abcdef\nghij\n", exit_code=0))
        self.wait_end(backend, ext)
        assert backend.read_log(ext, 0) == b"abcdef\nghij\n"
        assert backend.read_log(ext, 3, 4) == b"def\n"
        assert backend.read_log(ext, 100) == b""
        assert backend.log_size(ext) == 12

    def test_poll_is_stable_after_end(self, backend: Backend, launch: Any) -> None:
        ext, _ = launch(["/bin/sh", "-c", "exit 3"], Script(exit_code=3))
        first = self.wait_end(backend, ext)
        assert backend.poll(ext) == first

    def test_stop_sends_sigterm_then_grace(self, backend: Backend, launch: Any) -> None:
        script = "import signal,sys,time\nsignal.signal(signal.SIGTERM, lambda *a: (print('got TERM', flush=True), sys.exit(0)))\nprint('ready', flush=True)\ntime.sleep(60)"
        ext, _ = launch([sys.executable, "-c", script], Script(b"ready\n", on_term="exit", term_output=b"got TERM\n"),
                        grace=5.0)
        self._wait_log(backend, ext, b"ready")
        backend.stop(ext)
        status = self.wait_end(backend, ext)
        assert status.stopped and status.exit_code == 0
        assert b"got TERM" in backend.read_log(ext)

    def test_stop_kills_after_grace(self, backend: Backend, launch: Any) -> None:
        script = "import signal,time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\ntime.sleep(60)"
        # (a grace of 3 s: a stop that blocks for it is caught, and an engine's few API calls on a loaded
        # machine are not; with 0.5 s the Kubernetes backend's four requests missed it under CI's load)
        ext, _ = launch([sys.executable, "-c", script], Script(b"ready\n", on_term="ignore"), grace=3.0)
        self._wait_log(backend, ext, b"ready")
        t0 = time.monotonic()
        backend.stop(ext)
        assert time.monotonic() - t0 < 3.0, "stop() must not block for the grace period"
        status = self.wait_end(backend, ext)
        assert status.stopped and status.signal is not None
        assert time.monotonic() - t0 < 15

    def test_stop_is_idempotent_and_safe_after_end(self, backend: Backend, launch: Any) -> None:
        ext, _ = launch(["/bin/sh", "-c", "exit 0"], Script(exit_code=0))
        self.wait_end(backend, ext)
        backend.stop(ext)
        backend.stop(ext)
        assert backend.poll(ext).exit_code == 0

    def test_timeout(self, backend: Backend, launch: Any) -> None:
        ext, _ = launch(["sleep", "60"], Script(), timeout=0.5, grace=0.5)
        status = self.wait_end(backend, ext)
        assert status.timed_out and status.exit_code != 0

    def test_same_key_launches_once(self, backend: Backend, launch: Any, tmp_path: Path) -> None:
        marker = tmp_path / "count"
        def append(_: LaunchRequest) -> None:
            with marker.open("a") as f:
                f.write("x\n")

        ext, request = launch(["/bin/sh", "-c", f"echo x >> {marker}"], Script(exit_code=0, on_start=append))
        again = backend.start(request)
        assert again == ext
        self.wait_end(backend, ext)
        time.sleep(0.3)
        assert marker.read_text() == "x\n"

    def test_external_id_works_from_a_fresh_backend(self, backend: Backend, launch: Any) -> None:
        ext, _ = launch(["/bin/sh", "-c", "echo fresh; exit 4"], Script(b"fresh\n", exit_code=4))
        other = self.fresh(backend)
        assert self.wait_end(other, ext).exit_code == 4
        assert b"fresh" in other.read_log(ext)

    def _wait_log(self, backend: Backend, ext: str, needle: bytes) -> None:
        deadline = time.monotonic() + self.timeout_s
        while needle not in backend.read_log(ext):
            assert time.monotonic() < deadline, f"{needle!r} never appeared in the log"
            time.sleep(0.05)
