"""Slurm's client commands, each under a timeout, and what their output means.

Slurm's clients retry for ~9 s and then fail while slurmctld is down, and can hang on a
sick controller: every call here has a timeout, and a timeout or a refused connection is
:class:`Unreachable` — "unknown, ask again later", never "the job is gone". Anything else
Slurm says no to is :class:`Rejected`, carrying Slurm's own message.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from autoresearch.errors import BackendError

_UNREACHABLE = re.compile(r"unable to contact slurm controller|connection refused|socket timed out|"
                          r"zero bytes were transmitted|slurmctld.* is down|communication connection failure",
                          re.IGNORECASE)
_BARE = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ", "SLURM_CONF")
KIT_HINT = ("start the dev cluster with `python3 backends/slurm/kit.py start` and export the SLURM_CONF it "
            "prints (or set the profile's `conf`); on a real cluster ask whether slurmctld is up (`scontrol ping`)")


class Unreachable(BackendError):
    """slurmctld did not answer in time: nothing can be concluded."""


class Rejected(BackendError):
    """Slurm answered no (its message is ``message``)."""


class SlurmCli:
    """Runs Slurm's commands against one cluster (``conf``: its slurm.conf; empty: the client's default)."""

    def __init__(self, conf: str = "", timeout: float = 20.0) -> None:
        self.conf = conf or os.environ.get("SLURM_CONF", "")
        self.timeout = timeout
        self._down_until = 0.0  # after a failure, fail fast for a moment instead of waiting again
        self.ok_at = 0.0  # when slurmctld last answered (time.monotonic())
        self._lock = threading.Lock()

    @property
    def address(self) -> str:
        """slurmctld's host:port from slurm.conf, for messages ("?" when the file is unreadable)."""
        path = self.conf or "/etc/slurm/slurm.conf"
        host, port = "?", "6817"
        try:
            for line in Path(path).read_text(errors="replace").splitlines()[:400]:
                key, _, value = line.partition("=")
                key = key.strip().lower()
                if key in ("slurmctldhost", "controlmachine") and host == "?":
                    host = value.split("(")[0].strip()
                elif key == "slurmctldport":
                    port = value.strip()
        except OSError:
            pass
        return f"slurmctld at {host}:{port} (slurm.conf: {path})"

    def env(self, bare: bool = False) -> dict[str, str]:
        """The commands' environment; ``bare``: only what a batch job may inherit from sbatch
        (the job's own environment comes from its env.json)."""
        env = dict(os.environ)
        if bare:
            env = {k: v for k, v in env.items() if k in _BARE or k.startswith("SBATCH_")}
        if self.conf:
            env["SLURM_CONF"] = self.conf
        return env

    def run(self, argv: list[str], timeout: float | None = None, fast_fail: bool = True, bare: bool = False) -> str:
        """stdout of ``argv``; :class:`Unreachable` or :class:`Rejected` when Slurm does not say yes."""
        if fast_fail and time.monotonic() < self._down_until:
            raise Unreachable(f"{self.address} did not answer a moment ago", hint=KIT_HINT)
        limit = timeout or self.timeout
        try:
            done = subprocess.run(argv, env=self.env(bare), capture_output=True, text=True, timeout=limit,
                                  errors="replace", stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise BackendError(f"Slurm's `{argv[0]}` is not installed on this machine",
                               hint="install the Slurm client (Debian: apt-get install -y slurm-client), or "
                                    "run autoresearch on a login node of the cluster") from None
        except subprocess.TimeoutExpired:
            self._down(5.0)
            raise Unreachable(f"`{argv[0]}` got no answer from {self.address} within {limit:.0f}s",
                              hint=KIT_HINT) from None
        if done.returncode != 0:
            said = " ".join((done.stderr or done.stdout).split())[:500] or f"exit status {done.returncode}"
            if _UNREACHABLE.search(said):
                self._down(5.0)
                raise Unreachable(f"{self.address} does not answer: {said}", hint=KIT_HINT)
            raise Rejected(said)
        with self._lock:
            self._down_until, self.ok_at = 0.0, time.monotonic()
        return done.stdout

    def _down(self, seconds: float) -> None:
        with self._lock:
            self._down_until, self.ok_at = time.monotonic() + seconds, 0.0

    def ping(self) -> None:
        """Raise :class:`Unreachable` unless slurmctld answers (`scontrol ping` answers at once either way)."""
        try:
            out = self.run(["scontrol", "ping"], timeout=min(self.timeout, 10.0), fast_fail=False)
        except Rejected as err:  # ping exits 1 when the controller is DOWN
            self._down(2.0)
            raise Unreachable(f"{self.address} is down ({err.message[:200]})", hint=KIT_HINT) from None
        if "UP" not in out:
            raise Unreachable(f"{self.address} is not up: {' '.join(out.split())[:200]}", hint=KIT_HINT)

    # -- jobs ---------------------------------------------------------------------------------

    def jobs(self) -> dict[int, dict[str, Any]]:
        """This user's jobs Slurm still remembers (``squeue --json -t all``), by job id."""
        out = self.run(["squeue", "--json", "-t", "all", "--me"])
        try:
            data = json.loads(out)
        except ValueError:
            raise Rejected(f"squeue --json printed something that is not JSON: {out[:120]!r}") from None
        jobs = data.get("jobs") if isinstance(data, dict) else None
        return {int(j["job_id"]): j for j in jobs or [] if isinstance(j, dict) and isinstance(j.get("job_id"), int)}

    def show_job(self, job_id: int) -> dict[str, Any] | None:
        """``scontrol show job`` as a dict in squeue --json's words (None: Slurm no longer knows it)."""
        try:
            out = self.run(["scontrol", "show", "job", "-o", str(int(job_id))])
        except Rejected as err:
            if "invalid job id" in err.message.lower():
                return None
            raise
        fields = dict(re.findall(r"(\w+)=(\S*)", out))
        if not fields.get("JobId"):
            return None
        return {"job_id": int(fields["JobId"]), "job_state": fields.get("JobState", ""),
                "restart_cnt": int(fields.get("Restarts") or 0), "state_reason": fields.get("Reason", ""),
                "name": fields.get("JobName", "")}

    def find(self, name: str) -> list[int]:
        """Ids of this user's jobs named ``name`` (any state Slurm remembers)."""
        out = self.run(["squeue", "-h", "--me", "-t", "all", "-n", name, "-o", "%i"])
        return sorted(int(x) for x in out.split() if x.isdigit())

    # -- nodes and partitions ---------------------------------------------------------------

    def facts(self) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
        """:meth:`partitions` and :meth:`nodes` from one ``sinfo`` (a submit's first check needs both:
        one call less on the path of a fresh process's first submit)."""
        out = self.run(["sinfo", "-h", "-N", "-o", "%P|%N|%G|%c|%m|%T|%o|%E"])
        parts: dict[str, dict[str, Any]] = {}
        seen: dict[str, dict[str, Any]] = {}
        for line in out.splitlines():
            cells = line.split("|", 7)
            if len(cells) != 8:
                continue
            name, node = cells[0].strip(), cells[1].strip()
            default = name.endswith("*")
            part = parts.setdefault(name.rstrip("*"), {"nodes": set(), "gpus": 0, "cpus": 0, "memory": 0,
                                                       "default": default})
            part["nodes"].add(node)
            part["gpus"] = max(part["gpus"], gpu_count(cells[2]))
            part["cpus"] = max(part["cpus"], _int(cells[3]))
            part["memory"] = max(part["memory"], _int(cells[4]))
            if node not in seen:  # (a node in several partitions is listed once a partition)
                reason = cells[7].strip()
                seen[node] = {"name": node, "cpus": _int(cells[3]), "memory": _int(cells[4]),
                              "gpus": gpu_count(cells[2]), "state": cells[5].strip(), "addr": cells[6].strip(),
                              "reason": "" if reason == "none" else reason}
        return parts, list(seen.values())

    def partitions(self) -> dict[str, dict[str, Any]]:
        """Per partition: nodes, most GPUs / CPUs / memory (MB) on one node, and whether it is the default."""
        return self.facts()[0]

    def nodes(self) -> list[dict[str, Any]]:
        return self.facts()[1]


def gpu_count(gres: str) -> int:
    """GPUs in a gres string: ``gpu:4``, ``gpu:a100:8(S:0-1)``, ``gpu:2,shard:4`` -> 4, 8, 2."""
    total = 0
    for item in gres.split(","):
        item = item.split("(")[0].strip()
        parts = item.split(":")
        if parts[0] == "gpu" and len(parts) >= 2 and parts[-1].isdigit():
            total += int(parts[-1])
    return total


def _int(text: str) -> int:
    match = re.match(r"\s*(\d+)", text)
    return int(match.group(1)) if match else 0


def placed_on(job: dict[str, Any] | None) -> dict[str, Any]:
    """Where Slurm runs a job: its node and GPU indexes (``gres_detail``, one entry a node: ``gpu:2(IDX:0-1)``);
    for a gang also every node with its own (``members``), from ``job_resources``' node names or the host list."""
    job = job or {}
    details = job.get("gres_detail")
    per_node = [_gpu_indexes(str(entry)) for entry in (details if isinstance(details, list) else [])[:1024]]
    resources = job.get("job_resources")
    listed = resources.get("allocated_nodes") if isinstance(resources, dict) else None
    names = [str(n.get("nodename") or "") for n in listed if isinstance(n, dict)] if isinstance(listed, list) else []
    names = names if names and all(names) else expand_hostlist(str(job.get("nodes") or ""))
    names = [n for n in names if n.isprintable() and 0 < len(n) <= 200 and not any(c in n for c in "[],")]
    if not names:
        return {}
    if len(names) == 1:
        return {"node": names[0], "gpu_ids": tuple(i for ids in per_node for i in ids)[:1024]}
    members = tuple((name, per_node[i] if i < len(per_node) else ()) for i, name in enumerate(names))
    return {"node": names[0], "gpu_ids": members[0][1], "members": members}


def _gpu_indexes(entry: str) -> tuple[str, ...]:
    ids: list[str] = []
    found = re.search(r"IDX:([0-9,\-]{1,200})\)", entry)
    for part in found.group(1).split(",") if found else []:
        low, _, high = part.partition("-")
        if low.isdigit() and (not high or high.isdigit()):
            ids += [str(i) for i in range(int(low), min(int(high or low), int(low) + 1024) + 1)]
    return tuple(ids[:1024])


def expand_hostlist(text: str, limit: int = 1024) -> list[str]:
    """Slurm's compact host list, expanded: ``gpu[07-09],cpu1`` -> gpu07 gpu08 gpu09 cpu1 (zero padding
    kept; several bracket groups multiply); at most ``limit`` names, [] for what is not a host list."""
    if not text.isprintable() or len(text) > 4000:
        return []
    items, depth, word = [], 0, ""
    for ch in text:
        if ch == "," and depth == 0:
            items.append(word)
            word = ""
            continue
        depth += (ch == "[") - (ch == "]")
        if depth not in (0, 1):
            return []
        word += ch
    items.append(word)
    out: list[str] = []
    for item in items:
        names = [""]
        for literal, group in re.findall(r"([^\[\]]*)(?:\[([^\]]*)\])?", item):
            values = [""]
            if group:
                values = []
                for part in group.split(","):
                    low, _, high = part.partition("-")
                    if not low.isdigit() or (high and not high.isdigit()):
                        return []
                    last = int(high) if high else int(low)
                    values += [str(i).zfill(len(low)) for i in range(int(low), min(last, int(low) + limit) + 1)]
            names = [n + literal + v for n in names for v in values][:limit]
        out += [n for n in names if n]
        if len(out) >= limit:
            return out[:limit]
    return out
