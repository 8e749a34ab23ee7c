"""Reading metrics out of attempts: ``report()`` JSON lines and plain log lines.

Two sources, both read incrementally from a byte offset kept in the ledger, in the
same transaction as the inserted points, so reading twice never duplicates a point:

* ``$AUTORESEARCH_METRICS_FILE`` lines written by :func:`autoresearch.report`;
* log lines that are only ``name: value`` or ``name=value`` pairs — a
  karpathy/autoresearch summary block (``val_bpb:          0.997900``) works as is,
  and so does ``epoch=3 val_loss=0.41``. A ``step``/``epoch``/``iter`` key on the
  same line gives the step; otherwise each name counts its own steps.

When a name comes from both sources, ``report()`` wins (see :func:`best_source`).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf)"
_PAIR = re.compile(rf"([A-Za-z_][\w./-]{{0,80}})\s*(?::|=)\s*({_NUMBER})(?![\w.:/-])", re.IGNORECASE)
_LINE = re.compile(rf"^\s*(?:[A-Za-z_][\w./-]{{0,80}}\s*(?::|=)\s*(?:{_NUMBER})[\s,|;]*)+$", re.IGNORECASE)
STEP_KEYS = ("step", "epoch", "iter", "iteration")


@dataclass(frozen=True, slots=True)
class Point:
    name: str
    step: int
    value: float | None
    ts: float


def _number(text: str) -> float | None:
    value = float(text)
    return value if math.isfinite(value) else None


def complete_lines(chunk: bytes) -> tuple[list[str], int]:
    """Whole lines in ``chunk`` and how many bytes they span (a partial tail waits)."""
    end = chunk.rfind(b"\n")
    if end < 0:
        return [], 0
    return chunk[: end + 1].decode("utf-8", "replace").splitlines(), end + 1


def parse_report_lines(lines: list[str], counters: dict[str, int], now: float) -> list[Point]:
    points: list[Point] = []
    for line in lines:
        try:
            record = json.loads(line)
            values = record["metrics"]
        except (ValueError, KeyError, TypeError):
            continue
        ts = float(record.get("ts") or now)
        for name, value in values.items():
            step = record.get("step")
            if step is None:
                step = counters.get("r:" + name, 0)
            counters["r:" + name] = int(step) + 1
            points.append(Point(str(name), int(step), value if value is None else float(value), ts))
    return points


def parse_log_lines(lines: list[str], counters: dict[str, int], now: float) -> list[Point]:
    points: list[Point] = []
    for line in lines:
        if len(line) > 2000 or not _LINE.match(line):
            continue
        pairs = [(name, _number(value)) for name, value in _PAIR.findall(line)]
        step_value = next((v for n, v in pairs if n.lower() in STEP_KEYS and v is not None), None)
        for name, value in pairs:
            if step_value is not None and name.lower() in STEP_KEYS:
                continue
            if step_value is not None:
                step = int(step_value)
            else:
                step = counters.get("l:" + name, 0)
            counters["l:" + name] = step + 1
            points.append(Point(name, step, value, now))
    return points


@dataclass(frozen=True, slots=True)
class Summary:
    name: str
    last: float | None
    best: float | None
    step: int
    count: int
    mode: str  # "min" or "max": what "best" means for this name


def guess_mode(name: str) -> str:
    lowered = name.lower()
    if any(k in lowered for k in ("acc", "auc", "f1", "precision", "recall", "score", "reward", "mfu", "throughput")):
        return "max"
    return "min"


def downsample(series: list[tuple[int, float | None]], max_points: int) -> list[tuple[int, float | None]]:
    """Keep first and last, and evenly spaced points in between."""
    if len(series) <= max_points or max_points < 2:
        return series
    step = (len(series) - 1) / (max_points - 1)
    return [series[round(i * step)] for i in range(max_points)]
