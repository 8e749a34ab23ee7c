"""Concurrent MCP submits are recorded together: one Api.submit_many, one ledger transaction and
one pass per batch, not one per call (issue 16: 1,000 submits from 10 clients), and a bad spec in
a batch refuses only its own call."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from autoresearch.engine import jobs
from autoresearch.engine.runtime import Runtime
from autoresearch.store.ledger import Ledger
from tests.tools.conftest import connect, text

pytestmark = pytest.mark.anyio
N = 20


class Counts:
    """Counts submit_many calls, passes and ledger transactions; the first submit_many waits
    (at most 30 s) until every other submit has reached the server, so the batch is known."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, server: Any, expected: int) -> None:
        self.batches: list[int] = []
        self.passes = self.transactions = self.arrived = 0
        self.counting = False
        lock = threading.Lock()
        submit_many, tick, tx = jobs.submit_many, Runtime.tick, Ledger.tx

        def counted_submit_many(runtime: Any, specs: list[Any], project: str = "", **kwargs: Any) -> list[int]:
            with lock:
                self.arrived += 1
                first = self.arrived == 1
            batcher = getattr(server.autoresearch_ctx, "submits", None)
            deadline = time.monotonic() + 30
            while first and time.monotonic() < deadline:  # old code: the others arrive here, one by one
                if self.arrived >= expected or (batcher is not None and batcher.waiting >= expected - 1):
                    break
                time.sleep(0.01)
            with lock:
                self.batches.append(len(specs))
            return submit_many(runtime, specs, project, **kwargs)

        def counted_tick(runtime: Any, *args: Any, **kwargs: Any) -> bool:
            self.passes += self.counting
            return tick(runtime, *args, **kwargs)

        def counted_tx(ledger: Any) -> Any:
            self.transactions += self.counting
            return tx(ledger)

        monkeypatch.setattr(jobs, "submit_many", counted_submit_many)
        monkeypatch.setattr(Runtime, "tick", counted_tick)
        monkeypatch.setattr(Ledger, "tx", counted_tx)


async def settled(batcher: Any, timeout: float = 30) -> None:
    """Wait until no pass is owed to the batcher's jobs (the trailing pass ran)."""
    deadline = time.monotonic() + timeout
    while batcher.owed or batcher.trailing:
        assert time.monotonic() < deadline, "the trailing pass never ran"
        await anyio.sleep(0.01)


async def submit_all(server: Any, calls: list[dict[str, Any]]) -> list[Any]:
    results: list[Any] = [None] * len(calls)
    async with connect(server) as client:
        async def one(i: int) -> None:
            results[i] = await client.call_tool("submit", calls[i])

        async with anyio.create_task_group() as group:
            for i in range(len(calls)):
                group.start_soon(one, i)
    return results


async def test_concurrent_submits_share_one_transaction_and_one_pass(server: Any, api: Any, workdir: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = api.submit({"command": ["sleep", "60"], "gpus": 2, "priority": "critical", "workdir": str(workdir)})
    try:
        counts = Counts(monkeypatch, server, N)
        counts.counting = True
        results = await submit_all(server, [{"command": ["sleep", "1"], "gpus": 1, "priority": "best-effort",
                                             "name": f"s{i}"} for i in range(N)])
        await settled(server.autoresearch_ctx.submits)  # the second batch's pass trails it
        counts.counting = False
        assert [r.is_error for r in results] == [False] * N, [text(r) for r in results if r.is_error]
        ids = [r.structured_content["id"] for r in results]
        assert len(set(ids)) == N
        assert [r.structured_content["name"] for r in results] == [f"s{i}" for i in range(N)]  # each its own job
        assert all(api.status(i).state == "queued" for i in ids)
        # The first submit's batch, then everyone who arrived meanwhile: 2 batches, not 20; the
        # first runs its pass, the second (a flood's) owes it to the trailing pass.
        assert counts.batches == [1, N - 1]
        assert counts.passes == 2
        # per batch: its add_jobs and the pass's placement; one call at a time it was >= 20 (an add_jobs each)
        assert counts.transactions <= 2 * len(counts.batches), counts.transactions
    finally:
        api.cancel([blocker.id])


async def test_a_bad_spec_refuses_only_its_own_submit(server: Any, api: Any, workdir: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = api.submit({"command": ["sleep", "60"], "gpus": 2, "priority": "critical", "workdir": str(workdir)})
    try:
        Counts(monkeypatch, server, 5)
        calls = [{"command": ["sleep", "1"], "gpus": 1, "name": f"ok{i}"} for i in range(5)]
        calls[2] = {"command": ["sleep", "1"], "gpus": 3}  # more GPUs than the 2 that exist: capacity
        calls[3] = {"command": ["sleep", "1"], "memory": "lots"}  # not a size: spec_invalid
        results = await submit_all(server, calls)
        assert [r.is_error for r in results] == [False, False, True, True, False]
        assert "[capacity]" in text(results[2]) and "hint:" in text(results[2])
        assert "[spec_invalid]" in text(results[3]) and "memory" in text(results[3])
        names = [api.status(r.structured_content["id"]).name for r in results if not r.is_error]
        assert names == ["ok0", "ok1", "ok4"]  # recorded once each, none twice
        assert len(api.list_jobs(limit=100).jobs) == 4  # with the blocker: nothing else was recorded
    finally:
        api.cancel([blocker.id])


# -- a flood's passes (driven batch by batch: each _record is what a batch's worker thread runs) -----

BLOCKER = {"command": ["sleep", "60"], "gpus": 2, "priority": "critical"}


async def record(batcher: Any, specs: list[dict[str, Any]], handed_on: bool = True) -> list[Any]:
    """One batch of ``specs``, as the server's worker thread records it; ``handed_on``: its submits
    arrived while the batch before was recorded (a flood). Each submit's view, or its error."""
    from autoresearch.tools._batch import _Submit

    items = [_Submit(spec, "") for spec in specs]
    await anyio.to_thread.run_sync(batcher._record, items, handed_on)
    return [item.error if item.error is not None else item.view for item in items]


async def test_a_flood_owes_its_passes_and_runs_one_every_place_every_jobs(
        api: Any, workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from autoresearch.tools import _batch

    monkeypatch.setattr(_batch, "QUIET_S", 30.0)  # no trailing pass inside the test
    monkeypatch.setattr(_batch, "PLACE_EVERY_S", 60.0)
    monkeypatch.setattr(_batch, "PLACE_EVERY_JOBS", 3)
    blocker = api.submit({**BLOCKER, "workdir": str(workdir)})
    batcher = _batch.SubmitBatcher(api)
    ticks = []
    tick = Runtime.tick
    monkeypatch.setattr(Runtime, "tick", lambda rt, *a, **k: ticks.append(1) or tick(rt, *a, **k))
    try:
        job = {"command": ["sleep", "1"], "gpus": 1, "priority": "best-effort", "workdir": str(workdir)}
        await record(batcher, [job], handed_on=False)  # a quiet server: the batch runs its pass
        assert (len(ticks), batcher.passes, batcher.owed) == (1, 1, 0)
        first = await record(batcher, [job, job])
        assert [v.state for v in first] == ["queued", "queued"]
        assert (len(ticks), batcher.passes, batcher.owed) == (1, 1, 2)  # before: a pass per batch
        await record(batcher, [job, job])
        assert (len(ticks), batcher.passes, batcher.owed) == (2, 2, 0)  # 4 owed >= 3: this batch placed
    finally:
        if batcher._timer is not None:
            batcher._timer.cancel()
        api.cancel([blocker.id])


async def test_the_trailing_pass_places_what_a_flood_left_even_after_a_refused_batch(
        api: Any, workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from autoresearch.errors import SpecError
    from autoresearch.tools import _batch
    from tests.conftest import wait_state

    monkeypatch.setattr(_batch, "PLACE_EVERY_S", 60.0)
    monkeypatch.setenv("AUTORESEARCH_PASSD", "off")  # no daemon's pass places the flood's job before we look
    batcher = _batch.SubmitBatcher(api)
    quiet = await record(batcher, [{"command": ["sleep", "30"], "gpus": 1, "workdir": str(workdir)}], handed_on=False)
    try:
        assert quiet[0].state in ("starting", "running")  # a quiet server places at once, as without batching
        fits = await record(batcher, [{"command": ["sleep", "30"], "gpus": 1, "workdir": str(workdir)}])
        assert fits[0].state == "queued"  # a GPU is free, but the flood owes the pass (the trailing one pays)
        refused = await record(batcher, [{"command": ["sleep", "1"], "memory": "lots", "workdir": str(workdir)}])
        assert isinstance(refused[0], SpecError)
        await settled(batcher)  # the trailing pass, though the last batch recorded nothing
        assert batcher.passes == 2
        wait_state(api, fits[0].id, ("starting", "running"))
    finally:
        api.cancel([quiet[0].id] + [v.id for v in fits if hasattr(v, "id")])
