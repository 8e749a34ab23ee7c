"""The ``sim`` backend: a simulated GPU fleet with faults, in simulated time (docs/sim.md).

Nothing runs. An attempt is its launch record (``sim.json`` in its run dir) plus what happens
to its nodes (the fleet's seeded fault schedule, :mod:`autoresearch.sim.faults`), the stop it
was sent (``stop.json``) and the clock: its whole life is a pure function of those
(:func:`autoresearch.sim.timeline.live`), so every process that builds a ``SimBackend`` (the CLI,
``python -m autoresearch.engine.runtime``, a loop) sees the same attempt. ``poll`` and ``read_log``
append what happened up to simulated now to the attempt's log and ``report()`` file, which
the runtime ingests as it would a real trial's; faults write the driver's and NCCL's lines,
and :meth:`SimBackend.gpu_reader` answers NVML-like samples, so the same health policy
cordons a simulated node as it would a real one.

The fleet's state lives under ``<home>/sim/<fleet id>/``: its options, its epoch (wall mode)
or simulated now (events mode), the cordons the health checks sent. A ``SimBackend()`` built
without options (a later process that knows only the name ``sim``) uses the home's last
configured fleet.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
from pathlib import Path
from typing import Any

from autoresearch.backends._base import AttemptStatus, Backend, Capabilities, LaunchRequest, NodeInfo
from autoresearch.errors import BackendError, SpecError
from autoresearch.sim import fleet as F
from autoresearch.sim import trials as T
from autoresearch.sim.clock import SimClock
from autoresearch.sim.faults import Schedule
from autoresearch.sim.timeline import Life, Record, live

RECORD = "sim.json"
_KEY = re.compile(r"^(.*)\.(\d+)$")


class _Fleet:
    """One fleet's parsed options, schedule, clock and cordons (shared by every attempt on it)."""

    def __init__(self, state_dir: Path, options: dict[str, Any], next_event: Any) -> None:
        self.dir = state_dir
        self.options = options
        self.fleet = F.parse(options.get("nodes"), options.get("faults"), options.get("seed", 0), options.get("clock"))
        self.trial = T.parse(options.get("trial"))
        self.schedule = Schedule(self.fleet)
        self.clock = SimClock(state_dir, self.fleet.clock.mode, self.fleet.clock.speed, next_event)
        self._cordons: tuple[float, list[tuple[str, float]]] = (-1.0, [])

    def cordons(self) -> list[tuple[str, float]]:
        path = self.dir / "cordons.jsonl"
        try:
            mtime = path.stat().st_mtime_ns
        except OSError:
            return []
        if mtime != self._cordons[0]:
            out = []
            for line in path.read_text().splitlines():
                with contextlib.suppress(ValueError, TypeError, KeyError):
                    rec = json.loads(line)
                    out.append((str(rec["node"]), float(rec["t"])))
            self._cordons = (mtime, out)
        return self._cordons[1]


class SimBackend(Backend):
    """A simulated fleet. Options (a plan's ``backend: {kind: sim, ...}``): ``nodes`` (node types),
    ``trial`` (what attempts do), ``faults`` (rates per node-hour), ``seed``, ``clock``."""

    name = "sim"
    simulated = True
    capabilities = Capabilities(gpus=True, preemption=True, multi_node=True, places=True)

    def __init__(self, nodes: Any = None, trial: Any = None, faults: Any = None, seed: Any = None,
                 clock: Any = None, home_dir: str | os.PathLike[str] | None = None) -> None:
        root = Path(home_dir or os.environ.get("AUTORESEARCH_HOME") or Path.home() / ".autoresearch").expanduser()
        self.root = root.absolute() / "sim"
        given = {k: v for k, v in (("nodes", nodes), ("trial", trial), ("faults", faults), ("seed", seed),
                                   ("clock", clock)) if v is not None}
        if not given:
            given = self._current() or {}
        parsed = F.parse(given.get("nodes"), given.get("faults"), given.get("seed", 0), given.get("clock"))
        T.parse(given.get("trial"))  # validated before anything is written
        state_dir = self.root / (parsed.ident() + "-" + _trial_ident(given.get("trial")))
        self.state = _Fleet(state_dir, given, self._next_event)
        options = state_dir / "options.json"
        if not options.exists():
            tmp = state_dir / f".options.{os.getpid()}"
            tmp.write_text(json.dumps(given, sort_keys=True))
            os.replace(tmp, options)
        self._fleets: dict[str, _Fleet] = {str(state_dir): self.state}
        self._records: dict[str, dict[str, Any]] = {}
        self._lives: dict[str, tuple[Any, int, Life]] = {}
        self.scripts: dict[str, Any] = {}  # by key: what a conformance program does (timeline._script)
        self._remember(given)

    @classmethod
    def validate_options(cls, options: dict[str, Any]) -> None:
        """Refuse a fleet that contradicts itself, before anything runs (a plan's load calls this)."""
        F.parse(options.get("nodes"), options.get("faults"), options.get("seed", 0), options.get("clock"))
        T.parse(options.get("trial"))

    @property
    def fleet(self) -> F.Fleet:
        return self.state.fleet

    @property
    def clock(self) -> SimClock:
        return self.state.clock

    def now(self) -> float:
        """Simulated now as a timestamp (the epoch plus simulated seconds, as ``started_at`` is): the
        runtime's clock on this fleet (its ledger's stamps, reservation ages, cool-downs)."""
        return self.clock.wall(self.clock.now())

    def check(self, spec: Any) -> None:
        super().check(spec)
        self.fleet.check_job(int(getattr(spec, "gpus", 0) or 0), int(getattr(spec, "nodes", 1) or 1))

    # -- the contract -----------------------------------------------------------------

    def nodes(self) -> list[NodeInfo]:
        """Every node of the fleet; one its seeded schedule has lost is reported ``down``, with why and
        when it is back (the sim knows: it is no node that merely went unreported)."""
        now = self.clock.now()
        out = []
        for name, kind in self.fleet.nodes():
            loss = self.state.schedule.down(name, now)
            state, reason = "", ""
            if loss is not None:
                back = self.state.schedule.back_at(loss)  # a reason that stays put: a row written once
                state, reason = "down", (f"node lost (a simulated fault) at {loss.t / 3600:.2f} h of simulated time; "
                                         f"back at {back / 3600:.2f} h")
            out.append(NodeInfo(name, tuple(str(g) for g in range(kind.gpus)), kind.cpus, kind.memory,
                                {"sim.type": kind.name, "sim.speed": f"{kind.speed:g}"}, state, reason))
        return out

    def start(self, request: LaunchRequest) -> str:
        if request.sandbox is not None:
            raise BackendError("the sim backend runs nothing, so it cannot sandbox a tenant's job",
                               hint="submit tenant jobs to a backend that sandboxes (docs/security.md)")
        run_dir = Path(request.run_dir)
        external_id = f"sim:{run_dir}"
        if (run_dir / RECORD).exists():
            return external_id  # one launch per key
        alloc = getattr(request, "alloc", ()) or ((request.node, request.gpu_ids),)
        members = tuple(str(n) if n else self.fleet.node_names[0] for n, _ in alloc)
        speeds = [t.speed for t in (self.fleet.type_of(n) for n in members) if t is not None]
        gpus = sum(len(ids) for _, ids in alloc) or request.gpus * max(1, request.nodes)
        now = self.clock.now()
        script = self.scripts.pop(request.key, None)
        fields: dict[str, Any] = {}
        if script is not None:
            out = script.output(request) if callable(script.output) else script.output
            fields["script"] = {"output": out.decode(errors="replace"), "exit_code": script.exit_code,
                                "on_term": script.on_term, "term_output": script.term_output.decode(errors="replace")}
        else:
            params = _params(request.env.get("AUTORESEARCH_PARAMS"))
            work = self.state.trial.work(params, _KEY.sub(r"\1", request.key))
            fields.update(seconds=work.seconds, values=work.values, metric=work.metric,
                          checkpoint_steps=self.state.trial.checkpoint_steps,
                          checkpoint_s=self.state.trial.checkpoint_s,
                          resume=self._resume(run_dir, request.key, now) if self.state.trial.checkpoints else 0)
        rec = Record(request.key, now, members, gpus, min(speeds, default=1.0), request.timeout, request.grace,
                     **fields)
        doc = {"record": rec.to_json(), "fleet": str(self.state.dir), "log": request.log_path,
               "metrics": request.env.get("AUTORESEARCH_METRICS_FILE") or ""}
        run_dir.mkdir(parents=True, exist_ok=True)
        tmp = run_dir / f".{RECORD}.{os.getpid()}"
        tmp.write_text(json.dumps(doc))
        try:
            os.link(tmp, run_dir / RECORD)  # exactly one launch wins
        except FileExistsError:
            return external_id
        finally:
            tmp.unlink(missing_ok=True)
        Path(request.log_path).touch(0o600)
        live_dir = self.state.dir / "live"
        live_dir.mkdir(exist_ok=True)
        (live_dir / _safe(request.key)).write_text(str(run_dir))
        if script is not None and script.on_start is not None:
            script.on_start(request)
        self._advance(external_id)
        return external_id

    def poll(self, external_id: str) -> AttemptStatus:
        got = self._advance(external_id)
        if got is None:
            return AttemptStatus("lost", detail="no such attempt on this simulated fleet")
        doc, life, now, fleet = got
        rec = Record.from_json(doc["record"])
        started = fleet.clock.wall(rec.t0)
        end = life.ending
        if end is None or end.t > now:
            return AttemptStatus("running", started_at=started)
        with contextlib.suppress(OSError):
            (fleet.dir / "live" / _safe(rec.key)).unlink()
        return AttemptStatus(end.state, exit_code=end.exit_code, signal=end.signal, timed_out=end.timed_out,
                             stopped=end.stopped, started_at=started, ended_at=fleet.clock.wall(end.t),
                             detail=end.detail)

    def read_log(self, external_id: str, offset: int = 0, max_bytes: int = 1 << 20) -> bytes:
        got = self._advance(external_id)
        if got is None:
            return b""
        with contextlib.suppress(OSError), open(got[0]["log"], "rb") as f:
            f.seek(max(0, offset))
            return f.read(max(0, max_bytes))
        return b""

    def log_size(self, external_id: str) -> int:
        got = self._advance(external_id)
        try:
            return os.stat(got[0]["log"]).st_size if got is not None else 0
        except OSError:
            return 0

    def stop(self, external_id: str, grace: float | None = None) -> None:
        doc = self._doc(external_id)
        if doc is None:
            return
        fleet = self._fleet(doc["fleet"])
        rec = doc["record"]
        data = json.dumps({"t": fleet.clock.now(), "grace": rec.get("grace", 10.0) if grace is None else grace})
        with contextlib.suppress(FileExistsError):  # the first stop is the one that counts: idempotent
            fd = os.open(Path(external_id[4:]) / "stop.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(data)

    def release(self, external_id: str) -> None:
        doc = self._doc(external_id)
        if doc is not None:
            with contextlib.suppress(OSError):
                (Path(doc["fleet"]) / "live" / _safe(str(doc["record"]["key"]))).unlink()

    def cordon(self, node: str, reason: str) -> None:
        """The health checks cordoned ``node``: an operator takes it out and fixes it (``faults.repair``)."""
        with open(self.state.dir / "cordons.jsonl", "a") as f:
            f.write(json.dumps({"node": node, "t": self.clock.now(), "reason": reason[:200]}) + "\n")

    def gpu_reader(self, node: str) -> Any:
        """What NVML reads on ``node`` now (the health monitor's and the preflight's reader); None
        for a node this fleet does not have or cannot reach."""
        if self.fleet.type_of(node) is None or self.state.schedule.down(node, self.clock.now()) is not None:
            return None
        return _Reader(self.state, node)

    # -- inside ----------------------------------------------------------------------------

    def _current(self) -> dict[str, Any] | None:
        with contextlib.suppress(OSError, ValueError):
            data = json.loads((self.root / "current.json").read_text())
            return data if isinstance(data, dict) else None
        return None

    def _remember(self, given: dict[str, Any]) -> None:
        """This fleet is the home's current one (what ``SimBackend()`` in a later process opens)."""
        with contextlib.suppress(OSError, TypeError, ValueError):
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
            text = json.dumps(given, sort_keys=True)
            path = self.root / "current.json"
            if not path.exists() or path.read_text() != text:
                tmp = self.root / f".current.{os.getpid()}"
                tmp.write_text(text)
                os.replace(tmp, path)

    def _fleet(self, state_dir: str) -> _Fleet:
        fleet = self._fleets.get(state_dir)
        if fleet is None:
            options = json.loads((Path(state_dir) / "options.json").read_text())
            fleet = self._fleets[state_dir] = _Fleet(Path(state_dir), options, self._next_event)
        return fleet

    def _doc(self, external_id: str) -> dict[str, Any] | None:
        doc = self._records.get(external_id)
        if doc is None:
            if not external_id.startswith("sim:"):
                return None
            try:
                doc = json.loads((Path(external_id[4:]) / RECORD).read_text())
            except (OSError, ValueError):
                return None
            self._records[external_id] = doc
        return doc

    def _life(self, external_id: str, doc: dict[str, Any], fleet: _Fleet) -> Life:
        stop = _read_stop(Path(external_id[4:]))
        cordons = fleet.cordons()
        cached = self._lives.get(external_id)
        if cached is not None and cached[0] == stop and cached[1] == len(cordons):
            return cached[2]
        life = live(Record.from_json(doc["record"]), fleet.schedule, cordons, stop)
        self._lives[external_id] = (stop, len(cordons), life)
        return life

    def _advance(self, external_id: str) -> tuple[dict[str, Any], Life, float, _Fleet] | None:
        """Write what happened up to simulated now to the attempt's log and metrics file."""
        doc = self._doc(external_id)
        if doc is None:
            return None
        try:
            fleet = self._fleet(doc["fleet"])
        except (OSError, ValueError, SpecError):
            return None
        life = self._life(external_id, doc, fleet)
        now = fleet.clock.now()
        _materialize(Path(external_id[4:]), doc, life, now, fleet.clock)
        return doc, life, now, fleet

    def _resume(self, run_dir: Path, key: str, now: float) -> int:
        """The steps the job's last attempt checkpointed (0 for its first)."""
        m = _KEY.match(key)
        if m is None:
            return 0
        job, n = m.group(1), int(m.group(2))
        best: tuple[int, str] | None = None
        for rec_path in run_dir.parent.glob(f"*/{RECORD}"):
            with contextlib.suppress(OSError, ValueError, KeyError):
                doc = json.loads(rec_path.read_text())
                other = _KEY.match(str(doc["record"]["key"]))
                if other and other.group(1) == job and int(other.group(2)) < n and (
                        best is None or int(other.group(2)) > best[0]):
                    best = (int(other.group(2)), f"sim:{rec_path.parent}")
        if best is None:
            return 0
        doc = self._doc(best[1])
        if doc is None:
            return 0
        life = self._life(best[1], doc, self._fleet(doc["fleet"]))
        until = life.ending.t if life.ending is not None else now
        return life.checkpoint_at(min(until, now), int(doc["record"].get("resume", 0)))

    def _next_event(self, now: float) -> float | None:
        """The next observable moment of any live attempt (events mode's ``wait``)."""
        best: float | None = None
        for path in sorted((self.state.dir / "live").glob("*")):
            with contextlib.suppress(OSError):
                ext = "sim:" + path.read_text()
                doc = self._doc(ext)
                if doc is None:
                    continue
                nxt = self._life(ext, doc, self._fleet(doc["fleet"])).next_after(now)
                if nxt is not None and (best is None or nxt < best):
                    best = nxt
        return best


class _Reader:
    def __init__(self, fleet: _Fleet, node: str) -> None:
        self.fleet, self.node = fleet, node

    def sample(self) -> Any:
        return self.fleet.schedule.sample(self.node, self.fleet.clock.now(), self.fleet.cordons())


def _materialize(run_dir: Path, doc: dict[str, Any], life: Life, now: float, clock: SimClock) -> None:
    """Append the lines and points of ``life`` up to ``now`` not written yet (once, across processes)."""
    with open(run_dir / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        progress = run_dir / "progress"
        try:
            lines_done, points_done = (int(x) for x in progress.read_text().split())
        except (OSError, ValueError):
            lines_done = points_done = 0
        lines = [(t, text) for t, text in life.lines[lines_done:] if t <= now]
        points = [(t, s, v) for t, s, v in life.points[points_done:] if t <= now]
        if not lines and not points:
            return
        metric = str(doc["record"].get("metric") or "loss")
        text = [x for _, x in lines]
        if points and doc.get("metrics"):
            with open(doc["metrics"], "a") as f:
                f.write("".join(json.dumps({"ts": clock.wall(t), "step": s, "metrics": {metric: v}}) + "\n"
                                for t, s, v in points))
        elif points:  # no report() file (a bare launch): the points go to the log as metric lines
            text += [f"{metric}: {v}\n" for _, _, v in points]
        if text:
            with open(doc["log"], "a") as f:
                f.write("".join(text))
        progress.write_text(f"{lines_done + len(lines)} {points_done + len(points)}")


def _read_stop(run_dir: Path) -> tuple[float, float] | None:
    try:
        data = json.loads((run_dir / "stop.json").read_text())
        return float(data["t"]), float(data["grace"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _params(raw: str | None) -> dict[str, Any]:
    try:
        data = json.loads(raw or "{}")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _safe(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", key)[:200]


def _trial_ident(trial: Any) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(trial, sort_keys=True, default=str).encode()).hexdigest()[:8]
