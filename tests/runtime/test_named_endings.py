"""A pass told which attempts ended (their supervisors' pokes name them) polls those and the
starting ones, not every running attempt; a whole pass still finds the others (issue 16)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from autoresearch.api import Api
from autoresearch.backends.fake import FakeBackend
from autoresearch.watcher import Watcher
from tests.conftest import wait_for


def _polled(monkeypatch: pytest.MonkeyPatch, fake: FakeBackend) -> list[str]:
    seen: list[str] = []
    real = fake.poll

    def poll(external_id: str) -> object:
        seen.append(external_id)
        return real(external_id)

    monkeypatch.setattr(fake, "poll", poll)
    return seen


def test_a_named_pass_polls_the_named_attempts_and_the_starting_ones(home: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeBackend(gpus=8)
    api = Api(home, backend=fake)
    spec = {"command": ["train"], "workdir": os.getcwd()}
    a, b, c = (int(api.submit(spec).id) for _ in range(3))
    api._runtime.tick()  # all three running now
    assert [api.status(j).state for j in (a, b, c)] == ["running"] * 3
    d = int(api.submit(spec).id)  # its pass launched it after reconciling: starting, never polled
    assert api._ledger.one("SELECT state FROM attempts WHERE job_id=?", (d,))["state"] == "starting"
    fake.finish(f"{a}.1", 0)
    fake.finish(f"{b}.1", 0)
    seen = _polled(monkeypatch, fake)
    assert api._runtime.tick(only={(a, 1)})
    assert sorted(seen) == sorted([f"fake:{a}.1", f"fake:{d}.1"])  # not b (it ended, but nobody said so yet), not c
    rows = {r["id"]: r["state"] for r in api._ledger.query("SELECT id, state FROM jobs")}
    assert (rows[a], rows[b], rows[c]) == ("succeeded", "running", "running")
    seen.clear()
    assert api._runtime.tick()  # a whole pass: every active attempt
    assert sorted(seen) == sorted([f"fake:{b}.1", f"fake:{c}.1", f"fake:{d}.1"])
    rows = {r["id"]: r["state"] for r in api._ledger.query("SELECT id, state FROM jobs")}
    assert (rows[b], rows[c], rows[d]) == ("succeeded", "running", "running")


def test_a_local_supervisor_names_its_attempt_in_its_poke(home: Path, tmp_path: Path) -> None:
    """Through the zygote or not, the supervisor of attempt 1 of job J pokes ``eJ.1``."""
    api = Api(home)
    with Watcher(api._ledger.home) as watcher:  # a listener: supervisors poke it instead of running the pass
        job = int(api.submit({"command": ["true"], "workdir": str(tmp_path)}).id)
        heard: set[tuple[int, int]] = set()

        def named() -> bool:
            if watcher.wait(0.2):
                heard.update(watcher.take() or ())
            return (job, 1) in heard

        wait_for(named, timeout=30)
        api._runtime.tick(only=heard)
        assert api.status(job).state == "succeeded"
