"""config.yaml's sandbox: section (autoresearch/backends/limits.py): sizes, ids and garbage."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

from autoresearch.backends import limits
from autoresearch.errors import SpecError


def test_sizes_ids_and_per_project_limits_parse() -> None:
    conf = limits.parse({"uid": 1234, "gid": 1235, "uid_base": 200000,
                         "limits": {"processes": 512, "memory": "16G", "cpu": 2.5, "disk": "1.5GiB", "tmp": "512M",
                                    "log": 1000, "metric_points": 100},
                         "projects": {"team-a": {"memory": "64g", "log": None}}})
    assert (conf.uid, conf.gid, conf.uid_base) == (1234, 1235, 200000)
    assert conf.limits.as_dict() == {"processes": 512, "memory": 16 << 30, "cpu": 2.5, "disk": 3 << 29,
                                     "tmp": 512 << 20, "log": 1000, "metric_points": 100}
    team_a = conf.for_project("team-a")
    assert team_a.memory == 64 << 30 and team_a.log is None and team_a.processes == 512
    assert conf.for_project("other") == conf.limits
    assert limits.parse(None).limits.processes == limits.DEFAULTS["processes"]


@pytest.mark.parametrize("raw", [
    "x", [1], {"uid": 0}, {"uid": -1}, {"uid": True}, {"uid": 2**40}, {"gid": "65534"}, {"nope": 1},
    {"limits": {"memory": "lots"}}, {"limits": {"memory": float("nan")}}, {"limits": {"memory": "1e400G"}},
    {"limits": {"cpu": float("inf")}}, {"limits": {"cpu": 0}}, {"limits": {"processes": 1.5}},
    {"limits": {"processes": 2**40}}, {"limits": {"tmp": "<b>1G</b>"}}, {"limits": {"log": "1" * 100}},
    {"limits": {"disk": "../1G"}}, {"limits": []}, {"projects": []}, {"projects": {"": {}}},
    {"uid_base": 2**32 - 10}, {"limits": {"wat": 1}},
])
def test_garbage_is_refused_with_a_hint(raw: Any) -> None:
    with pytest.raises(SpecError) as err:
        limits.parse(raw)
    assert err.value.hint


def test_a_config_file_with_a_bad_sandbox_section_names_the_file(tmp_path: Any) -> None:
    from autoresearch.backends import profiles

    (tmp_path / "config.yaml").write_text("sandbox:\n  limits: {memory: lots}\n")
    with pytest.raises(SpecError, match="config.yaml: sandbox.limits.memory"):
        profiles.load(tmp_path)


# -- which mechanism enforces the limits: a delegated cgroup v2, else rlimits ------------------------

V1 = ("31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
      "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
      "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n")  # this host's (hybrid) layout
V2 = "30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 rw,nsdelegate\n"


def test_a_cgroup_v1_host_gets_rlimits_and_says_why() -> None:
    folder, why = limits.cgroup_decision(V1, "/sys/fs/cgroup/x", "cpu memory pids", True)
    assert folder is None and why == "no cgroup v2 at /sys/fs/cgroup (it is tmpfs: a cgroup v1 host)"
    assert limits.cgroup_decision("", None, None, True)[1].endswith("(it is not mounted: a cgroup v1 host)")


def test_a_delegated_cgroup_v2_with_every_controller_is_used() -> None:
    mine = limits.own_cgroup("0::/user.slice/user-1000.slice/autoresearch.service\n")
    assert mine == "/sys/fs/cgroup/user.slice/user-1000.slice/autoresearch.service"
    folder, why = limits.cgroup_decision(V2, mine, "cpuset cpu io memory pids\n", True)
    assert folder == mine and why == ""


@pytest.mark.parametrize(("folder", "subtree", "writable", "says"), [
    ("/sys/fs/cgroup/srv", "cpu memory\n", True, "does not enable pids for its children"),
    ("/sys/fs/cgroup/srv", None, True, "does not enable cpu, memory, pids"),
    ("/sys/fs/cgroup/srv", "cpu memory pids", False, "is not writable by the server"),
    (None, "cpu memory pids", True, "this process is in no cgroup v2"),
    ("/etc", "cpu memory pids", True, "this process is in no cgroup v2"),
])
def test_a_cgroup_v2_not_delegated_to_us_is_not_used(folder: str | None, subtree: str | None, writable: bool,
                                                      says: str) -> None:
    found, why = limits.cgroup_decision(V2, folder, subtree, writable)
    assert found is None and says in why, why


def test_our_own_cgroup_is_read_from_proc_and_never_escapes() -> None:
    assert limits.own_cgroup("0::/\n") == "/sys/fs/cgroup"
    assert limits.own_cgroup("1:name=systemd:/\n") is None and limits.own_cgroup("0::/../../etc\n") is None


def test_this_hosts_decision_is_one_of_the_two() -> None:
    folder, why = limits.cgroup_here()
    assert (folder is None) == bool(why)


def test_the_cgroup_files_of_the_limits() -> None:
    assert limits.cgroup_files({"memory": 1 << 30, "processes": 64, "cpu": 2.5, "tmp": 5}) == {
        "memory.max": "1073741824", "memory.swap.max": "0", "pids.max": "64", "cpu.max": "250000 100000"}
    assert limits.cgroup_files({"cpu": 0.001}) == {"cpu.max": "1000 100000"} and limits.cgroup_files({}) == {}


@pytest.mark.parametrize("bad", ["/etc/x", "/sys/fs/cgroup/../../etc", 5, "x" * 600, "/sys/fs/cgroup/a\0"])
def test_a_cgroup_setting_outside_the_cgroup_mount_is_refused(bad: Any) -> None:
    with pytest.raises(SpecError, match="sandbox.cgroup must be a folder under /sys/fs/cgroup"):
        limits.parse({"cgroup": bad})
    assert limits.parse({"cgroup": "/sys/fs/cgroup/autoresearch/"}).cgroup == "/sys/fs/cgroup/autoresearch"


def test_the_status_line_names_each_limit_and_how() -> None:
    recorded = {"limits": {"processes": [64, "RLIMIT_NPROC of the job's uid"], "disk": [2 << 20, "RLIMIT_FSIZE"],
                           "memory": [16 << 30, "not enforced: a GPU job"], "tmp": [1536 << 20, "tmpfs"],
                           "metric_points": [10_000_000, "at ingest"], "cpu": [0.5, "RLIMIT_CPU"], "bogus": [1, "x"], "log": ["<b>", "x"]},
                "limits_by": "rlimits (no cgroup v2 at /sys/fs/cgroup (it is tmpfs: a cgroup v1 host))"}
    line = limits.summary(recorded)
    assert line == ("rlimits (no cgroup v2 at /sys/fs/cgroup (it is tmpfs: a cgroup v1 host)): processes 64, "
                    "memory 16G (not enforced), cpu 0.5, disk 2M, tmp 1.5G, metric_points 10000000")
    assert limits.summary({"sandbox": False}) is None and limits.summary({"limits": "junk"}) is None


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
def test_an_attempt_with_a_cgroup_joins_it_before_its_sandbox_and_an_oom_kill_there_is_its_end(
        home: Any, tmp_path: Path) -> None:
    """The cgroup v2 path, end to end but for the kernel (this host is cgroup v1: no controller can be
    delegated; docs/security.md): a stand-in folder gets the limits' files, the supervisor's child
    writes its pid into cgroup.procs before it execs the sandbox, and an ``oom_kill`` in memory.events
    becomes the attempt's end reason."""
    import json
    import time

    from autoresearch.backends import Sandbox, _local, _sandbox
    from autoresearch.backends._base import LaunchRequest

    cgroup = tmp_path / "cg" / "autoresearch-1.1"
    cgroup.mkdir(parents=True)
    (cgroup / "cgroup.procs").write_text("")  # (the kernel's files of a new cgroup)
    work = Path(tempfile.mkdtemp(prefix="cgroup-", dir="/var/tmp"))  # (a tenant uid can enter it)
    work.chmod(0o755)
    uid, gid = _sandbox.tenant_ids()
    box = Sandbox(uid=uid, gid=gid, cgroup=str(cgroup), limits={"memory": 1 << 30, "processes": 64, "cpu": 2})
    request = LaunchRequest(key="1.1", argv=["sh", "-c", "sleep 2; echo ran"], env={"PATH": "/usr/bin:/bin"},
                            workdir=str(work), log_path=str(tmp_path / "attempt-1.log"),
                            run_dir=str(tmp_path / "attempt-1"), sandbox=box)
    backend = _local.LocalBackend()
    run_dir = backend.start(request)
    assert (cgroup / "memory.max").read_text() == str(1 << 30) and (cgroup / "pids.max").read_text() == "64"
    assert (cgroup / "cpu.max").read_text() == "200000 100000"
    deadline = time.time() + 30
    while not (cgroup / "cgroup.procs").read_text() and time.time() < deadline:
        time.sleep(0.05)
    (cgroup / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")  # what the kernel would say
    while (status := backend.poll(run_dir)).state != "exited" and time.time() < deadline:
        time.sleep(0.05)
    state = json.loads((Path(run_dir) / "state.json").read_text())
    # The sandbox's first process joined it: its pid, written by the supervisor's child before it
    # execs the programs; or, where that child makes the sandbox itself as pid 1 of a new pid
    # namespace (backends/_rootbox.py: a root launcher), "0", the kernel's word for the writer
    # (a pid is read in the writer's pid namespace, where its own is 1).
    made_by_child = uid is not None and _local._rootbox_on()
    assert (cgroup / "cgroup.procs").read_text() == ("0" if made_by_child else str(state["pid"]))
    assert status.detail == "over its limit: memory (memory.max of its cgroup: killed when out of memory)", status
    recorded = json.loads((Path(run_dir) / "request.json").read_text())
    assert recorded["limits_by"] == f"cgroup v2 ({cgroup.parent}) and rlimits", recorded
    assert recorded["limits"]["processes"] == [64, "pids.max of its cgroup"], recorded
    assert limits.summary(recorded) == f"cgroup v2 ({cgroup.parent}) and rlimits: processes 64, memory 1G, cpu 2"
    shutil.rmtree(work, ignore_errors=True)


def test_a_folders_usage_counts_each_inode_once_follows_no_link_and_reaches_past_path_max(tmp_path: Path) -> None:
    """What a tenant could do to hide its project folder's size from the quota's measure."""
    from autoresearch.backends._supervisor import folder_usage

    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "a").write_bytes(os.urandom(1 << 20))
    os.link(folder / "a", folder / "a-again")  # a hard link: the same blocks
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "big").write_bytes(os.urandom(2 << 20))
    (folder / "link").symlink_to(outside, target_is_directory=True)  # not ours: not counted
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:  # a folder 60 levels of 100 characters deep: its path is past PATH_MAX (4096)
        for _ in range(60):
            os.mkdir("d" * 100, dir_fd=fd)
            deeper = os.open("d" * 100, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = deeper
        leaf = os.open("deep", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd)
        os.write(leaf, os.urandom(1 << 20))
        os.close(leaf)
    finally:
        os.close(fd)
    used = folder_usage(str(folder))
    assert (2 << 20) <= used < (2 << 20) + (1 << 20), used  # a and deep, each once; not outside/big
    assert folder_usage(str(tmp_path / "missing")) == 0
