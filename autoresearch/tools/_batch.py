"""Concurrent submits go to the ledger together: one transaction and one pass per batch.

A server with many clients gets submits at once. One at a time, each would take the pass
lock in turn and run its own pass over the whole queue; here the first submit to arrive
leads: it takes every submit waiting (its own included) to a worker thread and records
them with :meth:`Api.submit_many`, one call per project (a token's tenant never shares a
batch with another's). Submits arriving meanwhile wait, and the first of them leads the
next batch once this one is done, so a caller waits for at most the batch before its own.

One bad spec must not refuse its neighbours: when a batch is refused before anything is
recorded (any error but the ledger's), its submits are retried one by one, so each caller
gets its own job or its own error, exactly as without batching.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import anyio

from autoresearch.errors import AutoresearchError, LedgerError


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
                await anyio.to_thread.run_sync(self._record, batch)
            finally:
                if self._pending:
                    self._pending[0].lead = True
                    self._pending[0].wake.set()
                else:
                    self._running = False
                for done in batch:
                    done.wake.set()
        return item.outcome()

    def _record(self, batch: list[_Submit]) -> None:
        """In a worker thread: record the batch, one ``submit_many`` per project; never raises."""
        groups: dict[str, list[_Submit]] = {}
        for item in batch:
            groups.setdefault(item.project, []).append(item)
        for project, items in groups.items():
            try:
                self.batches += 1
                self.submitted += len(items)
                views = self.api.submit_many([i.spec for i in items], project)
                for item, view in zip(items, views, strict=True):
                    item.view = view
            except AutoresearchError as err:
                if len(items) == 1 or isinstance(err, LedgerError):
                    for item in items:
                        item.error = err
                    continue
                for item in items:  # refused before anything was recorded: find whose spec it was
                    try:
                        self.batches += 1
                        self.submitted += 1
                        item.view = self.api.submit_many([item.spec], project)[0]
                    except Exception as single:  # noqa: BLE001 - the caller's tool_errors reports it
                        item.error = single
            except Exception as err:  # noqa: BLE001 - the callers' tool_errors report it, logged there
                for item in items:
                    item.error = err
