"""config.yaml's sandbox: section (autoresearch/backends/limits.py): sizes, ids and garbage."""

from __future__ import annotations

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
    folder, why = limits.cgroup_decision(V1, "0::/\n4:memory:/\n", "", True)
    assert folder is None and why == "no cgroup v2 at /sys/fs/cgroup (it is tmpfs: a cgroup v1 host)"
    assert limits.cgroup_decision("", "", None, True)[1].endswith("(it is not mounted: a cgroup v1 host)")


def test_a_delegated_cgroup_v2_with_every_controller_is_used() -> None:
    mine = "0::/user.slice/user-1000.slice/autoresearch.service\n"
    folder, why = limits.cgroup_decision(V2, mine, "cpuset cpu io memory pids\n", True)
    assert folder == "/sys/fs/cgroup/user.slice/user-1000.slice/autoresearch.service" and why == ""


@pytest.mark.parametrize(("mine", "controllers", "writable", "says"), [
    ("0::/srv\n", "cpu memory\n", True, "lacks the pids controller(s)"),
    ("0::/srv\n", None, True, "lacks the cpu, memory, pids controller(s)"),
    ("0::/srv\n", "cpu memory pids", False, "is not writable by the server"),
    ("1:name=systemd:/\n", "cpu memory pids", True, "this process is in no cgroup v2"),
    ("0::/../../etc\n", "cpu memory pids", True, "this process is in no cgroup v2"),
])
def test_a_cgroup_v2_not_delegated_to_us_is_not_used(mine: str, controllers: str | None, writable: bool,
                                                      says: str) -> None:
    folder, why = limits.cgroup_decision(V2, mine, controllers, writable)
    assert folder is None and says in why, why


def test_this_hosts_decision_is_one_of_the_two() -> None:
    folder, why = limits.cgroup_here()
    assert (folder is None) == bool(why)


def test_the_status_line_names_each_limit_and_how() -> None:
    recorded = {"limits": {"processes": [64, "RLIMIT_NPROC of the job's uid"], "disk": [2 << 20, "RLIMIT_FSIZE"],
                           "memory": [16 << 30, "not enforced: a GPU job"], "tmp": [1536 << 20, "tmpfs"],
                           "metric_points": [1000, "at ingest"], "bogus": [1, "x"], "log": ["<b>", "x"]},
                "limits_by": "rlimits (no cgroup v2 at /sys/fs/cgroup (it is tmpfs: a cgroup v1 host))"}
    line = limits.summary(recorded)
    assert line == ("rlimits (no cgroup v2 at /sys/fs/cgroup (it is tmpfs: a cgroup v1 host)): processes 64, "
                    "memory 16G (not enforced), disk 2M, tmp 1.5G, metric_points 1000")
    assert limits.summary({"sandbox": False}) is None and limits.summary({"limits": "junk"}) is None
