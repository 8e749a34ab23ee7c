"""The mirror's store: every query the MLflow mirror makes of the ledger.

Its own tables (``tracking_runs``: entity → run and how far it is mirrored;
``tracking_state``: the bound URI, the home id and the cursors; migration ``tracking-1``
in :mod:`autoresearch.store.ledger`) are written only here and in :mod:`autoresearch.store.outbox`
(the outbox's stdlib side: what the engine and the loop record for the mirror). The
ledger's other tables (jobs, attempts, metrics, loops, trials, decisions) are only read
here, often joined with ``tracking_runs``. Methods say what they mean; each write is one
transaction, as it was where it is called.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

from autoresearch.store.ledger import Ledger

Row = sqlite3.Row
# A job belongs to a trial by trials.job_id, or (before the loop wrote it back) by its spec tag.
TRIAL_JOIN = ("t.id=COALESCE((SELECT x.id FROM trials x WHERE x.job_id=j.id LIMIT 1), "
              "CAST(json_extract(j.spec, '$.tags.\"autoresearch.trial_id\"') AS INTEGER))")
ENTITY = "(CASE WHEN t.id IS NULL THEN 'job:' || j.id ELSE 'trial:' || t.id END)"


def use_wal(path: str) -> None:
    """Put the MLflow SQLite database at ``path`` in WAL mode (the one statement the mirror runs
    on MLflow's own database)."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("PRAGMA journal_mode=WAL")


class MirrorStore:
    """The mirror's view of one :class:`Ledger`."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self._open: tuple[sqlite3.Connection, int] | None = None  # the transaction of a :meth:`batch`, its thread
        # A pass's reads (:meth:`pass_reads`), of one thread: what cannot change under a pass (loops' rows,
        # run ids once made) read once, and what a phase read in bulk (:meth:`prefetch_jobs`, ...).
        self._memo: dict[tuple[str, object], Any] | None = None
        self._phase: dict[tuple[str, object], Any] | None = None
        self._memo_thread = 0

    def _tx(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        if self._open is not None and self._open[1] == threading.get_ident():
            return contextlib.nullcontext(self._open[0])
        return self.ledger.tx()

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """The writes made meanwhile (by this thread's calls of this store) in one transaction:
        the bookkeeping of a batch MLflow accepted, one commit instead of one a run."""
        if self._open is not None:
            yield
            return
        with self.ledger.tx() as c:
            self._open = (c, threading.get_ident())
            try:
                yield
            finally:
                self._open = None

    # -- a pass's reads in bulk ----------------------------------------------------------------

    @contextlib.contextmanager
    def pass_reads(self) -> Iterator[None]:
        """One pass of this thread: what cannot change under it is read once (a loop's row: its name,
        plan and experiment; a run id once made: it never changes) instead of once a trial, and what
        a phase prefetched in bulk is used (:meth:`prefetch_jobs`, :meth:`prefetch_decisions`)."""
        if self._memo is not None:
            yield
            return
        self._memo, self._memo_thread = {}, threading.get_ident()
        try:
            yield
        finally:
            self._memo = self._phase = None

    def _memo_here(self) -> dict[tuple[str, object], Any] | None:
        return self._memo if self._memo is not None and self._memo_thread == threading.get_ident() else None

    def _recall(self, kind: str, key: object) -> tuple[bool, Any]:
        """(found, value) of a prefetched or memoized read."""
        if self._memo_here() is None:
            return False, None
        for memo in (self._phase, self._memo):
            if memo is not None and (kind, key) in memo:
                return True, memo[(kind, key)]
        return False, None

    def _remember(self, kind: str, key: object, value: Any) -> None:
        memo = self._memo_here()
        if memo is not None:
            memo[(kind, key)] = value

    def _forget(self, kind: str, key: object) -> None:
        for memo in (self._phase, self._memo):
            if memo is not None:
                memo.pop((kind, key), None)

    def _in(self, sql: str, keys: Iterable[Any], params: tuple[Any, ...] = ()) -> list[Row]:
        """``sql`` with ``{}`` standing for a list of ``keys``' placeholders, 500 keys a query."""
        keys = sorted(set(keys))
        out: list[Row] = []
        for i in range(0, len(keys), 500):
            chunk = tuple(keys[i:i + 500])
            out += self.ledger.query(sql.format(",".join("?" * len(chunk))), params + chunk)
        return out

    @contextlib.contextmanager
    def prefetch_jobs(self, jobs: list[Row]) -> Iterator[None]:
        """While a phase mirrors ``jobs`` (rows of :meth:`jobs_to_sync`, read before this): their trials,
        the trials' decisions and verdicts, the jobs' last attempts, their runs' ids and recorded problems,
        and their loops, read in a few queries (one a table) instead of ~10 a job. Read after the jobs, as
        one job's mirror reads them: a run's synced version never claims a change it did not see."""
        if self._memo_here() is None:
            yield
            return
        phase: dict[tuple[str, object], Any] = {}
        trial_ids = {int(j["trial_id"]) for j in jobs if j["trial_id"] is not None}
        job_ids = {int(j["id"]) for j in jobs}
        for tid in trial_ids:
            phase[("trial", tid)] = None
        for row in self._in("SELECT * FROM trials WHERE id IN ({})", trial_ids):
            phase[("trial", row["id"])] = row
        trials = [t for k, t in phase.items() if k[0] == "trial" and t is not None]
        decision_ids = {int(t["decision_id"]) for t in trials if t["decision_id"] is not None}
        for did in decision_ids:
            phase[("decision", did)] = None
        for row in self._in("SELECT * FROM decisions WHERE id IN ({})", decision_ids):
            phase[("decision", row["id"])] = row
        self._verdicts(phase, trial_ids)
        for jid in job_ids:
            phase[("last_node", jid)] = None
        for row in self._in("SELECT job_id, node, failure_class FROM attempts a WHERE job_id IN ({}) AND n=(SELECT "
                            "MAX(n) FROM attempts b WHERE b.job_id=a.job_id)", job_ids):
            phase[("last_node", row["job_id"])] = row
        for job in jobs:
            entity = f"trial:{job['trial_id']}" if job["trial_id"] is not None else f"job:{job['id']}"
            if "error" in job.keys():
                phase[("error", entity)] = job["error"]
            if "run_id" in job.keys() and job["run_id"]:
                self._remember("run", entity, str(job["run_id"]))
        self.loops({int(t["loop_id"]) for t in trials})
        self._phase = phase
        try:
            yield
        finally:
            self._phase = None

    @contextlib.contextmanager
    def prefetch_decisions(self, decisions: list[Row]) -> Iterator[None]:
        """While a batch of ``decisions`` is mirrored: the trials each produced, and the trials its
        keep-or-discard decisions judged (their rows, verdicts and run ids), a query a table."""
        if self._memo_here() is None or not decisions:
            yield
            return
        phase: dict[tuple[str, object], Any] = {}
        ids = [int(d["id"]) for d in decisions]
        for did in ids:
            phase[("trials_of", did)] = []
        for row in self._in("SELECT id, decision_id FROM trials WHERE decision_id BETWEEN ? AND ? AND loop_id IN ({}) "
                            "ORDER BY id", {int(d["loop_id"]) for d in decisions}, (min(ids), max(ids))):
            if ("trials_of", row["decision_id"]) in phase:
                phase[("trials_of", row["decision_id"])].append(row["id"])
        judged = {int(d["trial_id"]) for d in decisions if d["kind"] == "promote" and d["trial_id"] is not None}
        for row in self._in("SELECT * FROM trials WHERE id IN ({})", judged):
            phase[("trial", row["id"])] = row
        self._verdicts(phase, judged)
        self.runs_of([f"trial:{t}" for t in judged])
        self.loops({int(d["loop_id"]) for d in decisions})
        self._phase = phase
        try:
            yield
        finally:
            self._phase = None

    def _verdicts(self, phase: dict[tuple[str, object], Any], trial_ids: set[int]) -> None:
        for tid in trial_ids:
            phase[("verdict", tid)] = None
        for row in self._in("SELECT id, trial_id, inputs, outputs FROM decisions WHERE kind='promote' AND trial_id "
                            "IN ({}) ORDER BY id", trial_ids):
            phase[("verdict", row["trial_id"])] = row  # (the last one wins)

    def loops(self, loop_ids: set[int]) -> None:
        """Read the rows of ``loop_ids`` not read yet in this pass (one query)."""
        if self._memo_here() is None:
            return
        todo = {i for i in loop_ids if not self._recall("loop", i)[0]}
        for row in self._in("SELECT * FROM loops WHERE id IN ({})", todo):
            self._remember("loop", row["id"], row)

    # -- tracking_state: the bound store, the home id, the cursors -------------------------

    def state(self, name: str) -> str | None:
        row = self.ledger.one("SELECT value FROM tracking_state WHERE name=?", (name,))
        return str(row["value"]) if row else None

    def set_state(self, name: str, value: object) -> None:
        with self._tx() as c:
            c.execute("INSERT OR REPLACE INTO tracking_state(name, value) VALUES (?,?)", (name, str(value)))

    def clear_state(self, *names: str) -> None:
        with self._tx() as c:
            c.executemany("DELETE FROM tracking_state WHERE name=?", [(n,) for n in names])

    def unmirrored(self) -> dict[str, int]:
        """What waits to be mirrored (blocked runs aside: they wait for a fix, not for time):
        metric points, decisions, outbox entries, and jobs and loops never mirrored."""
        state = {r["name"]: r["value"] for r in self.ledger.query(
            "SELECT name, value FROM tracking_state WHERE name IN ('metrics', 'decisions')")}
        counts = {
            "metric points": self.ledger.one("SELECT COUNT(*) AS n FROM metrics WHERE rowid > ?",
                                             (int(state.get("metrics", 0)),)),
            "decisions": self.ledger.one("SELECT COUNT(*) AS n FROM decisions WHERE id > ?",
                                         (int(state.get("decisions", 0)),)),
            "outbox entries": self.ledger.one("SELECT COUNT(*) AS n FROM tracking_outbox WHERE done_at IS NULL"),
            "jobs": self.ledger.one(
                f"SELECT COUNT(*) AS n FROM jobs j LEFT JOIN trials t ON {TRIAL_JOIN} "
                f"LEFT JOIN tracking_runs r ON r.entity={ENTITY} WHERE r.run_id IS NULL AND r.error IS NULL"),
            "loops": self.ledger.one("SELECT COUNT(*) AS n FROM loops l LEFT JOIN tracking_runs r ON "
                                     "r.entity='loop:' || l.id WHERE r.run_id IS NULL AND r.error IS NULL"),
        }
        return {k: int(row["n"]) for k, row in counts.items() if row is not None and row["n"]}

    def progress(self) -> tuple[dict[str, str], int, int, list[dict[str, str]], int]:
        """How far the mirror is: its state (name → value), the metric points past its cursor,
        the outbox entries not sent, the blocked entities (entity, error) and the runs made."""
        state = {r["name"]: r["value"] for r in self.ledger.query("SELECT name, value FROM tracking_state")}
        cursor = int(state.get("metrics", 0))
        pending = self.ledger.one("SELECT COUNT(*) AS n FROM metrics WHERE rowid > ?", (cursor,))
        unsent = self.ledger.one("SELECT COUNT(*) AS n FROM tracking_outbox WHERE done_at IS NULL")
        blocked = [{"entity": r["entity"], "error": r["error"]}
                   for r in self.ledger.query("SELECT entity, error FROM tracking_runs WHERE error IS NOT NULL")]
        runs = self.ledger.one("SELECT COUNT(*) AS n FROM tracking_runs WHERE run_id IS NOT NULL")
        return (state, pending["n"] if pending else 0, unsent["n"] if unsent else 0, blocked,
                runs["n"] if runs else 0)

    def offer_home_id(self, value: str) -> None:
        """Record ``value`` as this ledger's home id unless it has one."""
        with self._tx() as c:
            c.execute("INSERT OR IGNORE INTO tracking_state(name, value) VALUES ('home_id', ?)", (value,))

    def rebind(self, uri: str) -> None:
        """Bind to a new store: forget the run mapping, the cursors and what the outbox sent."""
        if self._memo is not None:
            self._memo.clear()
        with self._tx() as c:
            c.execute("DELETE FROM tracking_runs")
            c.execute("DELETE FROM tracking_state WHERE name IN ('metrics','decisions')")
            c.execute("UPDATE tracking_outbox SET done_at=NULL, sent_ref=NULL")
            c.execute("INSERT OR REPLACE INTO tracking_state(name, value) VALUES ('uri', ?)", (uri,))

    # -- tracking_runs: entity -> run -------------------------------------------------------

    def run_of(self, entity: str) -> Row | None:
        """(run_id, experiment_id) of ``entity``'s row, if it has one."""
        return self.ledger.one("SELECT run_id, experiment_id FROM tracking_runs WHERE entity=?", (entity,))

    def run_id_of(self, entity: str) -> str | None:
        """The run id of ``entity`` (None: none made yet); a run id once made never changes, so a pass
        reads it once (:meth:`pass_reads`)."""
        found, run_id = self._recall("run", entity)
        if found:
            return str(run_id)
        row = self.run_of(entity)
        if row is None or not row["run_id"]:
            return None
        self._remember("run", entity, str(row["run_id"]))
        return str(row["run_id"])

    def runs_of(self, entities: list[str]) -> dict[str, str | None]:
        """The run id of each of ``entities`` that has a row (None: reserved, its create maybe cut short)."""
        out: dict[str, str | None] = {}
        for r in self._in("SELECT entity, run_id FROM tracking_runs WHERE entity IN ({})", entities):
            out[r["entity"]] = r["run_id"]
            if r["run_id"]:
                self._remember("run", r["entity"], str(r["run_id"]))
        return out

    def reserve_run(self, entity: str, experiment_id: str, parent: str | None) -> None:
        """Write-ahead: the row of a run about to be created."""
        now = time.time()
        with self._tx() as c:
            c.execute("INSERT OR IGNORE INTO tracking_runs(entity, experiment_id, parent_run_id, created_at, "
                      "updated_at) VALUES (?,?,?,?,?)", (entity, experiment_id, parent, now, now))

    def set_run(self, entity: str, run_id: str, experiment_id: str, parent: str | None) -> None:
        self._remember("run", entity, run_id)
        with self._tx() as c:
            c.execute("UPDATE tracking_runs SET run_id=?, experiment_id=?, parent_run_id=?, updated_at=? "
                      "WHERE entity=?", (run_id, experiment_id, parent, time.time(), entity))

    def block(self, entity: str, text: str) -> None:
        """Record a run's permanent problem (a row even for a run never created: its points are
        backfilled once it is fixed)."""
        now = time.time()
        self._forget("loop_run", entity)
        self._forget("error", entity)
        with self._tx() as c:
            c.execute("INSERT OR IGNORE INTO tracking_runs(entity, created_at, updated_at) VALUES (?,?,?)",
                      (entity, now, now))
            c.execute("UPDATE tracking_runs SET error=?, updated_at=? WHERE entity=?", (text, now, entity))

    def error_of(self, entity: str) -> str | None:
        """The recorded problem of ``entity``'s run (None: none, or no row)."""
        found, error = self._recall("error", entity)
        if found:
            return str(error) if error is not None else None
        row = self.ledger.one("SELECT error FROM tracking_runs WHERE entity=?", (entity,))
        return str(row["error"]) if row is not None and row["error"] is not None else None

    def clear_error(self, entity: str) -> None:
        self._forget("error", entity)
        with self._tx() as c:
            c.execute("UPDATE tracking_runs SET error=NULL WHERE entity=?", (entity,))

    def job_run_error(self, job_id: int, trial_id: int | None) -> Row | None:
        """The recorded problem of a job's run (as a job, or as its trial)."""
        return self.ledger.one("SELECT error FROM tracking_runs WHERE entity IN (?, ?)",
                               (f"job:{job_id}", f"trial:{trial_id}"))

    def loop_run_id(self, loop_id: int) -> str | None:
        """The run of a loop that has no recorded problem (read once a pass once there is one)."""
        entity = f"loop:{loop_id}"
        found, run_id = self._recall("loop_run", entity)
        if found:
            return str(run_id)
        row = self.ledger.one("SELECT run_id FROM tracking_runs WHERE entity=? AND error IS NULL", (entity,))
        if row is None or not row["run_id"]:
            return None
        self._remember("loop_run", entity, str(row["run_id"]))
        return str(row["run_id"])

    def synced(self, entity: str, version: float) -> None:
        with self._tx() as c:
            c.execute("UPDATE tracking_runs SET synced_version=? WHERE entity=?", (version, entity))

    def loop_synced(self, entity: str, version: float, reopen: bool) -> None:
        """A loop's run is mirrored up to ``version``; ``reopen``: it runs again (not finished)."""
        with self._tx() as c:
            c.execute("UPDATE tracking_runs SET synced_version=?, error=NULL, finished=finished AND ? WHERE entity=?",
                      (version, not reopen, entity))

    def finished(self, entity: str) -> None:
        """A run has ended in MLflow."""
        with self._tx() as c:
            c.execute("UPDATE tracking_runs SET finished=1 WHERE entity=?", (entity,))

    def never_ran_finished(self, entity: str, run_id: str | None) -> None:
        """The run of a trial that never ran has ended (``run_id``: one found for a row whose
        create was cut short)."""
        with self._tx() as c:
            c.execute("UPDATE tracking_runs SET finished=1, run_id=COALESCE(run_id, ?) WHERE entity=?",
                      (run_id, entity))

    def reopen(self, entity: str) -> bool:
        """A trial's run that ended with its job goes on with the trial's next job (a paused trial
        resumed): open again, its next job's logs still to upload. False: it was open."""
        row = self.ledger.one("SELECT finished FROM tracking_runs WHERE entity=?", (entity,))
        if row is None or not row["finished"]:
            return False
        with self._tx() as c:
            c.execute("UPDATE tracking_runs SET finished=0, logs_done=0 WHERE entity=?", (entity,))
        return True

    def logs_done(self, entity: str, n: int) -> None:
        with self._tx() as c:
            c.execute("UPDATE tracking_runs SET logs_done=? WHERE entity=?", (n, entity))

    # -- loops, jobs, trials to mirror --------------------------------------------------------

    def loops_to_sync(self) -> list[Row]:
        """Loops without a run, changed since mirrored, or blocked, with their run's row."""
        return self.ledger.query(
            "SELECT l.*, r.synced_version, r.run_id, r.finished, r.error FROM loops l LEFT JOIN tracking_runs r "
            "ON r.entity='loop:' || l.id WHERE r.run_id IS NULL OR r.synced_version < l.updated_at "
            "OR r.error IS NOT NULL ORDER BY l.id")

    def loop(self, loop_id: int) -> Row | None:
        """A loop's row (read once a pass: the mirror uses its name, plan and experiment, which stay)."""
        found, row = self._recall("loop", loop_id)
        if found:
            return row  # type: ignore[no-any-return]
        row = self.ledger.one("SELECT * FROM loops WHERE id=?", (loop_id,))
        self._remember("loop", loop_id, row)
        return row

    def unsynced_loop(self, loop_id: int) -> Row | None:
        """A loop as :meth:`loops_to_sync` shows one never mirrored."""
        return self.ledger.one("SELECT l.*, -1 AS synced_version, 0 AS finished FROM loops l WHERE l.id=?", (loop_id,))

    def jobs_to_sync(self, since: float | None = None) -> list[Row]:
        """Jobs without a run, changed since mirrored (or their trial), or blocked, with their
        trial id and their run's row. ``since``: only jobs (or trials) changed after it, and the
        blocked ones: an index walk, not a scan of every job (None: look at all of them)."""
        where = ("WHERE r.run_id IS NULL OR r.synced_version < MAX(j.updated_at, COALESCE(t.updated_at, 0)) "
                 "OR r.error IS NOT NULL ORDER BY j.id")
        select = ("SELECT j.*, t.id AS trial_id, r.synced_version, r.run_id, r.error, r.metric_rowid FROM {jobs} "
                  f"LEFT JOIN trials t ON {TRIAL_JOIN} LEFT JOIN tracking_runs r ON r.entity={ENTITY} ")
        if since is None:
            return self.ledger.query(select.format(jobs="jobs j") + where)
        changed = (
            "(SELECT id FROM jobs WHERE updated_at > :since "
            "UNION SELECT job_id FROM trials WHERE updated_at > :since AND job_id IS NOT NULL "
            "UNION SELECT CAST(substr(entity, 5) AS INTEGER) FROM tracking_runs WHERE error IS NOT NULL "
            "AND entity LIKE 'job:%' "
            "UNION SELECT x.job_id FROM tracking_runs b JOIN trials x ON x.id=CAST(substr(b.entity, 7) AS INTEGER) "
            "WHERE b.error IS NOT NULL AND b.entity LIKE 'trial:%' AND x.job_id IS NOT NULL) c "
            "JOIN jobs j ON j.id=c.id")
        return self.ledger.query(select.format(jobs=changed) + where, {"since": since})

    def unsynced_job(self, job_id: int) -> Row | None:
        """A job as :meth:`jobs_to_sync` shows one never mirrored."""
        return self.ledger.one("SELECT j.*, t.id AS trial_id, -1 AS synced_version FROM jobs j "
                               f"LEFT JOIN trials t ON {TRIAL_JOIN} WHERE j.id=?", (job_id,))

    def trial(self, trial_id: int) -> Row | None:
        found, row = self._recall("trial", trial_id)
        return row if found else self.ledger.one("SELECT * FROM trials WHERE id=?", (trial_id,))  # type: ignore[no-any-return]

    def trials(self, trial_ids: Iterable[int]) -> dict[int, Row]:
        """The rows of ``trial_ids`` that exist (a query per 500)."""
        return {r["id"]: r for r in self._in("SELECT * FROM trials WHERE id IN ({})", trial_ids)}

    def decision(self, decision_id: int) -> Row | None:
        found, row = self._recall("decision", decision_id)
        return row if found else self.ledger.one("SELECT * FROM decisions WHERE id=?", (decision_id,))  # type: ignore[no-any-return]

    def latest_experiment(self) -> str | None:
        """The MLflow experiment of the newest loop mirrored (else of the newest job)."""
        for like in ("loop:%", "%"):
            row = self.ledger.one("SELECT experiment_id FROM tracking_runs WHERE entity LIKE ? AND run_id IS NOT "
                                  "NULL ORDER BY created_at DESC LIMIT 1", (like,))
            if row is not None and row["experiment_id"]:
                return str(row["experiment_id"])
        return None

    def verdict_of(self, trial_id: int) -> Row | None:
        """The keep-or-discard decision of a trial (the last one)."""
        found, row = self._recall("verdict", trial_id)
        if found:
            return row  # type: ignore[no-any-return]
        return self.ledger.one("SELECT id, inputs, outputs FROM decisions WHERE kind='promote' AND trial_id=? "
                               "ORDER BY id DESC LIMIT 1", (trial_id,))

    def replaced_by(self, decision_id: int, trial_id: int) -> Row | None:
        """The promotion after ``decision_id`` that replaced a promoted trial (a walk of the later
        decisions: asked only of trials that were promoted, the few incumbents)."""
        return self.ledger.one(
            "SELECT trial_id FROM decisions WHERE kind='promote' AND id > ? AND loop_id=(SELECT loop_id FROM trials "
            "WHERE id=?) AND json_extract(outputs, '$.promoted') ORDER BY id LIMIT 1", (decision_id, trial_id))

    def last_node(self, job_id: int) -> Row | None:
        """The node of a job's latest attempt, and its failure class (infra, user; NULL unless it failed)."""
        found, row = self._recall("last_node", job_id)
        if found:
            return row  # type: ignore[no-any-return]
        return self.ledger.one("SELECT node, failure_class FROM attempts WHERE job_id=? ORDER BY n DESC LIMIT 1",
                               (job_id,))

    def decisions_after(self, cursor: int, limit: int = 500) -> list[Row]:
        return self.ledger.query("SELECT * FROM decisions WHERE id > ? ORDER BY id LIMIT ?", (cursor, limit))

    def trials_of_decision(self, decision_id: int) -> list[int]:
        found, ids = self._recall("trials_of", decision_id)
        if found:
            return list(ids)
        return [r["id"] for r in self.ledger.query("SELECT id FROM trials WHERE decision_id=? ORDER BY id",
                                                   (decision_id,))]

    # -- metrics ------------------------------------------------------------------------------

    def run_of_job(self, job_id: int) -> Row | None:
        """A job's entity, and its run's id and problem (NULL without a row)."""
        return self.ledger.one(
            f"SELECT {ENTITY} AS entity, r.run_id, r.error FROM jobs j LEFT JOIN trials t ON {TRIAL_JOIN} "
            f"LEFT JOIN tracking_runs r ON r.entity={ENTITY} WHERE j.id=?", (job_id,))

    def runs_of_jobs(self, job_ids: Iterable[int]) -> dict[int, Row]:
        """:meth:`run_of_job` of many jobs (a query per 500)."""
        return {r["job_id"]: r for r in self._in(
            f"SELECT j.id AS job_id, {ENTITY} AS entity, r.run_id, r.error FROM jobs j LEFT JOIN trials t ON "
            f"{TRIAL_JOIN} LEFT JOIN tracking_runs r ON r.entity={ENTITY} WHERE j.id IN ({{}})", job_ids)}

    def reported_names_of(self, job_ids: Iterable[int]) -> dict[int, set[str]]:
        """:meth:`reported_names` of many jobs (a query per 500)."""
        out: dict[int, set[str]] = {}
        for r in self._in("SELECT DISTINCT job_id, name FROM metrics WHERE job_id IN ({}) AND source='report'",
                          job_ids):
            out.setdefault(r["job_id"], set()).add(r["name"])
        return out

    def reported_names(self, job_id: int) -> set[str]:
        """The metrics a job reported (the reported-beats-log rule needs all of them)."""
        return {r["name"] for r in self.ledger.query(
            "SELECT DISTINCT name FROM metrics WHERE job_id=? AND source='report'", (job_id,))}

    def points_after(self, rowid: int, limit: int) -> list[Row]:
        """The next ``limit`` metric points of any job (``rid``: their rowid)."""
        return self.ledger.query("SELECT rowid AS rid, * FROM metrics WHERE rowid > ? ORDER BY rowid LIMIT ?",
                                 (rowid, limit))

    def any_point_after(self, rowid: int) -> bool:
        return self.ledger.one("SELECT 1 FROM metrics WHERE rowid > ? LIMIT 1", (rowid,)) is not None

    def job_points(self, job_id: int, after: int, upto: int) -> list[Row]:
        return self.ledger.query("SELECT rowid AS rid, * FROM metrics WHERE job_id=? AND rowid > ? AND rowid <= ? "
                                 "ORDER BY rowid", (job_id, after, upto))

    def metric_rowid_of(self, run_id: str) -> Row | None:
        return self.ledger.one("SELECT metric_rowid, entity FROM tracking_runs WHERE run_id=?", (run_id,))

    def points_sent(self, entity: str, rowid: int) -> None:
        """A run has every point of its job up to ``rowid`` (never moves back)."""
        with self._tx() as c:
            c.execute("UPDATE tracking_runs SET metric_rowid=MAX(metric_rowid, ?) WHERE entity=?", (rowid, entity))

    def backfilled(self, entity: str, rowid: int) -> None:
        with self._tx() as c:
            c.execute("UPDATE tracking_runs SET metric_rowid=? WHERE entity=?", (rowid, entity))

    # -- the ends of runs ---------------------------------------------------------------------

    def job_runs_to_finish(self) -> list[Row]:
        """Runs of jobs with attempt logs to upload or a final state not yet sent (``ended_n``:
        the last ended attempt). Walks the open runs (a partial index), not every job."""
        return self.ledger.query(
            "SELECT * FROM (SELECT r.entity, r.run_id, r.logs_done, j.id AS job_id, j.state, j.ended_at, j.spec, "
            "t.state AS trial_state, "
            "(SELECT MAX(n) FROM attempts a WHERE a.job_id=j.id AND a.state='ended') AS ended_n "
            "FROM tracking_runs r JOIN jobs j ON j.id=(CASE WHEN r.entity LIKE 'job:%' "
            "THEN CAST(substr(r.entity, 5) AS INTEGER) ELSE (SELECT COALESCE(t.job_id, (SELECT y.id FROM jobs y "
            "WHERE CAST(json_extract(y.spec, '$.tags.\"autoresearch.trial_id\"') AS INTEGER)=t.id LIMIT 1)) "
            "FROM trials t WHERE t.id=CAST(substr(r.entity, 7) AS INTEGER)) END) "
            f"LEFT JOIN trials t ON {TRIAL_JOIN} "
            f"WHERE r.finished=0 AND r.run_id IS NOT NULL AND r.error IS NULL AND r.entity={ENTITY}) "
            "WHERE logs_done < COALESCE(ended_n, 0) OR state IN ('succeeded','failed','cancelled')")

    def loop_runs_open(self) -> list[Row]:
        return self.ledger.query(
            "SELECT l.id, l.state, l.updated_at, r.entity, r.run_id FROM loops l JOIN tracking_runs r "
            "ON r.entity='loop:' || l.id WHERE r.run_id IS NOT NULL AND r.finished=0 AND r.error IS NULL")

    def loop_has_open_trial_runs(self, loop_id: int) -> bool:
        return self.ledger.one("SELECT 1 FROM tracking_runs r JOIN trials t ON r.entity='trial:' || t.id "
                               "WHERE t.loop_id=? AND r.finished=0 LIMIT 1", (loop_id,)) is not None

    def never_ran_runs(self) -> list[Row]:
        """Open runs of trials that ended without a job (and never will have one)."""
        return self.ledger.query(
            "SELECT r.entity, r.run_id, r.experiment_id, t.state, t.failure, "
            "COALESCE(t.ended_at, t.updated_at) AS ended_at FROM tracking_runs r JOIN trials t "
            "ON r.entity='trial:' || t.id WHERE r.finished=0 AND r.error IS NULL AND t.job_id IS NULL "
            "AND t.state NOT IN ('proposed','queued','running') AND NOT EXISTS (SELECT 1 FROM jobs j WHERE "
            "json_extract(j.spec, '$.tags.\"autoresearch.trial_id\"')=CAST(t.id AS TEXT))")

    def attempt_logs(self, job_ids: Iterable[int]) -> dict[int, list[Row]]:
        """The attempts (n, log_path) of each of ``job_ids``, in order (a query per 500)."""
        out: dict[int, list[Row]] = {}
        for r in self._in("SELECT job_id, n, log_path FROM attempts WHERE job_id IN ({}) ORDER BY job_id, n", job_ids):
            out.setdefault(r["job_id"], []).append(r)
        return out

    def logs_to_upload(self, job_id: int, after: int, upto: int) -> list[Row]:
        return self.ledger.query("SELECT n, log_path FROM attempts WHERE job_id=? AND n > ? AND n <= ? "
                                 "ORDER BY n", (job_id, after, upto))

    # -- live ingestion, the daemon -------------------------------------------------------------

    def live_backends(self) -> list[Row]:
        """The backends of starting or running attempts."""
        return self.ledger.query("SELECT DISTINCT j.backend FROM attempts a JOIN jobs j ON j.id=a.job_id "
                                 "WHERE a.state IN ('starting','running')")

    def running_attempts(self, backend: str) -> list[Row]:
        return self.ledger.query("SELECT a.* FROM attempts a JOIN jobs j ON j.id=a.job_id "
                                 "WHERE a.state='running' AND j.backend=?", (backend,))

    def any_job_live(self) -> bool:
        """Whether a job is queued, starting or running."""
        return self.ledger.one("SELECT 1 FROM jobs WHERE state IN ('queued','starting','running') LIMIT 1") is not None

    # -- the outbox's LLM calls (its rows are written by autoresearch.store.outbox) --------------------

    def sending(self, entry_id: int) -> None:
        """An outbox entry is being sent (a later pass looks for what this one may have created)."""
        with self._tx() as c:
            c.execute("UPDATE tracking_outbox SET sent_ref='sending' WHERE id=?", (entry_id,))

