"""The kernel log, read as the machine's own evidence: the driver's ``NVRM: Xid`` lines and the OOM killer.

NVML's event set only reports Xids that happen while the process that registered it runs;
the kernel log keeps them. :class:`KernelLog` reads the records after a cursor (kept in
the ledger per node, ``nodes.kernel_cursor``, so a short-lived pass or ``health
--slurm-hc`` sees what happened since the last reader), from ``/dev/kmsg`` (records
``pri,seq,usec,flags;text``; the cursor is the sequence number) or, when that is not
readable, ``journalctl -k -o json`` (the cursor is journald's). A log that cannot be read,
or whose records were overwritten or reset (a reboot) since the cursor, is a finding
(``kernel_log_unreadable``, ``kernel_log_gap``: shown, never a cordon); it never raises.

:func:`findings_from` turns records into findings (pure): ``NVRM: Xid (PCI:<bus>): <n>,``
is ``xid_<n>`` (hard for ``hard_xids``), ``NVRM: GPU <bus>: GPU has fallen off the bus`` is
``xid_79``, and the OOM killer's ``Out of memory: Killed process <pid> (<name>)`` /
``oom-kill:...,task=<name>,pid=<pid>`` is ``oom_kill`` (the program's: it ran out of host
memory). Every one has source ``kernel``: only the kernel writes these records, however
the same text looks in a job's output.

``AUTORESEARCH_KMSG`` points the reader at a file in /dev/kmsg's format instead (tests,
demos; ``{node}`` in it is replaced by the node's name), or turns it off (``off``).
Stdlib only.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass

from autoresearch.health.config import HealthConfig
from autoresearch.health.findings import EXCERPT_CHARS, Finding
from autoresearch.health.signatures import XID_LINE

ENV = "AUTORESEARCH_KMSG"
DEV_KMSG = "/dev/kmsg"
MAX_RECORDS = 50_000  # read per call: a flood of records is cut, with a gap finding
MAX_TEXT = 2000

_FELL_OFF = re.compile(r"NVRM: GPU (?:at PCI:)?([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.\d)?): "
                       r"GPU has fallen off the bus")
_OOM = re.compile(r"(?:Out of memory|Memory cgroup out of memory): Killed process (\d+) \(([^)]{0,64})\)"
                  r"|oom-kill:\S*?task=([^,\s]{0,64}),pid=(\d+)")


@dataclass(frozen=True, slots=True)
class Record:
    """One kernel log record: its sequence number and its text."""

    seq: int
    text: str


@dataclass(frozen=True, slots=True)
class Read:
    """What a read of the kernel log since a cursor gave: its records, the next cursor, and any problem."""

    records: list[Record]
    cursor: str | None  # where the next read starts (None: keep the old one)
    problem: str = ""  # unreadable, or records lost since the cursor: said as a finding
    signature: str = ""


def parse_kmsg(line: str) -> Record | None:
    """One /dev/kmsg record (``6,1234,5678901,-;text``), or None when the line is not one."""
    head, sep, text = line.partition(";")
    if not sep:
        return None
    fields = head.split(",")
    if len(fields) < 4 or not fields[1].isdigit():
        return None
    return Record(int(fields[1]), text.rstrip("\n")[:MAX_TEXT])


class KernelLog:
    """Reads one node's kernel log after a cursor; ``read`` never raises."""

    def __init__(self, path: str = DEV_KMSG) -> None:
        self.path = path

    def read(self, cursor: str | None) -> Read:
        after = _seq(cursor)
        if cursor and after is None and cursor.startswith("j:"):
            return self._journal(cursor)
        try:
            records, overflow = self._kmsg()
        except OSError as err:
            if self.path == DEV_KMSG and shutil.which("journalctl"):
                return self._journal(cursor)
            return Read([], None, f"cannot read the kernel log {self.path}: {err.strerror or err}",
                        "kernel_log_unreadable")
        if not records:
            return Read([], cursor)
        last = records[-1].seq
        if after is None:
            return Read(records, f"k:{last}", "", "")
        fresh = [r for r in records if r.seq > after]
        problem, sig = "", ""
        if last < after:  # the sequence started again: the machine rebooted (or the log was replaced)
            fresh, problem, sig = records, f"the kernel log restarted (sequence {last} < cursor {after})", "kernel_log_gap"
        elif records[0].seq > after + 1 or overflow:
            problem, sig = (f"kernel log records {after + 1}..{records[0].seq - 1} were overwritten before they "
                            "were read", "kernel_log_gap")
        return Read(fresh, f"k:{last}", problem, sig)

    def _kmsg(self) -> tuple[list[Record], bool]:
        records: list[Record] = []
        overflow = False
        if self.path != DEV_KMSG and os.path.isfile(self.path):
            with open(self.path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if size > 8 << 20:
                    fh.seek(size - (8 << 20))
                    overflow = True
                for raw in fh:
                    rec = parse_kmsg(raw.decode("utf-8", "replace"))
                    if rec is not None:
                        records.append(rec)
            if len(records) > MAX_RECORDS:
                records, overflow = records[-MAX_RECORDS:], True
            return records, overflow
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            while len(records) < MAX_RECORDS * 2:
                try:
                    raw = os.read(fd, 16384)  # one record per read
                except BlockingIOError:
                    break
                except OSError as err:
                    if err.errno == errno.EPIPE:  # overwritten while we read: go on from the next
                        overflow = True
                        continue
                    if err.errno == errno.EINVAL:
                        continue
                    raise
                if not raw:
                    break
                rec = parse_kmsg(raw.decode("utf-8", "replace"))
                if rec is not None:
                    records.append(rec)
        finally:
            os.close(fd)
        if len(records) > MAX_RECORDS:
            records, overflow = records[-MAX_RECORDS:], True
        return records, overflow

    def _journal(self, cursor: str | None) -> Read:
        cmd = ["journalctl", "-k", "-o", "json", "--no-pager", "-q"]
        if cursor and cursor.startswith("j:"):
            cmd.append(f"--after-cursor={cursor[2:]}")
        else:
            cmd += ["-b", "-n", str(MAX_RECORDS)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=20,
                                  stdin=subprocess.DEVNULL, check=False)
        except (OSError, subprocess.TimeoutExpired) as err:
            return Read([], None, f"cannot read the kernel log ({DEV_KMSG} or journalctl): {err}",
                        "kernel_log_unreadable")
        if done.returncode != 0 and not done.stdout:
            return Read([], None, f"cannot read the kernel log: journalctl said "
                                  f"{(done.stderr or '').strip()[:200]}", "kernel_log_unreadable")
        records: list[Record] = []
        last = cursor
        for i, line in enumerate(done.stdout.splitlines()[-MAX_RECORDS:]):
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if not isinstance(entry, dict):
                continue
            message = entry.get("MESSAGE")
            if isinstance(message, list):  # journald stores non-UTF-8 text as a list of bytes
                message = bytes(b for b in message if isinstance(b, int) and 0 <= b < 256).decode("utf-8", "replace")
            records.append(Record(i, str(message or "")[:MAX_TEXT]))
            if isinstance(entry.get("__CURSOR"), str):
                last = "j:" + entry["__CURSOR"]
        return Read(records, last)


def _seq(cursor: str | None) -> int | None:
    if cursor and cursor.startswith("k:") and cursor[2:].isdigit():
        return int(cursor[2:])
    return None


def for_node(node: str, local: bool) -> KernelLog | None:
    """The kernel log of ``node`` this process can read: ``AUTORESEARCH_KMSG``'s file, else /dev/kmsg
    when the node is this machine (``local``); None otherwise (a remote node's own health program reads it)."""
    env = (os.environ.get(ENV) or "").strip()
    if env.lower() in ("off", "0", "none"):
        return None
    if env:
        return KernelLog(env.replace("{node}", node))
    return KernelLog(DEV_KMSG) if local else None


def findings_from(node: str, read: Read, config: HealthConfig, now: float) -> list[Finding]:
    """Findings of the kernel log's new records (and of a log that could not be read whole)."""
    out: list[Finding] = []
    if read.problem:
        out.append(Finding(node, read.signature or "kernel_log_unreadable", "infra", "info", "kernel", None,
                           read.problem[:EXCERPT_CHARS], now))
    out += findings_of_records(node, (r.text for r in read.records), config, now)
    return out


def findings_of_records(node: str, texts: Iterable[str], config: HealthConfig, now: float) -> list[Finding]:
    out: list[Finding] = []
    for text in texts:
        if "NVRM" not in text and "Killed process" not in text and "oom-kill" not in text:
            continue
        match = XID_LINE.search(text)
        if match is not None:
            xid = int(match.group(2))
            hard = xid in config.hard_xids
            out.append(Finding(node, f"xid_{xid}", "infra" if hard else "user", "hard" if hard else "info", "kernel",
                               None, text.strip()[:EXCERPT_CHARS], now))  # (the node's: the PCI bus is in the text)
            continue
        fell = _FELL_OFF.search(text)
        if fell is not None:
            out.append(Finding(node, "xid_79", "infra", "hard", "kernel", None,
                               text.strip()[:EXCERPT_CHARS], now))
            continue
        oom = _OOM.search(text)
        if oom is not None:
            pid, name = (oom.group(1), oom.group(2)) if oom.group(1) else (oom.group(4), oom.group(3))
            out.append(Finding(node, "oom_kill", "user", "info", "kernel", None,
                               f"the OOM killer ended pid {pid} ({name}): {text.strip()}"[:EXCERPT_CHARS], now))
    return out
