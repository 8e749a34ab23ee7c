"""The engine's side of the MLflow mirror: stdlib only, no mlflow (docs/architecture.md).

The engine writes the ledger; the mirror (:mod:`autoresearch.tracking`) reads it. What
the engine and the loop need from the mirror lives here, *below* the engine, so that
nothing on a fast path imports ``tracking`` (nor, through it, mlflow):

    kick(home)                  start the background syncer unless one runs (~1 ms)
    attempt_env(ledger, job_id) MLFLOW_* variables for a launching attempt, from the ledger
    record_llm_call(home, ...)  store one LLM call in the outbox; the syncer emits a trace
    record_report(home, ...)    ask for a loop's report files on its run; the syncer uploads them
    request_runs(ledger, ids)   ask for trials' MLflow runs before they launch (the run maker answers)
    trial_runs(ledger, ids)     the trials' run ids the mirror wrote so far
    tracking_uri(home)          where the mirror writes
    tracking_enabled()          ``AUTORESEARCH_TRACKING=off`` turns the mirror off

The tables are the mirror's (``tracking_runs``, ``tracking_state``, ``tracking_outbox``,
created by the ledger's migrations); :mod:`autoresearch.tracking` re-exports these names.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import sqlite3
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autoresearch.store.ledger import Ledger

__all__ = ["CREATE_LOCK_FILE", "KICK_FILE", "LOCK_FILE", "LOG_FILE", "TRIAL_TAG", "attempt_env", "background_enabled",
           "creation_lock", "default_uri", "kick", "record_llm_call", "record_report", "request_runs", "trial_runs",
           "trial_run_goes_on", "tracking_enabled", "tracking_uri"]

LOCK_FILE = "tracking.lock"
KICK_FILE = "tracking.kick"
LOG_FILE = "tracking.log"
CREATE_LOCK_FILE = "tracking.create.lock"  # held while the MLflow store, a run or a trace is created
RUN_MAKER = "autoresearch.tracking._prepare_runs"  # the mirror's helper process that answers request_runs
_OFF = ("0", "off", "false", "no")


@functools.lru_cache(maxsize=16)  # a launch asks for it: resolving the home costs a syscall per component
def default_uri(home: Path) -> str:
    return f"sqlite:///{Path(home).resolve() / 'mlflow.db'}"


def tracking_uri(home: str | os.PathLike[str] | None = None, conn: sqlite3.Connection | None = None) -> str:
    """Where the mirror writes: the URI recorded at the first sync, else
    ``$MLFLOW_TRACKING_URI``, else ``sqlite:///$AUTORESEARCH_HOME/mlflow.db``."""
    if conn is not None:
        row = conn.execute("SELECT value FROM tracking_state WHERE name='uri'").fetchone()
        if row is not None:
            return str(row[0])
    from autoresearch.store.ledger import default_home

    return os.environ.get("MLFLOW_TRACKING_URI") or default_uri(Path(home) if home else default_home())


def tracking_enabled() -> bool:
    """``AUTORESEARCH_TRACKING=off`` turns the MLflow mirror off entirely."""
    return os.environ.get("AUTORESEARCH_TRACKING", "").strip().lower() not in _OFF


def background_enabled() -> bool:
    """``AUTORESEARCH_SYNC=off`` keeps the mirror but runs it only on `autoresearch sync`.

    (The test suite sets it off for the whole session — a syncer per throwaway home,
    each importing mlflow, would swamp the machine — and on where the mirror is tested.)
    """
    value = os.environ.get("AUTORESEARCH_SYNC", "").strip().lower()
    return tracking_enabled() and value not in _OFF


def mirror_failed(ledger: Ledger) -> bool:
    """Whether the mirror's last sync failed and it has not worked since (a cheap read, for
    ``status``: the details are :func:`autoresearch.tracking._status.mirror_lag`'s)."""
    return ledger.one("SELECT 1 FROM tracking_state WHERE name='error'") is not None


SYNCER_NICE = 5  # the background syncer's niceness above the process that starts it


def kick(home: str | os.PathLike[str] | None = None) -> bool:
    """Make sure a background syncer will pick up new ledger rows. Never raises.

    Cheap (a touch, a non-blocking flock and, only when no syncer runs, a double
    fork + exec): it is called after every submit and at every attempt's end.
    ``AUTORESEARCH_SYNC=off`` turns the background syncer off (``autoresearch sync``
    still works). Returns True when it started a syncer.
    """
    if not background_enabled():
        return False
    try:
        from autoresearch.store.ledger import default_home

        root = Path(home).expanduser() if home else default_home()
        (root / KICK_FILE).touch(0o600)  # the syncer re-checks this before it exits: no kick is lost
        fd = os.open(root / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # a syncer holds the lock and will see the kick
        finally:
            os.close(fd)  # closing drops our probe lock
        from autoresearch.backends._supervisor import spawn_detached

        # in our directory, as always: a relative MLFLOW_TRACKING_URI means the same file to the syncer;
        # niced as the loop's report helper is: the mirror is background work, the command and its trials are not
        spawn_detached([sys.executable, "-m", "autoresearch.tracking", "--home", str(root)], root / LOG_FILE, cwd=None,
                       nice=SYNCER_NICE)
        return True
    except OSError:
        return False


@contextlib.contextmanager
def creation_lock(home: str | os.PathLike[str], wait_s: float | None = None) -> Iterator[bool]:
    """The lock around what must happen once across processes (the mirror's ``_critical``): creating
    the MLflow database, a run, a trace. Yields True once held; with ``wait_s``, False when it was
    not free within that many seconds (the caller goes on without it). A process killed while
    holding it releases it (flock)."""
    fd = os.open(Path(home) / CREATE_LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        if wait_s is None:
            fcntl.flock(fd, fcntl.LOCK_EX)
            held = True
        else:
            deadline = time.monotonic() + wait_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    held = True
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        held = False
                        break
                    time.sleep(0.05)
        yield held
    finally:
        os.close(fd)


TRIAL_TAG = "autoresearch.trial_id"  # the loop puts it in a trial job's spec tags


def attempt_env(ledger: Ledger, job_id: int, spec: dict[str, Any] | None = None) -> dict[str, str]:
    """MLflow variables for a launching attempt, read from the ledger (no mlflow import).

    ``MLFLOW_TRACKING_URI`` always (so a trial's own ``mlflow`` calls go to the same
    store), plus ``MLFLOW_EXPERIMENT_ID`` and ``MLFLOW_RUN_ID`` when the job's run
    exists already: the loop has its trials' runs created before it submits them
    (:func:`request_runs`) and tags the job spec with ``autoresearch.trial_id`` (the
    job id is not known before submit), and the syncer creates runs of jobs that wait
    in the queue.
    A standalone job that starts at once can call :func:`start_run` itself.
    """
    if not tracking_enabled():
        return {}
    conn = ledger.connection()
    env = {"MLFLOW_TRACKING_URI": tracking_uri(ledger.home, conn)}
    trial = str(((spec or {}).get("tags") or {}).get(TRIAL_TAG, "")).strip()
    row = conn.execute(
        "SELECT r.run_id, r.experiment_id FROM tracking_runs r WHERE r.entity IN (?, ?) AND r.run_id IS NOT NULL "
        "UNION ALL SELECT r.run_id, r.experiment_id FROM trials t JOIN tracking_runs r "
        "ON r.entity='trial:' || t.id WHERE t.job_id=? AND r.run_id IS NOT NULL LIMIT 1",
        (f"job:{job_id}", f"trial:{trial}", job_id)).fetchone()
    if row is not None:
        env["MLFLOW_RUN_ID"] = str(row[0])
        env["MLFLOW_EXPERIMENT_ID"] = str(row[1])
    return env


def record_llm_call(home: str | os.PathLike[str] | Ledger | None, *, loop_id: int | None, decision_id: int | None,
                    name: str, model: str, inputs: Any, outputs: Any, started_at: float, ended_at: float,
                    provider: str = "", prompt_name: str = "", prompt_sha256: str = "", temperature: float | None = None,
                    tokens_in: int = 0, tokens_out: int = 0, cost_usd: float = 0.0, error: str | None = None) -> int:
    """Store one LLM call behind a decision; the syncer turns it into an MLflow trace
    linked to the loop's parent run. Cheap (one ledger insert); returns its outbox id.

    ``inputs``/``outputs`` are anything JSON-able (messages, the response text);
    secrets of the loop's plan and of this process's environment are redacted before
    they are stored.
    """
    from autoresearch.store.ledger import Ledger
    from autoresearch.util.redact import ambient_secrets, plan_secrets, redact

    ledger = home if isinstance(home, Ledger) else Ledger(home)
    payload = {
        "name": name, "model": model, "provider": provider, "prompt_name": prompt_name,
        "prompt_sha256": prompt_sha256, "temperature": temperature, "inputs": inputs, "outputs": outputs,
        "started_at": started_at, "ended_at": ended_at, "tokens_in": tokens_in, "tokens_out": tokens_out,
        "cost_usd": cost_usd, "error": error,
    }
    plan = ledger.one("SELECT plan FROM loops WHERE id=?", (loop_id,)) if loop_id is not None else None
    secrets = plan_secrets(_json(plan["plan"]), ambient=False) if plan is not None else []
    text = redact(json.dumps(payload, default=str), secrets + ambient_secrets())
    with ledger.tx() as c:
        cur = c.execute("INSERT INTO tracking_outbox(kind, loop_id, decision_id, payload, created_at) "
                        "VALUES ('llm_call',?,?,?,?)", (loop_id, decision_id, text, time.time()))
        return int(cur.lastrowid or 0)


def record_report(home: str | os.PathLike[str] | Ledger | None, loop_id: int, report_dir: str | os.PathLike[str]) -> int:
    """Ask the mirror to attach a loop's report files (``report_dir``) to the loop's MLflow
    run, under ``report/``. One ledger insert; returns its outbox id. The next sync pass
    uploads them and records the run id in the row's ``sent_ref``."""
    from autoresearch.store.ledger import Ledger

    ledger = home if isinstance(home, Ledger) else Ledger(home)
    with ledger.tx() as c:
        cur = c.execute("INSERT INTO tracking_outbox(kind, loop_id, payload, created_at) VALUES ('report',?,?,?)",
                        (loop_id, json.dumps({"dir": str(report_dir)}), time.time()))
        return int(cur.lastrowid or 0)


def request_runs(ledger: Ledger, trial_ids: list[int]) -> int:
    """Ask the mirror for the MLflow runs of trials about to launch (``kind='trial_run'``).
    One ledger insert; returns its outbox id. The run maker (:data:`RUN_MAKER`) or the next
    sync pass creates the runs, writes them to ``tracking_runs`` and marks the entry sent."""
    with ledger.tx() as c:
        cur = c.execute("INSERT INTO tracking_outbox(kind, payload, created_at) VALUES ('trial_run',?,?)",
                        (json.dumps([int(i) for i in trial_ids]), time.time()))
        return int(cur.lastrowid or 0)


def trial_run_goes_on(ledger: Ledger, trial_id: int) -> None:
    """A paused trial now runs as a new job (loop/pause.py): its MLflow run goes on, and that
    job's attempt logs (numbered from 1 again) are still to upload."""
    with ledger.tx() as c:
        c.execute("UPDATE tracking_runs SET logs_done=0 WHERE entity=?", (f"trial:{int(trial_id)}",))


def trial_runs(ledger: Ledger, trial_ids: list[int]) -> dict[int, str]:
    """Trial id -> MLflow run id, for those of ``trial_ids`` whose run exists (cheap: one query)."""
    if not trial_ids:
        return {}
    entities = {f"trial:{int(i)}": int(i) for i in trial_ids}
    rows = ledger.query(f"SELECT entity, run_id FROM tracking_runs WHERE run_id IS NOT NULL AND entity IN "
                        f"({','.join('?' * len(entities))})", tuple(entities))
    return {entities[r["entity"]]: str(r["run_id"]) for r in rows}


def pending(ledger: Ledger, kind: str, limit: int = 50) -> list[sqlite3.Row]:
    """Outbox entries of ``kind`` not sent yet, oldest first."""
    return ledger.query("SELECT * FROM tracking_outbox WHERE done_at IS NULL AND kind=? ORDER BY id LIMIT ?",
                        (kind, limit))


def entry(ledger: Ledger, entry_id: int) -> sqlite3.Row | None:
    return ledger.one("SELECT * FROM tracking_outbox WHERE id=?", (entry_id,))


def mark_sent(ledger: Ledger, entry_id: int, ref: str) -> None:
    """The mirror sent an entry: ``ref`` says where to (a run or trace id), or ``error: ...``."""
    with ledger.tx() as c:
        c.execute("UPDATE tracking_outbox SET sent_ref=?, done_at=? WHERE id=?", (ref, time.time(), entry_id))


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return {}
