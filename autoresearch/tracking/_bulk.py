"""Runs, their tags, params and ends into MLflow's SQLite store in batched transactions.

The client path makes one store call (one transaction, one commit) for a run's creation, one for
its tags and params, one for its end, each with MLflow's ORM around it: ~60 ms of CPU a trial on
a 2-core VM. Here a batch of runs is one transaction of a few ``executemany`` statements, in
exactly the rows MLflow's ``SqlAlchemyStore`` (mlflow 3.17) writes:

* ``create_runs``: a ``runs`` row each (as ``create_run``: source type ``UNKNOWN``, status
  ``RUNNING``, lifecycle ``active``, ``artifact_uri`` = the experiment's location + ``/RUN/artifacts``,
  ``user_id`` from the ``mlflow.user`` tag or ``unknown``) and its tags, ``mlflow.runName`` included;
* ``write``: params (a param already there with another value is refused, as ``log_batch``
  refuses it), tags (insert or update; ``mlflow.runName`` also renames the run, as ``set_tag``
  does) and ends (status and end time, as ``set_terminated``), of active runs only.

Keys and values go through MLflow's own validators first (:func:`validate`), so what the client
path refuses is refused here (the caller sends the refused run through the client path, which
raises MLflow's own error). Only for a ``SqlAlchemyStore`` on SQLite; any other store keeps the
client path (:meth:`autoresearch.tracking._sync.Syncer.log_batch`).
"""

from __future__ import annotations

import itertools
import os
import stat
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any
from urllib.parse import unquote, urlparse

from autoresearch.util._private import open_beneath

CHUNK = 500  # ids per ``IN (...)``: well under SQLite's limit on bound variables


@dataclass
class NewRun:
    """A run to create: the caller knows its id (the ledger records it first, write-ahead)."""

    run_id: str
    experiment_id: str
    name: str
    start_ms: int
    tags: dict[str, str]


@dataclass
class Item:
    """What one run gets in a batch: params, tags (validated), an end (status, end time in ms)."""

    run_id: str
    params: list[tuple[str, str]] = field(default_factory=list)
    tags: list[tuple[str, str]] = field(default_factory=list)
    end: tuple[str, int] | None = None


def executemany(session: Any, key: Any, make: Callable[[], Any], rows: Sequence[dict[str, Any]]) -> None:
    """``rows`` through the SQLite driver's own ``executemany``, in ``session``'s transaction: the
    statement ``make()`` builds is compiled by SQLAlchemy once a process (cached under ``key`` and
    the rows' keys), each row handed over as a tuple. ``session.execute(stmt, rows)`` compiles the
    statement's parameters again for every row (~10 us a row in Python: a catch-up of 600 trials
    writes ~15,000 rows). The same SQL, the same values (with SQLAlchemy's bind processors, if a
    column has any); a driver error is raised as SQLAlchemy raises it (MLflow's session turns an
    ``OperationalError``, a busy database, into its retryable error)."""
    import sqlite3

    from sqlalchemy.exc import DBAPIError

    if not rows:
        return
    columns = tuple(rows[0])
    conn = session.connection()
    entry = _COMPILED.get((key, columns))
    if entry is None:
        entry = _COMPILED[(key, columns)] = _compile(make(), conn.dialect, columns)
    if isinstance(entry, str):  # (a column default computed in Python: SQLAlchemy's own way)
        session.execute(make(), rows)
        return
    sql, names, procs, consts = entry
    values = [{**consts, **r} for r in rows] if consts else rows
    params: list[Any] = (list(map(itemgetter(*names), values)) if len(names) > 1  # (a C call a row)
                         else [tuple(r[n] for n in names) for r in values])
    fixes = [(i, f) for i, f in enumerate(procs) if f is not None]
    if fixes:  # (a Boolean's processor on SQLite: metrics' is_nan)
        for k, row in enumerate(params):
            row = list(row)
            for i, f in fixes:
                row[i] = f(row[i])
            params[k] = row
    try:
        conn.connection.driver_connection.executemany(sql, params)
    except sqlite3.Error as err:
        raise DBAPIError.instance(sql, None, err, sqlite3.Error) from err


def _compile(stmt: Any, dialect: Any, columns: tuple[str, ...]) -> Any:
    """(SQL, its parameters' names in order, their bind processors, the constant defaults of the
    columns the rows leave out), or ``"execute"`` when a left-out column's default is computed."""
    compiled = stmt.compile(dialect=dialect, column_keys=list(columns))
    names = tuple(compiled.positiontup or ())
    consts: dict[str, Any] = {}
    for col, default in [(c, c.default) for c in compiled.insert_prefetch] + [
            (c, c.onupdate) for c in compiled.update_prefetch]:
        if col.key not in columns:
            if default is None or not default.is_scalar:
                return "execute"
            consts[col.key] = default.arg
    if any(n not in columns and n not in consts for n in names):
        return "execute"
    # (each parameter's type's processor for this dialect, as SQLAlchemy applies them: metrics' is_nan,
    # a Boolean, on SQLite)
    processors = {name: bind.type.dialect_impl(dialect).bind_processor(dialect)
                  for name, bind in compiled.binds.items()}
    return str(compiled), names, tuple(processors.get(n) for n in names), consts


_COMPILED: dict[tuple[Any, tuple[str, ...]], Any] = {}  # (statement, rows' keys) -> what _compile made


def new_run_id() -> str:
    return uuid.uuid4().hex  # as SqlAlchemyStore.create_run


def validate(params: dict[str, str], tags: dict[str, str]) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Params and tags as ``log_batch`` checks them (MLflow's validators: key names, lengths; a tag's
    value truncated as MLflow truncates it). Raises MLflow's own error for what it refuses."""
    from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_TAG_VAL_LENGTH, _validate_param, _validate_tag

    out: tuple[list[tuple[str, str]], list[tuple[str, str]]] = ([], [])
    for kind, items, check, limit in ((0, params, _validate_param, MAX_PARAM_VAL_LENGTH),
                                      (1, tags, _validate_tag, MAX_TAG_VAL_LENGTH)):
        for key, value in items.items():
            if (kind, key) not in _KEYS_OK:  # a key is checked once (the same few recur on every run)
                check(key, "")
                if len(_KEYS_OK) < 100_000:
                    _KEYS_OK.add((kind, key))
            if not isinstance(value, str) or len(value) > limit:
                value = check(key, value).value  # (truncated, or refused, as MLflow does it)
            out[kind].append((key, value))
    return out


_KEYS_OK: set[tuple[int, str]] = set()  # (0: param, 1: tag; key) that MLflow's validators passed


def _chunks(ids: list[str]) -> list[list[str]]:
    return [ids[i:i + CHUNK] for i in range(0, len(ids), CHUNK)]


def create_runs(store: Any, runs: list[NewRun]) -> None:
    """Create ``runs`` in one transaction (their experiments must exist and be active: else MLflow's
    error, and nothing is written)."""
    from mlflow.entities import LifecycleStage, RunStatus, SourceType
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE, RESOURCE_DOES_NOT_EXIST
    from mlflow.store.tracking.dbmodels.models import SqlExperiment, SqlRun, SqlTag
    from mlflow.utils.mlflow_tags import MLFLOW_RUN_NAME, MLFLOW_USER
    from mlflow.utils.uri import append_to_uri_path
    from sqlalchemy import insert, select

    if not runs:
        return
    exps = SqlExperiment.__table__
    run_rows: list[dict[str, Any]] = []
    tag_rows: list[dict[str, Any]] = []
    with store.ManagedSessionMaker(read_only=False) as session:
        wanted = sorted({int(r.experiment_id) for r in runs})
        found = {str(e): (stage, location) for e, stage, location in session.execute(
            select(exps.c.experiment_id, exps.c.lifecycle_stage, exps.c.artifact_location)
            .where(exps.c.experiment_id.in_(wanted)))}
        for r in runs:
            stage, location = found.get(str(r.experiment_id), (None, None))
            if stage is None:
                raise MlflowException(f"No Experiment with id={r.experiment_id} exists", RESOURCE_DOES_NOT_EXIST)
            if stage != LifecycleStage.ACTIVE:
                raise MlflowException(f"The experiment {r.experiment_id} must be in the 'active' state. "
                                      f"Current state is {stage}.", INVALID_PARAMETER_VALUE)
            _, tags = validate({}, {**r.tags, MLFLOW_RUN_NAME: r.name})
            run_rows.append({
                "run_uuid": r.run_id, "name": r.name, "source_type": SourceType.to_string(SourceType.UNKNOWN),
                "source_name": "", "entry_point_name": "", "user_id": r.tags.get(MLFLOW_USER, "unknown"),
                "status": RunStatus.to_string(RunStatus.RUNNING), "start_time": r.start_ms, "end_time": None,
                "deleted_time": None, "source_version": "", "lifecycle_stage": LifecycleStage.ACTIVE,
                "artifact_uri": append_to_uri_path(location, r.run_id, store.ARTIFACTS_FOLDER_NAME),
                "experiment_id": int(r.experiment_id)})
            tag_rows += [{"key": k, "value": v, "run_uuid": r.run_id} for k, v in tags]
        executemany(session, "runs", lambda: insert(SqlRun.__table__), run_rows)
        executemany(session, "tags", lambda: insert(SqlTag.__table__), tag_rows)


def write(store: Any, items: list[Item]) -> set[str]:
    """Params, tags and ends of ``items`` in one transaction. Returns the runs refused (not active,
    gone, or a param already there with another value): nothing of theirs is written; the caller
    sends them through the client path, which raises MLflow's own error for each."""
    from mlflow.entities import LifecycleStage
    from mlflow.store.tracking.dbmodels.models import SqlParam, SqlRun, SqlTag
    from mlflow.utils.mlflow_tags import MLFLOW_RUN_NAME
    from sqlalchemy import bindparam, select, update
    from sqlalchemy.dialects.sqlite import insert

    if not items:
        return set()
    runs, params_t, tags_t = SqlRun.__table__, SqlParam.__table__, SqlTag.__table__
    ids = sorted({i.run_id for i in items})
    with store.ManagedSessionMaker(read_only=False) as session:
        stages: dict[str, str] = {}
        existing: dict[tuple[str, str], str] = {}
        with_params = sorted({i.run_id for i in items if i.params})
        for chunk in _chunks(ids):
            stages.update((r, stage) for r, stage in session.execute(
                select(runs.c.run_uuid, runs.c.lifecycle_stage).where(runs.c.run_uuid.in_(chunk))))
        for chunk in _chunks(with_params):
            existing.update(((r, k), v) for r, k, v in session.execute(
                select(params_t.c.run_uuid, params_t.c.key, params_t.c.value).where(params_t.c.run_uuid.in_(chunk))))
        refused = {r for r in ids if stages.get(r) != LifecycleStage.ACTIVE}
        new_params: dict[tuple[str, str], str] = {}
        for item in items:
            for key, value in item.params:
                old = existing.get((item.run_id, key), new_params.get((item.run_id, key)))
                if old is not None and old != value:
                    refused.add(item.run_id)
                elif old is None:
                    new_params[(item.run_id, key)] = value
        tags: dict[tuple[str, str], str] = {}
        names: dict[str, str] = {}
        ends: dict[str, tuple[str, int]] = {}
        for item in items:
            if item.run_id in refused:
                continue
            for key, value in item.tags:
                tags[(item.run_id, key)] = value
                if key == MLFLOW_RUN_NAME:
                    names[item.run_id] = value
            if item.end is not None:
                ends[item.run_id] = item.end
        param_rows = [{"run_uuid": r, "key": k, "value": v} for (r, k), v in new_params.items() if r not in refused]
        executemany(session, "params+", lambda: insert(params_t).on_conflict_do_nothing(), param_rows)

        def upsert_tags() -> Any:
            stmt = insert(tags_t)
            return stmt.on_conflict_do_update(index_elements=[tags_t.c.key, tags_t.c.run_uuid],
                                              set_={"value": stmt.excluded.value})

        executemany(session, "tags+", upsert_tags, [{"run_uuid": r, "key": k, "value": v} for (r, k), v in tags.items()])
        executemany(session, "names", lambda: update(runs).where(runs.c.run_uuid == bindparam("rid")).values(
            name=bindparam("nm")), [{"rid": r, "nm": n} for r, n in names.items()])
        executemany(session, "ends", lambda: update(runs).where(runs.c.run_uuid == bindparam("rid")).values(
            status=bindparam("st"), end_time=bindparam("et")), [{"rid": r, "st": s, "et": t} for r, (s, t) in ends.items()])
    return refused


def find_runs(store: Any, keys: list[str]) -> dict[str, str]:
    """The runs tagged ``autoresearch.entity`` = each of ``keys`` (a create cut short may have made
    them), deleted ones included, as the client path's search finds them: key -> run id."""
    from mlflow.store.tracking.dbmodels.models import SqlTag
    from sqlalchemy import select

    tags = SqlTag.__table__
    out: dict[str, str] = {}
    if not keys:
        return out
    with store.ManagedSessionMaker(read_only=True) as session:
        for chunk in _chunks(sorted(set(keys))):
            out.update((v, r) for v, r in session.execute(
                select(tags.c.value, tags.c.run_uuid).where(tags.c.key == "autoresearch.entity",
                                                            tags.c.value.in_(chunk))))
    return out


def artifact_uris(store: Any, run_ids: list[str]) -> dict[str, str]:
    """The artifact location of each run (one query per 500)."""
    from mlflow.store.tracking.dbmodels.models import SqlRun
    from sqlalchemy import select

    runs = SqlRun.__table__
    out: dict[str, str] = {}
    with store.ManagedSessionMaker(read_only=True) as session:
        for chunk in _chunks(sorted(set(run_ids))):
            out.update((r, uri) for r, uri in session.execute(
                select(runs.c.run_uuid, runs.c.artifact_uri).where(runs.c.run_uuid.in_(chunk))))
    return out


def local_dir(uri: str) -> str | None:
    """The local folder of an artifact location (``file:///...`` or an absolute path); None for
    anything else (a server's ``mlflow-artifacts:``, s3, ...: the client path writes those)."""
    if uri.startswith("/"):
        return uri
    if uri.startswith("file:///") and not any(c in uri for c in "%?#;"):  # (as urlparse reads it, without it)
        return uri[7:]
    parsed = urlparse(uri)
    if parsed.scheme == "file" and parsed.netloc in ("", "localhost") and parsed.path.startswith("/"):
        return unquote(parsed.path)
    return None


def write_text(folder: str, artifact_path: str, text: str) -> None:
    """``text`` as the artifact ``artifact_path`` of a run whose artifacts are in ``folder``: folders
    made private, the file 0600, written beside and renamed into place (a reader never sees half of
    it), walked without following a link (:func:`autoresearch.util._private.open_beneath`)."""
    write_texts(folder, [(artifact_path, text)])


def write_texts(folder: str, files: Sequence[tuple[str, str | bytes]]) -> None:
    """:func:`write_text` of many artifacts (path, text or bytes) of one run: the run's folder made once and
    each folder of theirs walked once (a batch of decisions: one ``decisions/`` for all its files)."""
    if not files:
        return
    fresh = _make_dirs(os.path.abspath(folder))  # the run's folders, private whatever the umask
    by_dir: dict[str, list[tuple[str, str | bytes]]] = {}
    for artifact_path, text in files:
        parent, name = _split(artifact_path)
        by_dir.setdefault(parent, []).append((name, text))
    for parent, group in by_dir.items():
        if fresh and parent:  # a folder just made holds none of its own yet: made before the walk opens it
            _make_fresh(folder, parent)
        fd, _ = open_beneath(folder, f"{parent}/{group[0][0]}" if parent else group[0][0], create_dirs=True,
                             dir_mode=0o700)
        try:
            for name, text in group:
                _write_at(fd, name, text)
        finally:
            os.close(fd)


def folder_files(source: str, prefix: str) -> list[tuple[str, bytes]]:
    """The regular files under ``source`` as artifacts under ``prefix`` (for :func:`write_texts`), as
    ``log_artifacts`` takes a folder, without following a link (a link is left out)."""
    out: list[tuple[str, bytes]] = []
    for top, _dirs, names in os.walk(source, followlinks=False):
        rel = os.path.relpath(top, source)
        for name in sorted(names):
            try:
                fd = os.open(os.path.join(top, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
            except OSError:  # a link (ELOOP), gone
                continue
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    continue  # a FIFO, a device: not an artifact
                chunks: list[bytes] = []
                while chunk := os.read(fd, 1 << 20):
                    chunks.append(chunk)
            finally:
                os.close(fd)
            out.append((f"{prefix}/{name}" if rel == "." else f"{prefix}/{rel}/{name}", b"".join(chunks)))
    return out


def _split(artifact_path: str) -> tuple[str, str]:
    """(folder, file name) of an artifact path, refused (ValueError) as :func:`open_beneath` refuses it."""
    parts = artifact_path.split("/")
    if not artifact_path or artifact_path.startswith("/") or "\0" in artifact_path or any(
            p in (".", "..") for p in parts):
        raise ValueError(f"{artifact_path[:200]!r} is not a relative path without '.' or '..'")
    parts = [p for p in parts if p]
    if not parts:
        raise ValueError(f"{artifact_path[:200]!r} names no file")
    return "/".join(parts[:-1]), parts[-1]


def _make_dirs(path: str) -> bool:
    """``path`` and its missing parents made 0700, the deepest first (one ``mkdir`` when it is there,
    three for a new run's ``RUN/artifacts``, no ``stat`` walk); whether ``path`` was made now."""
    try:
        os.mkdir(path, 0o700)
        return True
    except FileExistsError:
        return False
    except FileNotFoundError:
        parent = os.path.dirname(path)
        if parent == path:
            raise
        _make_dirs(parent)
    try:
        os.mkdir(path, 0o700)
        return True
    except FileExistsError:
        return False


def _make_fresh(folder: str, parent: str) -> None:
    """The folders of ``parent`` (an artifact path's folder, checked by :func:`_split`) in a run folder
    just made: made without the failed ``openat`` :func:`open_beneath` tries first."""
    path = folder
    for part in parent.split("/"):
        path = os.path.join(path, part)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            return  # another writer made it: open_beneath walks (and checks) the rest


_TMP = itertools.count()
_PID = [os.getpid()]  # (a getpid a file was 600 of a pass's ~30,000 system calls)
os.register_at_fork(after_in_child=lambda: _PID.__setitem__(0, os.getpid()))


def _write_at(fd: int, name: str, text: str | bytes) -> None:
    """``text`` as the file ``name`` in the folder ``fd``: created 0600 under a temporary name beside it
    (``O_EXCL``: never a file that was there) and renamed into place, so a reader never sees half of it.
    No fsync: the mirror is a copy, the ledger (and the attempt logs in the home) the truth; a
    machine crash may lose a file the ledger counts as sent, never what it copies, and the rename
    alone keeps a reader from half a file. Raw ``os.write``: no text-file object (its
    ``fstat``, ``ioctl``, ``lseek`` and buffers) for a file written once; a counter for the temporary
    name, not random bytes (``O_EXCL`` refuses a left-over name: one retry with a random one)."""
    data = text if isinstance(text, bytes) else text.encode("utf-8", "surrogateescape")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    tmp = f".{name}.{_PID[0]}-{next(_TMP)}.tmp"
    try:
        out = os.open(tmp, flags, 0o600, dir_fd=fd)
    except FileExistsError:  # left by a crashed process of the same pid
        tmp = f".{name}.{uuid.uuid4().hex[:8]}.tmp"
        out = os.open(tmp, flags, 0o600, dir_fd=fd)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(out, view):]
        finally:
            os.close(out)
        os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=fd)
        except OSError:
            pass
        raise
