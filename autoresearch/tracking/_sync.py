"""The mirror itself: ledger rows → MLflow, in batches, resumable at any line.

Mapping (issue 4): experiment = the plan's name (or the loop's / job's ``experiment``;
``Default`` for a standalone job without one); one parent run per loop, one nested run
per trial, one run per standalone job.

Progress lives in the ledger:

* ``tracking_runs``: entity (``loop:3``, ``job:12``, ``trial:7``) → run id. The row is
  written *before* ``create_run`` (write-ahead); a row without a run id means a create
  may have happened, so the next pass looks for the run by its ``autoresearch.entity``
  tag before creating one. Also per run: ``synced_version`` (the entity's ``updated_at``
  last mirrored), ``metric_rowid`` (metrics sent up to this ledger rowid), ``logs_done``
  (attempt logs uploaded), ``finished`` (run terminated), ``error`` (why it is blocked).
* ``tracking_state``: the store URI the mirror is bound to, and the cursors ``metrics``
  (ledger rowid) and ``decisions`` (decision id).
* ``tracking_outbox``: LLM calls waiting to become traces.

A cursor moves only after MLflow accepted the batch. A crash in between replays that
batch, and MLflow's SQL store drops points equal in (key, step, timestamp, value) —
timestamps come from the ledger, so a replay is byte-for-byte the same: no duplicate,
no gap.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import re
import sqlite3
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoresearch.errors import TrackingError
from autoresearch.ledger import Ledger
from autoresearch.tracking import is_secret, redact, secret_values, tracking_uri

METRIC_WINDOW = 20_000  # ledger rows read per pass step
BATCH = 1_000  # MLflow's limit per log_batch
LOG_HEAD, LOG_TAIL = 256 << 10, 768 << 10  # attempt logs are capped at 1 MiB: head + tail
FINAL = {"succeeded": "FINISHED", "failed": "FAILED", "cancelled": "KILLED"}
LOOP_FINAL = {"done": "FINISHED", "finished": "FINISHED", "completed": "FINISHED", "succeeded": "FINISHED",
              "failed": "FAILED", "stopped": "KILLED", "cancelled": "KILLED", "killed": "KILLED"}
DEFAULT_EXPERIMENT = "Default"
URI_HINT = "set MLFLOW_TRACKING_URI to http(s)://HOST:PORT or sqlite:///ABSOLUTE/PATH.db, or unset it for the default"
# A job belongs to a trial by trials.job_id, or (before the loop wrote it back) by its spec tag.
TRIAL_JOIN = ("t.id=COALESCE((SELECT x.id FROM trials x WHERE x.job_id=j.id LIMIT 1), "
              "CAST(json_extract(j.spec, '$.tags.\"autoresearch.trial_id\"') AS INTEGER))")
ENTITY = "(CASE WHEN t.id IS NULL THEN 'job:' || j.id ELSE 'trial:' || t.id END)"
_BAD_NAME = re.compile(r"[^\w\-. /:]")


@dataclass
class SyncReport:
    runs_created: int = 0
    metrics: int = 0
    batches: int = 0
    decisions: int = 0
    traces: int = 0
    artifacts: int = 0
    finished: int = 0
    warnings: list[str] = field(default_factory=list)
    pending: bool = False  # more work than one pass handled

    @property
    def did_work(self) -> bool:
        return bool(self.runs_created or self.metrics or self.decisions or self.traces or self.artifacts
                    or self.finished)


def is_transient(err: BaseException) -> bool:
    """Worth retrying later (server down, DB busy) as opposed to a rejected write."""
    if isinstance(err, TrackingError):
        return bool(err.details.get("transient"))
    if isinstance(err, (ConnectionError, TimeoutError)):
        return True
    name = type(err).__name__
    if name in ("ConnectionError", "ReadTimeout", "ConnectTimeout", "MaxRetryError", "OperationalError"):
        return True
    code = getattr(err, "error_code", "")
    text = str(err)
    return code in ("TEMPORARILY_UNAVAILABLE", "REQUEST_LIMIT_EXCEEDED") or any(
        s in text for s in ("API request to", "Max retries exceeded", "Connection refused", "database is locked",
                            "timed out", "503", "502"))


def _metric_name(name: str) -> str:
    return _BAD_NAME.sub("_", name)[:250] or "_"


def _flatten(params: dict[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value if isinstance(value, str) else json.dumps(value, default=str)
    return out


@contextlib.contextmanager
def _critical(home: Path) -> Iterator[None]:
    """Serializes what must happen once across processes (a foreground `sync`, the
    background syncer, the loop's :func:`prepare_runs`): creating the database, a run,
    a trace. Held for one MLflow call or two, never across a pass."""
    fd = os.open(home / "tracking.create.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def fail_fast_http() -> Iterator[None]:
    """While mirroring: our own back-off (tenacity) decides when to retry, not MLflow's
    ~2 min of retries per request. Scoped, not set by :class:`Syncer` for good: a Syncer
    also runs inside trials (``start_run``), whose own MLflow calls keep MLflow's retries."""
    names = ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT")
    before = {name: os.environ.get(name) for name in names}
    os.environ.setdefault(names[0], "0")
    os.environ.setdefault(names[1], "10")
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class Syncer:
    """One handle on the mirror: a ledger, an MLflow client and the mapping between them."""

    def __init__(self, home: str | os.PathLike[str] | Ledger | None = None, uri: str | None = None) -> None:
        self.ledger = home if isinstance(home, Ledger) else Ledger(home)
        self.uri = self._bind_uri(uri)
        self.home_id = self._state("home_id") or self._init_home_id()
        self.secrets = secret_values(dict(os.environ))
        self._experiments: dict[str, str] = {}
        self._warned: set[str] = set()
        self._runtimes: dict[str, Any] = {}
        self.client = self._make_client()

    # -- setup ------------------------------------------------------------------------------

    def _bind_uri(self, uri: str | None) -> str:
        """The first sync binds the ledger to a store; later ones keep it (see docs/tracking.md)."""
        bound = self._state("uri")
        if uri is None:
            uri = bound or tracking_uri(self.ledger.home)
        if not re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", uri) or uri.startswith("sqlite:") and not uri.startswith(
                "sqlite:///"):
            raise TrackingError(f"tracking URI {uri!r} is malformed", hint=URI_HINT)
        if uri.startswith("sqlite:///"):
            path = Path(uri[len("sqlite:///"):])
            if not path.parent.is_dir():
                raise TrackingError(f"tracking URI {uri!r}: directory {path.parent} does not exist", hint=URI_HINT)
        if bound and bound != uri:
            self._rebind(uri)
        elif not bound:
            self._set_state("uri", uri)
        return uri

    def _rebind(self, uri: str) -> None:
        """A new store: forget the old mapping so everything is mirrored again into the new one."""
        with self.ledger.tx() as c:
            c.execute("DELETE FROM tracking_runs")
            c.execute("DELETE FROM tracking_state WHERE name IN ('metrics','decisions')")
            c.execute("UPDATE tracking_outbox SET done_at=NULL, sent_ref=NULL")
            c.execute("INSERT OR REPLACE INTO tracking_state(name, value) VALUES ('uri', ?)", (uri,))

    def artifact_root(self) -> str | None:
        """For a SQLite store, artifacts live beside the database (MLflow would use ./mlruns of the cwd)."""
        if not self.uri.startswith("sqlite:///"):
            return None
        return (Path(self.uri[len("sqlite:///"):]).resolve().parent / "mlartifacts").as_uri()

    def _make_client(self) -> Any:
        from mlflow.tracking import MlflowClient

        root = self.artifact_root()
        if root is not None and not Path(self.uri[len("sqlite:///"):]).exists():
            # Whoever creates the database creates experiment 0 with its artifact root: make it ours.
            from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

            try:
                with _critical(self.ledger.home):
                    SqlAlchemyStore(self.uri, root)
                    # WAL: the UI reads while the syncer writes, and a commit costs no fsync of the whole journal.
                    with contextlib.closing(sqlite3.connect(self.uri[len("sqlite:///"):])) as db:
                        db.execute("PRAGMA journal_mode=WAL")
            except Exception as err:
                raise TrackingError(f"cannot create the MLflow database {self.uri}: {str(err).splitlines()[0]}",
                                    hint=URI_HINT) from None

        try:
            return MlflowClient(tracking_uri=self.uri)
        except Exception as err:  # mlflow raises several types for a bad scheme
            raise TrackingError(f"cannot use tracking URI {self.uri!r}: {str(err).splitlines()[0]}",
                                hint=URI_HINT) from None

    def _init_home_id(self) -> str:
        value = uuid.uuid4().hex[:12]
        with self.ledger.tx() as c:
            c.execute("INSERT OR IGNORE INTO tracking_state(name, value) VALUES ('home_id', ?)", (value,))
        return self._state("home_id") or value

    def _state(self, name: str) -> str | None:
        row = self.ledger.one("SELECT value FROM tracking_state WHERE name=?", (name,))
        return str(row["value"]) if row else None

    def _set_state(self, name: str, value: object) -> None:
        with self.ledger.tx() as c:
            c.execute("INSERT OR REPLACE INTO tracking_state(name, value) VALUES (?,?)", (name, str(value)))

    def check(self) -> None:
        """Fail fast (TrackingError, transient) when the store cannot be reached."""
        try:
            self.client.search_experiments(max_results=1)
        except Exception as err:
            raise self._wrap(err, "cannot reach the tracking store") from None

    def _wrap(self, err: Exception, what: str) -> TrackingError:
        first = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
        transient = is_transient(err)
        hint = ("the sync retries with back-off; start the server or fix MLFLOW_TRACKING_URI"
                if transient else "see the message; `autoresearch sync` retries the rest")
        return TrackingError(f"{what} at {self.uri}: {first}", hint=hint, transient=transient)

    def warn(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            print(f"autoresearch tracking: {message}", file=__import__("sys").stderr, flush=True)

    # -- the pass ---------------------------------------------------------------------------

    def run_once(self, max_batches: int | None = None) -> SyncReport:
        """Mirror everything new. Raises TrackingError(transient) when the store is down."""
        report = SyncReport()
        self._ingest_live()
        try:
            self._sync_loops(report)
            self._sync_jobs(report)
            self._sync_metrics(report, max_batches)
            self._sync_decisions(report)
            self._sync_outbox(report)
            self._finish(report)
        except TrackingError:
            raise
        except Exception as err:
            if is_transient(err):
                raise self._wrap(err, "tracking store unavailable") from None
            raise
        self._set_state("last_sync", time.time())
        return report

    def _ingest_live(self) -> None:
        """Pull fresh points of running attempts into the ledger, so MLflow shows them live."""
        from autoresearch.backends import get_backend
        from autoresearch.runtime import Runtime

        rows = self.ledger.query("SELECT DISTINCT j.backend FROM attempts a JOIN jobs j ON j.id=a.job_id "
                                 "WHERE a.state IN ('starting','running')")
        for row in rows:
            try:
                runtime = self._runtimes.get(row["backend"])
                if runtime is None:
                    runtime = self._runtimes[row["backend"]] = Runtime(self.ledger.home, get_backend(row["backend"]))
                for att in self.ledger.query("SELECT a.* FROM attempts a JOIN jobs j ON j.id=a.job_id "
                                             "WHERE a.state='running' AND j.backend=?", (row["backend"],)):
                    runtime.ingest_attempt(att)
            except Exception as err:  # live metrics are a nicety; the final ingest is the runtime's
                self.warn(f"ingest:{row['backend']}", f"could not read live metrics ({err})")

    # -- runs -------------------------------------------------------------------------------

    def experiment_id(self, name: str) -> str:
        if name in self._experiments:
            return self._experiments[name]
        exp = self.client.get_experiment_by_name(name)
        if exp is not None and exp.lifecycle_stage == "deleted":
            raise TrackingError(
                f"MLflow experiment {name!r} (id {exp.experiment_id}) is deleted",
                hint=f"restore it (mlflow experiments restore --experiment-id {exp.experiment_id}) or delete it for "
                     f"good (mlflow gc --experiment-ids {exp.experiment_id}); the sync resumes by itself")
        if exp is None:
            location = self.artifact_root()
            try:
                exp_id = self.client.create_experiment(name, artifact_location=location)
            except Exception as err:
                if "already exists" not in str(err).lower() and "RESOURCE_ALREADY_EXISTS" not in str(err):
                    raise
                exp = self.client.get_experiment_by_name(name)  # a concurrent create won
                exp_id = exp.experiment_id
        else:
            exp_id = exp.experiment_id
        self._experiments[name] = str(exp_id)
        return str(exp_id)

    def _ensure_run(self, entity: str, experiment: str, run_name: str, parent: str | None,
                    report: SyncReport | None = None, started: float | None = None) -> tuple[str, bool]:
        """The run of ``entity`` (created if needed, exactly once). Returns (run id, created)."""
        row = self.ledger.one("SELECT run_id, experiment_id FROM tracking_runs WHERE entity=?", (entity,))
        if row is not None and row["run_id"]:
            return str(row["run_id"]), False
        with _critical(self.ledger.home):
            return self._create_run(entity, experiment, run_name, parent, report, started)

    def _create_run(self, entity: str, experiment: str, run_name: str, parent: str | None,
                    report: SyncReport | None, started: float | None) -> tuple[str, bool]:
        row = self.ledger.one("SELECT run_id, experiment_id FROM tracking_runs WHERE entity=?", (entity,))
        if row is not None and row["run_id"]:
            return str(row["run_id"]), False  # another process created it while we waited
        exp_id = self.experiment_id(experiment)
        key = f"{self.home_id}/{entity}"
        run_id = None
        if row is None:
            now = time.time()
            with self.ledger.tx() as c:  # write-ahead: a create may follow
                c.execute("INSERT OR IGNORE INTO tracking_runs(entity, experiment_id, parent_run_id, created_at, "
                          "updated_at) VALUES (?,?,?,?,?)", (entity, exp_id, parent, now, now))
        else:
            from mlflow.entities import ViewType

            found = self.client.search_runs([exp_id], filter_string=f"tags.`autoresearch.entity` = '{key}'",
                                            run_view_type=ViewType.ALL, max_results=1)
            run_id = found[0].info.run_id if found else None
        if run_id is None:
            tags = {"autoresearch.entity": key, "autoresearch.home": str(self.ledger.home)}
            if parent:
                tags["mlflow.parentRunId"] = parent
            start_ms = int((started or time.time()) * 1000)  # when it began in the ledger, not when mirrored
            run_id = self.client.create_run(exp_id, start_time=start_ms, run_name=run_name, tags=tags).info.run_id
            if report is not None:
                report.runs_created += 1
        with self.ledger.tx() as c:
            c.execute("UPDATE tracking_runs SET run_id=?, experiment_id=?, parent_run_id=?, updated_at=? "
                      "WHERE entity=?", (run_id, exp_id, parent, time.time(), entity))
        return str(run_id), True

    def _blocked(self, entity: str, err: Exception) -> None:
        """A permanent problem with one run: record it, warn once, go on with the others."""
        if is_transient(err):
            raise err
        text = err.render() if isinstance(err, TrackingError) else f"{type(err).__name__}: {err}"
        text = text.strip().splitlines()[0] if not isinstance(err, TrackingError) else text
        now = time.time()
        with self.ledger.tx() as c:  # a row even for a run never created: its points are backfilled once fixed
            c.execute("INSERT OR IGNORE INTO tracking_runs(entity, created_at, updated_at) VALUES (?,?,?)",
                      (entity, now, now))
            c.execute("UPDATE tracking_runs SET error=?, updated_at=? WHERE entity=?", (text, now, entity))
        self.warn(f"{entity}:{text}", f"{entity}: {text}")

    def _clear_error(self, entity: str) -> bool:
        row = self.ledger.one("SELECT error FROM tracking_runs WHERE entity=?", (entity,))
        if row is None or row["error"] is None:
            return False
        with self.ledger.tx() as c:
            c.execute("UPDATE tracking_runs SET error=NULL WHERE entity=?", (entity,))
        return True

    def _log(self, run_id: str, metrics: list[Any] = (), params: dict[str, str] | None = None,  # type: ignore[assignment]
             tags: dict[str, str] | None = None) -> None:
        from mlflow.entities import Param, RunTag

        plist = [Param(k[:250], redact(v, self.secrets)[:6000]) for k, v in (params or {}).items()]
        tlist = [RunTag(k[:250], redact(v, self.secrets)[:8000]) for k, v in (tags or {}).items()]
        for i in range(0, max(len(plist), len(tlist)), 100):
            self.client.log_batch(run_id, params=plist[i:i + 100], tags=tlist[i:i + 100])
        for i in range(0, len(metrics), BATCH):
            self.client.log_batch(run_id, metrics=list(metrics[i:i + BATCH]))

    # -- loops ------------------------------------------------------------------------------

    def _loop_experiment(self, loop: Any) -> str:
        return loop["experiment"] or loop["name"]

    def _sync_loops(self, report: SyncReport) -> None:
        rows = self.ledger.query(
            "SELECT l.*, r.synced_version, r.run_id, r.finished, r.error FROM loops l LEFT JOIN tracking_runs r "
            "ON r.entity='loop:' || l.id WHERE r.run_id IS NULL OR r.synced_version < l.updated_at "
            "OR r.error IS NOT NULL ORDER BY l.id")
        for loop in rows:
            self._sync_loop(loop, report)

    def _sync_loop(self, loop: Any, report: SyncReport) -> str | None:
        entity = f"loop:{loop['id']}"
        try:
            run_id, created = self._ensure_run(entity, self._loop_experiment(loop), loop["name"], None, report,
                                               loop["created_at"])
            tags = {"autoresearch.loop_id": str(loop["id"]), "autoresearch.loop": loop["name"],
                    "autoresearch.state": loop["state"], "autoresearch.kind": "loop"}
            params: dict[str, str] = {}
            if created or loop["synced_version"] is None or loop["synced_version"] < 0:
                try:
                    plan = json.loads(loop["plan"])
                except ValueError:
                    plan = {"plan": loop["plan"]}
                params = {k: v for k, v in _flatten(plan if isinstance(plan, dict) else {"plan": plan}).items()
                          if not is_secret(k.rsplit(".", 1)[-1]) and v not in ("null", "{}", "[]", "")}
                params = dict(list(params.items())[:300])
                self.client.log_text(run_id, redact(json.dumps(plan, indent=2, default=str), self.secrets),
                                     "plan.json")
                report.artifacts += 1
            self._log(run_id, params=params, tags=tags)
            with self.ledger.tx() as c:
                c.execute("UPDATE tracking_runs SET synced_version=?, error=NULL WHERE entity=?",
                          (loop["updated_at"], entity))
            return run_id
        except Exception as err:
            self._blocked(entity, err)
            return None

    def _loop_run(self, loop_id: int, report: SyncReport | None = None) -> str | None:
        row = self.ledger.one("SELECT run_id FROM tracking_runs WHERE entity=? AND error IS NULL", (f"loop:{loop_id}",))
        if row is not None and row["run_id"]:
            return str(row["run_id"])
        loop = self.ledger.one("SELECT l.*, -1 AS synced_version FROM loops l WHERE l.id=?", (loop_id,))
        return self._sync_loop(loop, report or SyncReport()) if loop is not None else None

    # -- jobs and trials --------------------------------------------------------------------

    def _job_target(self, job: Any, trial: Any) -> tuple[str, str, str, str | None]:
        """(entity, experiment, run name, parent run id) of a job's run."""
        if trial is not None:
            loop = self.ledger.one("SELECT * FROM loops WHERE id=?", (trial["loop_id"],))
            parent = self._loop_run(trial["loop_id"])
            experiment = self._loop_experiment(loop) if loop is not None else DEFAULT_EXPERIMENT
            if parent is None:
                raise TrackingError(f"the parent run of loop {trial['loop_id']} is not available",
                                    hint="see the loop's error in `autoresearch sync --status`")
            return f"trial:{trial['id']}", experiment, f"trial-{trial['id']}", parent
        return f"job:{job['id']}", job["experiment"] or DEFAULT_EXPERIMENT, f"{job['name']}-{job['id']}", None

    def _sync_jobs(self, report: SyncReport) -> None:
        rows = self.ledger.query(
            "SELECT j.*, t.id AS trial_id, r.synced_version, r.run_id, r.error, r.metric_rowid FROM jobs j "
            f"LEFT JOIN trials t ON {TRIAL_JOIN} "
            f"LEFT JOIN tracking_runs r ON r.entity={ENTITY} "
            "WHERE r.run_id IS NULL OR r.synced_version < MAX(j.updated_at, COALESCE(t.updated_at, 0)) "
            "OR r.error IS NOT NULL ORDER BY j.id")
        for job in rows:
            self.sync_job(job, report)

    def sync_job(self, job: Any, report: SyncReport) -> str | None:
        trial = (self.ledger.one("SELECT * FROM trials WHERE id=?", (job["trial_id"],))
                 if job["trial_id"] is not None else None)
        entity = f"trial:{trial['id']}" if trial is not None else f"job:{job['id']}"
        try:
            entity, experiment, name, parent = self._job_target(job, trial)
            run_id, created = self._ensure_run(entity, experiment, name, parent, report,
                                               job["started_at"] or job["submitted_at"])
            spec = json.loads(job["spec"])
            last = self.ledger.one("SELECT node FROM attempts WHERE job_id=? ORDER BY n DESC LIMIT 1", (job["id"],))
            tags = {k: v for k, v in (spec.get("tags") or {}).items() if not is_secret(k)}
            tags.update({
                "autoresearch.job_id": str(job["id"]), "autoresearch.state": job["state"],
                "autoresearch.attempts": str(job["attempts"]),
                "autoresearch.node": (last["node"] or "") if last else "",
                "autoresearch.end_reason": job["end_reason"] or "", "autoresearch.priority": job["priority"],
                "autoresearch.kind": "trial" if trial is not None else "job",
            })
            params: dict[str, str] = {}
            first = created or job["synced_version"] is None or job["synced_version"] < 0
            if trial is not None:
                decision = (self.ledger.one("SELECT * FROM decisions WHERE id=?", (trial["decision_id"],))
                            if trial["decision_id"] is not None else None)
                tags.update({
                    "autoresearch.trial_id": str(trial["id"]), "autoresearch.loop_id": str(trial["loop_id"]),
                    "autoresearch.decision_id": str(trial["decision_id"] or ""),
                    "autoresearch.parent_trial": str(trial["parent_trial"] or ""),
                    "autoresearch.proposer": trial["proposer"] or "", "autoresearch.trial_state": trial["state"],
                    "autoresearch.seed": "" if trial["seed"] is None else str(trial["seed"]),
                })
                if trial["objective"] is not None:
                    tags["autoresearch.objective"] = repr(trial["objective"])
                rationale = trial["rationale"] if "rationale" in trial.keys() else ""
                if not rationale and decision is not None:
                    rationale = decision["rationale"]
                if rationale:  # shown as the run's description: why this was tried
                    tags["mlflow.note.content"] = rationale
                if first:
                    params = {k: v for k, v in _flatten(json.loads(trial["params"] or "{}")).items()
                              if not is_secret(k)}
                    if trial["patch"]:
                        self.client.log_text(run_id, redact(trial["patch"], self.secrets), "patch.diff")
                        report.artifacts += 1
            elif first:
                command = spec.get("command")
                params = {"command": command if isinstance(command, str) else " ".join(command or []),
                          "gpus": str(spec.get("gpus", 0)), "nodes": str(spec.get("nodes", 1)),
                          "priority": str(spec.get("priority", "")), "workdir": str(spec.get("workdir", ""))}
                params.update({f"env.{k}": v for k, v in (spec.get("env") or {}).items() if not is_secret(k)})
            self._log(run_id, params=dict(list(params.items())[:500]), tags=tags)
            if self._clear_error(entity):
                self._backfill(job["id"], run_id, report)
            with self.ledger.tx() as c:
                c.execute("UPDATE tracking_runs SET synced_version=? WHERE entity=?",
                          (max(job["updated_at"], trial["updated_at"] if trial is not None else 0), entity))
            return run_id
        except Exception as err:
            self._blocked(entity, err)
            return None

    def ensure_job_run(self, job_id: int) -> str:
        job = self.ledger.one("SELECT j.*, t.id AS trial_id, -1 AS synced_version FROM jobs j "
                              f"LEFT JOIN trials t ON {TRIAL_JOIN} WHERE j.id=?", (job_id,))
        if job is None:
            raise TrackingError(f"no job {job_id}", hint="AUTORESEARCH_JOB_ID names a job of this ledger")
        run_id = self.sync_job(job, SyncReport())
        if run_id is None:
            row = self.ledger.one("SELECT error FROM tracking_runs WHERE entity IN (?, ?)",
                                  (f"job:{job_id}", f"trial:{job['trial_id']}"))
            raise TrackingError(f"no MLflow run for job {job_id}: {row['error'] if row else 'unknown error'}",
                                hint="check `autoresearch sync --status`")
        return run_id

    def prepare_trials(self, trial_ids: list[int]) -> dict[int, str]:
        out: dict[int, str] = {}
        report = SyncReport()
        for trial_id in trial_ids:
            trial = self.ledger.one("SELECT * FROM trials WHERE id=?", (trial_id,))
            if trial is None:
                continue
            parent = self._loop_run(trial["loop_id"], report)
            loop = self.ledger.one("SELECT * FROM loops WHERE id=?", (trial["loop_id"],))
            if parent is None or loop is None:
                continue
            entity = f"trial:{trial_id}"
            try:
                out[trial_id], _ = self._ensure_run(entity, self._loop_experiment(loop), f"trial-{trial_id}",
                                                    parent, report, trial["created_at"])
            except Exception as err:
                self._blocked(entity, err)
        return out

    # -- metrics ----------------------------------------------------------------------------

    def _run_of_job(self, job_id: int, report: SyncReport) -> tuple[str | None, str]:
        row = self.ledger.one(
            f"SELECT {ENTITY} AS entity, r.run_id, r.error FROM jobs j LEFT JOIN trials t ON {TRIAL_JOIN} "
            f"LEFT JOIN tracking_runs r ON r.entity={ENTITY} WHERE j.id=?", (job_id,))
        if row is None:
            return None, f"job:{job_id}"
        if row is not None and row["run_id"] and row["error"] is None:
            return str(row["run_id"]), row["entity"]
        if row is not None and row["error"] is not None:
            return None, row["entity"]
        job = self.ledger.one("SELECT j.*, t.id AS trial_id, -1 AS synced_version FROM jobs j "
                              f"LEFT JOIN trials t ON {TRIAL_JOIN} WHERE j.id=?", (job_id,))
        run_id = self.sync_job(job, report) if job is not None else None
        return run_id, row["entity"]

    def _points(self, rows: list[Any], job_id: int) -> list[Any]:
        from mlflow.entities import Metric

        reported = {r["name"] for r in self.ledger.query(
            "SELECT DISTINCT name FROM metrics WHERE job_id=? AND source='report'", (job_id,))}
        points = []
        for r in rows:
            if r["source"] == "log" and r["name"] in reported:
                continue  # the facade's rule: report() wins over a parsed log line of the same name
            value = r["value"]
            try:
                number = math.nan if value is None else float(value)
            except (TypeError, ValueError):
                self.warn(f"value:{job_id}:{r['name']}",
                          f"job {job_id}: metric {r['name']!r} has a non-numeric value {value!r}; skipped "
                          "(report numbers only)")
                continue
            points.append(Metric(_metric_name(r["name"]), number, int(r["ts"] * 1000), int(r["step"])))
        return points

    def _sync_metrics(self, report: SyncReport, max_batches: int | None = None) -> None:
        cursor = int(self._state("metrics") or 0)
        while True:
            rows = self.ledger.query("SELECT rowid AS rid, * FROM metrics WHERE rowid > ? ORDER BY rowid LIMIT ?",
                                     (cursor, METRIC_WINDOW))
            if not rows:
                return
            by_job: dict[int, list[Any]] = {}
            for r in rows:
                by_job.setdefault(r["job_id"], []).append(r)
            for job_id, job_rows in by_job.items():
                run_id, entity = self._run_of_job(job_id, report)
                if run_id is None:
                    continue  # blocked: its points wait in the ledger and are backfilled once it is fixed
                points = self._points(job_rows, job_id)
                try:
                    self._log(run_id, metrics=points)
                except Exception as err:
                    self._blocked(entity, err)
                    continue
                report.metrics += len(points)
                report.batches += (len(points) + BATCH - 1) // BATCH
                with self.ledger.tx() as c:
                    c.execute("UPDATE tracking_runs SET metric_rowid=MAX(metric_rowid, ?) WHERE entity=?",
                              (job_rows[-1]["rid"], entity))
            cursor = rows[-1]["rid"]
            self._set_state("metrics", cursor)
            if max_batches is not None and report.batches >= max_batches:
                report.pending = True
                return

    def _backfill(self, job_id: int, run_id: str, report: SyncReport) -> None:
        """A run that was blocked is writable again: send the points that waited for it."""
        row = self.ledger.one("SELECT metric_rowid, entity FROM tracking_runs WHERE run_id=?", (run_id,))
        upto = int(self._state("metrics") or 0)
        if row is None:
            return
        rows = self.ledger.query("SELECT rowid AS rid, * FROM metrics WHERE job_id=? AND rowid > ? AND rowid <= ? "
                                 "ORDER BY rowid", (job_id, row["metric_rowid"], upto))
        if rows:
            points = self._points(rows, job_id)
            self._log(run_id, metrics=points)
            report.metrics += len(points)
            with self.ledger.tx() as c:
                c.execute("UPDATE tracking_runs SET metric_rowid=? WHERE entity=?", (rows[-1]["rid"], row["entity"]))

    # -- decisions and LLM calls ------------------------------------------------------------

    def _sync_decisions(self, report: SyncReport) -> None:
        from mlflow.entities import Metric

        cursor = int(self._state("decisions") or 0)
        for d in self.ledger.query("SELECT * FROM decisions WHERE id > ? ORDER BY id LIMIT 500", (cursor,)):
            run_id = self._loop_run(d["loop_id"], report)
            if run_id is None:
                return  # the parent run is blocked; decisions wait in order
            record = {k: d[k] for k in d.keys()}
            for key in ("inputs", "outputs", "proposer"):
                try:
                    record[key] = json.loads(record[key] or "{}")
                except ValueError:
                    pass
            record["trials"] = [r["id"] for r in self.ledger.query(
                "SELECT id FROM trials WHERE decision_id=? ORDER BY id", (d["id"],))]
            text = redact(json.dumps(record, indent=2, default=str), self.secrets)
            self.client.log_text(run_id, text, f"decisions/{d['id']:06d}-{d['kind']}.json")
            ts = int(d["created_at"] * 1000)
            self._log(run_id, metrics=[Metric(f"decision.{k}", float(d[k] or 0), ts, int(d["id"]))
                                       for k in ("tokens_in", "tokens_out", "cost_usd", "latency_s")],
                      tags={"autoresearch.decisions": str(d["id"])})
            report.decisions += 1
            report.artifacts += 1
            self._set_state("decisions", d["id"])

    def _sync_outbox(self, report: SyncReport) -> None:
        rows = self.ledger.query("SELECT * FROM tracking_outbox WHERE done_at IS NULL AND kind='llm_call' "
                                 "ORDER BY id LIMIT 200")
        if not rows:
            return
        import mlflow

        mlflow.set_tracking_uri(self.uri)  # tracing exports through the global URI
        for row in rows:
            run_id = self._loop_run(row["loop_id"], report) if row["loop_id"] is not None else None
            loop = self.ledger.one("SELECT * FROM loops WHERE id=?", (row["loop_id"],))
            exp_id = self.experiment_id(self._loop_experiment(loop) if loop is not None else DEFAULT_EXPERIMENT)
            with _critical(self.ledger.home):
                self._send_llm_call(row, exp_id, run_id)
            report.traces += 1

    def _send_llm_call(self, row: Any, exp_id: str, run_id: str | None) -> None:
        fresh = self.ledger.one("SELECT done_at, sent_ref FROM tracking_outbox WHERE id=?", (row["id"],))
        if fresh is None or fresh["done_at"] is not None:
            return  # sent by another process meanwhile
        key = f"{self.home_id}/llm_call:{row['id']}"
        trace_id = None
        if fresh["sent_ref"] == "sending":  # a previous pass may have created it: adopt, never duplicate
            found = self.client.search_traces(locations=[exp_id],
                                              filter_string=f"tags.`autoresearch.llm_call` = '{key}'",
                                              max_results=1)
            trace_id = found[0].info.trace_id if found else None
        if trace_id is None:
            with self.ledger.tx() as c:
                c.execute("UPDATE tracking_outbox SET sent_ref='sending' WHERE id=?", (row["id"],))
            trace_id = self._emit_trace(row, exp_id, run_id, key)
        with self.ledger.tx() as c:
            c.execute("UPDATE tracking_outbox SET sent_ref=?, done_at=? WHERE id=?",
                      (trace_id, time.time(), row["id"]))

    def _emit_trace(self, row: Any, exp_id: str, run_id: str | None, key: str) -> str:
        import mlflow

        call = json.loads(row["payload"])
        attributes = {k: call.get(k) for k in ("model", "provider", "prompt_name", "prompt_sha256", "temperature",
                                               "tokens_in", "tokens_out", "cost_usd") if call.get(k) is not None}
        tags = {"autoresearch.llm_call": key, "autoresearch.decision_id": str(row["decision_id"] or ""),
                "autoresearch.loop_id": str(row["loop_id"] or "")}
        span = self.client.start_trace(call.get("name") or "llm_call", span_type="LLM", inputs=call.get("inputs"),
                                       attributes=attributes, tags=tags, experiment_id=exp_id,
                                       start_time_ns=int(float(call["started_at"]) * 1e9), run_id=run_id)
        self.client.end_trace(span.trace_id, outputs=call.get("outputs"),
                              status="ERROR" if call.get("error") else "OK",
                              end_time_ns=int(float(call["ended_at"]) * 1e9))
        mlflow.flush_trace_async_logging()
        return str(span.trace_id)

    # -- logs, patches and the end of runs --------------------------------------------------

    def _finish(self, report: SyncReport) -> None:
        """Upload logs of ended attempts; terminate runs of final jobs once all their points are in."""
        cursor = int(self._state("metrics") or 0)
        if self.ledger.one("SELECT 1 FROM metrics WHERE rowid > ? LIMIT 1", (cursor,)) is not None:
            return  # points still waiting: finish later, or a run would end before its last point
        rows = self.ledger.query(
            "SELECT r.entity, r.run_id, r.logs_done, j.id AS job_id, j.state, j.ended_at, j.spec, "
            "(SELECT MAX(n) FROM attempts a WHERE a.job_id=j.id AND a.state='ended') AS ended_n FROM jobs j "
            f"LEFT JOIN trials t ON {TRIAL_JOIN} JOIN tracking_runs r ON r.entity={ENTITY} "
            "WHERE r.run_id IS NOT NULL AND r.error IS NULL AND r.finished=0 "
            "AND (r.logs_done < COALESCE(ended_n, 0) OR j.state IN ('succeeded','failed','cancelled'))")
        for row in rows:
            try:
                self._upload_logs(row, report)
                if row["state"] in FINAL:
                    self.client.set_terminated(row["run_id"], FINAL[row["state"]],
                                               int((row["ended_at"] or time.time()) * 1000))
                    with self.ledger.tx() as c:
                        c.execute("UPDATE tracking_runs SET finished=1 WHERE entity=?", (row["entity"],))
                    report.finished += 1
            except Exception as err:
                self._blocked(row["entity"], err)
        for loop in self.ledger.query(
                "SELECT l.id, l.state, l.updated_at, r.entity, r.run_id FROM loops l JOIN tracking_runs r "
                "ON r.entity='loop:' || l.id WHERE r.run_id IS NOT NULL AND r.finished=0 AND r.error IS NULL"):
            status = LOOP_FINAL.get(str(loop["state"]).lower())
            if status is None:
                continue
            if self.ledger.one("SELECT 1 FROM tracking_runs r JOIN trials t ON r.entity='trial:' || t.id "
                               "WHERE t.loop_id=? AND r.finished=0 LIMIT 1", (loop["id"],)) is not None:
                continue
            self.client.set_terminated(loop["run_id"], status, int(loop["updated_at"] * 1000))
            with self.ledger.tx() as c:
                c.execute("UPDATE tracking_runs SET finished=1 WHERE entity=?", (loop["entity"],))
            report.finished += 1

    def _upload_logs(self, row: Any, report: SyncReport) -> None:
        spec = json.loads(row["spec"])
        secrets = secret_values(dict(os.environ), spec.get("env") or {})
        upto = row["ended_n"] or 0
        for att in self.ledger.query("SELECT n, log_path FROM attempts WHERE job_id=? AND n > ? AND n <= ? "
                                     "ORDER BY n", (row["job_id"], row["logs_done"], upto)):
            text = _read_capped(att["log_path"])
            self.client.log_text(row["run_id"], redact(text, secrets), f"logs/attempt-{att['n']}.log")
            report.artifacts += 1
            with self.ledger.tx() as c:
                c.execute("UPDATE tracking_runs SET logs_done=? WHERE entity=?", (att["n"], row["entity"]))



def _read_capped(path: str) -> str:
    """An attempt log for MLflow: whole up to 1 MiB, else its head and its tail."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            f.seek(0)
            if size <= LOG_HEAD + LOG_TAIL:
                return f.read().decode("utf-8", "replace")
            head = f.read(LOG_HEAD)
            f.seek(size - LOG_TAIL)
            tail = f.read()
    except OSError:
        return ""
    cut = size - LOG_HEAD - LOG_TAIL
    return (head.decode("utf-8", "replace") + f"\n[... {cut} bytes cut by autoresearch ...]\n"
            + tail.decode("utf-8", "replace"))
