"""Moving what an attempt wrote (its metrics file and its log) into the ledger, totally.

Whatever a trial writes, :func:`ingest_attempt` stores the points it can and drops the
rest, and never raises into the pass that called it (docs/architecture.md, invariant 8): a point
the parsers refuse, or a chunk they choke on, becomes one ``metrics_dropped`` warning
per attempt (a count and the first reason), shown by ``status`` under ``warnings``.
Only a ledger failure (locked, corrupt) propagates: it is nobody's job in particular.

A trial that prints a million bad lines adds one row (see :meth:`autoresearch.store.jobstore.JobStore.note`).
"""

from __future__ import annotations

import json
import os
import stat
from typing import Any, NamedTuple

from autoresearch.backends import Backend
from autoresearch.engine import metrics as M
from autoresearch.errors import LedgerError
from autoresearch.report import MARK
from autoresearch.store.jobstore import JobStore
from autoresearch.store.ledger import Ledger

LOG_CHUNK = 4 << 20
MAX_CHUNKS = 16  # per call: 64 MiB of each source
_UNREADABLE = "!unreadable:r"  # counters key: the metrics file's trouble was reported


def ingest_attempt(ledger: Ledger, backend: Backend, att: Any, final: bool = False) -> None:
    """Move new metric points of one attempt into the ledger; safe to call from anywhere.

    Reads at most ``MAX_CHUNKS`` chunks per call, so one pass is never held for long by an
    enormous (or endless) output: a running attempt's next pass reads on from there.

    ``final`` (the attempt is over): a chunk another process stored first does not end the read (that
    process may stop at its own cap); it reads on from where that one got to. When the cap stops it
    before the end of the files, the attempt records how many bytes (and, estimated, points) are still
    to read (``unread_bytes``, ``unread_points``: every read shows them, and the pass daemon and each
    metrics read go on reading them); once it reaches the end they are 0 again.
    """
    more = False
    for _ in range(MAX_CHUNKS):
        try:
            step = _ingest_chunk(ledger, backend, att, final)
        except LedgerError:
            raise
        except Exception as err:  # a parser bug must not stop the pass: skip what we could not read
            step = "more" if _skip_chunk(ledger, backend, att, f"{type(err).__name__}: {err}") else "done"
        more = step != "done"
        if not more or (step == "raced" and not final):
            break
        fresh = JobStore(ledger).attempt(att["job_id"], att["n"])
        if fresh is None:
            return
        att = fresh
    if final:
        _record_unread(ledger, backend, att, more)


def _record_unread(ledger: Ledger, backend: Backend, att: Any, more: bool) -> None:
    """Record what is left of an ended attempt's output after a final read (nothing: 0)."""
    left = 0
    if more:
        fresh = JobStore(ledger).attempt(att["job_id"], att["n"])
        if fresh is None:
            return
        att = fresh
        left = _unread_bytes(backend, att)
    had = att["unread_bytes"] if "unread_bytes" in att.keys() else 0
    if not left and not had:
        return
    points = 0
    if left:  # (an estimate: the points per byte of what was read so far)
        read = int(att["metrics_offset"]) + int(att["log_offset"])
        points = max(1, round(left * JobStore(ledger).point_count(att["job_id"], att["n"]) / max(1, read)))
    JobStore(ledger).set_unread(att["job_id"], att["n"], left, points)


def _unread_bytes(backend: Backend, att: Any) -> int:
    left = 0
    if att["external_id"]:
        try:
            left += max(0, backend.log_size(att["external_id"]) - int(att["log_offset"]))
        except Exception:  # noqa: BLE001, S110 - a backend that cannot say: the metrics file's part only
            pass
    if backend.capabilities.shared_fs:
        try:
            left += max(0, os.lstat(att["metrics_path"]).st_size - int(att["metrics_offset"]))
        except OSError:
            pass
    return left


def _read(ledger: Ledger, backend: Backend, att: Any) -> tuple[bytes, bytes, str]:
    """The next chunk of the metrics file and of the log, and why the metrics file cannot be read."""
    l_chunk = backend.read_log(att["external_id"], att["log_offset"], LOG_CHUNK) if att["external_id"] else b""
    if not backend.capabilities.shared_fs:  # its report() lines are in the log (report.MARK)
        return b"", l_chunk, ""
    try:  # the trial owns this path: no blocking on a FIFO, no following a link elsewhere
        fd = os.open(att["metrics_path"], os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return b"", l_chunk, ""
    except OSError as err:
        return b"", l_chunk, f"its metrics file cannot be opened ({err.strerror}; a link?)"
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # before fdopen, which refuses a directory by raising
        os.close(fd)
        return b"", l_chunk, "its metrics file is not a regular file"
    with os.fdopen(fd, "rb") as f:
        f.seek(att["metrics_offset"])
        return f.read(LOG_CHUNK), l_chunk, ""


def _ingest_chunk(ledger: Ledger, backend: Backend, att: Any, final: bool) -> str:
    """One chunk of each source: "more" when there is more to read right away, "done" when not,
    "raced" when another process stored this chunk first (where it got to is read again)."""
    chunk = _parse_chunk(ledger, backend, att, final)
    if chunk is None:
        return "done"
    if not JobStore(ledger).store_points(*chunk.store):
        return "raced"  # another process ingested this chunk
    if chunk.log_lines:
        _health_signatures(ledger, backend, att, chunk.log_lines)
    return "more" if chunk.more else "done"


class _Chunk(NamedTuple):
    store: tuple[Any, ...]  # JobStore.store_points's arguments
    log_lines: list[str]  # the log's lines, for the health scan
    more: bool  # a source filled the chunk: there is more to read right away


def _parse_chunk(ledger: Ledger, backend: Backend, att: Any, final: bool) -> _Chunk | None:
    """The next chunk of each source, read and parsed (not stored); None when there is nothing new."""
    m_off, l_off = att["metrics_offset"], att["log_offset"]
    m_chunk, l_chunk, problem = _read(ledger, backend, att)
    counters: dict[str, int] = json.loads(att["log_steps"] or "{}")
    drops = M.Drops()
    if problem and not counters.get(_UNREADABLE):
        counters[_UNREADABLE] = 1  # said once per attempt, not once per pass
        drops.add(problem)
    m_full, l_full = len(m_chunk) >= LOG_CHUNK, len(l_chunk) >= LOG_CHUNK
    m_lines, m_used = _lines(m_chunk, counters, "r", drops, m_full, final)
    l_lines, l_used = _lines(l_chunk, counters, "l", None, l_full, final)
    if not backend.capabilities.shared_fs:  # report() printed its records: they count as reported
        m_lines = [line[len(MARK):] for line in l_lines if line.startswith(MARK)]
        l_lines = [line for line in l_lines if not line.startswith(MARK)]
    if not m_used and not l_used and not drops.count:
        return None
    now = ledger.clock()
    limit = _limit(ledger, att["job_id"])
    if limit is not None and counters.get(_POINTS, 0) >= limit:  # full: its lines are not even parsed
        drops.add(_full(limit), len(m_lines) + len(l_lines))
        rows = []
    elif limit is None:
        rows = [(att["job_id"], att["n"], p.name, p.step, p.value, p.ts, "report")
                for p in M.parse_report_lines(m_lines, counters, now, drops)]
        rows += [(att["job_id"], att["n"], p.name, p.step, p.value, p.ts, "log")
                 for p in M.parse_log_lines(l_lines, counters, now, drops)]
    else:
        rows = _parse_within(ledger, att, m_lines, l_lines, counters, now, drops, limit)
    return _Chunk((att, (m_off, l_off), rows, (m_off + m_used, l_off + l_used), counters, (drops.count, drops.reason)),
                  l_lines, m_full or l_full)


_POINTS = "!points"  # counters key: points this job had stored, counted from this attempt's first chunk on
_limits: dict[tuple[str, int], int | None] = {}  # (home, job id) -> its metric_points limit (its project never changes)


def _limit(ledger: Ledger, job_id: int) -> int | None:
    """A tenant job's metric_points limit (config.yaml sandbox.limits); None for any other job."""
    key = (str(ledger.home), job_id)
    if key not in _limits:
        if len(_limits) > 10_000:
            _limits.clear()
        project = JobStore(ledger).tenant_project(job_id)
        limit = None
        if project is not None:
            from autoresearch.backends import limits, profiles

            try:
                limit = profiles.sandbox_config(ledger.home).for_project(project).metric_points
            except Exception:  # noqa: BLE001 - a config.yaml broken since: the defaults hold
                limit = limits.SandboxConfig().limits.metric_points
        _limits[key] = limit
    return _limits[key]


def _full(limit: int) -> str:
    return f"points (or lines, once full) past this job's limit of {limit} (sandbox.limits.metric_points) were dropped"


def _parse_within(ledger: Ledger, att: Any, m_lines: list[str], l_lines: list[str], counters: dict[str, int],
                  now: float, drops: M.Drops, limit: int) -> list[Any]:
    """The points of a tenant job's lines while it is under its limit (all its attempts), parsed a
    slice at a time so a flood past it is not parsed at all; what is past it is dropped, said once
    in the attempt's ``metrics_dropped`` warning with a count (of points, then of lines not read)."""
    if _POINTS not in counters:
        counters[_POINTS] = JobStore(ledger).count_points(att["job_id"])
    rows: list[Any] = []
    for lines, parse, source in ((m_lines, M.parse_report_lines, "report"), (l_lines, M.parse_log_lines, "log")):
        at = 0
        while at < len(lines):
            room = limit - counters[_POINTS] - len(rows)
            if room <= 0:
                drops.add(_full(limit), len(lines) - at)
                break
            part = lines[at:at + max(room, 64)]
            at += len(part)
            points = [(att["job_id"], att["n"], p.name, p.step, p.value, p.ts, source)
                      for p in parse(part, counters, now, drops)]
            if len(points) > room:
                drops.add(_full(limit), len(points) - room)
                points = points[:room]
            rows += points
    counters[_POINTS] += len(rows)
    return rows


def ingest_final_many(ledger: Ledger, backend: Backend, atts: list[Any]) -> set[tuple[int, int]]:
    """The last points of attempts that ended, as :func:`ingest_attempt` with ``final``, in one
    transaction for all whose rest fits in one chunk (a pass that records a dozen endings of short
    trials: one, not a dozen). The (job id, attempt) it ingested to the end; the others (a longer rest,
    a chunk it could not read or parse, one another process ingested first) are left to
    :func:`ingest_attempt`, which words what goes wrong."""
    done: set[tuple[int, int]] = set()
    chunks: list[_Chunk] = []
    for att in atts:
        try:
            chunk = _parse_chunk(ledger, backend, att, True)
        except LedgerError:
            raise
        except Exception:  # noqa: BLE001, S112 - ingest_attempt reads it again and records why it cannot
            continue
        if chunk is None:
            done.add((att["job_id"], att["n"]))  # nothing new since the last read: ingested
        elif not chunk.more:
            chunks.append(chunk)
    stored = JobStore(ledger).store_points_many([chunk.store for chunk in chunks]) if chunks else []
    for chunk, ok in zip(chunks, stored, strict=True):
        if not ok:
            continue
        att = chunk.store[0]
        done.add((att["job_id"], att["n"]))
        if chunk.log_lines:
            _health_signatures(ledger, backend, att, chunk.log_lines)
    return done


def _health_signatures(ledger: Ledger, backend: Backend, att: Any, lines: list[str]) -> None:
    """The same lines, read once, scanned for faults of the machine and the program (autoresearch/health/)."""
    from autoresearch.health.log_hits import record_log_hits

    try:
        record_log_hits(ledger, backend, att, lines)
    except LedgerError:
        raise
    except Exception as err:  # noqa: BLE001 - findings are diagnostics: the points are stored
        JobStore(ledger).warn("metrics_dropped", att["job_id"], att["n"], f"health scan failed: {err}")


def _lines(chunk: bytes, counters: dict[str, int], source: str, drops: M.Drops | None, full: bool,
           final: bool) -> tuple[list[str], int]:
    if final and chunk and not chunk.endswith(b"\n") and not full:
        # The attempt is over: its unterminated last line is complete.
        lines, used = M.complete_lines(chunk + b"\n", counters, source, drops)
        return lines, min(used, len(chunk))
    return M.complete_lines(chunk, counters, source, drops, full=full)


def _skip_chunk(ledger: Ledger, backend: Backend, att: Any, reason: str) -> bool:
    """Record that a chunk could not be read and move past it, so the next read does not fail again."""
    m_off, l_off = att["metrics_offset"], att["log_offset"]
    try:
        m_chunk, l_chunk, _ = _read(ledger, backend, att)
    except Exception as err:  # the backend cannot read its log now: nothing to move past
        reason, m_chunk, l_chunk = f"{reason}; then {type(err).__name__}: {err}", b"", b""
    if not JobStore(ledger).skip_chunk(att, (m_off, l_off), (m_off + len(m_chunk), l_off + len(l_chunk)), reason):
        return False
    return len(m_chunk) >= LOG_CHUNK or len(l_chunk) >= LOG_CHUNK

