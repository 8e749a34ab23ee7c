"""Run folders belong to the one ledger that made them (docs/architecture.md, invariant 10).

An attempt's files live at ``$AUTORESEARCH_HOME/jobs/<job id>/attempt-<n>`` (a folder) with its log
and metrics file beside it. Job ids are the ledger's: a ledger made afresh in a home that holds the
folders of an earlier one (moved aside after a corruption, emptied, truncated), or a home that had
another home's folders copied in, would number a job as one of theirs, and its launch would find an
attempt already there: the old command's exit and metrics read as the new job's, the new command
never run. So:

* a new or empty ledger beside existing run folders refuses to open (:meth:`Ledger._migrate`);
* a launch never starts in a folder someone else left there (:func:`claim`): the leftovers are moved
  aside, into ``jobs/<id>/foreign-<ns>/``, with an event that says what moved and whose they were
  (the ``ledger`` of their request.json); one a live supervisor still runs is never touched, and the
  launch fails instead (retried as another attempt);
* :func:`move_aside` (``autoresearch doctor --move-aside``) keeps an unusable ledger and its run
  folders in ``aside-<UTC time>/`` and lets a fresh ledger start, saying what it kept.

A launch pays two ``lstat`` calls for this (the run folder and the log: neither exists on a clean
launch); a status read pays nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from autoresearch.util._record import NEW, record

# What a launch may find in its run folder that is its own: a stop() that came before the start writes it.
OWN_EARLY = frozenset({"stop.json"})
LEDGER_FILES = ("ledger.db", "ledger.db-wal", "ledger.db-shm")


def leftovers(run_dir: str, log_path: str, metrics_path: str) -> list[str]:
    """The files of an attempt that are there before its launch (none on a clean launch)."""
    found: list[str] = []
    if os.path.lexists(run_dir):
        try:
            names = os.listdir(run_dir)
        except OSError:
            names = ["?"]
        if set(names) - OWN_EARLY:
            found.append(run_dir)
    if os.path.lexists(log_path):
        found.append(log_path)
    if found and os.path.lexists(metrics_path):
        found.append(metrics_path)
    elif os.path.lexists(metrics_path) and os.path.getsize(metrics_path) > 0:
        found.append(metrics_path)
    return found


def recorded_ledger(run_dir: str) -> str | None:
    """The ledger id a run folder's request.json names ('' when it names none: made before identities)."""
    try:
        with open(os.path.join(run_dir, "request.json"), "rb") as f:
            data = json.loads(f.read(1 << 20) or b"{}")
    except (OSError, ValueError):
        return None
    return str(data.get("ledger") or "") if isinstance(data, dict) else None


def live_supervisor(run_dir: str) -> int | None:
    """The pid of a live local supervisor that still runs the attempt of ``run_dir``, if any."""
    from autoresearch.backends import _supervisor as sup

    if os.path.exists(os.path.join(run_dir, sup.EXIT)):
        return None
    state = sup.read_json(os.path.join(run_dir, sup.STATE))
    if not state:
        return None
    try:
        pid = int(state["supervisor_pid"])
    except (KeyError, TypeError, ValueError):
        return None
    return pid if sup.is_alive(pid, state.get("supervisor_start")) else None


def set_aside(job_dir: str, paths: list[str]) -> str:
    """Move ``paths`` (an attempt's leftovers in ``job_dir``) into a new ``foreign-<ns>`` folder there."""
    target = os.path.join(job_dir, f"foreign-{time.time_ns()}")
    os.makedirs(target, mode=0o700)
    for path in paths:
        os.rename(path, os.path.join(target, os.path.basename(path)))
    return target


def count(home: str | os.PathLike[str]) -> int:
    """How many job folders ``home``'s jobs/ holds."""
    try:
        with os.scandir(os.path.join(home, "jobs")) as entries:
            return sum(1 for _ in entries)
    except OSError:
        return 0


@record()
@dataclass(init=False, repr=False, eq=False)
class Aside:
    """What :func:`move_aside` did: the folder it made and what it moved there."""

    folder: str
    moved: list[str] = field(default_factory=list)
    run_folders: int = 0  # job folders among them

    def __init__(self, folder: str, moved: list[str] = NEW, run_folders: int = 0) -> None:
        self.folder = folder
        self.moved = [] if moved is NEW else moved
        self.run_folders = run_folders


def move_aside(home: str | os.PathLike[str]) -> Aside:
    """Keep the ledger (its -wal and -shm too) and every run folder of ``home`` in ``aside-<UTC time>/``,
    so the next command starts a fresh ledger. Refuses (StateError) while a supervisor of the home still
    runs an attempt: its ending would be written into a folder that is no longer where it looks."""
    from autoresearch.errors import StateError

    base = Path(home).expanduser().absolute()
    jobs = base / "jobs"
    live: list[str] = []
    with contextlib.suppress(OSError):
        for job in os.scandir(jobs):
            with contextlib.suppress(OSError):
                for entry in os.scandir(job.path):
                    if entry.is_dir(follow_symlinks=False) and entry.name.startswith("attempt-"):
                        pid = live_supervisor(entry.path)
                        if pid is not None:
                            live.append(f"{entry.path} (supervisor pid {pid})")
    if live:
        raise StateError(
            f"{len(live)} attempt(s) of {base} still run: " + "; ".join(live[:3]) + ("; ..." if len(live) > 3 else ""),
            hint="let them end, or end them (kill the supervisor pids: they stop their commands), then run "
                 "`autoresearch doctor --move-aside` again")
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    folder = base / f"aside-{stamp}"
    suffix = 1
    while folder.exists():
        suffix += 1
        folder = base / f"aside-{stamp}-{suffix}"
    folder.mkdir(mode=0o700)
    aside = Aside(str(folder))
    aside.run_folders = count(base)
    for name in (*LEDGER_FILES, "jobs"):
        path = base / name
        if os.path.lexists(path):
            os.rename(path, folder / name)
            aside.moved.append(name)
    return aside
