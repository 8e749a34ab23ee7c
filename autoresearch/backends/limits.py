"""What a tenant job may use: ``sandbox:`` in ``$AUTORESEARCH_HOME/config.yaml`` (docs/security.md).

    sandbox:
      uid: 65534            # the uid and gid tenant jobs run as when the server is root
      gid: 65534
      uid_base: 200000      # instead: each project its own uid and gid, uid_base + its tenant number
      cgroup: /sys/fs/cgroup/autoresearch   # a delegated cgroup v2 folder for the jobs' cgroups (else ours)
      limits:               # every tenant job (each attempt), unless its project says otherwise
        processes: 512      # tasks of the job's uid (RLIMIT_NPROC) / of its cgroup (pids.max)
        memory: 16G         # address space (RLIMIT_AS) / cgroup memory.max
        cpu: 4              # cores (cgroup cpu.max); without a cgroup, cpu x the job's timeout seconds of CPU (RLIMIT_CPU)
        disk: 20G           # the project folder and every file the job writes (RLIMIT_FSIZE, a check)
        tmp: 2G             # the size of the job's private /tmp (and /dev/shm)
        log: 100M           # bytes of log per attempt; the rest is dropped, with one marker line
        metric_points: 1000000   # points per job; the rest are dropped, with one marker line
      projects:
        team-a: {memory: 64G}

Read through ``backends/profiles.py`` (cached on the file's stamp), which calls :func:`parse` and
answers a home's section (``profiles.sandbox_config(home)``); this module never imports it. Stdlib only.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

from autoresearch.errors import SpecError, check_section

DEFAULT_ID = 65534
_KEYS = ("uid", "gid", "uid_base", "limits", "projects", "cgroup")
LIMIT_KEYS = ("processes", "memory", "cpu", "disk", "tmp", "log", "metric_points")
_SIZES = ("memory", "disk", "tmp", "log")
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
MAX_BYTES = 1 << 60
EXAMPLE = "sandbox: {limits: {processes: 512, memory: 16G, cpu: 4, disk: 20G, tmp: 2G, log: 100M}}"
# What a tenant job gets when config.yaml says nothing: bounds no ordinary job reaches and that keep
# a hostile one from taking the host (a fork bomb, a full disk, a flood of log or points).
DEFAULTS = {"processes": 4096, "tmp": 4 << 30, "log": 1 << 30, "metric_points": 10_000_000}


@dataclass(frozen=True)
class Limits:
    """One tenant job's limits; None: no limit of that kind."""

    processes: int | None = None
    memory: int | None = None  # bytes
    cpu: float | None = None  # cores
    disk: int | None = None  # bytes
    tmp: int | None = None  # bytes
    log: int | None = None  # bytes per attempt
    metric_points: int | None = None  # per job

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


@dataclass(frozen=True)
class SandboxConfig:
    """config.yaml's ``sandbox:`` section (a docstring of its own: dataclasses would import inspect to write one)."""

    uid: int = DEFAULT_ID
    gid: int = DEFAULT_ID
    limits: Limits = field(default_factory=lambda: Limits(**DEFAULTS))
    projects: dict[str, Limits] = field(default_factory=dict)
    uid_base: int | None = None  # each project's own uid/gid: uid_base + its tenant number
    cgroup: str | None = None  # the cgroup v2 folder under which each tenant attempt gets its own

    def for_project(self, project: str) -> Limits:
        return self.projects.get(project, self.limits)


def parse(raw: Any) -> SandboxConfig:
    """The ``sandbox:`` section; SpecError naming the bad key or value."""
    if raw is None:
        return SandboxConfig()
    check_section(raw, "sandbox", _KEYS, EXAMPLE)
    ids = {k: _id(raw.get(k, DEFAULT_ID), f"sandbox.{k}") for k in ("uid", "gid")}
    base = _limits(raw.get("limits"), "sandbox.limits", Limits(**DEFAULTS))
    projects = raw.get("projects")
    if projects is None:
        projects = {}
    if not isinstance(projects, dict):
        raise SpecError(f"sandbox.projects must be a mapping of project -> limits, got {type(projects).__name__}",
                        hint="write sandbox: {projects: {team-a: {memory: 64G}}}")
    out = {}
    for name, body in projects.items():
        if not isinstance(name, str) or not name or len(name) > 200:
            raise SpecError(f"sandbox.projects: {str(name)[:60]!r} is not a project name",
                            hint="use the project name its token maps to")
        out[name] = _limits(body, f"sandbox.projects.{name[:60]}", base)
    uid_base = raw.get("uid_base")
    if uid_base is not None:
        uid_base = _id(uid_base, "sandbox.uid_base")
        if uid_base + (1 << 20) >= (1 << 32) - 1:
            raise SpecError(f"sandbox.uid_base {uid_base} leaves no room for a million projects below 2**32-1",
                            hint="write e.g. uid_base: 200000")
    cgroup = raw.get("cgroup")
    if cgroup is not None and (not isinstance(cgroup, str) or len(cgroup) > 500 or "\0" in cgroup
                               or not os.path.normpath(cgroup).startswith("/sys/fs/cgroup/")):
        raise SpecError(f"sandbox.cgroup must be a folder under /sys/fs/cgroup, got {str(cgroup)[:60]!r}",
                        hint="write cgroup: /sys/fs/cgroup/autoresearch (delegated to the server, with cpu, memory "
                             "and pids in its cgroup.subtree_control)")
    return SandboxConfig(ids["uid"], ids["gid"], base, out, uid_base,
                         os.path.normpath(cgroup) if cgroup is not None else None)


def _id(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < (1 << 32) - 1:
        raise SpecError(f"{where} must be an unprivileged uid/gid (1..4294967294, not 0), got {str(value)[:60]!r}",
                        hint="write 65534 (nobody), or the id of an account made for tenant jobs")
    return value


def _limits(raw: Any, where: str, base: Limits) -> Limits:
    if raw is None:
        return base
    values: dict[str, Any] = dataclasses.asdict(base)
    for key, value in check_section(raw, where, LIMIT_KEYS, EXAMPLE).items():
        values[key] = None if value is None else _value(key, value, f"{where}.{key}")
    return Limits(**values)


def _value(key: str, value: Any, where: str) -> float | int:
    if key in _SIZES:
        return parse_bytes(value, where)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise SpecError(f"{where} must be a number > 0, got {str(value)[:60]!r}", hint=f"write {key}: 4")
    if key == "cpu":
        return float(value)
    if value != int(value) or value >= 1 << 31:
        raise SpecError(f"{where} must be a whole number below 2**31, got {str(value)[:60]!r}",
                        hint=f"write {key}: 512")
    return int(value)


_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kKmMgGtT]?)(?:i?[bB])?\s*$")


def parse_bytes(value: Any, where: str = "size") -> int:
    """``16G``, ``512M``, ``1.5GiB`` or a number of bytes -> bytes (binary units)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value < MAX_BYTES:
        return value
    match = _SIZE.match(value) if isinstance(value, str) and len(value) < 40 else None
    if match is not None:
        number = float(match.group(1)) * _UNITS[match.group(2).lower()]
        if 1 <= number < MAX_BYTES:
            return int(number)
    raise SpecError(f"{where} must be a size like 512M, 16G or a number of bytes > 0, got {str(value)[:60]!r}",
                    hint="write e.g. memory: 16G")


# -- how the limits are enforced: a delegated cgroup v2, or rlimits --------------------------------

CGROUP_NEEDS = ("cpu", "memory", "pids")


def cgroup_decision(mountinfo: str, folder: str | None, subtree: str | None, writable: bool) -> tuple[str | None, str]:
    """Whether tenant attempts can get a cgroup v2 each: (the folder to make them in, "") when
    ``/sys/fs/cgroup`` is a cgroup2 mount (not v1, nor the hybrid layout's ``unified`` beside v1),
    ``folder`` (config.yaml ``sandbox.cgroup``, else our own cgroup) lists every controller of
    :data:`CGROUP_NEEDS` in its ``cgroup.subtree_control`` (``subtree``: enabled for its children)
    and we may write there (delegated to us); else (None, why not), which ``status`` says."""
    kind = None
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) > 4 and fields[4] == "/sys/fs/cgroup" and " - " in line:
            kind = line.split(" - ", 1)[1].split()[0]  # the last mount there wins, as it covers the others
    if kind != "cgroup2":
        return None, f"no cgroup v2 at /sys/fs/cgroup (it is {kind or 'not mounted'}: a cgroup v1 host)"
    if folder is None or not os.path.normpath(folder).startswith("/sys/fs/cgroup"):
        return None, "this process is in no cgroup v2"
    missing = [c for c in CGROUP_NEEDS if c not in (subtree or "").split()]
    if missing:
        return None, (f"{folder} does not enable {', '.join(missing)} for its children (cgroup.subtree_control): "
                      "not delegated to us")
    if not writable:
        return None, f"{folder} is not writable by the server: not delegated to us"
    return folder, ""


def own_cgroup(self_cgroup: str) -> str | None:
    """Our cgroup v2 folder, from /proc/self/cgroup's ``0::/PATH`` (None when there is none)."""
    path = next((line[3:] for line in self_cgroup.splitlines() if line.startswith("0::")), None)
    if path is None or ".." in path.split("/"):
        return None
    return os.path.normpath("/sys/fs/cgroup/" + path.lstrip("/"))


def cgroup_here(configured: str | None = None) -> tuple[str | None, str]:
    """:func:`cgroup_decision` for this host: ``configured`` (``sandbox.cgroup``) or our own cgroup."""
    def read(path: str) -> str | None:
        try:
            with open(path) as f:
                return f.read(1 << 20)
        except OSError:
            return None

    folder = configured or own_cgroup(read("/proc/self/cgroup") or "")
    subtree = read(os.path.join(folder, "cgroup.subtree_control")) if folder else None
    writable = bool(folder) and os.access(str(folder), os.W_OK)
    return cgroup_decision(read("/proc/self/mountinfo") or "", folder, subtree, writable)


def cgroup_files(limits: dict[str, Any]) -> dict[str, str]:
    """What to write in an attempt's own cgroup for ``limits`` (a :meth:`Limits.as_dict`): its
    memory (resident, GPU jobs' too), its tasks, its CPU share (cores: a quota of 100 ms periods)."""
    out = {}
    if limits.get("memory"):
        out["memory.max"] = str(int(limits["memory"]))
        out["memory.swap.max"] = "0"
    if limits.get("processes"):
        out["pids.max"] = str(int(limits["processes"]))
    if limits.get("cpu"):
        out["cpu.max"] = f"{max(1000, int(float(limits['cpu']) * 100_000))} 100000"
    return out


def size_text(n: int | float) -> str:
    """``17179869184`` -> ``16G`` (binary units, as config.yaml writes them)."""
    for unit, scale in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale:
            value = n / scale
            return f"{value:.0f}{unit}" if value == int(value) or value >= 100 else f"{value:.1f}{unit}"
    return f"{int(n)}B"


def summary(recorded: dict[str, Any]) -> str | None:
    """One short line of an attempt's limits and how they were enforced (its request.json's
    ``limits`` and ``limits_by``), for ``status``; None for a job that had none (not a tenant's)."""
    limits = recorded.get("limits")
    if not isinstance(limits, dict) or not limits:
        return None
    parts = []
    for key in LIMIT_KEYS:
        pair = limits.get(key)
        if not isinstance(pair, list) or len(pair) != 2 or not isinstance(pair[0], int | float):
            continue
        value = size_text(pair[0]) if key in _SIZES else str(pair[0]) if isinstance(pair[0], int) else f"{pair[0]:g}"
        parts.append(f"{key} {value}" + (" (not enforced)" if str(pair[1]).startswith("not enforced") else ""))
    by = recorded.get("limits_by")
    return f"{str(by)[:160] if isinstance(by, str) else 'rlimits'}: {', '.join(parts)}"
