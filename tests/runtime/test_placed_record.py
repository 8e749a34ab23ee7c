"""The placement record (``placed.<fifo>``): a read with jobs queued and nothing changed does not
re-place them; the record is overwritten in place (no truncate: ~0.4 ms on ext4 at every pass), so
anything longer left there is cut once and never makes every later pass place again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autoresearch.engine.runtime import PLACED_WIDTH
from tests.conftest import wait_state


def test_the_record_is_rewritten_in_place_and_garbage_is_cut_once(api: Any, tmp_path: Path) -> None:
    runtime = api._runtime
    hold = [api.submit({"command": ["sleep", "60"], "workdir": str(tmp_path), "gpus": 1}).id for _ in range(2)]
    for job in hold:
        wait_state(api, job, "running")
    queued = api.submit({"command": ["true"], "workdir": str(tmp_path), "gpus": 1}).id  # no GPU left: it waits
    runtime.tick()
    record = runtime._placed_file()
    assert api.status(queued).state == "queued" and record.stat().st_size == PLACED_WIDTH
    assert not runtime._placement_due()  # nothing changed since: a read does not re-place

    record.write_text("9" * 300 + "@not-a-time")  # something longer (another version, a bad write)
    assert runtime._placement_due()
    runtime.tick()
    assert record.stat().st_size == PLACED_WIDTH and not runtime._placement_due()
    api.cancel(hold)
    wait_state(api, queued, "succeeded")


def test_a_submit_places_without_reading_the_record(api: Any, tmp_path: Path, monkeypatch: Any) -> None:
    """A submit changes what placement depends on, so its own pass places at once: no read of the
    record and the change mark (a file and two queries of ~3 ms of submit->running). A pass of
    anything else still reads it."""
    runtime = api._runtime
    asked: list[bool] = []
    real = type(runtime)._placement_due
    monkeypatch.setattr(type(runtime), "_placement_due", lambda self: asked.append(True) or real(self))
    job = api.submit({"command": ["true"], "workdir": str(tmp_path), "gpus": 1}).id
    assert asked == [] and api.status(job).state in ("starting", "running", "succeeded")
    hold = [api.submit({"command": ["sleep", "60"], "workdir": str(tmp_path), "gpus": 1}).id for _ in range(2)]
    queued = api.submit({"command": ["true"], "workdir": str(tmp_path), "gpus": 1}).id  # no GPU left: it waits
    assert asked == []
    runtime.tick()  # a pass of nothing new: it asks, and finds the queue placed
    assert asked and api.status(queued).state == "queued"
    api.cancel(hold)
    wait_state(api, queued, "succeeded")


def test_a_pass_that_records_an_ending_places_without_reading_the_record(home: Path, monkeypatch: Any) -> None:
    """An ending (its event) changes what placement depends on, so the pass that records one places
    at once: no read of the record and the change mark (~0.25 ms of every turnover of a loop)."""
    import os

    from autoresearch.api import Api
    from autoresearch.backends.fake import FakeBackend

    fake = FakeBackend(gpus=2)
    api = Api(home, backend=fake)
    runtime = api._runtime
    spec = {"command": ["train"], "workdir": os.getcwd(), "gpus": 1}
    a, _ = (int(api.submit(spec).id) for _ in range(2))
    queued = int(api.submit(spec).id)  # no GPU left: it waits
    runtime.tick()
    asked: list[bool] = []
    real = type(runtime)._placement_due
    monkeypatch.setattr(type(runtime), "_placement_due", lambda self: asked.append(True) or real(self))
    def state(job: int) -> str:  # (read from the ledger: api.status runs a pass of its own)
        return str(api._ledger.one("SELECT state FROM jobs WHERE id=?", (job,))["state"])

    runtime.tick()  # nothing new: it asks, and finds the queue placed
    assert asked == [True] and state(queued) == "queued"
    fake.finish(f"{a}.1", 0)
    runtime.tick(only={(a, 1)})
    assert asked == [True]  # not asked again: the ending's pass placed
    assert state(a) == "succeeded" and state(queued) in ("starting", "running")
