"""The pass daemon (autoresearch/engine/passd.py): endings run their pass in one long-lived process per
home instead of a fresh interpreter each, and nothing depends on it staying alive (invariant 1)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from autoresearch.backends._supervisor import is_alive
from autoresearch.engine import passd
from tests.conftest import wait_for


@pytest.fixture(autouse=True)
def _daemon_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AUTORESEARCH_PASSD", raising=False)


@pytest.fixture
def stop_daemon(home: Path) -> Any:
    yield
    pid = passd.running_pid(home)
    if pid:
        os.kill(pid, signal.SIGTERM)


def submit(api: Any, command: str) -> int:
    return int(api.submit({"command": ["/bin/sh", "-c", command], "workdir": os.getcwd()}).id)


def hooks_run(home: Path, job: int) -> bool:
    """Whether an attempt of ``job`` ran its pass in a fresh interpreter (the on-exit hook's log)."""
    return any((home / "jobs" / str(job)).glob("attempt-*/on_exit.log"))


def test_endings_run_their_pass_in_the_daemon_not_in_a_fresh_interpreter(api: Any, home: Path,
                                                                          stop_daemon: Any) -> None:
    go = home.parent / "go"
    holder = submit(api, f"while [ ! -e {go} ]; do sleep 0.05; done")  # keeps the daemon busy (not idle)
    assert wait_for(lambda: passd.running_pid(home), timeout=30)  # it listens
    jobs = [submit(api, "true") for _ in range(6)]
    for job in jobs:  # nobody reads: the daemon alone records the endings
        wait_for(lambda job=job: api.status(job, refresh=False).state == "succeeded", timeout=60)
    go.touch()
    wait_for(lambda: api.status(holder, refresh=False).state == "succeeded", timeout=60)
    assert not any(hooks_run(home, job) for job in [holder, *jobs])


def test_the_first_wave_of_a_batch_waits_for_the_daemon_its_submit_started(api: Any, home: Path,
                                                                            stop_daemon: Any) -> None:
    """No daemon runs: the submit starts one before its pass launches the batch, and the jobs that
    end before it listens wait for it instead of each running the pass in a fresh interpreter (~130 ms
    of CPU each: the first wave of a big array of short jobs, dozens at once)."""
    assert passd.running_pid(home) is None
    jobs = [int(v.id) for v in api.submit_many([{"command": ["true"], "workdir": os.getcwd()}] * 6)]
    for job in jobs:  # nobody reads: the daemon records the endings
        wait_for(lambda job=job: api.status(job, refresh=False).state == "succeeded", timeout=60)
    assert not [job for job in jobs if hooks_run(home, job)]
    from autoresearch.backends import _supervisor

    assert _supervisor.DAEMON_GRACE_S == passd.SPAWN_GRACE_S  # (the supervisor cannot import passd)


def test_a_killed_daemon_leaves_endings_to_the_supervisors(api: Any, home: Path, stop_daemon: Any) -> None:
    go = home.parent / "go"
    job = submit(api, f"while [ ! -e {go} ]; do sleep 0.05; done")
    pid = wait_for(lambda: passd.running_pid(home), timeout=30)
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: passd.running_pid(home) is None, timeout=30)
    go.touch()
    wait_for(lambda: api.status(job, refresh=False).state == "succeeded", timeout=60)  # no read ran a pass
    assert hooks_run(home, job)  # its supervisor found nobody listening and ran the pass itself


def test_an_ending_nobody_heard_starts_a_daemon_for_the_endings_still_to_come(api: Any, home: Path,
                                                                               stop_daemon: Any) -> None:
    go1, go2 = home.parent / "go1", home.parent / "go2"
    first, second = (int(view.id) for view in api.submit_many(  # one submit: one daemon started
        [{"command": ["/bin/sh", "-c", f"while [ ! -e {go} ]; do sleep 0.05; done"], "workdir": os.getcwd()}
         for go in (go1, go2)]))
    pid = wait_for(lambda: passd.running_pid(home), timeout=30)
    os.kill(pid, signal.SIGKILL)  # a daemon killed (out of memory, by hand) while both run
    wait_for(lambda: passd.running_pid(home) is None, timeout=30)
    (home / "passd.wake.fifo.started").unlink()  # (as if it had run for a while: see the next test)
    go1.touch()
    wait_for(lambda: api.status(first, refresh=False).state == "succeeded", timeout=60)
    assert hooks_run(home, first)  # nobody listened: its supervisor ran the pass itself ...
    assert wait_for(lambda: passd.running_pid(home), timeout=30)  # ... and, the second still running, a daemon
    go2.touch()
    wait_for(lambda: api.status(second, refresh=False).state == "succeeded", timeout=60)
    assert not hooks_run(home, second)  # its ending was heard


def test_a_daemon_still_starting_is_not_started_again(api: Any, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Endings that nobody heard, all at once, each ask for a daemon; it takes its lock only once its
    imports are done, so without a grace every one of them would start one (all but one exiting)."""
    from autoresearch.backends import _supervisor

    started: list[list[str]] = []
    monkeypatch.setattr(_supervisor, "spawn_detached", lambda argv, log, cwd="/", wait=True: started.append(argv))
    assert passd.ensure(api._runtime)
    assert not passd.ensure(api._runtime) and not passd.ensure(api._runtime)
    assert len(started) == 1
    stamp = home / "passd.wake.fifo.started"
    os.utime(stamp, (0, time.time() - passd.SPAWN_GRACE_S - 1))  # it never came up: a later one may try again
    assert passd.ensure(api._runtime) and len(started) == 2


def test_the_daemon_makes_way_for_a_listening_loop_or_server(api: Any, home: Path) -> None:
    submit(api, "true")
    pid = wait_for(lambda: passd.running_pid(home), timeout=30)
    with api.watch():  # a loop's or a server's watcher: they run the pass themselves
        wait_for(lambda: passd.running_pid(home) is None, timeout=30)
        wait_for(lambda: not is_alive(pid, None), timeout=30)
        assert not passd.ensure(api._runtime)  # a submit starts none while somebody listens


def test_the_daemon_exits_when_idle_and_a_second_one_does_nothing(home: Path) -> None:
    from autoresearch.api import Api

    Api(home)  # the ledger exists
    assert passd.serve(str(home), "local", idle_s=0.0) == 0  # nothing queued or running: it exits at once
    assert passd.running_pid(home) is None


def test_no_daemon_for_backends_whose_attempts_poke_nobody(home: Path) -> None:
    from autoresearch.api import Api
    from autoresearch.backends.fake import FakeBackend

    api = Api(home, backend=FakeBackend(gpus=1))
    api.submit({"command": ["train"], "workdir": os.getcwd()})
    assert passd.running_pid(home, "fake") is None  # its attempts live in this process's memory


def test_off_switch(api: Any, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTORESEARCH_PASSD", "off")
    assert not passd.ensure(api._runtime)


def test_bad_arguments_are_refused_with_usage(home: Path) -> None:
    import subprocess

    out = subprocess.run([sys.executable, "-m", "autoresearch.engine.passd", "--home", str(home), "--idle", "nan?"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "usage" in out.stderr and "Traceback" not in out.stderr


def test_a_busy_listener_gets_more_than_three_seconds_and_a_gone_one_does_not(api: Any, home: Path) -> None:
    """A listener that lives but has not run its pass yet (a daemon placing dozens on a loaded
    machine) is waited for: no stampede of pass interpreters after the old fixed 3 s. One that
    goes away unacknowledged is not: the supervisor runs the pass itself."""
    import time

    watcher = api.watch()  # listens, and runs no pass until we say so
    job = submit(api, "true")
    wait_for(lambda: (home / "jobs" / str(job) / "attempt-1" / "exit.json").exists(), timeout=60)  # it ended, poked
    time.sleep(4.0)
    assert not hooks_run(home, job)  # still waiting for us, past the old ACK_WAIT_S
    watcher.close()  # gone without recording the ending
    wait_for(lambda: hooks_run(home, job), timeout=30)
    wait_for(lambda: api.status(job, refresh=False).state == "succeeded", timeout=60)


def test_a_job_that_cannot_start_does_not_keep_the_daemon_alive(api: Any, home: Path, stop_daemon: Any) -> None:
    """A queued job starts only after an ending (which pokes whoever listens) or at a submit (which
    runs its own pass): with nothing starting or running the daemon has nothing to do and exits.
    It used to count queued jobs as busy and idled forever beside a job no node could take."""
    holder = submit(api, "sleep 1")  # starts the daemon (the submit's pass ensures one)
    wait_for(lambda: passd.running_pid(home) is not None, timeout=30)
    api.cordon(api.nodes()[0].name, reason="maintenance")  # the only node: the job below queues
    job = api.submit({"command": ["true"], "gpus": 1}).id
    assert api.status(job).state == "queued"
    wait_for(lambda: api.status(holder).state == "succeeded", timeout=60)
    wait_for(lambda: passd.running_pid(home) is None, timeout=60)  # idle (10 s) once nothing runs
    assert api.status(job).state == "queued"


def test_the_daemon_and_the_syncer_start_through_one_detaching_helper(api: Any, home: Path, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from autoresearch.backends import _supervisor
    from autoresearch.store import outbox

    probe = tmp_path / "probe.log"
    _supervisor.spawn_detached([sys.executable, "-c", "import os, sys; sys.stderr.write("
                                "f'{os.getppid()} {os.getsid(0)} {os.getcwd()}')"], probe)
    text = wait_for(lambda: probe.exists() and probe.read_text(), timeout=30)
    ppid, sid, cwd = text.split(" ", 2)
    assert int(ppid) != os.getpid() and int(sid) != os.getsid(0) and cwd == "/"  # nobody's child, its own session

    # wait=False: it returns before the intermediate child is reaped; a thread reaps it (no zombie left)
    probe2 = tmp_path / "probe2.log"
    middle = _supervisor.spawn_detached([sys.executable, "-c", "import os, sys; sys.stderr.write("
                                         "f'{os.getsid(0)} {os.nice(0)}')"], probe2, cwd=None, wait=False, nice=3)
    sid, niceness = wait_for(lambda: probe2.exists() and probe2.read_text(), timeout=30).split()
    assert int(sid) != os.getsid(0) and int(niceness) == min(19, os.nice(0) + 3)

    def reaped() -> bool:
        try:
            os.waitpid(middle, os.WNOHANG)  # (0, 0) while it runs; (pid, status) had the thread not reaped it
        except ChildProcessError:
            return True
        return False

    wait_for(reaped, timeout=30)  # the thread reaped it: no zombie left

    started: list[list[str]] = []
    monkeypatch.setattr(_supervisor, "spawn_detached",
                        lambda argv, log, cwd="/", wait=True, nice=0: started.append([*argv, f"nice={nice}"]))
    monkeypatch.setenv("AUTORESEARCH_SYNC", "on")
    monkeypatch.delenv("AUTORESEARCH_TRACKING", raising=False)
    assert passd.ensure(api._runtime) and outbox.kick(home)
    assert [argv[2] for argv in started] == ["autoresearch.engine.passd", "autoresearch.tracking"]
    assert [argv[-1] for argv in started] == ["nice=0", f"nice={outbox.SYNCER_NICE}"]  # the mirror runs niced


def test_an_ending_waits_for_a_starting_daemon_only_within_its_grace(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import threading
    import types

    from autoresearch.backends import _supervisor as S

    fifo = tmp_path / "wake.fifo"
    os.mkfifo(fifo)
    stamp = tmp_path / "passd.wake.fifo.started"
    now = time.time()
    clock = {"t": now, "slept": 0.0}  # the supervisor's clock, simulated: a loaded machine cannot stretch a wait

    def sleep(seconds: float) -> None:
        clock["t"] += seconds
        clock["slept"] += seconds

    monkeypatch.setattr(S, "time", types.SimpleNamespace(time=lambda: clock["t"], sleep=sleep))
    for mtime in (None, now + 3600, now - S.DAEMON_GRACE_S - 1):  # none started; a stamp from the future; long ago
        if mtime is not None:
            stamp.touch()
            os.utime(stamp, (mtime, mtime))
        assert not S._poke_starting(str(fifo), "1.1") and clock["slept"] == 0  # no wait at all
    os.utime(stamp, (now - S.DAEMON_GRACE_S + 0.3,) * 2)  # started a moment ago and never listens
    assert not S._poke_starting(str(fifo), "1.1")
    assert 0.3 <= clock["slept"] <= 0.3 + 2 * S.DAEMON_LOOK_S  # the rest of the grace, not more
    # Past the grace, a daemon still importing on a loaded host (its pid in the stamp, alive) is waited
    # for, up to DAEMON_START_MAX_S from its start; one whose pid is gone, or none written, is not.
    dead = subprocess.Popen(["true"])
    dead.wait()
    for said, waits in ((f"{os.getpid()}\n", True), (f"{dead.pid}\n", False), ("", False), ("junk\x00", False)):
        stamp.write_text(said)
        os.utime(stamp, (clock["t"] - S.DAEMON_GRACE_S - 1,) * 2)
        clock["slept"] = 0.0
        assert not S._poke_starting(str(fifo), "1.1")
        rest = S.DAEMON_START_MAX_S - S.DAEMON_GRACE_S - 1
        assert (rest <= clock["slept"] <= rest + 2 * S.DAEMON_LOOK_S) if waits else clock["slept"] == 0, (said, clock)
    stamp.write_text("")
    monkeypatch.undo()
    monkeypatch.setattr(S, "DAEMON_GRACE_S", 120.0)  # a real wait: it ends when the daemon listens
    os.utime(stamp)  # just started; it listens 0.3 s later
    got: list[bytes] = []

    def listen() -> None:
        time.sleep(0.3)
        fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        deadline = time.monotonic() + 120
        while not got and time.monotonic() < deadline:
            try:
                data = os.read(fd, 64)
            except BlockingIOError:
                data = b""
            if data:
                got.append(data)
            time.sleep(0.01)
        os.close(fd)

    reader = threading.Thread(target=listen)
    reader.start()
    assert S._poke_starting(str(fifo), "7.2")
    reader.join()
    assert got == [b"\ne7.2\n"]  # the ending, handed to it
