"""A hostile tenant (docs/security.md): each test is an attack a tenant's job tried, and what must
hold. Run as root in CI (the server as root is the case that matters most): the job must be an
unprivileged uid with no capability, whatever the server's uid; a test that needs root says so."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_for, wait_state

ROOT = os.geteuid() == 0
# Tenant jobs run in bubblewrap: without it there is no sandbox to attack (.ci/run installs it)
pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap: apt-get install bubblewrap")
root_only = pytest.mark.skipif(not ROOT, reason="the attack needs the server to run as root")
SECRET_TEXT = "team-b-private-log-8841"


@pytest.fixture
def base() -> Iterator[Path]:
    """A folder outside /tmp: the sandbox's private /tmp would hide a home under /tmp from the job
    whatever else held, and these attacks must meet the masks themselves."""
    path = Path(tempfile.mkdtemp(prefix="autoresearch-attack-", dir="/var/tmp" if os.path.isdir("/var/tmp") else None))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def home(base: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = base / "home"
    monkeypatch.setenv("AUTORESEARCH_HOME", str(path))
    monkeypatch.setenv("AUTORESEARCH_GPUS", "2")
    monkeypatch.delenv("AUTORESEARCH_BACKEND", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return path


def _tenant(api: Any, *projects: str, hide: tuple[str, ...] = ()) -> None:
    from autoresearch.engine import isolation

    with api._ledger.tx() as c:
        for project in projects:
            isolation.register_tenant(c, project, isolation.tenant_policy(list(hide)))


def _run(api: Any, home: Path, script: str, project: str = "team-a", wait_s: float = 60,
         **spec: Any) -> tuple[Any, str]:
    job = api.submit({"command": ["sh", "-c", script], "max_retries": 0, **spec}, project=project)
    view = wait_state(api, job.id, ("succeeded", "failed"), timeout=wait_s)
    return view, (home / "jobs" / str(job.id) / "attempt-1.log").read_text(errors="replace")


LAUNCHER_VARS = ("LD_PRELOAD", "LD_AUDIT", "LD_LIBRARY_PATH", "GCONV_PATH", "PYTHONSTARTUP", "BASH_ENV")


def test_the_jobs_environment_reaches_no_program_that_runs_before_its_sandbox(
        api: Any, home: Path, tmp_path: Path) -> None:
    """LD_DEBUG_OUTPUT makes every dynamically linked program that gets the variable write a file
    there: a program outside the sandbox (bwrap, as the server's uid) could write it, the job
    inside cannot (the folder is not in its view). With the job's env, bwrap itself wrote it."""
    outside = tmp_path / "outside"
    outside.mkdir()
    _tenant(api, "team-a")
    env = {"LD_DEBUG": "libs", "LD_DEBUG_OUTPUT": str(outside / "dbg"), "LD_PRELOAD": "/nonexistent/evil.so",
           "LD_AUDIT": "/nonexistent/audit.so", "LD_LIBRARY_PATH": str(outside), "GCONV_PATH": str(outside),
           "PYTHONSTARTUP": str(outside / "startup.py"), "BASH_ENV": str(outside / "bash_env")}
    view, log = _run(api, home, "env; echo ran", env=env)
    assert view.state == "succeeded" and "ran" in log, log
    assert sorted(p.name for p in outside.iterdir()) == [], log  # nothing outside read the job's variables
    for name in LAUNCHER_VARS:  # the job itself still gets its own environment
        assert f"{name}={env[name]}" in log, (name, log)


PRELOAD_C = r"""
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
__attribute__((constructor)) static void grab(void) {
    char exe[512] = {0};
    if (readlink("/proc/self/exe", exe, sizeof exe - 1) < 0) return;
    const char *name = strrchr(exe, '/');
    const char *dir = getenv("GRAB_DIR"), *tokens = getenv("GRAB_TOKENS");
    if (!name || !dir || !tokens) return;
    char path[1024];
    strcpy(path, dir); strcat(path, name);
    int in = open(tokens, O_RDONLY), out = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    char buf[4096]; ssize_t n;
    if (out >= 0 && in >= 0) while ((n = read(in, buf, sizeof buf)) > 0) write(out, buf, n);
}
"""


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler to build the preloaded library")
def test_a_preloaded_library_of_the_job_never_runs_outside_its_sandbox(api: Any, home: Path, tmp_path: Path) -> None:
    """The attack as observed: a library named in the job's LD_PRELOAD copied the tokens file where
    the tenant could read it. It may load into the job's own programs, never into bwrap/setpriv."""
    source, lib = tmp_path / "grab.c", tmp_path / "lib" / "grab.so"
    lib.parent.mkdir()
    lib.parent.chmod(0o755)
    source.write_text(PRELOAD_C)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(source)], check=True, capture_output=True)
    lib.chmod(0o755)
    loot = tmp_path / "loot"
    loot.mkdir()
    loot.chmod(0o777)
    tokens = tmp_path / "tokens"
    tokens.write_text("server-token-0123456789abcdef team-b\n")
    _tenant(api, "team-a", hide=(str(tokens),))
    # (the library lies outside the tenant's places, so the sandbox does not show it to the job: what is
    # tested is the launcher, which runs outside with the host's files, and loaded it on main)
    view, log = _run(api, home, "echo ran", env={"LD_PRELOAD": str(lib), "GRAB_DIR": str(loot),
                                                  "GRAB_TOKENS": str(tokens)})
    assert view.state == "succeeded" and "ran" in log, log
    assert [p.name for p in loot.iterdir()] == [], log


def _status(log: str, field: str) -> str:
    return next(line.split(":", 1)[1].strip() for line in log.splitlines() if line.startswith(f"{field}:"))


def test_a_tenant_job_has_no_capability_and_an_unprivileged_uid(api: Any, home: Path) -> None:
    _tenant(api, "team-a")
    view, log = _run(api, home, "cat /proc/self/status; echo map; cat /proc/self/uid_map; echo groups; id -G")
    assert view.state == "succeeded", log
    for field in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(_status(log, field), 16) == 0, (field, log)
    assert _status(log, "NoNewPrivs") == "1", log
    uid_map = log.split("map\n", 1)[1].split("groups", 1)[0].split()
    assert len(uid_map) == 3, log  # a user namespace
    if ROOT:  # mapped to the tenant uid, not root (a server that is not root maps its own uid, through
        # a namespace of bwrap's in which it is 0: the map read inside says 0 for that one)
        assert uid_map[1] != "0" and int(_status(log, "Uid").split()[0]) != 0, log
        assert "0" not in log.split("groups\n", 1)[1].split(), log


def test_the_masks_cannot_be_unmounted_nor_the_root_made_writable(api: Any, home: Path, base: Path) -> None:
    """As root with every capability the job lazily unmounted the tmpfs over the home and read the
    ledger, the tokens file and B's logs, and remounted the shared root read-write."""
    tokens = base / "tokens"
    tokens.write_text("server-token-0123456789abcdef team-b\n")
    shared = base / "shared"
    shared.mkdir()
    _tenant(api, "team-a", "team-b", hide=(str(tokens),))
    b_view, _ = _run(api, home, f"echo {SECRET_TEXT}", project="team-b")
    assert b_view.state == "succeeded"
    script = "; ".join([
        f"umount -l {home}", f"umount -l {tokens}", "umount -l /tmp",
        f"cat {home}/ledger.db | head -c 100", f"cat {tokens}", f"cat {home}/jobs/{b_view.id}/attempt-1.log",
        f"mount -o remount,bind,rw {shared}", "mount -o remount,rw /", f"mount -t tmpfs none {shared}",
        f"touch {shared}/pwned", "echo attack-done"])
    view, log = _run(api, home, script, workdir=str(shared))
    assert "attack-done" in log, log
    for leaked in ("SQLite format", "server-token-0123456789abcdef", SECRET_TEXT):
        assert leaked not in log, (leaked, log)
    assert not (shared / "pwned").exists()


def test_a_new_namespace_does_not_lift_the_masks(api: Any, home: Path) -> None:
    _tenant(api, "team-a")
    other = api.submit({"command": ["sh", "-c", f"echo {SECRET_TEXT}"]})
    wait_state(api, other.id, "succeeded")
    script = (f"unshare -Urm sh -c 'umount -l {home}; cat {home}/jobs/{other.id}/attempt-1.log'; "
              f"unshare -m sh -c 'umount -l {home}; cat {home}/jobs/{other.id}/attempt-1.log'; echo attack-done")
    view, log = _run(api, home, script)
    assert "attack-done" in log and SECRET_TEXT not in log, log


def test_dev_is_minimal_and_no_node_can_be_made(api: Any, home: Path) -> None:
    _tenant(api, "team-a")
    host_before = set(os.listdir("/dev"))
    view, log = _run(api, home, "mknod /dev/evil c 1 1; touch /dev/pwned; ls /dev; echo attack-done")
    assert "attack-done" in log, log
    assert set(os.listdir("/dev")) - host_before == set()  # nothing made in the host's /dev
    listed = set(log.split())
    assert {"null", "zero", "urandom"} <= listed and "evil" not in listed, log
    for host_only in ("sda", "vda", "kmsg", "mem", "nvidiactl", "loop0"):
        assert host_only not in listed, (host_only, log)


def test_kill_minus_one_reaches_nothing_outside_the_job(api: Any, home: Path, tmp_path: Path) -> None:
    _tenant(api, "team-a", "team-b")
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        other = api.submit({"command": ["sh", "-c", "echo up; sleep 30; echo b-survived"], "max_retries": 0},
                           project="team-b")
        log_b = home / "jobs" / str(other.id) / "attempt-1.log"
        wait_for(lambda: log_b.exists() and "up" in log_b.read_text(), 30)
        view, log = _run(api, home, "kill -9 -1; echo after", timeout="30s")
        time.sleep(0.5)
        assert bystander.poll() is None, log  # a process of the server's uid outside: untouched
        assert api.status(other.id).state == "running", log  # another tenant's job: untouched
        api.cancel([other.id])
    finally:
        bystander.kill()
        bystander.wait()


def test_a_tokened_server_that_cannot_build_the_sandbox_refuses_to_start(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("server-token-0123456789abcdef team-a\n")
    home = tmp_path / "home"
    env = {**os.environ, "AUTORESEARCH_HOME": str(home), "AUTORESEARCH_TOKENS": str(tokens),
           "PATH": os.path.dirname(sys.executable)}  # no bwrap on it
    done = subprocess.run([sys.executable, "-m", "autoresearch.cli", "serve", "--http", "--port", "1"], env=env,
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode != 0
    assert "sandbox" in done.stderr and "bubblewrap" in done.stderr and "apt-get install" in done.stderr, done.stderr


FORKS = """
import os, signal, time
pids = []
for _ in range(2000):
    try:
        pid = os.fork()
    except OSError as err:
        print("fork failed:", err.strerror)
        break
    if pid == 0:
        time.sleep(20)
        os._exit(0)
    pids.append(pid)
print("started=%d" % len(pids))
for pid in pids:
    os.kill(pid, signal.SIGKILL)
"""
LIMITS = "sandbox:\n  limits: {processes: 64, disk: 2M, tmp: 1M}\n"


@root_only  # (the process count is per uid: as root the tenant uid's, else the server's own)
def test_a_fork_bomb_is_bounded(api: Any, home: Path) -> None:
    (home / "config.yaml").write_text(LIMITS)
    _tenant(api, "team-a")
    # Bounded on its own too (2,000 forks at most, a 20 s timeout): it must not take this machine
    # down even where the limit failed to apply.
    script = (f"{sys.executable} -c '{FORKS}'; echo bomb-done")
    view, log = _run(api, home, script, timeout="20s")
    assert "bomb-done" in log, log
    started = int(log.split("started=", 1)[1].split()[0])
    assert started < 64 and "fork failed: Resource temporarily unavailable" in log, log
    recorded = json.loads((home / "jobs" / str(view.id) / "attempt-1" / "request.json").read_text())
    assert recorded["limits"]["processes"] == [64, "RLIMIT_NPROC of the job's uid"], recorded
    # status says what applied and how (this host has no delegated cgroup v2: rlimits, and why)
    assert view.limits is not None and view.limits.startswith("rlimits (") and "processes 64" in view.limits, view
    assert "disk 2M" in view.limits and "tmp 1M" in view.limits, view.limits


def test_writing_until_full_stops_at_the_disk_and_tmp_limits(api: Any, home: Path) -> None:
    (home / "config.yaml").write_text(LIMITS)
    _tenant(api, "team-a")
    view, log = _run(api, home, "head -c 3000000 /dev/zero > /tmp/fill; echo tmp-rc=$?; ls -l /tmp/fill; "
                                "exec head -c 3000000 /dev/zero > $AUTORESEARCH_PROJECT_DIR/fill")
    assert "tmp-rc=1" in log and "No space left on device" in log, log
    assert "wrote a file past its disk limit" in log, log
    assert view.state == "failed" and view.attempt_list[-1].signal == 25, view
    last = view.attempt_list[-1]  # a clear end, the job's own doing: not "a signal nobody sent", not retried
    assert last.detail == "over its limit: a file past sandbox.limits.disk (SIGXFSZ)", last
    assert last.end_reason == "exit" and last.failure_class == "user", last
    assert (home / "projects" / "team-a" / "fill").stat().st_size == 2 << 20


@pytest.mark.slow  # (~5 s: the million lines are written, read and counted)
def test_a_million_metric_lines_store_at_most_the_jobs_limit(api: Any, home: Path) -> None:
    (home / "config.yaml").write_text("sandbox:\n  limits: {metric_points: 1000}\n")
    _tenant(api, "team-a")
    view, log = _run(api, home, f"{sys.executable} -c \"import sys; sys.stdout.write('loss: 0.5\\\\n' * 1000000)\"")
    assert view.state == "succeeded", view
    stored = api._ledger.one("SELECT COUNT(*) AS n FROM metrics WHERE job_id=?", (view.id,))["n"]
    assert stored == 1000, stored
    warning = " ".join(view.warnings)
    assert "limit of 1000 (sandbox.limits.metric_points)" in warning and "999000" in warning, view.warnings
    # A single-user job of the same home has no such limit.
    other = api.submit({"command": ["sh", "-c", "for i in $(seq 1 1500); do echo loss: 0.5; done"]})
    wait_state(api, other.id, "succeeded")
    assert api._ledger.one("SELECT COUNT(*) AS n FROM metrics WHERE job_id=?", (other.id,))["n"] == 1500


def test_a_flood_of_log_keeps_the_first_bytes_and_one_marker(api: Any, home: Path) -> None:
    (home / "config.yaml").write_text("sandbox:\n  limits: {log: 64K}\n")
    _tenant(api, "team-a")
    view, log = _run(api, home, "echo first-line; head -c 50000000 /dev/zero | tr '\\0' x; echo; echo flood-done")
    assert view.state == "succeeded", view  # the job was never blocked nor stopped
    size = (home / "jobs" / str(view.id) / "attempt-1.log").stat().st_size
    assert 64 * 1024 <= size < 64 * 1024 + 300, size
    assert log.startswith("first-line\n") and "flood-done" not in log, log[:100]
    assert log.count("reached its limit of 65536 bytes (sandbox.limits.log)") == 1, log[-300:]
    detail = view.attempt_list[-1].detail or ""
    assert detail.startswith("exited 0; log past sandbox.limits.log: ") and int(detail.split()[5]) > 49_000_000, detail


def test_a_tenant_job_has_its_own_private_writable_home(api: Any, home: Path) -> None:
    """Not the server's HOME (root's, read-only or hidden in the sandbox): the project's own."""
    _tenant(api, "team-a")
    script = 'echo "home=$HOME"; echo hi > "$HOME/.rc" && echo wrote; stat -c "mode=%a uid=%u" "$HOME"; id -u'
    view, log = _run(api, home, script)
    own = home / "projects" / "team-a" / ".home"
    assert view.state == "succeeded" and f"home={own}\n" in log and "wrote" in log, log
    assert "mode=700" in log and f"uid={log.split()[-1]}" in log, log
    assert (own / ".rc").read_text() == "hi\n" and os.environ.get("HOME") != str(own)
    # A job that names its HOME keeps it.
    view, log = _run(api, home, 'echo "home=$HOME"', env={"HOME": "/tmp"})
    assert "home=/tmp\n" in log, log


def test_a_project_folder_over_its_disk_quota_stops_the_job_and_not_another_projects(
        api: Any, home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """sandbox.limits.disk bounds the project folder's total, not only each file: three files of 1M
    each (every one under the per-file limit) take team-a's folder past 2M; team-b's job goes on."""
    (home / "config.yaml").write_text(LIMITS)
    _tenant(api, "team-a", "team-b")
    other = api.submit({"command": ["sh", "-c", "head -c 1500000 /dev/zero > $AUTORESEARCH_PROJECT_DIR/mine; "
                                                "sleep 4; echo b-done"], "max_retries": 0}, project="team-b")
    fill = "for i in 1 2 3; do head -c 1000000 /dev/urandom > $AUTORESEARCH_PROJECT_DIR/f$i; done; echo filled; sleep 60"
    view, log = _run(api, home, fill, timeout="90s")
    assert "filled" in log and view.state == "failed", (view, log)
    last = view.attempt_list[-1]
    assert (last.detail or "").startswith("over its limit: disk quota (project folder: 2."), last
    assert last.detail.endswith(" of 2.0M)") and last.failure_class == "user" and last.end_reason == "exit", last
    assert last.ended_at is not None and last.started_at is not None and last.ended_at - last.started_at < 30, last
    assert "over its limit: disk quota" in log, log
    # status says the limits and how they apply: the CLI's `autoresearch status JOB` and the MCP tool's
    from autoresearch.cli._render import render_job
    from autoresearch.tools.models import JobDetail, from_view

    assert view.limits and view.limits.startswith("rlimits (") and "disk 2M" in view.limits, view.limits
    assert from_view(JobDetail, view).limits == view.limits
    render_job(view)
    shown = capsys.readouterr().out
    assert f"limits: {view.limits}" in shown and "attempt 1: over its limit: disk quota" in shown, shown
    b = wait_state(api, other.id, ("succeeded", "failed"), timeout=60)
    assert b.state == "succeeded", b


HOLD = FORKS.replace('print("started=%d" % len(pids))', 'print("started=%d" % len(pids), flush=True); time.sleep(10)')


@root_only
def test_a_fork_bomb_of_one_project_leaves_another_projects_jobs_their_processes(api: Any, home: Path) -> None:
    """With one uid per project (sandbox.uid_base) the process limit is each project's own: while A's
    job holds all of its processes, B's job still starts its own."""
    (home / "config.yaml").write_text("sandbox:\n  uid_base: 200000\n  limits: {processes: 64}\n")
    _tenant(api, "team-a", "team-b")
    bomb = api.submit({"command": [sys.executable, "-c", HOLD], "max_retries": 0, "timeout": "30s"}, project="team-a")
    log_a = home / "jobs" / str(bomb.id) / "attempt-1.log"
    wait_for(lambda: log_a.exists() and "started=" in log_a.read_text(), 30)
    view, log = _run(api, home, f"id -u; {sys.executable} -c '{FORKS.replace('2000', '20')}'", project="team-b")
    assert view.state == "succeeded" and "started=20" in log, log
    a_text = log_a.read_text()
    assert "fork failed" in a_text and int(a_text.split("started=", 1)[1].split()[0]) < 64, a_text
    assert int(log.split()[0]) >= 200000 and (home / "projects" / "team-a").stat().st_uid != int(log.split()[0])
    api.cancel([bomb.id])


@pytest.mark.slow  # (it burns 3 s of CPU)
def test_a_job_past_its_cpu_time_gets_a_clear_end(api: Any, home: Path) -> None:
    """No cgroup here: cpu (cores) x the job's timeout is its CPU time per process (RLIMIT_CPU)."""
    (home / "config.yaml").write_text("sandbox:\n  limits: {cpu: 0.01}\n")
    _tenant(api, "team-a")
    # 2 s of CPU within 200 s of wall: the limit comes first even with a twentieth of a core (a loaded CI)
    view, log = _run(api, home, "exec sh -c 'while :; do :; done'", timeout="200s", wait_s=240)
    assert "used its CPU time limit" in log and view.attempt_list[-1].signal == 24, (view, log)
    assert (view.attempt_list[-1].detail or "").startswith("over its limit: its CPU time"), view
    recorded = json.loads((home / "jobs" / str(view.id) / "attempt-1" / "request.json").read_text())
    assert recorded["limits"]["cpu"][1].startswith("RLIMIT_CPU"), recorded


def test_the_jobs_environment_is_never_on_a_command_line_and_cannot_smuggle_options() -> None:
    """bwrap reads the job's env from a descriptor: /proc/PID/cmdline (readable by every user) never
    holds it, and a NUL or '=' that would split or forge a bwrap option is left out."""
    from autoresearch.backends import Sandbox, _sandbox

    argv = _sandbox._argv(("/usr/bin/bwrap", "/usr/bin/setpriv"), ["true"], "/", Sandbox(uid=65534, gid=65534))
    fd = _sandbox.env_fd({"HF_TOKEN": "hf-secret-value", "EVIL": "x\0--bind\0/\0/", "A=B": "c", "": "d", "OK": "1"})
    try:
        blob = os.read(fd, 1 << 16)
    finally:
        os.close(fd)
    assert not any("hf-secret-value" in a for a in argv) and _sandbox.ARGS_FD in argv
    assert blob.split(b"\0") == [b"--clearenv", b"--setenv", b"HF_TOKEN", b"hf-secret-value", b"--setenv", b"OK",
                                 b"1", b""]
