"""Concurrent submits go to the ledger together: one transaction per batch, and passes shared.

A server with many clients gets submits at once. One at a time, each would take the pass
lock in turn and run its own pass over the whole queue; here the first submit to arrive
leads: it takes every submit waiting (its own included) to a worker thread and records
them with :meth:`Api.submit_many`, one call per project (a token's tenant never shares a
batch with another's). Submits arriving meanwhile wait, and the first of them leads the
next batch once this one is done, so a caller waits for at most the batch before its own.

A pass re-places the whole queue (~7 ms at 1,000 queued), so a flood of submits does not run
one per batch. A batch runs the pass itself (its jobs answer ``starting`` when they fit, as
without a server) when the server was quiet: nobody waits behind it and no batch ended in the
last :data:`QUIET_S`. In a flood the pass is owed instead: a later batch pays it, at the
latest once :data:`PLACE_EVERY_JOBS` jobs or :data:`PLACE_EVERY_S` seconds went unplaced, and
once the flood stops a trailing pass (a timer, ``QUIET_S`` after the last batch) places the
rest. Such a job answers ``queued`` and starts milliseconds later; nothing recorded is left
unplaced (and the ledger is the truth: any later pass or read places it anyway).

One bad spec must not refuse its neighbours: when a batch is refused before anything is
recorded (any error but the ledger's), its submits are retried one by one, so each caller
gets its own job or its own error, exactly as without batching.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import anyio

from autoresearch.errors import AutoresearchError, LedgerError

log = logging.getLogger("autoresearch.tools")

QUIET_S = 0.005  # no batch ended this long before: not a flood, the batch runs its own pass
# In a flood, a pass at least every PLACE_EVERY_JOBS jobs or PLACE_EVERY_S seconds.
PLACE_EVERY_JOBS = 64
PLACE_EVERY_S = 0.5


@dataclass(eq=False)
class _Submit:
    spec: dict[str, Any]
    project: str
    wake: anyio.Event = field(default_factory=anyio.Event)
    lead: bool = False
    view: Any = None
    error: BaseException | None = None

    def outcome(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.view


class SubmitBatcher:
    """Batches the submits of one server (one event loop). ``batches`` and ``submitted``
    count calls of ``Api.submit_many`` and the submits they carried (tests read them)."""

    def __init__(self, api: Any) -> None:
        self.api = api
        self._pending: list[_Submit] = []
        self._running = False
        self.batches = 0
        self.submitted = 0
        self.passes = 0  # passes run for submits, in a batch or trailing (tests read it)
        # What the worker threads and the trailing timer share, under _lock:
        self._lock = threading.Lock()
        self._placed_at = float("-inf")  # monotonic: the last pass run for submits
        self._ended_at = float("-inf")  # monotonic: the last batch's end
        self._owed = 0  # jobs recorded since that pass, none placed yet
        self._timer: threading.Timer | None = None
        self._trailing = False  # the timer's pass runs
        self._recording = False  # a batch is in _record (it arms the timer at its end if need be)

    @property
    def owed(self) -> int:
        """Jobs recorded and not placed yet: a later batch or the trailing pass places them."""
        return self._owed

    @property
    def trailing(self) -> bool:
        """Whether the trailing pass is armed or running."""
        return self._timer is not None or self._trailing

    @property
    def waiting(self) -> int:
        """Submits waiting for the batch in progress to end."""
        return len(self._pending)

    async def submit(self, spec: dict[str, Any], project: str) -> Any:
        item = _Submit(spec, project)
        self._pending.append(item)
        # Shielded: a submit in flight is recorded whatever its caller does, and a caller that
        # went away must still hand the lead on (else every later submit would wait forever).
        with anyio.CancelScope(shield=True):
            if self._running:
                await item.wake.wait()
                if not item.lead:
                    return item.outcome()
            self._running = True
            batch, self._pending = self._pending, []
            try:
                await anyio.to_thread.run_sync(self._record, batch, item.lead)
            finally:
                if self._pending:
                    self._pending[0].lead = True
                    self._pending[0].wake.set()
                else:
                    self._running = False
                for done in batch:
                    done.wake.set()
        return item.outcome()

    def _record(self, batch: list[_Submit], handed_on: bool = False) -> None:
        """In a worker thread: record the batch, one ``submit_many`` per project (the last one runs
        the pass when it is due: see the module's docstring); never raises. ``handed_on``: its
        submits arrived while the batch before was being recorded (a flood)."""
        with self._lock:
            self._recording = True
            flood = handed_on or time.monotonic() - self._ended_at < QUIET_S  # or the one before ended just now
        groups: dict[str, list[_Submit]] = {}
        for item in batch:
            groups.setdefault(item.project, []).append(item)
        for n, (project, items) in enumerate(groups.items(), 1):
            place = n == len(groups)  # one pass per batch: after its last project's submits
            try:
                self._submit_many(items, project, place, flood)
            except AutoresearchError as err:
                if len(items) == 1 or isinstance(err, LedgerError):
                    for item in items:
                        item.error = err
                    continue
                for item in items:  # refused before anything was recorded: find whose spec it was
                    try:
                        self._submit_many([item], project, False, flood)
                    except Exception as single:  # noqa: BLE001 - the caller's tool_errors reports it
                        item.error = single
            except Exception as err:  # noqa: BLE001 - the callers' tool_errors report it, logged there
                for item in items:
                    item.error = err
        with self._lock:
            self._recording = False
            self._ended_at = time.monotonic()
            trailing = self._owed and not self._pending  # no next batch to pay it
        if trailing:
            self._trail_later()

    def _pass_due(self, recorded: int, flood: bool) -> bool:
        """Asked by ``submit_many`` once ``recorded`` jobs are in the ledger: run the pass now
        (the server is quiet, or too much went unplaced), or owe it (module docstring)."""
        now = time.monotonic()
        with self._lock:
            self._owed += recorded
            due = ((not self._pending and not flood) or self._owed >= PLACE_EVERY_JOBS
                   or now - self._placed_at >= PLACE_EVERY_S)
            if due:
                self.passes += 1
                self._placed_at, self._owed = now, 0
        return due

    def _submit_many(self, items: list[_Submit], project: str, place: bool, flood: bool) -> None:
        self.batches += 1
        self.submitted += len(items)
        decide = (lambda: self._pass_due(len(items), flood)) if place else False
        views = self.api.submit_many([i.spec for i in items], project, place=decide)
        if not place:
            self._owe(len(items))
        for item, view in zip(items, views, strict=True):
            item.view = view

    def _owe(self, recorded: int) -> None:
        with self._lock:
            self._owed += recorded

    def _trail_later(self, delay: float | None = None) -> None:
        with self._lock:
            if self._timer is not None:
                return  # one armed already: it sees these too
            self._timer = threading.Timer(QUIET_S if delay is None else delay, self._trail)
            self._timer.daemon = True
        self._timer.start()

    def _trail(self) -> None:
        """The trailing pass: the jobs owed get placed once no batch ended for QUIET_S."""
        with self._lock:
            self._timer = None
            if not self._owed:
                return
            if self._recording or self._pending:
                return  # a batch is on, or comes: it pays, or arms the timer again when it ends
            wait = QUIET_S - (time.monotonic() - self._ended_at)
            if wait <= 0:
                self.passes += 1
                self._placed_at, self._owed, self._trailing = time.monotonic(), 0, True
        if wait > 0:  # a batch ended meanwhile: wait for quiet again
            self._trail_later(wait)
            return
        try:
            self.api.tick(only=())  # (a submit's pass: the starting attempts, not every running one)
        except Exception:  # noqa: BLE001 - a read or the next submit places them; nothing to answer here
            log.warning("the trailing pass after a flood of submits failed; the next pass places them", exc_info=True)
        finally:
            self._trailing = False
