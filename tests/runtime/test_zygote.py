"""The home's pre-forked launcher (autoresearch/backends/_zygote.py): supervisors are forked from its
small image when it answers, by the launcher when it does not, and every attempt runs once either way."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from autoresearch.backends import _supervisor, _zygote
from tests.conftest import wait_for


@pytest.fixture(autouse=True)
def _zygote_on(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("AUTORESEARCH_ZYGOTE", raising=False)
    monkeypatch.setattr(_zygote, "stats", {"sent": 0, "taken": 0, "refused": 0})
    yield
    for sock in list(_zygote._conns.values()):  # no connection of ours outlives the test's zygote
        _zygote._drop(sock)


def _start(home: Path, idle: float = 60.0) -> subprocess.Popen[bytes]:
    """A zygote of ``home`` as our child (so the test can kill it), listening."""
    home.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-S", "-E", _zygote.__file__, str(home), str(idle)])
    wait_for(lambda: _zygote.running_pid(home) == proc.pid and (home / _zygote.SOCK).exists(), timeout=30)
    return proc


@pytest.fixture
def zygote(home: Path) -> Iterator[subprocess.Popen[bytes]]:
    proc = _start(home)
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture
def no_spawn(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Launchers start no detached zygote (the test says which one runs); the homes they asked for."""
    asked: list[str] = []
    monkeypatch.setattr(_zygote, "start", asked.append)
    return asked


def _request(home: Path, key: str, command: str, **extra: Any) -> dict[str, Any]:
    run_dir = home / "runs" / key
    run_dir.mkdir(parents=True)
    return {"argv": ["/bin/sh", "-c", command], "sandbox": False, "env": {"PATH": os.environ["PATH"]},
            "members": None, "workdir": str(home), "log_path": str(run_dir / "log"), "run_dir": str(run_dir),
            "timeout": None, "grace": 1.0, "on_exit": None, "wake_fifo": str(home / "wake.fifo"), **extra}


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_the_running_zygote_forks_the_supervisors(api: Any, home: Path, zygote: Any, tmp_path: Path) -> None:
    go = tmp_path / "go"
    job = api.submit({"command": ["/bin/sh", "-c", f"while [ ! -e {go} ]; do sleep 0.05; done"],
                      "workdir": str(tmp_path)}).id
    state = home / "jobs" / str(job) / "attempt-1" / "state.json"
    wait_for(state.exists, timeout=30)
    supervisor = json.loads(state.read_text())["supervisor_pid"]
    assert _ppid(supervisor) == zygote.pid  # not the launcher (this process)
    assert _zygote.stats["taken"] == 1
    go.touch()
    wait_for(lambda: api.status(job).state == "succeeded", timeout=60)


def test_the_zygote_and_its_supervisors_yield_on_wake_and_commands_keep_the_launchers_policy(
        api: Any, home: Path, zygote: Any, tmp_path: Path) -> None:
    """SCHED_BATCH: a request or a child's end wakes them without preempting the loop controller
    that sent it; the command itself runs as SCHED_OTHER, as it would if its launcher forked it."""
    probe = subprocess.run([sys.executable, "-c", "import os; os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))"],
                           capture_output=True)
    if probe.returncode or os.sched_getscheduler(0) != os.SCHED_OTHER:
        pytest.skip("this host lets no process switch to SCHED_BATCH, or runs the tests under another policy")
    seen, go = tmp_path / "policy", tmp_path / "go"
    code = (f"import os, time; open({str(seen)!r}, 'w').write(str(os.sched_getscheduler(0)))\n"
            f"while not os.path.exists({str(go)!r}): time.sleep(0.05)")
    job = api.submit({"command": [sys.executable, "-c", code], "workdir": str(tmp_path)}).id
    state = home / "jobs" / str(job) / "attempt-1" / "state.json"
    wait_for(lambda: state.exists() and seen.exists() and seen.read_text(), timeout=30)
    supervisor = json.loads(state.read_text())["supervisor_pid"]
    assert _ppid(supervisor) == zygote.pid
    assert os.sched_getscheduler(zygote.pid) == os.sched_getscheduler(supervisor) == os.SCHED_BATCH
    assert int(seen.read_text()) == os.SCHED_OTHER == os.sched_getscheduler(0)
    go.touch()
    wait_for(lambda: api.status(job).state == "succeeded", timeout=60)


def test_without_a_zygote_the_launcher_forks_and_starts_one(api: Any, home: Path, tmp_path: Path) -> None:
    """The home's first launch in a while is forked here (a lone CLI submit starts no zygote that would
    only go idle); the next one too, and it starts a zygote for the launches after it."""
    first = api.submit({"command": ["true"], "workdir": str(tmp_path)}).id
    assert _zygote.running_pid(home) is None
    second = api.submit({"command": ["true"], "workdir": str(tmp_path)}).id
    try:
        pid = wait_for(lambda: _zygote.running_pid(home), timeout=30)
        assert _zygote.stats["sent"] == 0  # both forked here
        # The third launch is this process's pass or the pass daemon's, whichever gets there: either
        # way its supervisor is the zygote's child (it waits for `go`, so it is there to be asked).
        go = tmp_path / "go"
        third = api.submit({"command": ["/bin/sh", "-c", f"while [ ! -e {go} ]; do sleep 0.05; done"],
                            "workdir": str(tmp_path)}).id
        state = home / "jobs" / str(third) / "attempt-1" / "state.json"
        wait_for(state.exists, timeout=30)
        assert _ppid(json.loads(state.read_text())["supervisor_pid"]) == pid
        go.touch()
        for job in (first, second, third):
            wait_for(lambda job=job: api.status(job).state == "succeeded", timeout=60)
    finally:
        (tmp_path / "go").touch()  # (a failed assertion must not leave the third job's loop running)
        os.kill(pid, signal.SIGTERM)


def test_off_switch(home: Path, monkeypatch: pytest.MonkeyPatch, no_spawn: list[str]) -> None:
    monkeypatch.setenv("AUTORESEARCH_ZYGOTE", "off")
    home.mkdir(parents=True)
    req = _request(home, "a", "sleep 0.3")
    _supervisor.launch(req)
    state = Path(req["run_dir"]) / "state.json"
    wait_for(state.exists, timeout=30)
    assert _ppid(json.loads(state.read_text())["supervisor_pid"]) == os.getpid()
    assert no_spawn == [] and _zygote.stats["sent"] == 0
    wait_for(lambda: (Path(req["run_dir"]) / "exit.json").exists(), timeout=30)
    _supervisor.reap()


def test_a_zygote_killed_mid_batch_still_runs_every_attempt_exactly_once(home: Path, no_spawn: list[str]) -> None:
    zygote = _start(home)
    ran = home / "ran"
    requests = [_request(home, str(i), f"echo {i} >> {ran}") for i in range(8)]
    try:
        with _supervisor.batch():
            for i, req in enumerate(requests):
                if i == 3:
                    zygote.kill()  # with requests sent and not answered, maybe forked, maybe not
                    zygote.wait()
                _supervisor.launch(req)
    finally:
        zygote.kill()
        zygote.wait()
    for req in requests:
        wait_for(lambda req=req: (Path(req["run_dir"]) / "exit.json").exists(), timeout=30)
    assert sorted(int(line) for line in ran.read_text().split()) == list(range(8))  # each once
    assert _zygote.stats["sent"] >= 3
    # The launches after the kill ask for a new zygote, at the latest the next one after the batch: a
    # send right after the kill may still have gone through, when a supervisor forked a moment before
    # held the zygote's end of our connection until it closed what it inherited (then no answer came,
    # settle() forked that request here and dropped the connection, as for every unanswered one).
    late = _request(home, "8", f"echo 8 >> {ran}")
    _supervisor.launch(late)
    wait_for(lambda: (Path(late["run_dir"]) / "exit.json").exists(), timeout=30)
    assert sorted(int(line) for line in ran.read_text().split()) == list(range(9))
    assert no_spawn == [str(home)] * len(no_spawn) and no_spawn
    _supervisor.reap()


def test_threads_and_forks_of_a_launcher_do_not_share_its_connection(home: Path, zygote: Any,
                                                                   no_spawn: list[str]) -> None:
    """Two threads launching at once each read their own answers; a forked child of a launcher opens
    its own connection (its parent's stays usable)."""
    import threading

    ran = home / "ran"
    requests = [_request(home, str(i), f"echo {i} >> {ran}") for i in range(12)]

    def launch_half(part: list[dict[str, Any]]) -> None:
        with _supervisor.batch():
            for req in part:
                _supervisor.launch(req)

    threads = [threading.Thread(target=launch_half, args=(requests[i::2],)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    _supervisor.launch(_request(home, "parent", f"echo 100 >> {ran}"))  # our connection: this thread's
    child = os.fork()
    if child == 0:
        try:
            _supervisor.launch(_request(home, "child", f"echo 101 >> {ran}"))
            os._exit(0 if _zygote.stats["taken"] == 14 and _zygote.stats["refused"] == 0 else 3)
        finally:
            os._exit(4)
    assert os.waitpid(child, 0)[1] == 0
    _supervisor.launch(_request(home, "after", f"echo 102 >> {ran}"))  # the parent's connection still works
    assert _zygote.stats["taken"] == 14 and _zygote.stats["refused"] == 0
    wait_for(lambda: ran.exists() and len(ran.read_text().split()) == 15, timeout=30)
    assert sorted(int(x) for x in ran.read_text().split()) == [*range(12), 100, 101, 102]


def test_a_second_supervisor_of_one_attempt_runs_nothing(home: Path) -> None:
    """A launcher that forks a supervisor itself after its zygote forked one but died before it answered."""
    home.mkdir(parents=True)
    ran = home / "ran"
    req = _request(home, "a", f"echo x >> {ran}")
    _supervisor._fork(req)
    _supervisor._fork(req)
    wait_for(lambda: (Path(req["run_dir"]) / "exit.json").exists(), timeout=30)
    wait_for(lambda: not _supervisor._children or (_supervisor.reap() or not _supervisor._children), timeout=30)
    assert ran.read_text() == "x\n"


def test_a_supervisor_forked_by_a_launcher_with_its_standard_descriptors_closed_still_logs(home: Path) -> None:
    """The log is the supervisor's claim and its first file; it must not land on 0-2 (a daemon's launcher
    may have them closed), where the /dev/null meant for the supervisor's own would replace it."""
    home.mkdir(parents=True)
    req = _request(home, "a", "echo into-the-log; echo and-its-errors >&2")
    code = ("import json, os, sys\n"
            "from autoresearch.backends import _supervisor\n"
            "req = json.loads(sys.argv[1])\n"
            "for fd in (0, 1, 2):\n"
            "    os.close(fd)\n"
            "_supervisor.attempt(req)\n")
    subprocess.run([sys.executable, "-c", code, json.dumps(req)], timeout=60, check=True)
    assert json.loads((Path(req["run_dir"]) / "exit.json").read_text())["exit_code"] == 0
    assert Path(req["log_path"]).read_text().split() == ["into-the-log", "and-its-errors"]


def test_the_hook_runs_in_the_launchers_environment(home: Path, monkeypatch: pytest.MonkeyPatch,
                                                    no_spawn: list[str]) -> None:
    """on_exit is exec'd in the environment of the process that launched the attempt, as when it forked
    the supervisor itself: not the zygote's (started by another process) nor the command's."""
    zygote = _start(home)  # started without ZYG_MARK
    monkeypatch.setenv("ZYG_MARK", "launcher")
    out = home / "hook.out"
    req = _request(home, "a", "true", on_exit=["/bin/sh", "-c", f"echo ${{ZYG_MARK:-none}} $PATH > {out}"])
    try:
        _supervisor.launch(req)
        assert _zygote.stats["taken"] == 1
        wait_for(lambda: out.exists() and out.read_text().strip(), timeout=30)  # nobody listens: the hook runs
        assert out.read_text().split() == ["launcher", os.environ["PATH"]]
    finally:
        zygote.kill()
        zygote.wait()


def _frame(payload: bytes, version: bytes = _zygote.VERSION) -> bytes:
    return _zygote._HEAD.pack(len(payload), version) + payload


def _answer(sock: socket.socket) -> int:
    return int(_zygote._ACK.unpack(_zygote._recv_exact(sock, _zygote._ACK.size))[0])


def test_garbage_on_the_socket_runs_nothing_and_the_zygote_lives_on(home: Path, zygote: Any,
                                                                    no_spawn: list[str]) -> None:
    marker = home / "ran"
    good = _request(home, "good", f"touch {marker}")
    bad = {**good, "timeout": "soon", "umask": 0o22, "environ": {}, "environ_drop": []}
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(str(home / _zygote.SOCK))
    sock.sendall(_frame(json.dumps(good).encode(), version=b"x" * 16))  # another version's: refused
    assert _answer(sock) == -1
    for payload in (b"\xff\x00garbage", b"[1, 2]", b"{" * 100_000, json.dumps(bad).encode(),
                    json.dumps({**bad, "timeout": None, "run_dir": "../../etc"}).encode()):
        sock.sendall(_frame(payload))
        assert _answer(sock) != 0  # (a child that parsed it and left without running anything)
    sock.sendall(struct.pack("!I", 1 << 30) + b"y" * 16)  # a frame too big: the connection ends
    assert sock.recv(4) == b""
    sock.close()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:  # bytes, then gone mid-frame
        raw.connect(str(home / _zygote.SOCK))
        raw.sendall(b"\x00\x00")
    assert zygote.poll() is None
    assert not marker.exists() and not (home / "runs" / "good" / "log").exists()  # (its claim: nobody made it)
    _supervisor.launch(_request(home, "after", f"touch {marker}"))  # and it still launches
    assert _zygote.stats["taken"] == 1
    wait_for(marker.exists, timeout=30)


def test_the_zygote_leaves_when_idle_and_when_its_home_is_gone(tmp_path: Path) -> None:
    idle = _start(tmp_path / "a", idle=0.2)
    assert idle.wait(timeout=30) == 0
    assert not (tmp_path / "a" / _zygote.SOCK).exists()
    gone = _start(tmp_path / "b")
    shutil.rmtree(tmp_path / "b")
    assert gone.wait(timeout=30) == 0


def test_a_second_zygote_of_a_home_leaves_at_once_and_bad_arguments_are_refused(home: Path, zygote: Any) -> None:
    second = subprocess.run([sys.executable, "-S", "-E", _zygote.__file__, str(home)], timeout=30)
    assert second.returncode == 0 and _zygote.running_pid(home) == zygote.pid
    bad = subprocess.run([sys.executable, "-S", "-E", _zygote.__file__, "relative/home"], capture_output=True,
                         text=True, timeout=30)
    assert bad.returncode == 2 and "usage" in bad.stderr and "Traceback" not in bad.stderr
    gone = subprocess.run([sys.executable, "-S", "-E", _zygote.__file__, str(home / "nowhere")], capture_output=True,
                          text=True, timeout=30)
    assert gone.returncode == 1 and "cannot use home" in gone.stderr and "Traceback" not in gone.stderr


# -- supervisors that take another request ---------------------------------------------------------

def _supervisor_of(req: dict[str, Any]) -> int:
    state = Path(req["run_dir"]) / "state.json"
    wait_for(state.exists, timeout=30)
    return int(json.loads(state.read_text())["supervisor_pid"])


def _free(pid: int) -> None:
    """Wait until the supervisor ``pid`` finished its attempt and told the zygote it is free (it moves
    to / just before it says so; the zygote reads it at once)."""
    wait_for(lambda: os.readlink(f"/proc/{pid}/cwd") == "/", timeout=30)
    time.sleep(0.2)


def _exit(req: dict[str, Any]) -> dict[str, Any]:
    done = Path(req["run_dir"]) / "exit.json"
    wait_for(done.exists, timeout=30)
    return dict(json.loads(done.read_text()))


def test_a_supervisor_whose_attempt_ended_runs_the_next_one_in_that_ones_own_settings(
        home: Path, zygote: Any, no_spawn: list[str], tmp_path: Path) -> None:
    """No fork per attempt once supervisors are free (their fork and copy-on-write faults were most of
    their CPU): the next request goes to one whose attempt ended and was recorded, and it runs in its
    own workdir, environment and umask, with nothing left of the last one's."""
    other = tmp_path / "elsewhere"
    other.mkdir()
    first = _request(home, "a", "pwd > out; echo ${MARK:-none} >> out; touch made; exit 3",
                     env={"PATH": os.environ["PATH"], "MARK": "first"})
    mask = os.umask(0o077)  # the launcher's umask travels with its request
    try:
        _supervisor.launch(first)
    finally:
        os.umask(mask)
    pid = _supervisor_of(first)
    assert _exit(first)["exit_code"] == 3
    _free(pid)
    second = _request(home, "b", "pwd > out; echo ${MARK:-none} >> out; touch made", workdir=str(other))
    mask = os.umask(0o022)
    try:
        _supervisor.launch(second)
    finally:
        os.umask(mask)
    assert _supervisor_of(second) == pid and _ppid(pid) == zygote.pid  # the same process, the zygote's child
    done = _exit(second)
    assert done["exit_code"] == 0 and not done["stopped"]
    assert (home / "out").read_text().split() == [str(home), "first"]
    assert (other / "out").read_text().split() == [str(other), "none"]  # MARK was the first one's only
    assert (home / "made").stat().st_mode & 0o777 == 0o600  # each request's umask
    assert (other / "made").stat().st_mode & 0o777 == 0o644
    assert _zygote.stats["taken"] == 2


def _next(home: Path, pid: int, key: str, command: str) -> dict[str, Any]:
    """Launch ``command`` once the supervisor ``pid`` is free: it runs it."""
    _free(pid)
    req = _request(home, key, command)
    _supervisor.launch(req)
    assert _supervisor_of(req) == pid
    return req


def test_a_stop_meant_for_an_attempt_that_just_ended_does_not_stop_a_later_one(home: Path, zygote: Any,
                                                                                no_spawn: list[str]) -> None:
    """stop() read the state.json of an attempt that ended right after: its SIGTERM reaches the process
    while it runs a later attempt (here two later), which has no stop.json of its own. A stop of the
    attempt it runs stops it, and so does a SIGTERM that no stop() sent (a person's kill)."""
    first = _request(home, "a", "true")
    _supervisor.launch(first)
    pid = _supervisor_of(first)
    _exit(first)
    _exit(_next(home, pid, "b", "true"))
    go = home / "go"
    third = _next(home, pid, "c", f"while [ ! -e {go} ]; do sleep 0.05; done")
    _supervisor.write_json(str(Path(first["run_dir"]) / _supervisor.STOP), {"requested_at": time.time()})
    os.kill(pid, signal.SIGTERM)  # the late stop of the first
    time.sleep(0.5)
    assert not (Path(third["run_dir"]) / "exit.json").exists()  # still running
    go.touch()
    done = _exit(third)
    assert done["exit_code"] == 0 and not done["stopped"]
    stopped = _next(home, pid, "d", "sleep 30")
    from autoresearch.backends._local import LocalBackend

    LocalBackend().stop(stopped["run_dir"], grace=1)
    done = _exit(stopped)
    assert done["stopped"] and done["signal"] == signal.SIGTERM
    os.utime(Path(first["run_dir"]) / _supervisor.STOP, (0, 0))  # long ago: no stop is on its way
    os.utime(Path(stopped["run_dir"]) / _supervisor.STOP, (0, 0))
    killed = _next(home, pid, "e", "sleep 30")
    os.kill(pid, signal.SIGTERM)  # nobody's stop(): it stops the attempt, as with a supervisor of one
    done = _exit(killed)
    assert done["stopped"] and done["signal"] == signal.SIGTERM


def test_free_supervisors_leave_with_the_zygote(home: Path, no_spawn: list[str]) -> None:
    zygote = _start(home)
    try:
        req = _request(home, "a", "true")
        _supervisor.launch(req)
        pid = _supervisor_of(req)
        _exit(req)
        _free(pid)
    finally:
        zygote.terminate()
        zygote.wait()
    wait_for(lambda: not _supervisor.is_alive(pid, None), timeout=30)


def test_the_zygote_keeps_at_most_max_idle_free_supervisors_and_drops_those_that_leave() -> None:
    import select

    poller = select.poll()
    pool = _zygote._Pool(poller)
    pairs = [socket.socketpair() for _ in range(_zygote.MAX_IDLE + 2)]
    for i, (ours, _) in enumerate(pairs):
        pool.add(ours, 1000 + i)
    for ours, theirs in pairs:
        theirs.sendall(b"R")
        pool.event(ours.fileno())
    assert len(pool.idle) == _zygote.MAX_IDLE and len(pool.socks) == _zygote.MAX_IDLE
    assert pairs[-1][1].recv(8) == b""  # a spare one reads the end of its socket: it leaves
    last = pool.idle[-1]
    gone = next(theirs for ours, theirs in pairs if ours.fileno() == last)
    gone.close()  # the readiest one left (killed): handing to it fails, the next one gets it
    assert pool.hand(b"{}") == 1000 + _zygote.MAX_IDLE - 2
    taker = pairs[_zygote.MAX_IDLE - 2][1]
    assert taker.recv(64) == _zygote._LEN.pack(2) + b"{}"
    pool.close()
    assert not pool.socks and not pool.idle
    for _, theirs in pairs:
        theirs.close()


def test_a_supervisor_says_it_is_free_only_while_it_would_take_the_request(
        home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The protocol of a forked supervisor and its zygote, played here: it says ``R`` when an attempt
    is over, runs the request it is handed, and after ``MAX_USES`` attempts leaves without saying it
    (a request handed to it then would be lost)."""
    home.mkdir(parents=True)
    monkeypatch.setattr(_zygote, "MAX_USES", 2)
    ran = home / "ran"
    payloads = [json.dumps({**_request(home, str(i), f"echo {i} >> {ran}"), "umask": 0o077, "environ": {},
                            "environ_drop": []}).encode() for i in range(2)]
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        try:
            ours.close()
            _zygote._supervise(payloads[0], theirs.detach(), _supervisor)
        finally:
            os._exit(70)
    theirs.close()
    ours.settimeout(30)
    assert ours.recv(8) == b"R"
    ours.sendall(_zygote._LEN.pack(len(payloads[1])) + payloads[1])
    assert ours.recv(8) == b""  # its second and last: it leaves, and says nothing
    assert os.waitpid(pid, 0)[1] == 0
    assert ran.read_text().split() == ["0", "1"]


def test_the_version_changes_with_each_of_its_files(monkeypatch: pytest.MonkeyPatch) -> None:
    """A zygote refuses requests of other code: a change to any of the files it runs is another
    version (it was the last 16 characters of the stamps: the last file's alone)."""
    import types

    real = os.stat
    seen = {}
    for changed in (None, "_zygote.py", "_supervisor.py", "_rootbox.py"):
        def fake(path: Any, *args: Any, changed: str | None = changed, **kwargs: Any) -> Any:
            st = real(path, *args, **kwargs)
            if changed is not None and str(path).endswith("/" + changed):
                return types.SimpleNamespace(st_mtime_ns=st.st_mtime_ns + 1, st_size=st.st_size)
            return st

        monkeypatch.setattr(os, "stat", fake)
        seen[changed] = _zygote._version()
        monkeypatch.setattr(os, "stat", real)
    assert len(set(seen.values())) == 4 and all(len(v) == 16 for v in seen.values()), seen
