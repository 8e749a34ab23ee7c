"""Log signatures: lines of an attempt's log that say whose fault a crash was.

The machine's (``infra``): NCCL ``WARN`` and errors, a watchdog's collective timeout, an
illegal memory access, uncorrectable ECC, an ``Xid`` in the log. The user's: ``CUDA out
of memory`` and Python tracebacks. Extra patterns come from ``health.patterns``
(:mod:`autoresearch.health.config`); one that does not compile is refused with a hint.

Scanning is one combined regular expression per line (most lines match nothing), then
the specific patterns on the few that do. Stdlib only.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass

from autoresearch.errors import SpecError
from autoresearch.health.config import HealthConfig, Pattern

MAX_LINE = 2000  # a longer line is matched on its first MAX_LINE characters


@dataclass(frozen=True, slots=True)
class Signature:
    regex: re.Pattern[str]
    signature: str
    cls: str  # infra | user
    severity: str  # hard | soft
    rank: int  # which wins when an attempt's log has several (lower wins)


def compile_pattern(pattern: str, where: str) -> re.Pattern[str]:
    if len(pattern) > 500:
        raise SpecError(f"{where}: the pattern is {len(pattern)} characters; at most 500", hint="shorten it")
    try:
        return re.compile(pattern)
    except re.error as err:
        raise SpecError(f"{where}: {pattern[:80]!r} does not compile ({err})",
                        hint="write a Python regular expression; escape ( ) [ ] . * + ? with a backslash "
                             "to match them literally") from None


_XID = re.compile(r"\bXid\b\s*(?:\([^)]{0,60}\))?\s*[:=]?\s*(\d{1,4})\b")  # NVRM: Xid (PCI:0000:3b:00): 79, ...
BUILTIN: tuple[tuple[str, str, str, str], ...] = (
    # pattern, signature, class, severity (in rank order: the first that an attempt's log matched names it)
    (r"[Uu]ncorrectable ECC|uncorrectable (?:ECC|memory) error|ECC error", "ecc_uncorrectable", "infra", "hard"),
    (r"\bXid\b", "xid", "infra", "soft"),  # hardness by number: see _xid_signature
    (r"[Ww]atchdog caught collective operation timeout|collective operation timeout|NCCL.*[Tt]imeout",
     "collective_timeout", "infra", "soft"),
    (r"NCCL error|ncclInternalError|ncclSystemError|ncclUnhandledCudaError|ncclRemoteError|NCCL failure",
     "nccl_error", "infra", "soft"),
    (r"illegal memory access", "illegal_memory_access", "infra", "soft"),
    (r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory", "cuda_oom", "user", "soft"),
    (r"NCCL WARN", "nccl_warn", "infra", "soft"),
    (r"^Traceback \(most recent call last\)", "python_exception", "user", "soft"),
)


@functools.lru_cache(maxsize=16)
def _table(extra: tuple[Pattern, ...]) -> tuple[re.Pattern[str], tuple[Signature, ...]]:
    sigs = [Signature(re.compile(p), s, c, v, i) for i, (p, s, c, v) in enumerate(BUILTIN)]
    sigs += [Signature(compile_pattern(p.pattern, "health.patterns"), p.signature, p.cls, p.severity, -1)
             for p in extra]  # the operator's patterns say more than ours: they rank first
    quick = re.compile("|".join(f"(?:{s.regex.pattern})" for s in sigs))
    return quick, tuple(sigs)


@dataclass(frozen=True, slots=True)
class Hit:
    signature: str
    cls: str
    severity: str
    rank: int
    line: str
    gpu: str | None = None


def scan(lines: Iterable[str], config: HealthConfig) -> list[Hit]:
    """The signatures these log lines show, at most one hit per signature (the first line)."""
    quick, sigs = _table(config.patterns)
    hits: dict[str, Hit] = {}
    for raw in lines:
        line = raw[:MAX_LINE]
        if not quick.search(line):
            continue
        for sig in sigs:
            if sig.signature in hits or not sig.regex.search(line):
                continue
            name, severity, gpu = sig.signature, sig.severity, None
            if name == "xid":
                name, severity, cls, gpu = _xid_signature(line, config)
                if name in hits:
                    continue
                hits[name] = Hit(name, cls, severity, sig.rank, line.strip(), gpu)
                continue
            hits[name] = Hit(name, sig.cls, severity, sig.rank, line.strip())
    return list(hits.values())


def _xid_signature(line: str, config: HealthConfig) -> tuple[str, str, str, str | None]:
    match = _XID.search(line)
    if match is None:
        return "xid", "soft", "infra", None
    xid = int(match.group(1))
    gpu = re.search(r"PCI:([0-9a-fA-F:.]+)", line)
    hard = xid in config.hard_xids
    return f"xid_{xid}", "hard" if hard else "soft", "infra", gpu.group(1) if gpu else None
