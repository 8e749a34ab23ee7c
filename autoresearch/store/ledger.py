"""The ledger: SQLite in WAL mode, the single source of truth (docs/architecture.md, invariant 1).

Every state change is a transaction *before* it becomes an action. Many processes
(CLI calls, the MCP server, the loop, attempt supervisors) open the same file;
writes use ``BEGIN IMMEDIATE`` so they serialize instead of deadlocking, and the
scheduling pass additionally holds an exclusive file lock (:meth:`Ledger.pass_lock`).

Stdlib only: a status read must not pay for pydantic or mlflow.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from autoresearch.errors import LedgerError


def _busy_timeout(default: float = 15.0) -> float:
    """``AUTORESEARCH_LEDGER_TIMEOUT`` in seconds; a value that is not a positive number is ignored
    (with a warning): the ledger is on every path, including the one that would report the error."""
    text = os.environ.get("AUTORESEARCH_LEDGER_TIMEOUT") or ""
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < 1e6:
        import sys

        print(f"warning: AUTORESEARCH_LEDGER_TIMEOUT={text!r} is not a number of seconds; using {default:g}",
              file=sys.stderr)
        return default
    return value


BUSY_TIMEOUT_S = _busy_timeout()

# One writer at a time per ledger *within this process*, queued on a mutex before BEGIN IMMEDIATE:
# two threads of a process (a server's tool calls, a loop and its MLflow preparer) that meet on SQLite's write
# lock otherwise wait in its busy handler, which sleeps 1, 2, 5, 10... ms between tries, where a
# mutex hands over at once. Other processes still meet on SQLite's lock. A forked child starts with
# none held (a child must not use a connection or transaction of its parent's anyway: SQLite's rule).
_WRITERS: dict[str, threading.RLock] = {}
_WRITERS_GUARD = threading.Lock()


def _writer(path: Path) -> threading.RLock:
    key = str(path)
    lock = _WRITERS.get(key)
    if lock is None:
        with _WRITERS_GUARD:
            lock = _WRITERS.setdefault(key, threading.RLock())
    return lock


# The commit that brings the WAL past this many pages copies them into the database and syncs it (a
# checkpoint: 5-27 ms on a 2-core VM's disk, in the committing process). SQLite's default, 1,000 pages
# (4 MB), made a loop's controller wait on 27 of them in a 1,000-trial sweep of 0.05 s trials, 0.5 ms a
# trial; at 8,000 (a WAL of up to 32 MB, reused from its start after each) it waits on four, and a page
# written many times between two (the jobs' and trials' hot pages) is copied once: the sweep's wall
# 1.96 / 1.79 / 1.80x -> 1.78 / 1.72 / 1.78x ideal (three alternating pairs; docs/DESIGN-NOTES.md). Every
# connection sets it: a process checkpoints whenever its own commit finds the WAL past its own threshold.
WAL_CHECKPOINT_PAGES = 8000


def _wal(conn: sqlite3.Connection) -> None:
    """Put ``conn``'s database in WAL mode (a no-op once it is). Switching a fresh ledger takes the
    write lock from inside a read, which SQLite refuses at once, with no busy wait (it could
    deadlock), while another connection writes it: several processes opening a new home at once
    (six ``autoresearch submit`` of an agent) saw "database is locked". Tried again until
    ``BUSY_TIMEOUT_S``, as a busy write waits."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    pause = 0.001
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as err:
            if not ("locked" in str(err) or "busy" in str(err)) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(2 * pause, 0.05)


def _forget_writers() -> None:
    global _WRITERS_GUARD
    _WRITERS.clear()
    _WRITERS_GUARD = threading.Lock()


os.register_at_fork(after_in_child=_forget_writers)

# (name, SQL) pairs, applied once each in list order and remembered in the
# ``migrations`` table. Append only; never edit one that has shipped. Components
# (tracking, loop) add their own named entries, so their order does not matter.
MIGRATIONS: list[tuple[str, str]] = [
    ("core-1", """
    CREATE TABLE jobs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        name TEXT NOT NULL,
        state TEXT NOT NULL,
        priority TEXT NOT NULL,
        spec TEXT NOT NULL,
        gpus INTEGER NOT NULL,
        nodes INTEGER NOT NULL,
        cpus REAL NOT NULL DEFAULT 0,
        memory INTEGER NOT NULL DEFAULT 0,
        experiment TEXT NOT NULL DEFAULT '',
        project TEXT NOT NULL DEFAULT '',
        backend TEXT NOT NULL,
        submitted_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        started_at REAL,
        ended_at REAL,
        attempts INTEGER NOT NULL DEFAULT 0,
        retries_used INTEGER NOT NULL DEFAULT 0,
        exit_code INTEGER,
        end_reason TEXT,
        cancel_requested INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX jobs_by_state ON jobs(state, id);
    CREATE INDEX jobs_by_experiment ON jobs(experiment, id);
    CREATE TABLE attempts (
        job_id INTEGER NOT NULL REFERENCES jobs(id),
        n INTEGER NOT NULL,
        state TEXT NOT NULL,
        node TEXT,
        gpu_ids TEXT NOT NULL DEFAULT '[]',
        external_id TEXT,
        log_path TEXT NOT NULL,
        metrics_path TEXT NOT NULL,
        created_at REAL NOT NULL,
        started_at REAL,
        ended_at REAL,
        exit_code INTEGER,
        signal INTEGER,
        end_reason TEXT,
        stop_reason TEXT,
        detail TEXT,
        peak_rss_mb REAL,
        metrics_offset INTEGER NOT NULL DEFAULT 0,
        log_offset INTEGER NOT NULL DEFAULT 0,
        log_steps TEXT NOT NULL DEFAULT '{}',
        PRIMARY KEY (job_id, n)
    );
    CREATE INDEX attempts_by_state ON attempts(state);
    CREATE TABLE events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        ts REAL NOT NULL,
        job_id INTEGER,
        attempt INTEGER,
        kind TEXT NOT NULL,
        data TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX events_by_job ON events(job_id, id);
    CREATE TABLE nodes (
        name TEXT PRIMARY KEY,
        backend TEXT NOT NULL,
        gpus INTEGER NOT NULL,
        gpu_ids TEXT NOT NULL,
        cpus REAL NOT NULL,
        memory INTEGER NOT NULL,
        state TEXT NOT NULL DEFAULT 'healthy',
        reason TEXT NOT NULL DEFAULT '',
        updated_at REAL NOT NULL
    );
    CREATE TABLE metrics (
        job_id INTEGER NOT NULL,
        attempt INTEGER NOT NULL,
        name TEXT NOT NULL,
        step INTEGER NOT NULL,
        value REAL,
        ts REAL NOT NULL,
        source TEXT NOT NULL
    );
    CREATE INDEX metrics_by_job ON metrics(job_id, name, step);
    """),
    ("loop-1", """
    CREATE TABLE loops (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        name TEXT NOT NULL UNIQUE,
        plan TEXT NOT NULL,
        state TEXT NOT NULL,
        experiment TEXT NOT NULL DEFAULT '',
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE TABLE decisions (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        loop_id INTEGER NOT NULL REFERENCES loops(id),
        kind TEXT NOT NULL,
        inputs TEXT NOT NULL DEFAULT '{}',
        outputs TEXT NOT NULL DEFAULT '{}',
        rationale TEXT NOT NULL DEFAULT '',
        proposer TEXT NOT NULL DEFAULT '{}',
        tokens_in INTEGER NOT NULL DEFAULT 0,
        tokens_out INTEGER NOT NULL DEFAULT 0,
        cost_usd REAL NOT NULL DEFAULT 0,
        latency_s REAL NOT NULL DEFAULT 0,
        created_at REAL NOT NULL
    );
    CREATE INDEX decisions_by_loop ON decisions(loop_id, id);
    CREATE TABLE trials (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        loop_id INTEGER NOT NULL REFERENCES loops(id),
        job_id INTEGER REFERENCES jobs(id),
        decision_id INTEGER REFERENCES decisions(id),
        parent_trial INTEGER REFERENCES trials(id),
        params TEXT NOT NULL DEFAULT '{}',
        patch TEXT,
        seed INTEGER,
        proposer TEXT NOT NULL DEFAULT '',
        state TEXT NOT NULL,
        objective REAL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE INDEX trials_by_loop ON trials(loop_id, id);
    CREATE INDEX trials_by_job ON trials(job_id);
    """),
    ("tracking-1", """
    CREATE TABLE tracking_runs (
        entity TEXT PRIMARY KEY,
        run_id TEXT,
        experiment_id TEXT,
        parent_run_id TEXT,
        synced_version REAL NOT NULL DEFAULT -1,
        metric_rowid INTEGER NOT NULL DEFAULT 0,
        logs_done INTEGER NOT NULL DEFAULT 0,
        finished INTEGER NOT NULL DEFAULT 0,
        error TEXT,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE TABLE tracking_state (
        name TEXT PRIMARY KEY,
        value TEXT NOT NULL
    );
    CREATE TABLE tracking_outbox (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        kind TEXT NOT NULL,
        loop_id INTEGER,
        decision_id INTEGER,
        job_id INTEGER,
        payload TEXT NOT NULL,
        created_at REAL NOT NULL,
        sent_ref TEXT,
        done_at REAL
    );
    CREATE INDEX tracking_outbox_pending ON tracking_outbox(done_at, id);
    """),
    ("loop-2", """
    ALTER TABLE trials ADD COLUMN role TEXT NOT NULL DEFAULT 'explore';
    ALTER TABLE trials ADD COLUMN rationale TEXT NOT NULL DEFAULT '';
    ALTER TABLE trials ADD COLUMN failure TEXT;
    ALTER TABLE trials ADD COLUMN metrics TEXT NOT NULL DEFAULT '{}';
    ALTER TABLE trials ADD COLUMN workdir TEXT;
    ALTER TABLE trials ADD COLUMN started_at REAL;
    ALTER TABLE trials ADD COLUMN ended_at REAL;
    ALTER TABLE decisions ADD COLUMN trial_id INTEGER;
    ALTER TABLE loops ADD COLUMN digest TEXT NOT NULL DEFAULT '';
    ALTER TABLE loops ADD COLUMN elapsed_s REAL NOT NULL DEFAULT 0;
    ALTER TABLE loops ADD COLUMN ended_at REAL;
    CREATE INDEX decisions_by_trial ON decisions(trial_id, kind);
    """),
    ("loop-3", """
    ALTER TABLE loops ADD COLUMN project TEXT NOT NULL DEFAULT '';
    """),
    # autoresearch/engine/isolation.py: a job's isolation policy, recorded at submit ('' inherits the
    # submitter's environment), and the projects served by a tokened (multi-tenant) server.
    ("isolation-1", """
    ALTER TABLE jobs ADD COLUMN isolation TEXT NOT NULL DEFAULT '';
    CREATE TABLE tenants (
        project TEXT PRIMARY KEY,
        policy TEXT NOT NULL,
        updated_at REAL NOT NULL
    );
    """),
    # autoresearch/health/: node health (since when, last clearing), the preflight cache and the
    # monitor's rate limit on nodes; an attempt's failure class and output progress (hangs);
    # findings are events of kind 'finding', read newest first.
    ("health-1", """
    ALTER TABLE nodes ADD COLUMN since REAL;
    ALTER TABLE nodes ADD COLUMN cleared_at REAL NOT NULL DEFAULT 0;
    ALTER TABLE nodes ADD COLUMN checked_at REAL;
    ALTER TABLE nodes ADD COLUMN check_result TEXT NOT NULL DEFAULT '';
    ALTER TABLE nodes ADD COLUMN poll_due_at REAL;
    ALTER TABLE attempts ADD COLUMN failure_class TEXT;
    ALTER TABLE attempts ADD COLUMN failure_why TEXT;
    ALTER TABLE attempts ADD COLUMN seen_bytes INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE attempts ADD COLUMN seen_at REAL;
    CREATE INDEX events_by_kind ON events(kind, id);
    """),
    # issue 11: a gang's whole placement, [[node, [gpu ids]], ...] per member (NULL: one node;
    # node and gpu_ids stay member 0's, for every reader that knows one node).
    ("gang-1", """
    ALTER TABLE attempts ADD COLUMN alloc TEXT;
    """),
    # The pass's and the reads' look-ups stay flat in the number of jobs (issue 16): the busy
    # backends (a skip-scan), a backend's queue in id order.
    ("fastrt-1", """
    CREATE INDEX jobs_by_state_backend ON jobs(state, backend, id);
    """),
    # The mirror's per-second pass reads what changed, not every job (issue 16): jobs and trials
    # by their last change, and its own runs that are still open or blocked (partial indexes).
    ("tracking-2", """
    CREATE INDEX jobs_by_update ON jobs(updated_at);
    CREATE INDEX trials_by_update ON trials(updated_at);
    CREATE INDEX tracking_runs_open ON tracking_runs(entity) WHERE finished=0;
    CREATE INDEX tracking_runs_blocked ON tracking_runs(entity) WHERE error IS NOT NULL;
    """),
    # A group's running cap (issue 16, like Slurm's --array=0-99%16): a research loop submits trials
    # ahead of its free slots under a cap of ``parallel``, and the pass that records an ending starts
    # the next one at once. Jobs of a group are counted through the index, never a scan of all jobs.
    # queue_order: a job's place in its priority class (NULL: its id); a paused trial's resume keeps
    # the place of its paused job (as Slurm's requeue keeps a job's submit time).
    ("group-1", """
    ALTER TABLE jobs ADD COLUMN job_group TEXT;
    ALTER TABLE jobs ADD COLUMN queue_order INTEGER;
    CREATE INDEX jobs_by_group ON jobs(job_group, state) WHERE job_group IS NOT NULL;
    CREATE TABLE job_groups (
        name TEXT PRIMARY KEY,
        max_running INTEGER NOT NULL,
        updated_at REAL NOT NULL
    );
    """),
    # Whether any queued job could start on a full cluster (a GPU-less one) or preempt (a critical
    # or normal one) is a seek, not a scan of the queue: a submit behind a deep queue costs the same
    # as behind an empty one (JobStore.any_gpuless_queued and any_preemptor_queued, scheduler.nothing_starts).
    ("queue-1", """
    CREATE INDEX jobs_by_queue_shape ON jobs(state, backend, priority, gpus);
    """),
    # The kernel log's cursor per node (health/kernel_log.py: what a reader has seen), and when the
    # machine last reported an event there (a cached preflight older than it is checked again).
    ("health-2", """
    ALTER TABLE nodes ADD COLUMN kernel_cursor TEXT;
    ALTER TABLE nodes ADD COLUMN machine_event_at REAL;
    """),
    # The ledger's identity: a random id made when the ledger is made (or, for a ledger made before
    # identities, when it is upgraded). Every run folder records it (the launch request), and a launch
    # never adopts a folder that names another (docs/architecture.md, "Run folders belong to one ledger").
    ("identity-1", """
    CREATE TABLE ledger_identity (
        id TEXT NOT NULL,
        created_at REAL NOT NULL
    );
    INSERT INTO ledger_identity(id, created_at) VALUES (lower(hex(randomblob(16))), (julianday('now') - 2440587.5) * 86400.0)
    """),
    # An attempt whose ending was recorded before all its output was read (more than one read's cap at
    # its end): the bytes still to read and the points they hold (an estimate), shown by every read until
    # the pass daemon or a metrics read has read them (autoresearch/engine/ingest.py). Found through the index.
    ("ingest-1", """
    ALTER TABLE attempts ADD COLUMN unread_bytes INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE attempts ADD COLUMN unread_points INTEGER NOT NULL DEFAULT 0;
    CREATE INDEX attempts_unread ON attempts(job_id) WHERE unread_bytes > 0
    """),
    # Fair share's past usage (engine/shares.py, docs/scheduling.md): per backend and project, the
    # GPU-seconds of its ended attempts decayed to ``as_of`` (a decayed accumulator: never a scan of
    # history), and the last 'end' event folded into it (the cursor; events_by_kind finds the next).
    ("shares-1", """
    CREATE TABLE share_usage (
        backend TEXT NOT NULL,
        project TEXT NOT NULL,
        gpu_s REAL NOT NULL,
        as_of REAL NOT NULL,
        PRIMARY KEY (backend, project)
    );
    CREATE TABLE share_cursor (event_id INTEGER NOT NULL);
    INSERT INTO share_cursor(event_id) VALUES (0)
    """),
]


RESERVE_NAME, RESERVE_BYTES = "ledger.reserve", 256 << 10  # room for the commits of a home whose disk filled


def _disk_full(err: sqlite3.Error) -> bool:
    return "disk is full" in str(err)


def default_home() -> Path:
    return Path(os.environ.get("AUTORESEARCH_HOME") or Path.home() / ".autoresearch").expanduser()


class Ledger:
    """A handle on ``$AUTORESEARCH_HOME/ledger.db``; one SQLite connection per thread."""

    def __init__(self, home: str | os.PathLike[str] | None = None) -> None:
        # Absolute: attempt supervisors change directory, and hand this path to their hooks.
        self.home = (Path(home).expanduser() if home else default_home()).absolute()
        self.path = self.home / "ledger.db"
        self._local = threading.local()
        self._identity = ""
        self._freed = False
        # What "now" is for what this handle records (submits, stops, endings, findings) and for the waits
        # measured from them: the wall clock, or a simulated fleet's (the runtime on the sim backend sets it).
        self.clock: Callable[[], float] = time.time
        try:
            self.home.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as err:
            raise LedgerError(
                f"cannot create {self.home}: {err.strerror}", hint="set AUTORESEARCH_HOME to a writable directory"
            ) from None
        # Private before SQLite creates it: it holds every job's env (its -wal/-shm copy the mode).
        # O_EXCL: never open (and close) a file SQLite has open here, as the close would drop its locks.
        with contextlib.suppress(OSError):
            os.close(os.open(self.path, os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
        self._migrate()
        self._keep_reserve()
        try:
            st = os.stat(self.path)
            self._file: tuple[int, int] = (st.st_dev, st.st_ino)
        except OSError:
            self._file = (0, 0)

    def replaced(self) -> bool:
        """Whether ``ledger.db`` is gone, emptied or another file since this handle opened it (moved aside,
        truncated, restored from a backup): a long-lived process (the pass daemon) must not go on with the
        old one's connection."""
        try:
            st = os.stat(self.path)
        except OSError:
            return True
        return (st.st_dev, st.st_ino) != self._file or st.st_size == 0  # (emptied in place: the same inode)

    # -- connections and transactions -------------------------------------------------

    def connection(self) -> sqlite3.Connection:
        """This thread's connection, for a store's read outside a transaction (do not close it)."""
        return self._connect()

    def _connect(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is not None and getattr(self._local, "pid", None) == os.getpid():
            return conn
        try:
            conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
        except sqlite3.DatabaseError as err:
            raise self._explain(err) from None
        try:
            conn.row_factory = sqlite3.Row
            _wal(conn)
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute(f"PRAGMA wal_autocheckpoint={WAL_CHECKPOINT_PAGES}")
            conn.execute("PRAGMA foreign_keys=ON")
        except sqlite3.DatabaseError as err:
            conn.close()
            raise self._explain(err) from None
        self._local.conn = conn
        self._local.pid = os.getpid()
        return conn

    def _explain(self, err: sqlite3.Error) -> LedgerError:
        text = str(err)
        if "locked" in text or "busy" in text:
            return LedgerError(
                f"the ledger {self.path} stayed locked for {BUSY_TIMEOUT_S:.0f} s",
                hint="another autoresearch process holds a long write; retry, or find it with `fuser` on the file",
            )
        if _disk_full(err) or "No space left" in text:
            return LedgerError(
                f"the disk of {self.home} is full: the ledger cannot record anything ({text})",
                hint=f"free space on that disk (finished jobs' run folders under {self.home / 'jobs'}, old "
                     "checkpoints, aside-* folders), or set AUTORESEARCH_HOME to a larger disk; nothing was lost: "
                     "the next command records what happened meanwhile",
            )
        if "not a database" in text or "malformed" in text or "corrupt" in text:
            return LedgerError(
                f"the ledger {self.path} is corrupt ({text})",
                hint=f"restore a backup, or run `autoresearch doctor --move-aside --home {self.home}`: it keeps the "
                     "corrupt ledger and its run folders in a folder of their own and starts a fresh ledger",
            )
        return LedgerError(f"ledger error: {text}", hint=f"check that {self.path} is on a writable local disk")

    @contextlib.contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """A write transaction (``BEGIN IMMEDIATE``): all or nothing."""
        conn = self._connect()
        writer = _writer(self.path)
        if not writer.acquire(timeout=BUSY_TIMEOUT_S):
            raise self._explain(sqlite3.OperationalError("database is locked"))
        try:
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as err:
                raise self._explain(err) from None
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            try:
                conn.execute("COMMIT")
            except sqlite3.Error as err:
                if _disk_full(err) and self._free_reserve():  # (SQLite rolled it back: the caller tries again)
                    self._freed = True
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise self._explain(err) from None
        finally:
            writer.release()

    def take_freed(self) -> bool:
        """Whether a commit that found the disk full freed the reserve since the last call: the failed
        transaction may be tried again once (Runtime.tick does, for the pass that records endings)."""
        freed, self._freed = self._freed, False
        return freed

    def _keep_reserve(self) -> None:
        """Keep ``RESERVE_BYTES`` set aside beside the ledger (made again once the disk has room): a commit that
        finds the disk full frees it (SQLite has rolled that transaction back), and the pass tries once more."""
        path = self.home / RESERVE_NAME
        if os.path.exists(path):
            return
        try:
            vfs = os.statvfs(self.home)
            if vfs.f_bavail * vfs.f_frsize < 4 * RESERVE_BYTES:
                return
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                os.posix_fallocate(fd, 0, RESERVE_BYTES)
            finally:
                os.close(fd)
        except OSError:
            return

    def _free_reserve(self) -> bool:
        """Free the reserve (see :meth:`_keep_reserve`); whether there was one."""
        try:
            os.unlink(self.home / RESERVE_NAME)
            return True
        except OSError:
            return False

    def query(self, sql: str, params: tuple[Any, ...] | dict[str, Any] = ()) -> list[sqlite3.Row]:
        try:
            return self._connect().execute(sql, params).fetchall()
        except sqlite3.Error as err:
            raise self._explain(err) from None

    def tuples(self, sql: str, params: tuple[Any, ...] | dict[str, Any] = ()) -> list[tuple[Any, ...]]:
        """:meth:`query`'s rows as plain tuples (no column names: a cheaper row, for a hot path's many)."""
        try:
            cur = self._connect().cursor()
            cur.row_factory = None
            return cur.execute(sql, params).fetchall()
        except sqlite3.Error as err:
            raise self._explain(err) from None

    def one(self, sql: str, params: tuple[Any, ...] | dict[str, Any] = ()) -> sqlite3.Row | None:
        rows = self.query(sql, params)
        return rows[0] if rows else None

    def _migrate(self) -> None:
        conn = self._connect()
        try:
            # user_version counts applied migrations: one cheap read on the fast path.
            if conn.execute("PRAGMA user_version").fetchone()[0] >= len(MIGRATIONS):
                return
            with self.tx() as c:
                c.execute("CREATE TABLE IF NOT EXISTS migrations (name TEXT PRIMARY KEY, applied_at REAL NOT NULL)")
                done = {r[0] for r in c.execute("SELECT name FROM migrations")}
                if not done:  # a new ledger (or an empty file): never a fresh start beside another's run folders
                    self._refuse_beside_run_folders()
                for name, sql in MIGRATIONS:
                    if name in done:
                        continue
                    for statement in sql.split(";"):
                        if statement.strip():
                            c.execute(statement)
                    c.execute("INSERT INTO migrations(name, applied_at) VALUES (?,?)", (name, time.time()))
                c.execute(f"PRAGMA user_version={len(MIGRATIONS)}")
            self._make_private()
        except sqlite3.Error as err:
            raise self._explain(err) from None

    def _refuse_beside_run_folders(self) -> None:
        """Raise when the home already holds run folders: they were made by a ledger that is gone (moved,
        emptied, truncated), and a new one would number its jobs from 1 again and read their files as its own."""
        from autoresearch.engine.runfolders import count  # (only a new ledger's open gets here)

        found = count(self.home)
        if found:
            raise LedgerError(
                f"the ledger {self.path} is new or empty, but {self.home / 'jobs'} holds {found} run folder(s) "
                "of an earlier ledger; a fresh ledger here would number its jobs as theirs and report their results as its own",
                hint=f"restore the ledger (e.g. from a backup, or `mv {self.path}.bad {self.path}` if you moved it), "
                     f"or run `autoresearch doctor --move-aside --home {self.home}` to keep the old state in a "
                     "folder of its own and start a fresh ledger",
            )

    @property
    def identity(self) -> str:
        """This ledger's id (hex), made when it was made; read once per handle."""
        if not self._identity:
            row = self.one("SELECT id FROM ledger_identity LIMIT 1")
            self._identity = str(row[0]) if row is not None else ""
        return self._identity

    def _make_private(self) -> None:
        """Once per upgrade (when migrations ran): a home made before 0700 homes becomes private too."""
        try:
            for path, mode in ((self.home, 0o700), (self.path, 0o600)):
                if path.stat().st_mode & 0o077 and path.stat().st_uid == os.getuid():
                    path.chmod(mode)
            from autoresearch.util._private import private_dir

            for folder in ("jobs", "loops", "projects"):  # made here, private, before anything makes them 0755
                private_dir(self.home / folder)
        except OSError:
            pass
        except sqlite3.Error as err:
            raise self._explain(err) from None

    # -- the scheduling-pass lock -----------------------------------------------------

    @contextlib.contextmanager
    def pass_lock(self, wait: bool = True) -> Iterator[bool]:
        """Exclusive lock for one reconcile + scheduling pass across processes.

        Yields False (without the lock) when ``wait`` is False and another process holds it:
        that process is doing the same pass right now.
        """
        fd = os.open(self.home / "pass.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(fd)

    # -- small helpers used across modules --------------------------------------------

    @staticmethod
    def event(conn: sqlite3.Connection, kind: str, job_id: int | None = None, attempt: int | None = None,
              *, _ts: float | None = None, **data: object) -> None:
        """Record an event at ``_ts`` (the caller's ledger clock; None: the wall clock)."""
        conn.execute(
            "INSERT INTO events(ts, job_id, attempt, kind, data) VALUES (?,?,?,?,?)",
            (time.time() if _ts is None else _ts, job_id, attempt, kind, json.dumps(data, default=str)),
        )

    def job_dir(self, job_id: int) -> Path:
        return Path(self.job_path(job_id))

    def job_path(self, job_id: int) -> str:
        """:meth:`job_dir` as a string: a launch's hot path (two pathlib joins cost ~20 us)."""
        return os.path.join(self.home, "jobs", str(job_id))
