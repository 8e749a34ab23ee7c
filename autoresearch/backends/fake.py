"""The fake backend: attempts simulated in memory, for tests where processes are not the point.

Nothing runs. ``start`` records the attempt and acts out its :class:`Script` (output
written at once, an exit code or "runs until something happens"); a test then drives
it through a small explicit API and runs the runtime's passes itself::

    fake = FakeBackend(nodes=2, gpus=4)
    api = Api(home, backend=fake)          # a Runtime/Api takes a backend instance
    job = api.submit({"command": ["train"], "workdir": ".", "gpus": 2}).id
    fake.emit(f"{job}.1", "loss: 0.5\\n")  # an attempt is named by its key or external id
    fake.finish(f"{job}.1", 0)
    api.tick()

Choices, so that the fake passes :class:`~autoresearch.testing.backends.BackendConformance`
honestly:

* **Scripts.** What an attempt does on its own comes from, in order: the script given
  for its key (:meth:`FakeBackend.expect`), the one given for its program (``argv[0]``,
  the ``programs`` argument), else :class:`Script()`: it runs until driven, stopped or
  timed out, and dies of SIGTERM.
* **Time.** Grace periods and timeouts are checked when someone polls, against the
  fleet's clock: wall time plus whatever :meth:`FakeBackend.advance` added, so a test
  can jump past a timeout without waiting for it.
* **Processes.** "Another process" is another instance on the same fleet
  (:meth:`FakeBackend.twin`): external ids are valid across twins, as the contract
  asks. A real other process (the ``on_exit`` hook, a CLI call) sees an empty fleet,
  so the fake never runs ``on_exit``: the test runs the passes.
* **Ending.** Once ended, an attempt's status never changes; ``release`` only marks it
  released (its log stays readable, as the local backend's does).
* **Honest refusals.** ``start`` refuses what the instance's capabilities lack, like a
  real engine would; ``Backend.check`` refuses the same at submit. The fake is never
  suggested to a user in those hints (:attr:`simulated`).
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from autoresearch.backends._base import AttemptStatus, Backend, Capabilities, LaunchRequest, NodeInfo
from autoresearch.errors import BackendError

OnTerm = Literal["die", "exit", "ignore"]


@dataclass(frozen=True)
class Script:
    """What a simulated program does by itself.

    ``output`` is written at start (bytes, or made from the recorded request);
    ``exit_code`` ends it at once (None: it runs on); ``on_term``: on SIGTERM it dies
    of the signal, exits 0 after writing ``term_output``, or ignores it (SIGKILL after
    the grace period); ``on_start`` runs once per real launch (a side effect a test
    can count).
    """

    output: bytes | Callable[[LaunchRequest], bytes] = b""
    exit_code: int | None = None
    on_term: OnTerm = "die"
    term_output: bytes = b""
    on_start: Callable[[LaunchRequest], None] | None = None


@dataclass
class FakeAttempt:
    """One simulated attempt: its request and what happened to it so far."""

    external_id: str
    request: LaunchRequest
    script: Script
    started_at: float
    log: bytearray = field(default_factory=bytearray)
    status: AttemptStatus | None = None  # set once it ended, never changed after
    term_at: float | None = None  # when SIGTERM was delivered (stop or timeout)
    kill_at: float | None = None  # when SIGKILL follows an ignored SIGTERM
    stopped: bool = False
    timed_out: bool = False
    released: bool = False

    @property
    def key(self) -> str:
        return self.request.key


class FakeFleet:
    """The state every twin of a fake backend shares: nodes, attempts, the clock."""

    def __init__(self, nodes: list[NodeInfo], clock: Callable[[], float]) -> None:
        self.lock = threading.RLock()
        self.nodes = nodes
        self.down: set[str] = set()
        self.attempts: dict[str, FakeAttempt] = {}  # external id -> attempt
        self.clock = clock
        self.offset = 0.0

    def now(self) -> float:
        return self.clock() + self.offset


def _nodes(nodes: int | list[NodeInfo], gpus: int) -> list[NodeInfo]:
    if isinstance(nodes, list):
        return nodes
    return [NodeInfo(f"fake-{i}", tuple(str(g) for g in range(gpus)), 8.0, 32768) for i in range(nodes)]


class FakeBackend(Backend):
    """In-memory backend. ``nodes``: a count (each with ``gpus`` slots) or the NodeInfos;
    ``capabilities``: what this instance claims (the class claims a multi-node GPU fleet
    that preempts); ``programs``: scripts by ``argv[0]``; ``clock``: the fleet's time source."""

    name = "fake"
    simulated = True
    capabilities = Capabilities(gpus=True, preemption=True, multi_node=True, places=True)

    def __init__(self, nodes: int | list[NodeInfo] = 1, gpus: int = 0, capabilities: Capabilities | None = None,
                 programs: dict[str, Script] | None = None, clock: Callable[[], float] = time.time,
                 fleet: FakeFleet | None = None) -> None:
        self.fleet = fleet or FakeFleet(_nodes(nodes, gpus), clock)
        if capabilities is not None:
            self.capabilities = capabilities
        self.programs = dict(programs or {})
        self.scripts: dict[str, Script] = {}  # by key: expect()

    def twin(self) -> FakeBackend:
        """Another instance on the same fleet: what another process would build."""
        other = FakeBackend(capabilities=self.capabilities, programs=self.programs, fleet=self.fleet)
        other.scripts = self.scripts
        return other

    # -- the contract -----------------------------------------------------------------

    def nodes(self) -> list[NodeInfo]:
        with self.fleet.lock:
            return [n for n in self.fleet.nodes if n.name not in self.fleet.down]

    def start(self, request: LaunchRequest) -> str:
        caps = self.capabilities
        if request.nodes > 1 and not caps.multi_node:
            raise BackendError(f"the {self.name} backend runs single-node jobs", hint="use nodes: 1")
        if request.gpu_ids and not caps.gpus:
            raise BackendError(f"the {self.name} backend has no GPUs", hint="use gpus: 0")
        if request.sandbox is not None and not caps.sandbox:
            raise BackendError(f"the {self.name} backend cannot sandbox jobs", hint="see docs/security.md")
        external_id = f"fake:{request.key}"
        with self.fleet.lock:
            if external_id in self.fleet.attempts:
                return external_id  # one launch per key
            script = self.scripts.get(request.key) or self.programs.get(request.argv[0] if request.argv else "")
            att = FakeAttempt(external_id, request, script or Script(), self.fleet.now())
            self.fleet.attempts[external_id] = att
            output = att.script.output
            att.log += output(request) if callable(output) else output
            if att.script.on_start is not None:
                att.script.on_start(request)
            if att.script.exit_code is not None:
                self._end(att, exit_code=att.script.exit_code)
        return external_id

    def poll(self, external_id: str) -> AttemptStatus:
        with self.fleet.lock:
            att = self.fleet.attempts.get(external_id)
            if att is None:
                return AttemptStatus("lost", ended_at=self.fleet.now(), detail="no such attempt on this fake fleet")
            self._advance(att)
            if att.status is not None:
                return att.status
            return AttemptStatus("running", started_at=att.started_at)

    def read_log(self, external_id: str, offset: int = 0, max_bytes: int = 1 << 20) -> bytes:
        with self.fleet.lock:
            att = self.fleet.attempts.get(external_id)
            return bytes(att.log[offset:offset + max_bytes]) if att is not None else b""

    def log_size(self, external_id: str) -> int:
        with self.fleet.lock:
            att = self.fleet.attempts.get(external_id)
            return len(att.log) if att is not None else 0

    def stop(self, external_id: str, grace: float | None = None) -> None:
        with self.fleet.lock:
            att = self.fleet.attempts.get(external_id)
            if att is None or att.status is not None or att.term_at is not None:
                return  # unknown, over, or already told: idempotent
            att.stopped = True
            self._term(att, att.request.grace if grace is None else grace)

    def release(self, external_id: str) -> None:
        with self.fleet.lock:
            att = self.fleet.attempts.get(external_id)
            if att is not None:
                att.released = True

    # -- what a test drives --------------------------------------------------------------

    def expect(self, key: str, script: Script) -> None:
        """The script the attempt launched under ``key`` will act out."""
        self.scripts[key] = script

    def attempt(self, ref: str) -> FakeAttempt:
        """An attempt by external id or key (``"12.1"``)."""
        with self.fleet.lock:
            att = self.fleet.attempts.get(ref) or self.fleet.attempts.get(f"fake:{ref}")
            if att is None:
                raise KeyError(f"no fake attempt {ref!r}; known: {', '.join(a.key for a in self.attempts())}")
            return att

    def attempts(self) -> list[FakeAttempt]:
        """Every attempt ever started on the fleet, in start order."""
        with self.fleet.lock:
            return list(self.fleet.attempts.values())

    def running(self) -> list[FakeAttempt]:
        """Attempts that have not ended (after applying due grace periods and timeouts)."""
        with self.fleet.lock:
            for att in self.fleet.attempts.values():
                self._advance(att)
            return [a for a in self.fleet.attempts.values() if a.status is None]

    def emit(self, ref: str, data: bytes | str) -> None:
        """Append to the attempt's log (stdout and stderr are one stream)."""
        with self.fleet.lock:
            self._live(ref).log += data.encode() if isinstance(data, str) else data

    def report(self, ref: str, step: int | None = None, **metrics: float) -> None:
        """What ``autoresearch.report`` does in the attempt: a line in its metrics file."""
        att = self._live(ref)
        path = att.request.env.get("AUTORESEARCH_METRICS_FILE")
        if not path:
            self.emit(ref, "".join(f"{k}: {v}\n" for k, v in metrics.items()))
            return
        record: dict[str, object] = {"ts": self.fleet.now(), "metrics": metrics}
        if step is not None:
            record["step"] = step
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")

    def finish(self, ref: str, exit_code: int = 0) -> None:
        """The program exits with ``exit_code``."""
        with self.fleet.lock:
            self._end(self._live(ref), exit_code=exit_code)

    def kill(self, ref: str, sig: int = signal.SIGKILL) -> None:
        """The program dies of ``sig`` that nobody here sent (SIGKILL: the OOM killer; SIGSEGV: a crash)."""
        with self.fleet.lock:
            self._end(self._live(ref), sig=int(sig))

    def fail(self, ref: str, detail: str = "lost by the fake backend") -> None:
        """The engine loses the attempt (its supervisor or node is gone)."""
        with self.fleet.lock:
            self._end(self._live(ref), lost=detail)

    def hang(self, ref: str) -> None:
        """The program stops answering: it ignores SIGTERM and ends only by SIGKILL after the grace."""
        with self.fleet.lock:
            att = self._live(ref)
            att.script = Script(on_term="ignore")

    def crash_node(self, node: str) -> None:
        """The node goes away: it is no longer reported, and its attempts are lost."""
        with self.fleet.lock:
            self.fleet.down.add(node)
            for att in self.fleet.attempts.values():
                if att.status is None and att.request.node == node:
                    self._end(att, lost=f"node {node} crashed")

    def restore_node(self, node: str) -> None:
        with self.fleet.lock:
            self.fleet.down.discard(node)

    def advance(self, seconds: float) -> None:
        """Move the fleet's clock forward (timeouts and grace periods fall due on the next poll)."""
        with self.fleet.lock:
            self.fleet.offset += seconds

    # -- inside ----------------------------------------------------------------------------

    def _live(self, ref: str) -> FakeAttempt:
        att = self.attempt(ref)
        self._advance(att)
        if att.status is not None:
            raise ValueError(f"fake attempt {att.key} has already ended ({att.status.state})")
        return att

    def _advance(self, att: FakeAttempt) -> None:
        if att.status is not None:
            return
        now = self.fleet.now()
        timeout = att.request.timeout
        if att.term_at is None and timeout is not None and now >= att.started_at + timeout:
            att.timed_out = True
            self._term(att, att.request.grace, at=att.started_at + timeout)
        if att.status is None and att.kill_at is not None and now >= att.kill_at:
            self._end(att, sig=signal.SIGKILL, at=att.kill_at)

    def _term(self, att: FakeAttempt, grace: float, at: float | None = None) -> None:
        att.term_at = self.fleet.now() if at is None else at
        if att.script.on_term == "die":
            self._end(att, sig=signal.SIGTERM, at=att.term_at)
        elif att.script.on_term == "exit":
            att.log += att.script.term_output
            self._end(att, exit_code=0, at=att.term_at)
        else:
            att.kill_at = att.term_at + grace
            self._advance(att)

    def _end(self, att: FakeAttempt, exit_code: int | None = None, sig: int | None = None, lost: str = "",
             at: float | None = None) -> None:
        ended = self.fleet.now() if at is None else at
        if lost:
            att.status = AttemptStatus("lost", started_at=att.started_at, ended_at=ended, detail=lost)
            return
        att.status = AttemptStatus("exited", exit_code=exit_code, signal=sig, timed_out=att.timed_out,
                                   stopped=att.stopped, started_at=att.started_at, ended_at=ended)
