"""The Slurm backend's files in an attempt's run dir (see _slurm.py), read as untrusted input.

The run dir is within the job's reach, so what is read back is checked field by field,
never followed through a link, and never trusted to be whole.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import math
import os
from pathlib import Path
from typing import Any

from autoresearch.backends._base import AttemptState, AttemptStatus
from autoresearch.backends._supervisor import read_json, temp_path, write_json


def _int(data: dict[str, Any], key: str, low: int, high: int) -> int | None:
    value = data.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and low <= value <= high else None


def _time(data: dict[str, Any], key: str) -> float | None:
    value = data.get(key)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
        return float(value)
    return None


def from_exit(done: dict[str, Any], state: AttemptState = "exited") -> AttemptStatus:
    """An ending from exit.json (written by wrap.py) or ending.json: both are within the job's reach,
    so every field is checked (an int that is an exit status, finite times, flags that are true)."""
    return AttemptStatus(state, exit_code=_int(done, "exit_code", -(2**31), 2**31), signal=_int(done, "signal", 1, 128),
                         timed_out=done.get("timed_out") is True, stopped=done.get("stopped") is True,
                         started_at=_time(done, "started_at"), ended_at=_time(done, "ended_at"),
                         peak_rss_mb=_time(done, "peak_rss_mb"), detail=str(done.get("detail") or "")[:500],
                         preempted=done.get("preempted") is True)


def status_of(data: dict[str, Any]) -> AttemptStatus:
    """An ending read back from ending.json (``cancelled``: only ours says so, never the job's exit.json)."""
    status = from_exit(data, "exited" if data.get("state") == "exited" else "lost")
    return dataclasses.replace(status, cancelled=True) if data.get("cancelled") is True else status


def read_file(path: str) -> dict[str, Any] | None:
    return read_json(path)  # no links, no FIFOs, no garbage


def write_file(path: str, data: dict[str, Any], exclusive: bool = False) -> None:
    if exclusive:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        return
    write_json(path, data)


def write_text(path: str, text: str) -> None:
    tmp = temp_path(path)
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(text)
    os.replace(tmp, path)


def read_id(run_dir: str) -> int | None:
    try:
        text = Path(run_dir, "slurm_job_id").read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


class locked:
    """An exclusive flock on ``path`` for the length of a ``with`` (released by the kernel if we die)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = -1

    def __enter__(self) -> None:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


def held(path: str) -> bool:
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)
