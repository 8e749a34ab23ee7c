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
import re
import shlex
from collections.abc import Mapping, Sequence
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


GPU_VARS = ("CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "ROCR_VISIBLE_DEVICES", "SLURMD_NODENAME")  # as wrap.py's
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,199}")
# Names a /bin/sh that is bash will not export or unset (it would exit), and IFS (the script's own splitting):
# such an environment goes through wrap.py.
_READONLY = frozenset({"BASHOPTS", "SHELLOPTS", "BASH_VERSINFO", "EUID", "PPID", "UID", "BASH_ARGV0", "IFS"})


# A gang's rendezvous found by job.sbatch without Python (wrap.py's gang_env does the same): MASTER_ADDR is
# the first host's NodeAddr (from the run dir's nodeaddrs, else scontrol); MASTER_PORT the first of a sequence derived from the job id (20000..39999, below
# Linux's ephemeral range) that /proc/net/tcp{,6} does not list on this node. No answer: _ar_port stays
# empty and wrap.py starts the gang itself.
GANG_MASTER = [
    '_ar_port=""; _ar_addr=""',
    '_ar_first=${SLURMD_NODENAME:-}  # the batch script runs on the allocation\'s first node',
    'if [ -n "$_ar_first" ] && [ -r /proc/net/tcp ]; then',
    '  if [ -r "$R/nodeaddrs" ]; then  # (sinfo\'s NodeAddr, written at submit)',
    '    while read -r _ar_n _ar_a; do [ "$_ar_n" = "$_ar_first" ] && _ar_addr=$_ar_a && break; done < "$R/nodeaddrs"',
    '  fi',
    '  [ -n "$_ar_addr" ] || _ar_addr=$(scontrol -o show node "$_ar_first" 2>/dev/null '
    '| sed -n \'s/.* NodeAddr=\\([^ ]*\\).*/\\1/p\')',
    '  [ -n "$_ar_addr" ] || _ar_addr=$_ar_first',
    '  _ar_used=$(cat /proc/net/tcp /proc/net/tcp6 2>/dev/null)',
    '  _ar_i=0; _ar_s=$(( (${SLURM_JOB_ID:-0} * 7919) % 20000 ))',
    '  while [ "$_ar_i" -lt 64 ]; do',
    '    _ar_port=$(( 20000 + (_ar_s + _ar_i * 7) % 20000 ))',
    '    case $_ar_used in *$(printf \':%04X \' "$_ar_port")*) _ar_port=""; _ar_i=$((_ar_i + 1)) ;; *) break ;; esac',
    '  done',
    'fi',
]


def run_sh(env: Mapping[str, str], workdir: str, argv: Sequence[str], members: int = 1) -> str | None:
    """``run.sh``: what job.sbatch's background subshell sources to become the program without Python
    (the fast start, see _slurm_wrap.py): the environment wrap.py would give it, the workdir, then
    ``exec setsid argv`` (a gang's: ``srun`` and its members, with ``MASTER_ADDR``/``MASTER_PORT`` from the
    script's ``_ar_addr``/``_ar_port``). None where sh cannot say it (a variable's name is not a shell name)."""
    if not argv or any(not _NAME.fullmatch(k) or k.startswith("_ar_") or k in _READONLY for k in env):
        return None
    keep = "SLURM*|" + "|".join(GPU_VARS)
    lines = [
        "# sourced by job.sbatch's background subshell (the fast start: see _slurm_wrap.py)",
        # dash's `&` ignores INT and QUIT in the child for good: put them back for the program
        "if env --default-signal=INT,QUIT >/dev/null 2>&1; then set -- env --default-signal=INT,QUIT",
        "elif [ -x /bin/bash ]; then set -- /bin/bash -c 'trap - INT QUIT; exec \"$@\"' autoresearch-start",
        "else set --; fi",
        f"cd {shlex.quote(workdir)} 2>/dev/null || {{ printf 'autoresearch: cannot run %s: no directory %s\\n' "
        f"{shlex.quote(argv[0])} {shlex.quote(workdir)} >&2; exit 127; }}",
        # the program's environment: the allocation's SLURM_* and GPU variables, plus the attempt's own
        # (the names from `export -p`, a builtin: no program started; a line of a value spread over
        # several is at worst a name unset that is not there, or set again below)
        "set -f; IFS='",
        "'",
        "for _ar_l in $(export -p); do",
        '  case $_ar_l in "export "*) _ar_v=${_ar_l#export } ;; "declare -x "*) _ar_v=${_ar_l#declare -x } ;; '
        "*) continue ;; esac",
        "  _ar_v=${_ar_v%%=*}",
        f'  case $_ar_v in {keep}|""|*[!A-Za-z0-9_]*) ;; *) unset "$_ar_v" ;; esac',
        "done",
        "set +f; unset IFS _ar_l _ar_v",
        "unset SLURM_EXPORT_ENV",
    ]
    for key in sorted(env):
        if key.startswith("SLURM"):
            continue  # the allocation's own facts win over the submitter's
        line = f"export {key}={shlex.quote(str(env[key]).replace(chr(0), ''))}"
        lines.append(f'[ -n "${{{key}+x}}" ] || {line}' if key in GPU_VARS else line)
    if members > 1:  # a gang's rendezvous, as job.sbatch found it (each member's ranks: its prologue)
        lines.append(f'export MASTER_ADDR="$_ar_addr" MASTER_PORT="$_ar_port" WORLD_SIZE={int(members)} '
                     "LOCAL_WORLD_SIZE=1")
    lines.append(f'exec "$_ar_setsid" "$@" {shlex.join(argv)}')
    return "\n".join(lines) + "\n"


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

