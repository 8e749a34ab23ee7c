"""A root server's tenant sandbox made by the supervisor's child (backends/_rootbox.py) rather than by
the chain of programs (prlimit, bwrap as root, setpriv, bwrap): the same plan, the same sandbox."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_state

ROOT = os.geteuid() == 0


def _root_argv(**limits: Any) -> list[str]:
    from autoresearch.backends import Sandbox, _sandbox

    sandbox = Sandbox(hidden=("/var/lib/nothing-here",), visible=("/usr",), own=("/var/tmp",), uid=4242, gid=4343,
                      limits={"processes": 64, "tmp": 1 << 20, **limits})
    argv = _sandbox._argv(("/usr/bin/bwrap", "/usr/bin/setpriv"), ["sh", "-c", "echo hi"], "/usr", sandbox)
    return [("7" if a == _sandbox.INFO_FD else "8" if a == _sandbox.ARGS_FD else a) for a in argv]


def test_the_plan_is_the_chains_argv() -> None:
    from autoresearch.backends import _rootbox

    argv = _root_argv(disk=1 << 20, cpu_seconds=30)
    plan = _rootbox.plan(argv)
    assert plan is not None
    assert (plan.uid, plan.gid, plan.info_fd, plan.args_fd, plan.workdir, plan.command) == (
        4242, 4343, 7, 8, "/usr", ["sh", "-c", "echo hi"])
    import resource

    assert sorted(plan.rlimits) == sorted([(resource.RLIMIT_NPROC, 64, 64), (resource.RLIMIT_FSIZE, 1 << 20, 1 << 20),
                                           (resource.RLIMIT_CPU, 30, 40)])
    kinds = [op[0] for op in plan.ops]
    assert kinds[:2] == ["ro-bind", "dev"] and plan.ops[0] == ("ro-bind", "/", "/")
    assert ("tmpfs", "/tmp", 0o1777, 1 << 20) in plan.ops and ("proc", "/proc") in plan.ops
    assert ("bind", "/var/tmp", "/var/tmp") == plan.ops[-1]  # the own path last: over what hides
    # Anything it does not know is left to the programs, never half understood.
    for bad in (["--bind-fd", "3"], ["--ro-bind-try", "/a", "/a"], ["--setenv", "A", "B"]):
        at = argv.index("--unshare-pid")
        assert _rootbox.plan([*argv[:at], *bad, *argv[at:]]) is None, bad
    at = argv.index("--no-new-privs")
    assert _rootbox.plan([*argv[:at], *argv[at + 1:]]) is None  # a setpriv without no_new_privs
    assert _rootbox.plan([a.replace("--reuid=4242", "--reuid=0") for a in argv]) is None  # never to root
    first = argv.index("--ro-bind")
    moved = [*argv[:first], *argv[first + 3:first + 5], *argv[first:first + 3], *argv[first + 5:]]
    assert _rootbox.plan(moved) is None  # the read-only root must come first: all else is on top of it
    assert _rootbox.plan([a for a in argv if a != "--disable-userns"]) is None


def test_a_launcher_that_is_not_root_keeps_its_one_bwrap() -> None:
    from autoresearch.backends import Sandbox, _rootbox, _sandbox

    argv = _sandbox._argv(("/usr/bin/bwrap", ""), ["true"], "/", Sandbox(limits={"processes": 8}))
    assert _rootbox.plan(argv) is None


PROBE = r"""
id -u; id -G
grep -E '^(Cap|NoNewPrivs)' /proc/self/status
echo "map $(cat /proc/self/uid_map)"
echo "pid $$"
awk '{top[$5] = $6} END {for (m in top) print "mount", m, top[m]}' /proc/self/mountinfo | sort
echo "dev $(ls /dev | tr '\n' ' ')"
echo "home $(ls -a HOME | tr '\n' ' ')"
echo "tmp $(stat -c %a /tmp) $(ls -a /tmp | tr '\n' ' ')"
unshare -U true 2>/dev/null && echo "userns made" || echo "no userns"
touch /pwned 2>/dev/null && echo "root written" || echo "root read-only"
grep -E 'Max (processes|address space)' /proc/self/limits
"""


@pytest.fixture
def base() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="autoresearch-rootbox-", dir="/var/tmp" if os.path.isdir("/var/tmp") else None))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.skipif(not ROOT or shutil.which("bwrap") is None or shutil.which("setpriv") is None,
                    reason="a root launcher with bubblewrap and setpriv")
def test_the_supervisors_sandbox_is_the_programs_sandbox(base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same probe in a tenant job, once through each: the same uid, capabilities, mounts and
    their flags (the one on top at each place: under a mask the programs leave some host mounts
    writable where ours are read-only, out of reach either way), /dev, the hidden home, a private
    /tmp, limits; and the host's mount table untouched."""
    from autoresearch.api import Api
    from autoresearch.backends import _rootbox, _sandbox
    from autoresearch.engine import isolation

    if not _rootbox.usable():
        pytest.skip("a kernel without open_tree/mount_setattr: the programs run")
    # This way works here (else the launches below fall back to the programs and compare them with
    # themselves); its answer is then held for the test, not left to a check that timed out under load.
    why, _ = _sandbox.rootbox_check()
    assert why is None, why
    monkeypatch.setattr(_sandbox, "_ROOTBOX", (True, float("inf")))
    monkeypatch.setenv("AUTORESEARCH_GPUS", "2")
    monkeypatch.delenv("AUTORESEARCH_BACKEND", raising=False)
    base.chmod(0o755)
    host_mounts = {line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()}
    # A home for each way: the processes a launch starts (the home's pass daemon, the supervisors that
    # run the pass on an ending) keep the environment they were started with, so in one shared home a
    # daemon started under AUTORESEARCH_ROOTBOX=off would launch the second way's jobs with the programs.
    seen, apis = {}, {}
    for way in ("programs", "rootbox"):
        if way == "programs":
            monkeypatch.setenv("AUTORESEARCH_ROOTBOX", "off")
        else:
            monkeypatch.delenv("AUTORESEARCH_ROOTBOX")
        home = base / way
        monkeypatch.setenv("AUTORESEARCH_HOME", str(home))
        apis[way] = api = Api(home)
        # (memory: an address-space limit below what a fork of a Python process holds, the job's alone)
        (home / "config.yaml").write_text("sandbox:\n  limits: {processes: 64, tmp: 1M, memory: 24M}\n")
        with api._ledger.tx() as c:
            isolation.register_tenant(c, "team-a", isolation.tenant_policy([]))
        job = api.submit({"command": ["sh", "-c", PROBE.replace("HOME", str(home))], "workdir": str(base),
                          "max_retries": 0}, project="team-a")
        view = wait_state(api, job.id, ("succeeded", "failed"), timeout=60)
        log = (home / "jobs" / str(job.id) / "attempt-1.log").read_text()
        assert view.state == "succeeded", log
        seen[way] = log.replace(f"/jobs/{job.id}/", "/jobs/N/").replace(str(home), "HOME")
    assert seen["rootbox"] == seen["programs"], (seen["programs"], seen["rootbox"])
    lines = seen["rootbox"].splitlines()
    assert lines[0] != "0" and "pid 2" in lines and "no userns" in lines and "root read-only" in lines, lines
    assert all(int(line.split()[1], 16) == 0 for line in lines if line.startswith("Cap")), lines
    # Nothing of it reached the host: no new mount where the sandbox mounts (others' come and go here)
    made = {line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()} - host_mounts
    ours = ("/tmp", "/dev", "/dev/shm", "/dev/pts", "/proc", "/root", "/proc/sys", "/proc/irq", "/proc/bus")
    assert not [m for m in made if m in ours or m == str(base) or m.startswith(f"{base}/")], made
    # The sandbox's pid 1 is a fork of the supervisor, forked from its launcher (here: this pytest):
    # the job reads none of the launcher's command line there (a CLI's could be another project's).
    api = apis["rootbox"]
    job = api.submit({"command": ["sh", "-c", "tr '\\0' '\\n' < /proc/1/cmdline; cat /proc/1/environ; "
                                              "ls /proc/self/fd | tr '\\n' ' '"],
                      "workdir": str(base), "max_retries": 0}, project="team-a")
    wait_state(api, job.id, ("succeeded", "failed"), timeout=60)
    log = (base / "rootbox" / "jobs" / str(job.id) / "attempt-1.log").read_text()
    assert log.split("\n", 1)[0] == "autoresearch-sandbox" and "pytest" not in log, log
    assert "Permission denied" in log and "AUTORESEARCH_HOME" not in log, log  # not dumpable: no environ
    assert log.rsplit("\n", 1)[-1].split() == ["0", "1", "2", "3"], log  # its output, and ls's own


@pytest.mark.skipif(not ROOT or shutil.which("bwrap") is None or shutil.which("setpriv") is None,
                    reason="a root launcher with bubblewrap and setpriv")
def test_the_launchers_check_runs_the_sandbox_and_says_its_exit() -> None:
    """rootbox_works runs ``true`` this way once per process; the script says the command's exit,
    and 2 for an argv it does not take (the programs then run every launch)."""
    import subprocess
    import sys

    from autoresearch.backends import Sandbox, _rootbox, _sandbox

    if not _rootbox.usable():
        pytest.skip("a kernel without open_tree/mount_setattr: the programs run")
    why, definite = _sandbox.rootbox_check()
    assert why is None and definite, why
    found = _sandbox.programs(Sandbox(uid=65534, gid=65534))
    script = [sys.executable, "-S", "-E", _rootbox.__file__]
    for command, code in ((["true"], 0), (["sh", "-c", "exit 3"], 3), (["sh", "-c", "kill -TERM $$"], 128 + 15),
                          (["/nonexistent/program"], 127)):
        argv = _sandbox._argv(found, command, "/", Sandbox(uid=65534, gid=65534))
        done = subprocess.run([*script, *argv], capture_output=True, text=True, timeout=60, cwd="/")
        assert done.returncode == code, (command, done.stderr)
    # A device node of the attempt's (a GPU's; /dev/kmsg stands in) is bound into the minimal /dev
    # as bwrap --dev-bind-try binds it: without nodev (a nodev mount refuses to open any node); absent
    # without it.
    if os.path.exists("/dev/kmsg"):
        probe = "test -c /dev/kmsg && awk '$5 == \"/dev/kmsg\" {print $6}' /proc/self/mountinfo"
        for devices, out in ((("/dev/kmsg",), "rw,nosuid"), ((), "")):
            argv = _sandbox._argv(found, ["sh", "-c", probe], "/", Sandbox(uid=65534, gid=65534, devices=devices))
            done = subprocess.run([*script, *argv], capture_output=True, text=True, timeout=60, cwd="/")
            assert done.stdout.strip().replace(",relatime", "") == out, (devices, done.stdout, done.stderr)
    not_root = _sandbox._argv(found, ["true"], "/", Sandbox())
    assert subprocess.run([*script, *not_root], capture_output=True, timeout=60, cwd="/").returncode == 2


def test_a_check_that_did_not_finish_is_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A check that timed out (a loaded host) does not pin the programs' chain for the process's life:
    it is tried again after ROOTBOX_RETRY_S; a definite answer is kept."""
    from autoresearch.backends import _sandbox

    answers = iter([("the check did not finish: timed out", False), (None, True)])
    calls = []
    now = [1000.0]
    monkeypatch.setattr(_sandbox, "_ROOTBOX", None)
    monkeypatch.setattr(_sandbox, "rootbox_check", lambda: calls.append(1) or next(answers))
    monkeypatch.setattr(_sandbox.time, "monotonic", lambda: now[0])
    assert _sandbox.rootbox_works() is False
    now[0] += _sandbox.ROOTBOX_RETRY_S - 1
    assert _sandbox.rootbox_works() is False and len(calls) == 1  # held for a while: no check per launch
    now[0] += 2
    assert _sandbox.rootbox_works() is True and len(calls) == 2
    now[0] += 1e9
    assert _sandbox.rootbox_works() is True and len(calls) == 2  # definite: held
