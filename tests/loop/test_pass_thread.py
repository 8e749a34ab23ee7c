"""Issue 16: the controller's pass thread (autoresearch/loop/_passes.py) runs the pass as soon as
an ending pokes the wake FIFO, beside the main thread: the ending is recorded and the loop's next
queued trial started without the main thread; a pass that fails is handed to the main thread."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from autoresearch.backends.fake import FakeBackend, Script
from autoresearch.errors import LedgerError
from autoresearch.jobs import submit_many
from autoresearch.loop._passes import PassThread
from autoresearch.runtime import Runtime
from autoresearch.watcher import wake

SPEC = {"command": ["train"], "workdir": os.getcwd()}


def test_an_ending_runs_the_pass_on_the_thread_and_starts_the_groups_next_job(home: Path) -> None:
    fake = FakeBackend(programs={"train": Script()})
    runtime = Runtime(home, backend=fake)
    watcher = runtime.watch()
    passes = PassThread(runtime, watcher, safety_s=60)  # no safety pass in this test: only pokes
    passes.start()
    try:
        first, second = submit_many(runtime, [SPEC] * 2, group="loop:1", max_running=1)
        assert runtime.jobs.job(second)["state"] == "queued"
        fake.finish(f"{first}.1", 0)
        wake(home, "fake")  # what the ending's supervisor does
        assert passes.wait(10)
        assert runtime.jobs.job(first)["state"] == "succeeded"  # recorded by the thread's pass ...
        assert runtime.jobs.job(second)["state"] in ("starting", "running")  # ... which started the next one
        assert passes.passes >= 1
    finally:
        passes.close()
        watcher.close()
    assert not passes.is_alive()


def test_a_failed_pass_is_handed_to_the_main_thread_and_close_is_prompt(home: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = Runtime(home, backend=FakeBackend())
    watcher = runtime.watch()

    def locked(wait: bool = True) -> bool:
        raise LedgerError("the ledger stayed locked", hint="retry")

    monkeypatch.setattr(runtime, "tick", locked)
    passes = PassThread(runtime, watcher, safety_s=60)
    passes.start()
    try:
        wake(home, "fake")
        assert passes.wait(10)
        with pytest.raises(LedgerError):
            passes.raise_error()
        passes.raise_error()  # handed over once
    finally:
        began = time.monotonic()
        passes.close()
        watcher.close()
    assert not passes.is_alive() and time.monotonic() - began < 5  # no wait for a timeout


def test_a_report_waiting_at_its_rung_is_handed_over_before_the_pass(home: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from autoresearch.watcher import fifo_name

    runtime = Runtime(home, backend=FakeBackend())
    watcher = runtime.watch()
    release = threading.Event()
    monkeypatch.setattr(runtime, "tick", lambda wait=True: release.wait(30))  # a long pass
    passes = PassThread(runtime, watcher, safety_s=60)
    passes.start()
    try:
        with open(home / fifo_name("fake"), "wb", buffering=0) as fifo:
            fifo.write(b"r")  # what report() at a rung writes (loop/rungsync.py)
        assert passes.wait(10) and passes.take_points()  # while the pass still runs
        assert passes.passes == 0
    finally:
        release.set()
        passes.close()
        watcher.close()


def test_a_deferred_submit_pokes_the_listener_instead_of_running_a_pass(home: Path) -> None:
    runtime = Runtime(home, backend=FakeBackend())
    alone = submit_many(runtime, [SPEC], defer=True)  # nobody listens: its own pass places it
    assert runtime.jobs.job(alone[0])["state"] in ("starting", "running")
    with runtime.watch() as watcher:  # the controller's: its pass thread places what we submit
        ids = submit_many(runtime, [SPEC] * 3, defer=True)
        assert {runtime.jobs.job(j)["state"] for j in ids} == {"queued"} and watcher.wait(0)
        runtime.tick()
        assert {runtime.jobs.job(j)["state"] for j in ids} <= {"starting", "running"}
