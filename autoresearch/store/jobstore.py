"""The job store: every read and write of the engine's tables (jobs, attempts, nodes, metrics,
events, tenants; migrations ``core-1`` and ``isolation-1`` in :mod:`autoresearch.store.ledger`).

The engine (runtime, guard, ingest, isolation) says what it means (``active_attempts``,
``end_attempt``) and this module says it in SQL. A unit of work that was one transaction
stays one method and one transaction; where a rule decides in the middle of one (how an
ended attempt leaves its job), the rule is passed in, so the transaction never splits.
Methods that take a ``conn`` run inside the caller's transaction.

Stdlib only, like the ledger: it is on the status read and the pass.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
import zlib
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from typing import Any

from autoresearch.errors import NotFoundError
from autoresearch.store.ledger import Ledger
from autoresearch.util.decay import accrued, decayed

_REASON_CHARS = 300
_ATTEMPT_WITH_JOB = ("SELECT a.*, j.priority, j.spec, j.retries_used, j.cancel_requested, j.backend FROM attempts a "
                     "JOIN jobs j ON j.id = a.job_id ")


def attempt_paths(job_dir: str | os.PathLike[str], n: int) -> tuple[str, str, str]:
    """An attempt's run dir, log and metrics file."""
    base = os.path.join(job_dir, f"attempt-{n}")  # (not pathlib: a launch's hot path, ~0.1 ms)
    return base, f"{base}.log", f"{base}.metrics.jsonl"

# The attempts' endings past fair share's cursor, oldest first (LIMIT -1: all of them).
_ENDINGS_SINCE = ("SELECT e.id, a.started_at, a.ended_at, j.gpus * j.nodes AS gpus, j.project, j.backend "
                  "FROM events e JOIN attempts a ON a.job_id=e.job_id AND a.n=e.attempt JOIN jobs j ON j.id=e.job_id "
                  "WHERE e.kind='end' AND e.id>? ORDER BY e.id LIMIT ?")


class JobStore:
    """The engine's tables in one :class:`Ledger`; as cheap to make as the ledger handle it wraps."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def _event(self, conn: sqlite3.Connection, kind: str, job_id: int | None = None, attempt: int | None = None,
               *, at: float | None = None, **data: object) -> None:
        """An event stamped ``at`` (the caller's now), else now on the ledger's clock (a simulated fleet's,
        on the sim backend: one read of its clock file per call, so a batch passes its own now)."""
        Ledger.event(conn, kind, job_id, attempt, _ts=self.ledger.clock() if at is None else at, **data)

    # -- jobs: submit, cancel, look-ups ----------------------------------------------------

    def add_job(self, job: Any, project: str, backend: str, policy: str) -> int:
        """Record a validated job (a JobSpec) as queued, with its ``submit`` event; its id."""
        return self.add_jobs([job], project, backend, policy)[0]

    def add_jobs(self, jobs: list[Any], project: str, backend: str, policy: str, group: str | None = None,
                 max_running: int | None = None, place_as: int | None = None) -> list[int]:
        """Record validated jobs (JobSpecs) as queued, each with its ``submit`` event, in one
        transaction; their ids, in order. ``group``: theirs, whose running cap becomes ``max_running``
        (when given) in the same transaction (:meth:`group_room`). ``place_as``: the job id whose place
        in the queue they take (``queue_order``; None: their own)."""
        now = self.ledger.clock()
        ids = []
        with self.ledger.tx() as c:
            if group is not None and max_running is not None:
                self.set_group_cap(group, max_running, c)
            for job in jobs:
                cur = c.execute(
                    "INSERT INTO jobs(name, state, priority, spec, gpus, nodes, cpus, memory, experiment, project, "
                    "backend, submitted_at, updated_at, isolation, job_group, queue_order) "
                    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (job.name, "queued", job.priority, job.model_dump_json(), job.gpus, job.nodes, job.cpus,
                     job.memory, job.experiment, project, backend, now, now, policy, group, place_as),
                )
                job_id = int(cur.lastrowid or 0)
                self._event(c, "submit", job_id, priority=job.priority, gpus=job.gpus, at=now)
                ids.append(job_id)
        return ids

    def set_group_cap(self, group: str, max_running: int, conn: sqlite3.Connection | None = None) -> None:
        """At most ``max_running`` jobs of ``group`` start or run at once (inside ``conn``'s transaction,
        else one of its own)."""
        if conn is None:
            with self.ledger.tx() as c:
                self.set_group_cap(group, max_running, c)
            return
        cur = conn.execute("INSERT INTO job_groups(name, max_running, updated_at) VALUES (?,?,?) ON CONFLICT(name) "
                           "DO UPDATE SET max_running=excluded.max_running, updated_at=excluded.updated_at "
                           "WHERE job_groups.max_running!=excluded.max_running", (group, max_running, self.ledger.clock()))
        if cur.rowcount:  # a new cap: the next pass places the queue again (its change mark moved)
            self._event(conn, "group_cap", group=group, max_running=max_running)

    def group_room(self, groups: Iterable[str]) -> dict[str, int]:
        """Per capped group of ``groups``: how many more of its jobs may start now (its cap less its
        starting and running jobs, counted through ``jobs_by_group``: O(its running), not O(jobs))."""
        names = sorted(set(groups))
        if not names:
            return {}
        caps = self.ledger.query(f"SELECT name, max_running FROM job_groups WHERE name IN "
                                 f"({','.join('?' * len(names))})", tuple(names))
        out = {}
        for r in caps:
            busy = self.ledger.one("SELECT COUNT(*) AS n FROM jobs WHERE job_group=? AND state IN ('starting','running')",
                                   (r["name"],))
            out[r["name"]] = max(0, int(r["max_running"]) - (busy["n"] if busy else 0))
        return out

    def cancel_queued(self, job_ids: list[int]) -> list[int]:
        """Cancel those of ``job_ids`` that are still queued (never started), each with its ``cancel``
        event, in one transaction: a pass that starts one first wins, and it is not in the list."""
        done: list[int] = []
        if not job_ids:
            return done
        with self.ledger.tx() as c:
            now = self.ledger.clock()
            for job_id in job_ids:
                cur = c.execute("UPDATE jobs SET state='cancelled', cancel_requested=1, end_reason='cancelled', "
                                "ended_at=?, updated_at=? WHERE id=? AND state='queued'", (now, now, job_id))
                if cur.rowcount:
                    self._event(c, "cancel", job_id, at=now)
                    done.append(job_id)
        return done

    def seed_finished(self, count: int, backend: str, spec: str, chunk: int = 10_000) -> None:
        """``count`` succeeded jobs of one attempt each, with their events, written straight in
        (benchmarks and tests: a ledger of 100k jobs in seconds, not hours of submits). ``spec``:
        a job spec's JSON as :meth:`add_jobs` stores it."""
        now = self.ledger.clock()
        for start in range(0, count, chunk):
            with self.ledger.tx() as c:
                for _ in range(min(chunk, count - start)):
                    cur = c.execute(
                        "INSERT INTO jobs(name, state, priority, spec, gpus, nodes, backend, submitted_at, updated_at, "
                        "started_at, ended_at, attempts, exit_code, end_reason) "
                        "VALUES ('seed','succeeded','normal',?,0,1,?,?,?,?,?,1,0,'exit')",
                        (spec, backend, now, now, now, now))
                    job_id = int(cur.lastrowid or 0)
                    c.execute("INSERT INTO attempts(job_id, n, state, external_id, log_path, metrics_path, created_at, "
                              "started_at, ended_at, exit_code, end_reason) VALUES (?,1,'ended','','','',?,?,?,0,'exit')",
                              (job_id, now, now, now))
                    c.executemany("INSERT INTO events(ts, job_id, attempt, kind, data) VALUES (?,?,1,?,'{}')",
                                  [(now, job_id, kind) for kind in ("submit", "launch", "end")])

    def request_cancel(self, job_ids: list[int], final: Iterable[str], chunk: int = 500) -> list[int]:
        """Ask for these jobs' cancel (a queued job is cancelled at once), each with its ``cancel``
        event, in transactions of ``chunk`` jobs (a whole array's without holding the ledger for
        seconds); the ids asked for, in order: not those already in a ``final`` state (nothing done)."""
        final = tuple(final)
        job_ids = list(dict.fromkeys(job_ids))  # (an id named twice is asked for once)
        asked: list[int] = []
        for part, marks in _chunks(job_ids, chunk):
            with self.ledger.tx() as c:
                states = {r["id"]: r["state"] for r in c.execute(f"SELECT id, state FROM jobs WHERE id IN ({marks})",
                                                                 tuple(part))}
                now = self.ledger.clock()
                for job_id in part:
                    state = states.get(job_id)
                    if state is None or state in final:
                        continue
                    c.execute("UPDATE jobs SET cancel_requested=1, updated_at=? WHERE id=?", (now, job_id))
                    if state == "queued":
                        c.execute("UPDATE jobs SET state='cancelled', end_reason='cancelled', ended_at=? WHERE id=?",
                                  (now, job_id))
                    self._event(c, "cancel", job_id, at=now)
                    asked.append(job_id)
        return asked

    def active_attempt_numbers(self, job_ids: list[int], chunk: int = 500) -> list[sqlite3.Row]:
        """``job_id`` and ``n`` of these jobs' starting or running attempts."""
        rows: list[sqlite3.Row] = []
        for part, marks in _chunks(job_ids, chunk):
            rows += self.ledger.query(f"SELECT job_id, n FROM attempts WHERE job_id IN ({marks}) "
                                      "AND state IN ('starting','running') ORDER BY job_id, n", tuple(part))
        return rows

    def jobs_by_ids(self, job_ids: list[int], chunk: int = 500) -> list[sqlite3.Row]:
        """The rows of these jobs, in the order asked (ids that are no job left out)."""
        rows: dict[int, sqlite3.Row] = {}
        for part, marks in _chunks(job_ids, chunk):
            for r in self.ledger.query(f"SELECT * FROM jobs WHERE id IN ({marks})", tuple(part)):
                rows[r["id"]] = r
        return [rows[j] for j in job_ids if j in rows]

    def job(self, job_id: int) -> sqlite3.Row | None:
        return self.ledger.one("SELECT * FROM jobs WHERE id=?", (job_id,))

    def latest_attempt(self, job_id: int) -> sqlite3.Row | None:
        return self.ledger.one("SELECT * FROM attempts WHERE job_id=? ORDER BY n DESC LIMIT 1", (job_id,))

    def node_sizes(self, backend: str) -> list[sqlite3.Row]:
        """Name, GPUs, state and its reason of ``backend``'s nodes (cordoned or not)."""
        return self.ledger.query("SELECT name, gpus, state, reason FROM nodes WHERE backend=?", (backend,))

    def nodes_and_owners(self, backend: str, names: list[str]) -> tuple[list[sqlite3.Row], dict[str, str]]:
        """The rows of ``backend``'s nodes, and which of ``names`` another backend of this home already
        reports (node name -> that backend): one read, a pass's."""
        marks = ",".join("?" * len(names))
        rows = self.ledger.query(f"SELECT * FROM nodes WHERE backend=? OR name IN ({marks})" if names else
                                 "SELECT * FROM nodes WHERE backend=?", (backend, *names))
        return [r for r in rows if r["backend"] == backend], {r["name"]: r["backend"] for r in rows
                                                               if r["backend"] != backend}

    def jobs_page(self, state: str | None, experiment: str | None, project: str | None, cursor: int | None,
                  limit: int) -> list[sqlite3.Row]:
        """Up to ``limit`` jobs, newest first, matching the filters that are not None, below
        job id ``cursor``. ``experiment`` matches case-insensitively: a glob when it has ``*?[``,
        else any experiment containing it ('' matches jobs without one)."""
        where, params = ["1=1"], []  # type: list[str], list[Any]
        for column, value in (("state", state), ("project", project)):
            if value is not None:
                where.append(f"{column}=?")
                params.append(value)
        if experiment:
            glob = any(ch in experiment for ch in "*?[")
            where.append("lower(experiment) GLOB lower(?)" if glob else "instr(lower(experiment), lower(?)) > 0")
            params.append(experiment)
        elif experiment is not None:
            where.append("experiment=''")
        if cursor is not None:
            where.append("id<?")
            params.append(min(int(cursor), 2**63 - 1))  # past any id: the first page
        return self.ledger.query(f"SELECT * FROM jobs WHERE {' AND '.join(where)} ORDER BY id DESC LIMIT ?",
                                 (*params, limit))

    def attempts(self, job_id: int) -> list[sqlite3.Row]:
        """A job's attempts, first to last."""
        return self.ledger.query("SELECT * FROM attempts WHERE job_id=? ORDER BY n", (job_id,))

    def queued_by_priority(self, project: str | None) -> list[sqlite3.Row]:
        """(priority, n) of the queued jobs (of ``project``, unless None)."""
        scope, params = ("AND project=?", (project,)) if project is not None else ("", ())
        return self.ledger.query(f"SELECT priority, COUNT(*) AS n FROM jobs WHERE state='queued' {scope} "
                                 "GROUP BY priority", params)

    def running_count(self, project: str | None) -> int:
        """How many jobs (of ``project``, unless None) are starting or running."""
        scope, params = ("AND project=?", (project,)) if project is not None else ("", ())
        running = self.ledger.one(f"SELECT COUNT(*) AS n FROM jobs WHERE state IN ('starting','running') {scope}",
                                  params)
        return running["n"] if running else 0

    def project_usage(self, project: str | None) -> list[sqlite3.Row]:
        """Per project (``project`` only, unless None): GPUs its starting and running jobs hold (all of
        them, and the best-effort part), how many run and how many are queued."""
        scope, params = ("AND project=?", (project,)) if project is not None else ("", ())
        return self.ledger.query(
            "SELECT project, SUM(CASE WHEN state='queued' THEN 0 ELSE gpus*nodes END) AS gpus_used, "
            "SUM(CASE WHEN state!='queued' AND priority='best-effort' THEN gpus*nodes ELSE 0 END) AS best_effort_gpus, "
            "SUM(state!='queued') AS running, SUM(state='queued') AS queued FROM jobs "
            f"WHERE state IN ('queued','starting','running') {scope} GROUP BY project ORDER BY project", params)

    # -- fair share's past usage: a decayed accumulator ------------------------------------------

    FOLD_LIMIT = 5_000  # endings folded in one call: a ledger older than the accumulator catches up in steps

    def share_usage(self, backend: str, half_life: float, now: float, fold: bool = True) -> dict[str, float]:
        """Per project, the GPU-seconds its ended attempts on ``backend`` used, each second decayed with
        ``half_life`` to ``now`` (util/decay.py). The accumulator (``share_usage``) first folds in the
        endings recorded since its cursor (the 'end' events past it, through their index: at most
        :attr:`FOLD_LIMIT` a call); with none new it is one read of a row per project.

        ``fold=False`` (a read: ``autoresearch nodes``, ``cluster_status``) writes nothing: the endings
        past the cursor are added in memory to the stored rows decayed to ``now``, the same figures the
        scheduler's pass, the one writer, would fold in. A read may run beside the pass or on a
        read-only copy of the ledger."""
        cursor = self.ledger.one("SELECT event_id FROM share_cursor")
        top = self.ledger.one("SELECT MAX(id) AS id FROM events WHERE kind='end'")
        behind = cursor is not None and top is not None and top["id"] is not None and top["id"] > cursor["event_id"]
        if behind and fold:
            self._fold_endings(half_life, now)
        out = {r["project"]: decayed(r["gpu_s"], now - r["as_of"], half_life)
               for r in self.ledger.query("SELECT project, gpu_s, as_of FROM share_usage WHERE backend=?", (backend,))}
        if behind and not fold and cursor is not None:
            for r in self.ledger.query(_ENDINGS_SINCE, (cursor["event_id"], -1)):
                if r["backend"] == backend and r["started_at"] and r["ended_at"] and r["gpus"]:
                    out[r["project"]] = out.get(r["project"], 0.0) + accrued(r["gpus"], r["started_at"],
                                                                             r["ended_at"], now, half_life)
        return out

    def _fold_endings(self, half_life: float, now: float) -> None:
        with self.ledger.tx() as c:
            start = c.execute("SELECT event_id FROM share_cursor").fetchone()["event_id"]
            rows = c.execute(_ENDINGS_SINCE, (start, self.FOLD_LIMIT)).fetchall()
            if not rows:
                return
            added: dict[tuple[str, str], float] = {}
            for r in rows:
                if r["started_at"] and r["ended_at"] and r["gpus"]:
                    key = (r["backend"], r["project"])
                    added[key] = added.get(key, 0.0) + accrued(r["gpus"], r["started_at"], r["ended_at"], now,
                                                               half_life)
            for (backend, project), gpu_s in added.items():
                old = c.execute("SELECT gpu_s, as_of FROM share_usage WHERE backend=? AND project=?",
                                (backend, project)).fetchone()
                total = gpu_s + (decayed(old["gpu_s"], now - old["as_of"], half_life) if old else 0.0)
                c.execute("INSERT INTO share_usage(backend, project, gpu_s, as_of) VALUES (?,?,?,?) "
                          "ON CONFLICT(backend, project) DO UPDATE SET gpu_s=excluded.gpu_s, as_of=excluded.as_of",
                          (backend, project, total, now))
            c.execute("UPDATE share_cursor SET event_id=?", (rows[-1]["id"],))

    # -- nodes: cordon, the cluster view ------------------------------------------------------

    def set_node_state(self, node: str, state: str, why: str, kind: str) -> None:
        """Set a node's state and reason, with a ``kind`` event (cordon, uncordon); NotFoundError
        (naming the nodes) when there is no such node."""
        with self.ledger.tx() as c:
            row = c.execute("SELECT * FROM nodes WHERE name=?", (node,)).fetchone()
            if row is None:
                names = [r["name"] for r in c.execute("SELECT name FROM nodes")]
                raise NotFoundError(f"no node named {node!r}", hint=f"nodes: {', '.join(names) or 'none yet'}")
            now = self.ledger.clock()
            c.execute("UPDATE nodes SET state=?, reason=?, updated_at=?, since=?, "  # an uncordon: check it afresh
                      "cleared_at=CASE WHEN ?='healthy' THEN ? ELSE cleared_at END, "
                      "checked_at=CASE WHEN ?='healthy' THEN NULL ELSE checked_at END WHERE name=?",
                      (state, why, now, now, state, now, state, node))
            self._event(c, kind, node=node, reason=why)

    def busy_gpus(self) -> list[sqlite3.Row]:
        """(node, gpu_ids, alloc: every gang member's or NULL) of every starting or running attempt."""
        return self.ledger.query("SELECT node, gpu_ids, alloc FROM attempts WHERE state IN ('starting','running')")

    def all_nodes(self) -> list[sqlite3.Row]:
        """Every node of every backend, by name."""
        return self.ledger.query("SELECT * FROM nodes ORDER BY name")

    # -- attempts: the pass ---------------------------------------------------------------

    def active_attempts(self, backend: str) -> list[sqlite3.Row]:
        """Every starting or running attempt on ``backend``, with its job's priority, spec, retries and cancel flag."""
        return self.ledger.query(_ATTEMPT_WITH_JOB + "WHERE a.state IN ('starting','running') AND j.backend=?",
                                 (backend,))

    def attempts_to_poll(self, backend: str, named: Collection[tuple[int, int]]) -> list[sqlite3.Row]:
        """:meth:`active_attempts`, of the starting ones and those ``named`` (job id, n) alone: what a pass
        told which attempts ended polls (Runtime.tick)."""
        rows = self.ledger.query(_ATTEMPT_WITH_JOB + "WHERE a.state='starting' AND j.backend=?", (backend,))
        for part, marks in _chunks(sorted({job for job, _ in named if type(job) is int and 0 < job < 2**63}), 500):
            rows += [r for r in self.ledger.query(
                _ATTEMPT_WITH_JOB + f"WHERE a.state='running' AND j.backend=? AND a.job_id IN ({marks})",
                (backend, *part)) if (r["job_id"], r["n"]) in named]
        return rows

    def any_active_on(self, backend: str, nodes: Collection[str]) -> bool:
        """Whether a starting or running attempt of ``backend`` may be on one of ``nodes``: its first member's,
        or any gang (its other members' nodes are in its ``alloc``: the monitor sorts them out)."""
        return any(self.ledger.one(
            "SELECT 1 FROM attempts a JOIN jobs j ON j.id=a.job_id WHERE a.state IN ('starting','running') "
            f"AND j.backend=? AND (a.node IN ({marks}) OR a.alloc IS NOT NULL) LIMIT 1", (backend, *part)) is not None
            for part, marks in _chunks(sorted(nodes), 500))

    def busy_backends(self) -> list[str]:
        """The backends with queued or running jobs (a read runs a pass on each)."""
        found: set[str] = set()
        for state in ("queued", "starting", "running"):  # a skip-scan of jobs_by_state_backend: O(backends), not O(jobs)
            after = ""
            while True:
                row = self.ledger.one("SELECT backend FROM jobs WHERE state=? AND backend>? ORDER BY backend LIMIT 1",
                                      (state, after))
                if row is None:
                    break
                found.add(after := row["backend"])
        return sorted(found)

    def any_unfinished(self, backend: str) -> bool:
        """Whether ``backend`` has a starting or running job (the pass daemon's idle clock). A queued
        job alone keeps no daemon: it starts after an ending, which pokes a listener or runs the
        pass itself, or at a submit, which runs its own pass."""
        return self.ledger.one("SELECT 1 FROM jobs WHERE state IN ('starting','running') AND backend=? "
                               "LIMIT 1", (backend,)) is not None

    def tenant_project(self, job_id: int) -> str | None:
        """The project of a tenant job (one with an isolation policy); None for any other job."""
        row = self.ledger.one("SELECT project, isolation FROM jobs WHERE id=?", (job_id,))
        return str(row["project"] or "") if row is not None and row["isolation"] else None

    def count_points(self, job_id: int) -> int:
        """How many metric points the job has stored, all attempts."""
        row = self.ledger.one("SELECT COUNT(*) AS n FROM metrics WHERE job_id=?", (job_id,))
        return int(row["n"]) if row is not None else 0

    def attempt_with_job(self, job_id: int, n: int) -> sqlite3.Row | None:
        return self.ledger.one(_ATTEMPT_WITH_JOB + "WHERE a.job_id=? AND a.n=?", (job_id, n))

    def attempt(self, job_id: int, n: int) -> sqlite3.Row | None:
        return self.ledger.one("SELECT * FROM attempts WHERE job_id=? AND n=?", (job_id, n))

    def unended_attempts(self, job_id: int) -> list[sqlite3.Row]:
        return self.ledger.query("SELECT * FROM attempts WHERE job_id=? AND state!='ended'", (job_id,))

    def mark_running(self, job_id: int, n: int, started: float) -> None:
        """A starting attempt (and its job) runs since ``started``."""
        self.mark_running_many([(job_id, n, started)])

    def mark_running_many(self, started: list[tuple[int, int, float]]) -> None:
        """:meth:`mark_running` for (job id, n, started) of several attempts, in one transaction."""
        with self.ledger.tx() as c:
            now = self.ledger.clock()
            for job_id, n, at in started:
                c.execute("UPDATE attempts SET state='running', started_at=? WHERE job_id=? AND n=? "
                          "AND state='starting'", (at, job_id, n))
                c.execute("UPDATE jobs SET state='running', started_at=COALESCE(started_at, ?), updated_at=? "
                          "WHERE id=? AND state='starting'", (at, now, job_id))

    def note_engine_many(self, notes: list[tuple[int, int, str | None, str | None, str, str | None]]) -> None:
        """What engines said of active attempts (runtime.engine_note): the node and GPUs they placed
        them on (a gang's every node: ``alloc``), and why they hold them (``detail`` while starting),
        in one transaction."""
        with self.ledger.tx() as c:
            for job_id, n, node, gpu_ids, detail, alloc in notes:
                c.execute("UPDATE attempts SET node=COALESCE(?, node), gpu_ids=COALESCE(?, gpu_ids), "
                          "alloc=COALESCE(?, alloc), "
                          "detail=CASE WHEN ? != '' THEN ? WHEN detail LIKE 'engine: %' THEN NULL ELSE detail END "
                          "WHERE job_id=? AND n=? AND state IN ('starting','running')",
                          (node, gpu_ids, alloc, detail, detail, job_id, n))

    def begin_attempt(self, job_id: int, node: str | None, gpu_ids: Iterable[str],
                      job_dir: str | os.PathLike[str], alloc: Any = None, **event: object) -> tuple[sqlite3.Row, int] | None:
        """Write a queued job's next attempt (``starting``) before it is launched; None if the job
        is no longer queued or its cancel was asked for. Its paths are :func:`attempt_paths`."""
        return self.begin_attempts([(job_id, node, gpu_ids, job_dir, alloc, event)])[0]

    def begin_attempts(self, launches: Sequence[tuple[int, str | None, Any, str | os.PathLike[str], Any, dict[str, Any]]]
                       ) -> list[tuple[sqlite3.Row, int] | None]:
        """:meth:`begin_attempt` for every launch of a pass, (job id, node, GPU ids, job dir, alloc,
        launch event data) each, in one transaction (write-ahead: all are recorded before any starts;
        one that dies unstarted is lost and retried by the next pass); in order."""
        out: list[tuple[sqlite3.Row, int] | None] = []
        with self.ledger.tx() as c:
            now = self.ledger.clock()
            for job_id, node, gpu_ids, job_dir, alloc, event in launches:
                job = c.execute("SELECT * FROM jobs WHERE id=?", (job_id,)).fetchone()
                if job is None or job["state"] != "queued" or job["cancel_requested"]:
                    out.append(None)
                    continue
                n = job["attempts"] + 1
                gpus = list(gpu_ids)
                run_dir, log_path, metrics_path = attempt_paths(job_dir, n)
                c.execute(
                    "INSERT INTO attempts(job_id, n, state, node, gpu_ids, external_id, log_path, metrics_path, "
                    "created_at, alloc) VALUES (?,?,?,?,?,?,?,?,?,?)",
                    (job_id, n, "starting", node, json.dumps(gpus), run_dir, log_path, metrics_path, now,
                     json.dumps(alloc) if alloc else None),
                )
                c.execute("UPDATE jobs SET state='starting', attempts=?, updated_at=? WHERE id=?", (n, now, job_id))
                self._event(c, "launch", job_id, n, node=node, gpus=gpus, **event, at=now)
                out.append((job, n))
        return out

    def last_stop_request(self, job_id: int) -> float | None:
        """When the job's latest stop or cancel was recorded (None: never)."""
        row = self.ledger.one("SELECT MAX(ts) AS ts FROM events WHERE job_id=? AND kind IN ('stop','cancel')",
                              (job_id,))
        return None if row is None or row["ts"] is None else float(row["ts"])

    def set_external_id(self, job_id: int, n: int, external_id: str) -> None:
        with self.ledger.tx() as c:
            c.execute("UPDATE attempts SET external_id=? WHERE job_id=? AND n=?", (external_id, job_id, n))

    def mark_stop(self, job_id: int, n: int, reason: str, **data: object) -> sqlite3.Row | None:
        """Record why an active attempt is being stopped (the first reason stays); the attempt, or
        None when it is not active (nothing to stop)."""
        with self.ledger.tx() as c:
            att = c.execute("SELECT a.*, j.backend FROM attempts a JOIN jobs j ON j.id=a.job_id "
                            "WHERE a.job_id=? AND a.n=?", (job_id, n)).fetchone()
            if att is None or att["state"] not in ("starting", "running"):
                return None
            if att["stop_reason"] is None:
                c.execute("UPDATE attempts SET stop_reason=? WHERE job_id=? AND n=?", (reason, job_id, n))
            fields: dict[str, Any] = {"reason": reason, **data}
            self._event(c, "stop", job_id, n, **fields)
            return att

    def end_attempt(self, job_id: int, n: int, status: Any, reason: str, detail: str,
                    next_state: Callable[[sqlite3.Row], tuple[str, int]],
                    failure: tuple[str, str] | None = None) -> str | None:
        """Record how attempt ``n`` ended (``status``: an AttemptStatus) and what ``next_state(job)``
        (state, retries used) makes of its job, in one transaction; the job's new state, or None
        when another pass ended this attempt first. ``failure``: its class (infra, user) and why."""
        return self.end_attempts([(job_id, n, status, reason, detail, next_state, failure)])[0]

    def end_attempts(self, endings: list[tuple[int, int, Any, str, str, Callable[[sqlite3.Row], tuple[str, int]],
                                               tuple[str, str] | None]]) -> list[str | None]:
        """:meth:`end_attempt` for every ending a pass found, (job id, n, status, reason, detail,
        next_state, failure) each, in one transaction: all are recorded or none; in order."""
        out: list[str | None] = []
        with self.ledger.tx() as c:
            for job_id, n, status, reason, detail, next_state, failure in endings:
                out.append(self._end(c, job_id, n, status, reason, detail, next_state, failure))
        return out

    def _end(self, c: sqlite3.Connection, job_id: int, n: int, status: Any, reason: str, detail: str,
             next_state: Callable[[sqlite3.Row], tuple[str, int]], failure: tuple[str, str] | None) -> str | None:
        job = c.execute("SELECT * FROM jobs WHERE id=?", (job_id,)).fetchone()
        current = c.execute("SELECT state FROM attempts WHERE job_id=? AND n=?", (job_id, n)).fetchone()
        if current is None or current["state"] == "ended":
            return None  # another pass got here first
        now = self.ledger.clock()
        c.execute(
            "UPDATE attempts SET state='ended', started_at=COALESCE(started_at, ?), ended_at=?, exit_code=?, "
            "signal=?, end_reason=?, detail=?, peak_rss_mb=?, failure_class=?, failure_why=? "
            "WHERE job_id=? AND n=?",
            (status.started_at, status.ended_at or now, status.exit_code, status.signal, reason, detail,
             status.peak_rss_mb, *(failure or (None, None)), job_id, n),
        )
        state, retries = next_state(job)
        c.execute(
            "UPDATE jobs SET state=?, retries_used=?, exit_code=?, end_reason=?, updated_at=?, "
            "started_at=COALESCE(started_at, ?), "
            "ended_at=CASE WHEN ? IN ('succeeded','failed','cancelled') THEN ? ELSE NULL END WHERE id=?",
            (state, retries, status.exit_code, reason, now, status.started_at, state, status.ended_at or now, job_id),
        )
        self._event(c, "end", job_id, n, at=now, reason=reason, exit_code=status.exit_code, job_state=state,
                     detail=detail, **({"failure_class": failure[0]} if failure else {}))
        return state

    def give_up_attempt(self, job_id: int, n: int, detail: str) -> None:
        """End an active attempt as ``infra`` and fail its job (unless it already ended)."""
        now = self.ledger.clock()
        with self.ledger.tx() as c:
            cur = c.execute("UPDATE attempts SET state='ended', ended_at=?, end_reason='infra', detail=? "
                            "WHERE job_id=? AND n=? AND state IN ('starting','running')", (now, detail, job_id, n))
            if not cur.rowcount:
                return
            c.execute("UPDATE jobs SET state='failed', end_reason='infra', ended_at=?, updated_at=? WHERE id=? "
                      "AND state NOT IN ('succeeded','failed','cancelled')", (now, now, job_id))
            self._event(c, "end", job_id, n, reason="infra", job_state="failed", detail=detail)

    # -- nodes and the queue: the scheduler's inputs --------------------------------------

    def nodes(self, backend: str) -> list[sqlite3.Row]:
        return self.ledger.query("SELECT * FROM nodes WHERE backend=?", (backend,))

    def save_nodes(self, backend: str, seen: Iterable[Any], now: float,
                   states: dict[str, tuple[str, str]] | None = None) -> None:
        """The nodes ``backend`` reports now (a down one comes back healthy); the others are down.
        ``states``: name -> (state, reason) an engine that schedules itself reports (it is the truth)."""
        seen = list(seen)
        with self.ledger.tx() as c:
            for node in seen:
                c.execute(
                    "INSERT INTO nodes(name, backend, gpus, gpu_ids, cpus, memory, state, reason, updated_at) "
                    "VALUES (?,?,?,?,?,?,'healthy','',?) ON CONFLICT(name) DO UPDATE SET backend=excluded.backend, "
                    "gpus=excluded.gpus, "
                    "gpu_ids=excluded.gpu_ids, cpus=excluded.cpus, memory=excluded.memory, "
                    "updated_at=excluded.updated_at, "
                    "since=CASE WHEN nodes.state='down' THEN excluded.updated_at ELSE nodes.since END, "
                    "reason=CASE WHEN nodes.state='down' THEN '' ELSE nodes.reason END, "  # why it was down: no more
                    "state=CASE WHEN nodes.state='down' THEN 'healthy' ELSE nodes.state END",
                    (node.name, backend, len(node.gpu_ids), json.dumps(node.gpu_ids), node.cpus,
                     node.memory, now),
                )
                if states is not None and node.name in states:
                    c.execute("UPDATE nodes SET state=?, reason=? WHERE name=?", (*states[node.name], node.name))
            names = [n.name for n in seen]
            c.execute(
                f"UPDATE nodes SET state='down', reason='not reported by backend', updated_at=?, since=? "
                f"WHERE backend=? AND state!='down' AND name NOT IN ({','.join('?' * len(names))})",
                (now, now, backend, *names),
            )

    def change_mark(self, backend: str) -> str:
        """What a placement depends on, in a word that changes when it does: the last event (every
        submit, launch, ending, stop, cancel and cordon writes one) and ``backend``'s nodes."""
        last = self.ledger.one("SELECT MAX(id) AS m FROM events")
        nodes = self.ledger.query("SELECT name, state, gpus, gpu_ids, cpus, memory FROM nodes WHERE backend=? "
                                  "ORDER BY name", (backend,))
        digest = zlib.crc32(repr([tuple(r) for r in nodes]).encode())  # hash() differs between processes
        return f"{last['m'] if last else 0}:{digest:x}"

    def any_queued(self, backend: str) -> bool:
        return self.ledger.one("SELECT 1 FROM jobs WHERE state='queued' AND backend=? LIMIT 1", (backend,)) is not None

    def queued(self, backend: str) -> list[sqlite3.Row]:
        return self.ledger.query("SELECT id, priority, gpus, nodes, cpus, memory, updated_at, attempts, project, "
                                 "job_group, COALESCE(queue_order, id) AS queue_order FROM jobs "
                                 "WHERE state='queued' AND backend=? ORDER BY id", (backend,))

    # What scheduler.nothing_starts needs of the queue, each a seek in the index jobs_by_queue_shape
    # whatever the queue's depth (a job's priority is one of the three).
    def any_gpuless_queued(self, backend: str) -> bool:
        """Whether a queued job of ``backend`` asks for no GPU."""
        return self.ledger.one("SELECT 1 FROM jobs WHERE state='queued' AND backend=? AND priority IN "
                               "('critical','normal','best-effort') AND gpus=0 LIMIT 1", (backend,)) is not None

    def any_preemptor_queued(self, backend: str) -> bool:
        """Whether a queued job of ``backend`` is critical or normal (could preempt a best-effort one)."""
        return self.ledger.one("SELECT 1 FROM jobs WHERE state='queued' AND backend=? AND priority IN "
                               "('critical','normal') LIMIT 1", (backend,)) is not None

    def infra_failed_nodes(self, job_ids: list[int]) -> dict[int, list[str]]:
        """Per job, the nodes where an attempt of it failed for the machine's fault (placed last)."""
        out: dict[int, list[str]] = {}
        for chunk in range(0, len(job_ids), 500):
            ids = job_ids[chunk:chunk + 500]
            for r in self.ledger.query("SELECT job_id, node FROM attempts WHERE failure_class IN "
                                       "('infra','infra-suspect','unknown') AND node IS NOT "
                                       f"NULL AND job_id IN ({','.join('?' * len(ids))})", tuple(ids)):
                out.setdefault(r["job_id"], []).append(r["node"])
        return out

    def any_health_cordon(self) -> bool:
        """Whether a node is cordoned by the health checks (a passing check may lift it)."""
        return self.ledger.one("SELECT 1 FROM nodes WHERE state='cordoned' AND reason LIKE 'health: %' "
                               "LIMIT 1") is not None

    def placed(self, backend: str, job_ids: Collection[int] | None = None) -> list[sqlite3.Row]:
        """The active attempts of ``backend``'s jobs (of ``job_ids`` alone, when given), with what the
        scheduler needs of their job."""
        if job_ids is None:
            return self.ledger.query(_PLACED, (backend,))
        rows: list[sqlite3.Row] = []
        for part, marks in _chunks(sorted(set(job_ids)), 500):
            rows += self.ledger.query(_PLACED + f" AND a.job_id IN ({marks})", (backend, *part))
        return rows

    def placed_marks(self, backend: str) -> list[tuple[int, int, float, float | None, int]]:
        """The active attempts of ``backend``'s jobs as (job id, n, created at, started at, stop
        requested): what of a placed attempt can change after its launch (Runtime.running_view)."""
        return self.ledger.tuples(
            "SELECT a.job_id, a.n, a.created_at, a.started_at, a.stop_reason IS NOT NULL FROM attempts a "
            "JOIN jobs j ON j.id=a.job_id WHERE a.state IN ('starting','running') AND j.backend=?", (backend,))

    def job_ends(self, job_ids: list[int]) -> list[sqlite3.Row]:
        """State, end reason, exit code and times of these jobs."""
        marks = ",".join("?" * len(job_ids))
        return self.ledger.query(
            f"SELECT id, state, end_reason, exit_code, started_at, ended_at FROM jobs WHERE id IN ({marks})",
            tuple(job_ids))

    def range_ends(self, first: int, last: int, project: str | None = None) -> list[sqlite3.Row]:
        """:meth:`job_ends` of the jobs with ids ``first`` to ``last`` (a job array's), of ``project``
        when given, in id order (one read through the primary key)."""
        sql = "SELECT id, state, end_reason, exit_code, started_at, ended_at FROM jobs WHERE id BETWEEN ? AND ?"
        if project is not None:
            return self.ledger.query(sql + " AND project=? ORDER BY id", (first, last, project))
        return self.ledger.query(sql + " ORDER BY id", (first, last))

    # -- metric points --------------------------------------------------------------------

    def metric_series(self, name: str, job_ids: Iterable[int]) -> list[sqlite3.Row]:
        """Every point of metric ``name`` of these jobs (job, attempt, step, value, source, ts), in order;
        both sources: :func:`autoresearch.engine.metrics.best_source` applies the reported-beats-log rule."""
        job_ids = tuple(job_ids)
        marks = ",".join("?" * len(job_ids))
        return self.ledger.query(
            f"SELECT job_id, attempt, step, value, source, ts FROM metrics WHERE name=? AND job_id IN ({marks}) "
            "AND value IS NOT NULL ORDER BY job_id, attempt, step, rowid", (name, *job_ids))

    def metric_points(self, job_id: int) -> list[sqlite3.Row]:
        """Every point of a job (name, step, value, source, attempt), oldest first (see :meth:`metric_series`)."""
        return self.ledger.query(
            "SELECT name, step, value, source, attempt FROM metrics WHERE job_id=? ORDER BY attempt, step, rowid",
            (job_id,))

    # -- ingestion ------------------------------------------------------------------------

    def store_points(self, att: Any, offsets: tuple[int, int], rows: list[tuple[Any, ...]], new_offsets: tuple[int, int],
                     counters: dict[str, int], drops: tuple[int, str]) -> bool:
        """Store a chunk's metric points and move the attempt's read offsets past it, with its
        dropped points (count, first reason) as a warning; False (and nothing written) when
        another process has moved the offsets since ``offsets`` were read."""
        return self.store_points_many([(att, offsets, rows, new_offsets, counters, drops)])[0]

    def store_points_many(self, chunks: list[tuple[Any, ...]]) -> list[bool]:
        """:meth:`store_points` for chunks of several attempts (its arguments, one tuple each), in one
        transaction; for each, whether it was stored."""
        out = []
        with self.ledger.tx() as c:
            for att, offsets, rows, new_offsets, counters, drops in chunks:
                if not _still_at(c, att, *offsets):
                    out.append(False)  # another process ingested this chunk
                    continue
                c.executemany("INSERT INTO metrics(job_id, attempt, name, step, value, ts, source) "
                              "VALUES (?,?,?,?,?,?,?)", rows)
                c.execute("UPDATE attempts SET metrics_offset=?, log_offset=?, log_steps=? WHERE job_id=? AND n=?",
                          (*new_offsets, json.dumps(counters), att["job_id"], att["n"]))
                if drops[0]:
                    self.note(c, "metrics_dropped", att["job_id"], att["n"], drops[1], drops[0])
                out.append(True)
        return out

    def set_unread(self, job_id: int, n: int, unread_bytes: int, unread_points: int) -> None:
        """Record how much of an ended attempt's output is still to be read (0, 0: all of it is read)."""
        with self.ledger.tx() as c:
            c.execute("UPDATE attempts SET unread_bytes=?, unread_points=? WHERE job_id=? AND n=?",
                      (max(0, unread_bytes), max(0, unread_points), job_id, n))

    def unread_attempts(self, job_id: int | None = None, limit: int = 100) -> list[sqlite3.Row]:
        """Attempts (with their job's backend) whose output is still being read after their ending
        (of ``job_id``, or of any job); through the partial index, never a scan."""
        where = "a.unread_bytes > 0" + (" AND a.job_id=?" if job_id is not None else "")
        return self.ledger.query(_ATTEMPT_WITH_JOB + f"WHERE {where} ORDER BY a.job_id LIMIT ?",
                                 (*((job_id,) if job_id is not None else ()), limit))

    def point_count(self, job_id: int, n: int) -> int:
        row = self.ledger.one("SELECT COUNT(*) FROM metrics WHERE job_id=? AND attempt=?", (job_id, n))
        return int(row[0]) if row is not None else 0

    def skip_chunk(self, att: Any, offsets: tuple[int, int], new_offsets: tuple[int, int], reason: str) -> bool:
        """Move the read offsets past a chunk that could not be read, with a warning; False when
        another process moved them first."""
        with self.ledger.tx() as c:
            if not _still_at(c, att, *offsets):
                return False
            c.execute("UPDATE attempts SET metrics_offset=?, log_offset=? WHERE job_id=? AND n=?",
                      (*new_offsets, att["job_id"], att["n"]))
            self.note(c, "metrics_dropped", att["job_id"], att["n"], f"an unreadable chunk ({reason})")
        return True

    # -- warnings (events, one per attempt and kind) --------------------------------------

    def note(self, conn: sqlite3.Connection, kind: str, job_id: int, attempt: int | None, reason: str,
             count: int = 1) -> dict[str, Any]:
        """Add ``count`` to the one ``kind`` warning of this attempt (created with ``reason``), inside
        the caller's transaction; return it."""
        reason, now = reason[:_REASON_CHARS], self.ledger.clock()
        row = conn.execute("SELECT id, data FROM events WHERE job_id=? AND attempt IS ? AND kind=? ORDER BY id "
                           "LIMIT 1", (job_id, attempt, kind)).fetchone()
        if row is None:
            data: dict[str, Any] = {"count": count, "reason": reason, "first_at": now, "last_at": now}
            self._event(conn, kind, job_id, attempt, **data, at=now)
            return data
        try:
            data = json.loads(row["data"])
            data = data if isinstance(data, dict) else {}
        except ValueError:
            data = {}
        data["count"] = int(data.get("count") or 0) + count
        data.setdefault("reason", reason)
        data.setdefault("first_at", now)
        data["last"], data["last_at"] = reason, now
        conn.execute("UPDATE events SET data=? WHERE id=?", (json.dumps(data, default=str), row["id"]))
        return data

    def warn(self, kind: str, job_id: int, attempt: int | None, reason: str, count: int = 1) -> dict[str, Any]:
        """:meth:`note` in a transaction of its own."""
        with self.ledger.tx() as c:
            return self.note(c, kind, job_id, attempt, reason, count)

    def warning_events(self, job_id: int, kinds: tuple[str, ...]) -> list[sqlite3.Row]:
        marks = ",".join("?" * len(kinds))
        return self.ledger.query(f"SELECT attempt, kind, data FROM events WHERE job_id=? AND kind IN ({marks}) "
                                 "ORDER BY id", (job_id, *kinds))

    # -- tenants (isolation) --------------------------------------------------------------

    @staticmethod
    def register_tenant(conn: sqlite3.Connection, project: str, policy: dict[str, Any]) -> None:
        """Record ``project``'s tenant policy (inside the caller's transaction)."""
        conn.execute("INSERT INTO tenants(project, policy, updated_at) VALUES (?,?,?) ON CONFLICT(project) DO UPDATE "
                     "SET policy=excluded.policy, updated_at=excluded.updated_at WHERE tenants.policy!=excluded.policy",
                     (project, json.dumps(policy), time.time()))

    @staticmethod
    def tenant_policy(conn: sqlite3.Connection, project: str) -> str:
        """``project``'s recorded tenant policy (JSON), or '' if it is not a tenant."""
        row = conn.execute("SELECT policy FROM tenants WHERE project=?", (project,)).fetchone()
        return str(row[0]) if row is not None else ""

    def tenant_number(self, project: str) -> int:
        """A number of its own for each tenant project, fixed once it is one (its row's rowid): 0 if none."""
        row = self.ledger.one("SELECT rowid AS n FROM tenants WHERE project=?", (project,))
        return int(row["n"]) if row is not None else 0

    def project_tenant_policy(self, project: str) -> str:
        return self.tenant_policy(self.ledger._connect(), project)

    def loop_of_project(self, name: str, project: str) -> bool:
        """Whether loop ``name`` belongs to ``project``. The one read of a loop table here: the
        engine may not import the loop's store (it lies above the engine)."""
        return self.ledger.one("SELECT 1 FROM loops WHERE name=? AND project=?", (name, project)) is not None


_PLACED = ("SELECT a.job_id, a.n, a.node, a.gpu_ids, a.alloc, a.started_at, a.created_at, a.stop_reason, "
           "j.priority, j.gpus, j.cpus, j.memory, j.project FROM attempts a JOIN jobs j ON j.id=a.job_id "
           "WHERE a.state IN ('starting','running') AND j.backend=?")


def _chunks(ids: list[Any], size: int) -> Iterator[tuple[list[Any], str]]:
    """``ids`` (or node names) in parts of at most ``size`` (SQLite's limit on bound values), each with its ``?,?,...``."""
    for start in range(0, len(ids), size):
        part = ids[start:start + size]
        yield part, ",".join("?" * len(part))


def _still_at(c: sqlite3.Connection, att: Any, m_off: int, l_off: int) -> bool:
    row = c.execute("SELECT metrics_offset, log_offset FROM attempts WHERE job_id=? AND n=?",
                    (att["job_id"], att["n"])).fetchone()
    return row is not None and (row["metrics_offset"], row["log_offset"]) == (m_off, l_off)
