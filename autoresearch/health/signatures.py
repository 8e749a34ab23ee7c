"""Log signatures: lines of an attempt's log in the formats NCCL, PyTorch, CUDA and the driver print.

An attempt's log is the job's own output: untrusted (invariant 8) and job-owned
(invariant 10). What it says decides only about that job, never about the node: a hit
is a finding with source ``log``, class ``user`` (the program's bug) or
``infra-suspect`` (the machine may be at fault: the node gets an immediate re-check,
whose machine-owned result decides), or ``info`` (shown, decides nothing).

Each built-in signature is anchored to a format that the tool actually prints (see
tests/health/corpus/ for real excerpts), never to a word: a line that merely mentions
``Xid``, ``ECC`` or ``NCCL`` (``checking dmesg for Xid 79 ... none found``,
``step 1 no ECC error detected``) matches nothing.

* PyTorch's NCCL errors: ``NCCL error in: <file>:<line>, <ncclGetErrorString>``; NCCL's
  own ``ncclSystemError: ...`` / ``ncclRemoteError: ...`` lines; ``NCCL WARN NET/...``
  from ``host:pid:tid [rank] file.cc:line NCCL WARN``. System, remote and internal
  errors and unhandled CUDA errors are ``infra-suspect``; ``invalid usage`` and
  ``invalid argument`` are the program's (``user``).
* PyTorch's watchdog: ``Watchdog caught collective operation timeout: WorkNCCL(SeqNum=N``
  (``infra-suspect``).
* CUDA's runtime messages (``CUDA error: an illegal memory access was encountered``,
  ``CUDA error: device-side assert triggered``, a kernel's ``Assertion `...` failed.``,
  ``CUDA out of memory. Tried to allocate``, ``CUDA error: out of memory``): ``user``;
  ``CUDA error: uncorrectable ECC error encountered``: ``infra-suspect``.
* The driver's kernel-log line ``NVRM: Xid (PCI:<bus>): <n>, ...`` printed by the job:
  ``infra-suspect`` at most (the kernel log itself, read by :mod:`.kernel_log`, is the
  machine's word).
* ``Traceback (most recent call last):`` at a line's start: the program's exception.

Operator patterns (``health.patterns``) match the same job output: class ``infra`` there
means ``infra-suspect`` here. Scanning is one combined regular expression per line (most
lines match nothing), then the specific patterns on the few that do. Stdlib only.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass

from autoresearch.health.config import HealthConfig, Pattern, compile_pattern

MAX_LINE = 2000  # a longer line is matched on its first MAX_LINE characters
SUSPECT = "infra-suspect"


@dataclass(frozen=True, slots=True)
class Signature:
    """A log signature: the pattern, its name, whose fault it means and its rank among several."""

    regex: re.Pattern[str]
    signature: str
    cls: str  # user | infra-suspect | info
    rank: int  # which wins when an attempt's log has several (lower wins)


# The driver's Xid line as the kernel log has it: "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, ..."
XID_LINE = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-9a-fA-F])?)\): "
                      r"(\d{1,4}),")
_NCCL_FILE = r"NCCL error in: \S+:\d+, "
_NCCL_WARN = r"\b[\w.-]{1,64}:\d+:\d+ \[\d+\] \S+:\d+ NCCL WARN "  # host:pid:tid [cudaDev] file.cc:line NCCL WARN
BUILTIN: tuple[tuple[str, str, str], ...] = (
    # pattern, signature, class (in rank order: the first that an attempt's log matched names it)
    # -- the program's own bugs, as CUDA, PyTorch and NCCL print them
    (r"CUDA out of memory\. Tried to allocate \d|OutOfMemoryError: CUDA out of memory|CUDA error: out of memory"
     r"|NCCL WARN Cuda failure 'out of memory'", "cuda_oom", "user"),
    (r"CUDA error: an illegal memory access was encountered|Cuda failure 'an illegal memory access was encountered'"
     r"|cudaErrorIllegalAddress", "illegal_memory_access", "user"),
    (r"CUDA error: device-side assert triggered|\.cu:\d+: \w[^\n]{0,200}block: \[\d+,\d+,\d+\], thread: \[\d+,\d+,\d+\] "
     r"Assertion `", "device_assert", "user"),
    (_NCCL_FILE + r"invalid (?:usage|argument)|ncclInvalidUsage: |ncclInvalidArgument: |NCCL Error \d: invalid usage",
     "nccl_invalid_usage", "user"),
    # -- the machine may be at fault: the node is re-checked, the attempt retried elsewhere
    (r"CUDA error: uncorrectable ECC error encountered|cudaErrorECCUncorrectable", "ecc_in_log", SUSPECT),
    (XID_LINE.pattern, "xid_in_log", SUSPECT),
    (r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=\d+", "collective_timeout", SUSPECT),
    (_NCCL_FILE + r"(?:unhandled system error|remote process exited or there was a network error|internal error"
     r"|unhandled cuda error)|ncclSystemError: |ncclRemoteError: |ncclInternalError: |ncclUnhandledCudaError: "
     r"|NCCL Error \d: (?:unhandled system error|unhandled cuda error|internal error)", "nccl_error", SUSPECT),
    (_NCCL_WARN + r"(?:NET/|Call to \w+ failed|Connect to \S+ failed|socket)",
     "nccl_net_error", SUSPECT),
    # -- the program's exception (after the specific ones above: a watchdog's traceback is not the program's)
    (r"^(?:\[[^\]]{1,40}\]:?\s*)?Traceback \(most recent call last\):", "python_exception", "user"),
    # -- shown, decides nothing
    (_NCCL_WARN, "nccl_warn", "info"),
)


@functools.lru_cache(maxsize=16)
def _table(extra: tuple[Pattern, ...]) -> tuple[re.Pattern[str], tuple[Signature, ...]]:
    sigs = [Signature(re.compile(p, re.M), s, c, i) for i, (p, s, c) in enumerate(BUILTIN)]
    # The operator's patterns say more than ours (they rank first), but they too read job output:
    # "infra" there is a suspicion here, never a verdict about the node.
    sigs += [Signature(compile_pattern(p.pattern, "health.patterns"), p.signature,
                       SUSPECT if p.cls == "infra" else "user", -1) for p in extra]
    quick = re.compile("|".join(f"(?:{s.regex.pattern})" for s in sigs), re.M)
    return quick, tuple(sigs)


@dataclass(frozen=True, slots=True)
class Hit:
    """A signature found in an attempt's log, with the line it matched."""

    signature: str
    cls: str  # user | infra-suspect | info
    rank: int
    line: str
    severity: str = "soft"  # job-owned evidence is never hard
    gpu: str | None = None


def scan(lines: Iterable[str], config: HealthConfig) -> list[Hit]:
    """The signatures these log lines show, at most one hit per signature (the first line)."""
    quick, sigs = _table(config.patterns)
    hits: dict[str, Hit] = {}
    for raw in lines:
        if not isinstance(raw, str):
            continue
        line = raw[:MAX_LINE].strip("\r\n")
        if not quick.search(line):
            continue
        for sig in sigs:
            if sig.signature in hits or not sig.regex.search(line):
                continue
            severity = "info" if sig.cls == "info" else "soft"
            hits[sig.signature] = Hit(sig.signature, sig.cls, sig.rank, line.strip(), severity)
    return list(hits.values())


def classify_line(line: str, config: HealthConfig | None = None) -> str:
    """The class one line shows (``user``, ``infra-suspect``, ``info``), or ``none``: for tests and docs."""
    hits = scan([line], config or HealthConfig())
    return min(hits, key=lambda h: h.rank).cls if hits else "none"
