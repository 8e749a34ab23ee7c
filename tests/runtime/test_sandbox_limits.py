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
