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
* ``tracking_outbox``: LLM calls waiting to become traces, loop reports waiting to be uploaded,
  trials' run requests their run maker left unanswered.

A cursor moves only after MLflow accepted the batch. A crash in between replays that
batch, and MLflow's SQL store drops points equal in (key, step, timestamp, value) —
timestamps come from the ledger, so a replay is byte-for-byte the same: no duplicate,
no gap.

The pass and the run bookkeeping live here; what is mirrored lives beside it, as
functions of a :class:`~autoresearch.tracking._common.Mirror` (the public face of a
:class:`Syncer`): ``_entities`` (loops, jobs, trials), ``_metrics``, ``_traces``
(decisions, LLM calls), ``_reports`` (loops' reports) and ``_finish`` (logs, the end of runs).
None of them imports this module or the package's ``__init__``: what they share is in ``_common``.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import re
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import autoresearch.tracking._bulk as _bulk
import autoresearch.tracking._entities as _entities
import autoresearch.tracking._finish as _finish
import autoresearch.tracking._metrics as _metrics
import autoresearch.tracking._reports as _reports
import autoresearch.tracking._traces as _traces
from autoresearch.backends import Backend
from autoresearch.errors import TrackingError
from autoresearch.store.ledger import Ledger
from autoresearch.store.outbox import tracking_uri
from autoresearch.tracking._common import STORE_RACE, SyncReport, _critical, is_transient
from autoresearch.tracking._metrics import BATCH
from autoresearch.tracking._store import MirrorStore, use_wal
from autoresearch.util._private import private_dir, tighten
from autoresearch.util.redact import ambient_secrets, job_secrets, redact

__all__ = ["SyncReport", "Syncer", "fail_fast_http", "freeze_imports", "is_transient"]

_FROZEN = [False]


def freeze_imports() -> None:
    """For the mirror's own process (the background syncer, after its first Syncer), once: what is
    alive then (~400,000 objects of mlflow, SQLAlchemy and their modules, there for the process's life)
    moved out of the collector's generations (``gc.freeze``). Each full collection walked them all:
    ~0.3 s of a 600-trial catch-up's ~1.1 s of user time went to 6 of them. Never in a process that
    only uses a Syncer (a trial's ``start_run``, the loop's run maker, a server): a frozen object that
    later becomes garbage in a cycle is never freed, and there the heap is the user's."""
    if not _FROZEN[0]:
        _FROZEN[0] = True
        gc.freeze()


KIND_TAG = "mlflow.experimentKind"
FLUSH_AT = 500  # runs' writes queued in a pass before they are sent (one transaction)
URI_HINT = "set MLFLOW_TRACKING_URI to http(s)://HOST:PORT or sqlite:///ABSOLUTE/PATH.db, or unset it for the default"


def check_uri(uri: str) -> None:
    """Refuse a tracking URI that cannot be a store (before anything is bound to it)."""
    if not re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", uri) or uri.startswith("sqlite:") and not uri.startswith(
            "sqlite:///"):
        raise TrackingError(f"tracking URI {uri!r} is malformed", hint=URI_HINT)
    if uri.startswith("sqlite:///"):
        path = Path(uri[len("sqlite:///"):])
        if not path.parent.is_dir():
            raise TrackingError(f"tracking URI {uri!r}: directory {path.parent} does not exist", hint=URI_HINT)


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
        self.store = MirrorStore(self.ledger)
        self.uri = self._bind_uri(uri)
        self.home_id = self._state("home_id") or self._init_home_id()
        self.secrets = ambient_secrets()  # a supplement: each entity adds its own (redact.job_secrets)
        self._experiments: dict[str, str] = {}
        self._warned: set[str] = set()
        self._backends: dict[str, Backend] = {}  # by name, from the registry: the mirror never builds a Runtime
        # Jobs changed after this are looked at by the next pass (None: all of them, as a fresh
        # syncer's first pass does). An optimization only: lost with the process, never in the ledger.
        self.jobs_since: float | None = None
        self._bulk = os.environ.get("AUTORESEARCH_MIRROR_BULK", "on").strip().lower() not in ("0", "off", "false")
        # In a pass (run_once), runs' params, tags and ends wait here for one transaction (_bulk.write),
        # each with its entity and the ledger's bookkeeping to do once it is in.
        self._batching = False
        self._queue: list[tuple[str, _bulk.Item, Callable[[], None] | None]] = []
        self._artifacts: dict[str, str] = {}  # run id -> artifact location (it never changes)
        self._specs: dict[str, tuple[dict[str, Any], list[str]]] = {}  # a job's spec text -> (spec, secrets)
        self._folders: dict[str, str | None] = {}  # run id -> its local artifact folder (None: not local)
        self.client = self._make_client()

    # -- setup ------------------------------------------------------------------------------

    def _bind_uri(self, uri: str | None) -> str:
        """The first sync binds the ledger to a store; later ones keep it (see docs/tracking.md)."""
        bound = self._state("uri")
        if uri is None:
            uri = bound or tracking_uri(self.ledger.home)
        check_uri(uri)
        if bound and bound != uri:
            self._rebind(uri)
        elif not bound:
            self._set_state("uri", uri)
        return uri

    def _rebind(self, uri: str) -> None:
        """A new store: forget the old mapping so everything is mirrored again into the new one."""
        self.store.rebind(uri)

    def artifact_root(self) -> str | None:
        """For a SQLite store, artifacts live beside the database (MLflow would use ./mlruns of the cwd)."""
        if not self.uri.startswith("sqlite:///"):
            return None
        return (Path(self.uri[len("sqlite:///"):]).resolve().parent / "mlartifacts").as_uri()

    def _make_client(self) -> Any:
        from mlflow.tracking import MlflowClient

        root = self.artifact_root()
        if root is not None:
            # Whoever creates the database creates experiment 0 with its artifact root: make it ours.
            # Under the creation lock even when the file is there: another process of ours (the loop's
            # run maker, a background syncer) may be creating it now, and a half-made database opened
            # beside it fails ("table ... already exists"). mlflow is imported before the lock is taken.
            from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

            try:
                with contextlib.ExitStack() as held:
                    with contextlib.suppress(OSError):  # a home we may not write: nothing of ours creates it
                        held.enter_context(_critical(self.ledger.home))
                    self._check_home()  # (after mlflow's import: seconds in which the home may go)
                    db = Path(self.uri[len("sqlite:///"):])
                    ours = db.parent.resolve() == self.ledger.home.resolve()  # the home's store, not one of yours
                    if not db.exists() or db.stat().st_size == 0:
                        if ours:  # private before SQLAlchemy makes it: SQLite gives -wal/-shm the file's mode
                            with contextlib.suppress(OSError):
                                os.close(os.open(db, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
                        SqlAlchemyStore(self.uri, root)
                    if ours:  # (a store made by an earlier version is tightened here)
                        for path in (db, Path(f"{db}-wal"), Path(f"{db}-shm")):
                            tighten(path, recursive=False)
                        private_dir(db.parent / "mlartifacts")
                        # WAL: the UI reads while the syncer writes, and a commit costs no fsync of the whole journal.
                        use_wal(self.uri[len("sqlite:///"):])
            except TrackingError:
                raise
            except Exception as err:
                first = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
                if is_transient(err):
                    raise TrackingError(f"cannot create the MLflow database {self.uri} yet: {first}",
                                        hint="another MLflow client may be creating it at the same moment; "
                                             "the sync retries with back-off", transient=True) from None
                raise TrackingError(f"cannot create the MLflow database {self.uri}: {first}",
                                    hint=URI_HINT) from None

        try:
            return MlflowClient(tracking_uri=self.uri)
        except Exception as err:  # mlflow raises several types for a bad scheme
            if is_transient(err):  # the store exists but is being created or migrated by another client
                raise self._wrap(err, "cannot open the tracking store yet") from None
            raise TrackingError(f"cannot use tracking URI {self.uri!r}: {str(err).splitlines()[0]}",
                                hint=URI_HINT) from None

    def _check_home(self) -> None:
        """Raise when the home was removed since the ledger was opened: mlflow makes the directories of a
        SQLite store it opens, and a removed home would come back with a fresh database in it."""
        if not self.ledger.path.exists():
            raise TrackingError(f"the home {self.ledger.home} was removed: nothing is left to mirror",
                                hint="set AUTORESEARCH_HOME to the home to mirror")

    def _init_home_id(self) -> str:
        value = uuid.uuid4().hex[:12]
        self.store.offer_home_id(value)
        return self._state("home_id") or value

    def _state(self, name: str) -> str | None:
        return self.store.state(name)

    def _set_state(self, name: str, value: object) -> None:
        self.store.set_state(name, value)

    def cursor(self, name: str) -> int:
        """Where the mirror got to in the ledger: ``metrics`` (a rowid) or ``decisions`` (an id)."""
        return int(self._state(name) or 0)

    def move_cursor(self, name: str, value: int) -> None:
        """Move a cursor, once MLflow accepted everything before it."""
        self._set_state(name, value)

    def check(self) -> None:
        """Fail fast (TrackingError, transient) when the store cannot be reached."""
        try:
            self.client.search_experiments(max_results=1)
        except Exception as err:
            raise self._wrap(err, "cannot reach the tracking store") from None

    def _wrap(self, err: Exception, what: str) -> TrackingError:
        first = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
        transient = is_transient(err)
        race = bool(STORE_RACE.search(str(err)))
        hint = ("another MLflow client may be creating or upgrading the same database; the sync retries with "
                "back-off" if race else "the sync retries with back-off; start the server or fix MLFLOW_TRACKING_URI"
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
        self._batching, self._queue = self._bulk_store() is not None, []
        try:
            with self.store.pass_reads():
                self._phases(report, max_batches)
        except TrackingError:
            raise
        except Exception as err:
            if is_transient(err):
                raise self._wrap(err, "tracking store unavailable") from None
            raise
        finally:  # what did not go in is sent again by the next pass: its bookkeeping was not done
            self._batching, self._queue = False, []
        self._set_state("last_sync", time.time())
        if self._state("error") is not None:  # it works again: status stops saying why it was behind
            self.store.clear_state("error", "error_at", "retry_at")
        return report

    def _phases(self, report: SyncReport, max_batches: int | None) -> None:
        _entities.sync_loops(self, report)
        _entities.sync_jobs(self, report)
        self.flush()  # the runs' tags before their points and their ends
        _metrics.sync_metrics(self, report, max_batches)
        _traces.sync_decisions(self, report)
        _traces.sync_outbox(self, report)
        _reports.sync_reports(self, report)
        _entities.sync_run_requests(self, report)
        _finish.finish(self, report)
        self.flush()

    def _ingest_live(self) -> None:
        """Pull fresh points of running attempts into the ledger, so MLflow shows them live."""
        from autoresearch.backends import open_backend
        from autoresearch.engine.ingest import ingest_attempt

        for row in self.store.live_backends():
            try:
                backend = self._backends.get(row["backend"])
                if backend is None:
                    # the ledger stores a profile's name: rebuilt from this home's config.yaml
                    backend = self._backends[row["backend"]] = open_backend(row["backend"], self.ledger.home)
                for att in self.store.running_attempts(row["backend"]):
                    ingest_attempt(self.ledger, backend, att)
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
        if exp is None or KIND_TAG not in (exp.tags or {}):
            # A model-training experiment: the UI opens it on its runs, not on GenAI traces.
            try:
                self.client.set_experiment_tag(exp_id, KIND_TAG, "custom_model_development")
            except Exception as err:
                if is_transient(err):
                    raise
                self.warn(f"kind:{exp_id}", f"experiment {name!r} was not marked as model training ({err})")
        self._experiments[name] = str(exp_id)
        return str(exp_id)

    def ensure_run(self, entity: str, experiment: str, run_name: str, parent: str | None,
                    report: SyncReport | None = None, started: float | None = None) -> tuple[str, bool]:
        """The run of ``entity`` (created if needed, exactly once). Returns (run id, created)."""
        run_id = self.store.run_id_of(entity)
        if run_id is not None:
            return run_id, False
        with _critical(self.ledger.home):
            return self._create_run(entity, experiment, run_name, parent, report, started)

    def _create_run(self, entity: str, experiment: str, run_name: str, parent: str | None,
                    report: SyncReport | None, started: float | None) -> tuple[str, bool]:
        row = self.store.run_of(entity)
        if row is not None and row["run_id"]:
            return str(row["run_id"]), False  # another process created it while we waited
        exp_id = self.experiment_id(experiment)
        key = f"{self.home_id}/{entity}"
        run_id = None
        if row is None:
            self.store.reserve_run(entity, exp_id, parent)  # write-ahead: a create may follow
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
        self.store.set_run(entity, run_id, exp_id, parent)
        return str(run_id), True

    def create_runs(self, wanted: list[tuple[str, str, str, str | None, float | None]],
                    report: SyncReport | None = None) -> None:
        """The runs of ``wanted`` entities (entity, experiment, run name, parent run id, start time)
        that have none yet, made in one transaction into a SQLite store (:func:`_bulk.create_runs`),
        write-ahead as :meth:`ensure_run` makes one: the ledger's rows first (one transaction), then
        the runs, then their ids in the rows (one transaction). A crash in between leaves rows
        without a run id: the runs made are found by their ``autoresearch.entity`` tag (one query),
        not made twice. Anything else (another store, a refusal) is left to :meth:`ensure_run`."""
        store = self._bulk_store()
        if store is None or len(wanted) < 2:
            return
        have = self.store.runs_of([w[0] for w in wanted])
        if all(have.get(w[0]) for w in wanted):
            return
        with _critical(self.ledger.home):
            have = self.store.runs_of([w[0] for w in wanted])  # (another process may have made some meanwhile)
            todo = [w for w in wanted if not have.get(w[0])]
            try:
                found = _bulk.find_runs(store, [f"{self.home_id}/{w[0]}" for w in todo if w[0] in have])
                specs: list[tuple[str, str | None, _bulk.NewRun]] = []
                for entity, experiment, name, parent, started in todo:
                    exp_id = self.experiment_id(experiment)
                    tags = {"autoresearch.entity": f"{self.home_id}/{entity}", "autoresearch.home": str(self.ledger.home)}
                    if parent:
                        tags["mlflow.parentRunId"] = parent
                    run_id = found.get(tags["autoresearch.entity"]) or _bulk.new_run_id()
                    specs.append((entity, parent, _bulk.NewRun(run_id, exp_id, name, int((started or time.time()) * 1000),
                                                               tags)))
                with self.store.batch():  # write-ahead
                    for entity, parent, run in specs:
                        self.store.reserve_run(entity, run.experiment_id, parent)
                fresh = [run for _, _, run in specs if run.run_id not in found.values()]
                _bulk.create_runs(store, fresh)
            except Exception as err:
                if is_transient(err):
                    raise
                self.warn("bulk-create", f"runs are made one by one ({type(err).__name__}: {str(err)[:200]})")
                return
            with self.store.batch():
                for entity, parent, run in specs:
                    self.store.set_run(entity, run.run_id, run.experiment_id, parent)
            if report is not None:
                report.runs_created += len(fresh)

    def mark_blocked(self, entity: str, err: Exception) -> None:
        """A permanent problem with one run: record it, warn once, go on with the others."""
        if is_transient(err):
            raise err
        text = err.render() if isinstance(err, TrackingError) else f"{type(err).__name__}: {err}"
        text = text.strip().splitlines()[0] if not isinstance(err, TrackingError) else text
        self.store.block(entity, text)  # a row even for a run never created: its points are backfilled once fixed
        self.warn(f"{entity}:{text}", f"{entity}: {text}")

    def clear_error(self, entity: str) -> bool:
        """Forget a run's recorded problem (it synced again); whether there was one."""
        if self.store.error_of(entity) is None:
            return False
        self.store.clear_error(entity)
        return True

    def log_batch(self, run_id: str, metrics: list[Any] = (), params: dict[str, str] | None = None,  # type: ignore[assignment]
                  tags: dict[str, str] | None = None, secrets: list[str] | None = None,
                  entity: str | None = None, then: Callable[[], None] | None = None) -> None:
        """Metrics, params and tags to a run in batches, params and tags redacted (``secrets``,
        or the ambient ones). ``entity`` (in a pass, into a SQLite store): the params and tags
        wait for the pass's next :meth:`flush`, one transaction for many runs, and ``then`` runs
        once they are in (at once otherwise)."""
        known = self.secrets if secrets is None else secrets
        plain = {k[:250]: redact(v, known)[:6000] for k, v in (params or {}).items()}
        tagged = {k[:250]: redact(v, known)[:8000] for k, v in (tags or {}).items()}
        if entity is not None and self._batching and not metrics:
            plist, tlist = _bulk.validate(plain, tagged)  # MLflow's refusal, raised here as log_batch raises it
            self._enqueue(entity, _bulk.Item(run_id, plist, tlist), then)
            return
        self._client_batch(run_id, list(plain.items()), list(tagged.items()))
        for i in range(0, len(metrics), BATCH):
            self.client.log_batch(run_id, metrics=list(metrics[i:i + BATCH]))
        if then is not None:
            then()

    def _client_batch(self, run_id: str, params: list[tuple[str, str]], tags: list[tuple[str, str]]) -> None:
        from mlflow.entities import Param, RunTag

        plist = [Param(k, v) for k, v in params]
        tlist = [RunTag(k, v) for k, v in tags]
        for i in range(0, max(len(plist), len(tlist)), 100):
            self.client.log_batch(run_id, params=plist[i:i + 100], tags=tlist[i:i + 100])

    def end_run(self, entity: str, run_id: str, status: str, end_ms: int, then: Callable[[], None]) -> None:
        """End a run (``set_terminated``): in a pass into a SQLite store, in the next :meth:`flush`."""
        if self._batching:
            self._enqueue(entity, _bulk.Item(run_id, end=(status, end_ms)), then)
            return
        self.client.set_terminated(run_id, status, end_ms)
        then()

    def _enqueue(self, entity: str, item: _bulk.Item, then: Callable[[], None] | None) -> None:
        self._queue.append((entity, item, then))
        if len(self._queue) >= FLUSH_AT:
            self.flush()

    def flush(self) -> None:
        """Send the queued params, tags and ends in one transaction (:func:`_bulk.write`), then do
        their bookkeeping in one ledger transaction. A crash in between sends them again: the same
        params, the same tags, the same ends (idempotent). A run the batch refuses (deleted, a param
        with another value) goes through the client path, whose error blocks it."""
        queue, self._queue = self._queue, []
        if not queue:
            return
        store = self._bulk_store()
        refused: set[str] = {item.run_id for _, item, _ in queue}
        if store is not None:
            try:
                refused = _bulk.write(store, [item for _, item, _ in queue])
            except Exception as err:
                if is_transient(err):
                    raise
                self.warn("bulk-runs", f"a batch of runs went through the client path ({type(err).__name__}: "
                          f"{str(err)[:200]})")
        done: list[Callable[[], None]] = []
        for entity, item, then in queue:
            if item.run_id in refused:
                try:
                    self._client_batch(item.run_id, item.params, item.tags)
                    if item.end is not None:
                        self.client.set_terminated(item.run_id, item.end[0], item.end[1])
                except Exception as err:
                    self.mark_blocked(entity, err)
                    continue
            if then is not None:
                done.append(then)
        with self.store.batch():
            for then in done:
                then()

    def job_spec(self, text: str) -> tuple[dict[str, Any], list[str]]:
        """A job's spec as the ledger stores it (JSON) and the secrets to redact from what is sent of
        it (its own and this process's), parsed once (a job's run and its logs both ask: ~0.2 ms each). The
        spec is shared: read it, never change it."""
        hit = self._specs.get(text)
        if hit is None:
            spec = json.loads(text)
            hit = (spec, job_secrets(spec, ambient=False) + self.secrets)
            if len(text) <= 65536:  # (a huge spec is parsed again rather than held)
                if len(self._specs) >= 4096:
                    self._specs.clear()
                self._specs[text] = hit
        return hit

    def artifact_locations(self, run_ids: list[str]) -> None:
        """Learn the artifact locations of runs about to get artifacts (one query for all of them)."""
        store = self._bulk_store()
        missing = [r for r in run_ids if r not in self._artifacts]
        if store is not None and missing:
            self._artifacts.update(_bulk.artifact_uris(store, missing))

    def artifact_folder(self, run_id: str) -> str | None:
        """The local folder of a run's artifacts in a SQLite store, to write into directly (None:
        another store, bulk writes off, or artifacts elsewhere than on this machine)."""
        store = self._bulk_store()
        if store is None:
            return None
        if run_id in self._folders:
            return self._folders[run_id]
        uri = self._artifacts.get(run_id)
        if uri is None:
            uri = self._artifacts[run_id] = _bulk.artifact_uris(store, [run_id]).get(run_id, "")
        folder = _bulk.local_dir(uri) if uri else None
        if uri:  # (a run's location never changes: parsed once)
            self._folders[run_id] = folder
        return folder

    def log_text(self, run_id: str, text: str, artifact_path: str) -> None:
        """An artifact of a run: into a SQLite store's local artifact folder directly (no upload
        through the client: ~30 ms of CPU a file), else with ``log_text``."""
        folder = self.artifact_folder(run_id)
        if folder is not None:
            try:
                _bulk.write_text(folder, artifact_path, text)
                return
            except ValueError:  # a path MLflow would take apart itself: its own way
                pass
        self.client.log_text(run_id, text, artifact_path)

    def log_metrics(self, run_id: str, points: list[Any]) -> None:
        """Metric points to a run: in bulk into a SQLite store's tables when the store is MLflow's
        SQL store (:func:`_metrics.bulk_log`), else through log_batch."""
        store = self._bulk_store()
        if store is not None:
            try:
                _metrics.bulk_log(store, run_id, points)
                return
            except (ImportError, AttributeError, TypeError) as err:  # mlflow changed inside: the public path
                self._bulk = False
                self.warn("bulk", f"bulk metric writes are off, log_batch instead ({type(err).__name__}: {err})")
        self.log_batch(run_id, metrics=points)

    def bulk_store(self) -> Any:
        """MLflow's SQL store on SQLite, to write into in batches (None: another store, or bulk off)."""
        return self._bulk_store()

    def _bulk_store(self) -> Any:
        if not self._bulk or not self.uri.startswith("sqlite:///"):
            return None
        try:
            from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

            store = self.client._tracking_client.store
        except (ImportError, AttributeError):
            self._bulk = False
            return None
        return store if isinstance(store, SqlAlchemyStore) else None

    # -- what other modules and the facade ask of a run ------------------------------------

    def sync_job(self, job: Any, report: SyncReport) -> str | None:
        return _entities.sync_job(self, job, report)

    def ensure_job_run(self, job_id: int) -> str:
        return _entities.ensure_job_run(self, job_id)

    def prepare_trials(self, trial_ids: list[int]) -> dict[int, str]:
        return _entities.prepare_trials(self, trial_ids)
