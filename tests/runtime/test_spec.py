"""The job spec on its own: durations, memory sizes, defaults, and one-line refusals with a hint."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from autoresearch.engine.spec import make_spec, parse_duration, parse_grace, parse_memory_mb
from autoresearch.errors import SpecError


@pytest.mark.parametrize(("text", "seconds"), [
    (90, 90.0), (2.5, 2.5), ("90", 90.0), ("90s", 90.0), ("5m", 300.0), ("1h30m", 5400.0), ("1h", 3600.0),
    (" 2m 30s ", 150.0), ("1.5h", 5400.0), ("0.5s", 0.5), (None, None), ("", None),
])
def test_durations(text: object, seconds: float | None) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["5ms", "soon", "1d", "m", "h", True, 0, -3, "0s"])
def test_bad_durations_are_refused_with_a_hint(text: object) -> None:
    with pytest.raises(SpecError) as err:
        parse_duration(text, "timeout")
    assert "timeout" in str(err.value) and err.value.hint


def test_grace_zero_means_at_once_and_empty_means_ten_seconds() -> None:
    assert parse_grace(0) == 0.0 and parse_grace("0") == 0.0
    assert parse_grace(None) == 10.0 and parse_grace("") == 10.0
    assert parse_grace("30s") == 30.0


@pytest.mark.parametrize(("text", "mb"), [
    (4096, 4096), ("512M", 512), ("16G", 16384), ("16g", 16384), ("1.5GiB", 1536), ("2GB", 2048), ("1T", 1 << 20),
    ("2048K", 2), (str(3 << 20) + "B", 3), ("100", 100), (None, 0), ("", 0),
])
def test_memory_sizes(text: object, mb: int) -> None:
    assert parse_memory_mb(text) == mb


@pytest.mark.parametrize("text", ["lots", "16 X", "-1G", True, -5])
def test_bad_memory_sizes_are_refused_with_a_hint(text: object) -> None:
    with pytest.raises(SpecError) as err:
        parse_memory_mb(text)
    assert "memory" in str(err.value) and err.value.hint


def test_defaults(tmp_path: Path) -> None:
    spec = make_spec({"command": ["python", "train.py"], "workdir": str(tmp_path)})
    assert (spec.name, spec.shell, spec.gpus, spec.cpus, spec.memory, spec.nodes) == ("python", False, 0, 0, 0, 1)
    assert (spec.priority, spec.max_retries, spec.retry_on_exit_codes) == ("normal", 2, [])
    assert (spec.timeout, spec.grace, spec.checkpoint, spec.experiment) == (None, 10.0, False, "")
    assert spec.env == {} and spec.tags == {} and spec.mounts == {}
    assert spec.workdir == str(tmp_path.resolve())
    assert spec.argv() == ["python", "train.py"]


def test_normalizations(tmp_path: Path) -> None:
    spec = make_spec({"command": "python train.py --lr 3", "shell": True, "priority": "Best_Effort",
                      "timeout": "5m", "grace": "30s", "memory": "2G", "env": {"SEED": 3, "FLAG": True, "NONE": None},
                      "tags": {"round": 1}}, check_paths=False)
    assert spec.name == "python" and spec.argv() == ["/bin/sh", "-c", "python train.py --lr 3"]
    assert (spec.priority, spec.timeout, spec.grace, spec.memory) == ("best-effort", 300.0, 30.0, 2048)
    assert spec.env == {"SEED": "3", "FLAG": "True", "NONE": ""} and spec.tags == {"round": "1"}
    assert make_spec({"command": ["/usr/bin/env"], "priority": "besteffort"}, check_paths=False).priority == \
        "best-effort"
    assert make_spec({"command": ["/opt/x/" + "n" * 100]}, check_paths=False).name == "n" * 64


@pytest.mark.parametrize(("data", "where", "hint"), [
    ({"command": []}, "command", "--"),
    ({"command": ["  "]}, "command", "--"),
    ({"command": "python train.py"}, "shell: true", "--"),
    ({"command": ["x"], "gpus": -1}, "gpus", "whole number"),
    ({"command": ["x"], "gpus": "two"}, "gpus", "whole number"),
    ({"command": ["x"], "nodes": 0}, "nodes", ""),
    ({"command": ["x"], "priority": "urgent"}, "priority", "--priority"),
    ({"command": ["x"], "gpu": 1}, "gpu", "valid keys"),
    ({"command": ["x"], "timeout": "soon"}, "timeout", "5m"),
    ({"command": ["x"], "memory": "lots"}, "memory", "16G"),
])
def test_refusals_are_one_line_with_a_hint(data: dict[str, Any], where: str, hint: str) -> None:
    with pytest.raises(SpecError) as err:
        make_spec(data, check_paths=False)
    message = str(err.value)
    assert where in message and "\n" not in message
    assert err.value.hint and hint in err.value.hint
    assert err.value.code == "spec_invalid"


def test_paths_are_checked_unless_told_not_to(tmp_path: Path) -> None:
    missing = str(tmp_path / "nowhere")
    with pytest.raises(SpecError, match="workdir") as err:
        make_spec({"command": ["x"], "workdir": missing})
    assert err.value.hint
    with pytest.raises(SpecError, match="mount source"):
        make_spec({"command": ["x"], "workdir": str(tmp_path), "mounts": {"/data": missing}})
    assert make_spec({"command": ["x"], "workdir": missing}, check_paths=False).workdir == missing
    home = make_spec({"command": ["x"], "workdir": "~"})
    assert home.workdir == str(Path(os.path.expanduser("~")).resolve())

