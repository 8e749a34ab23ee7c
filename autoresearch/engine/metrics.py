"""Reading metrics out of attempts: ``report()`` JSON lines and plain log lines.

Two sources, both read incrementally from a byte offset kept in the ledger, in the
same transaction as the inserted points, so reading twice never duplicates a point:

* ``$AUTORESEARCH_METRICS_FILE`` lines written by :func:`autoresearch.report`;
* log lines in one of the :data:`LOG_FORMATS`: only ``name: value`` or ``name=value``
  pairs (a karpathy/autoresearch summary block ``val_bpb:          0.997900`` works as
  is, and so does ``val_loss=0.41 epoch=3``), the same after a leading ``epoch 3`` /
  ``step 3/100``, or a JSON object of numbers (``{"step": 3, "val_acc": 0.95}``). A
  ``step``/``epoch``/``iter`` key on the line gives the step; otherwise each name counts
  its own steps.

When a name comes from both sources, ``report()`` wins (see :func:`best_source`).

Whatever a trial writes is untrusted (docs/architecture.md, invariant 8): the parsers never raise.
A point they cannot store (a step that is not a whole number in ``0..MAX_STEP``, a
value that is not a number, a name that is empty, too long or not text, a line that is
not a JSON object) is dropped and counted in :class:`Drops`, which the runtime turns
into one warning per attempt. Non-finite values (NaN, inf, 1e400) are kept as gaps.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Collection, Hashable, Iterable
from dataclasses import dataclass
from typing import Any

from autoresearch.report import MAX_STEP
from autoresearch.util._record import record
from autoresearch.util._regex import lazy

_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf)"
_PAIR = lazy(rf"([A-Za-z_][\w./-]{{0,80}})\s*(?::|=)\s*({_NUMBER})(?![\w.:/-])", re.IGNORECASE)
_LINE = lazy(rf"^\s*(?:[A-Za-z_][\w./-]{{0,80}}\s*(?::|=)\s*(?:{_NUMBER})[\s,|;]*)+$", re.IGNORECASE)
STEP_KEYS = ("step", "epoch", "iter", "iteration")
# A leading "epoch 3", "Step 3/100:", "iter 7 |" before the pairs: the step of the line.
_LEAD = lazy(r"^\s*(step|epoch|iter|iteration)\s+(\d{1,19})(?:\s*/\s*\d+)?\s*[:,|;-]?\s*(.*)$", re.IGNORECASE)
# Numbers a structured logger puts on every JSON line; they are not metrics.
_JSON_NOT_METRICS = frozenset({"ts", "time", "timestamp", "created", "msecs", "relativeCreated", "pid", "process",
                               "thread", "lineno"})
LOG_FORMATS = ("report(step=3, val_acc=0.95) (from autoresearch import report)",
               "val_acc: 0.95 (a line of name: value pairs; name=value too: val_acc=0.95 step=3)",
               "epoch 3 val_acc: 0.95 (after a leading step/epoch/iter N)",
               '{"step": 3, "val_acc": 0.95} (a JSON line of numbers)')
MAX_NAME = 250  # MLflow's limit on a metric name
MAX_NAMES = 1000  # distinct metric names per attempt and source; more is a runaway loop, not a metric
MAX_LINE = 1 << 20  # a metrics-file line longer than this is dropped unread
_SKIP = "!skip"  # counters key: the next bytes are the rest of an over-long line (see complete_lines)


@record(frozen=True)
@dataclass(slots=True, init=False, repr=False, eq=False)
class Point:
    """One metric point of an attempt."""

    name: str
    step: int
    value: float | None
    ts: float

    def __init__(self, name: str, step: int, value: float | None, ts: float) -> None:
        _set = object.__setattr__
        _set(self, "name", name)
        _set(self, "step", step)
        _set(self, "value", value)
        _set(self, "ts", ts)


class Drops:
    """What a read dropped: how many points or lines, and the first reason (a sample)."""

    def __init__(self) -> None:
        self.count = 0
        self.reason = ""

    def add(self, reason: str, count: int = 1) -> None:
        if not self.reason:
            self.reason = reason
        self.count += count


def _short(raw: object, limit: int = 60) -> str:
    text = repr(raw)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def as_step(raw: object) -> int:
    """A step as the ledger stores it, or ValueError saying why not (never OverflowError)."""
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        raise ValueError(f"step {_short(raw)} is not a number")
    try:
        number = raw if isinstance(raw, int) else float(raw)
    except ValueError:
        raise ValueError(f"step {_short(raw)} is not a number") from None
    if isinstance(number, float) and not math.isfinite(number):
        raise ValueError(f"step {_short(raw)} is not a finite number")
    if not 0 <= number <= MAX_STEP:
        raise ValueError(f"step {_short(raw)} is outside 0..{MAX_STEP}")
    return int(number)


def _value(raw: object) -> float | None:
    """A metric value: a finite float, or None for NaN/inf (a gap); ValueError if not a number."""
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise ValueError(f"value {_short(raw)} is not a number")
    try:
        value = float(raw)
    except OverflowError:  # an int past 1e308
        return None
    return value if math.isfinite(value) else None


def _number(text: str) -> float | None:
    value = float(text)
    return value if math.isfinite(value) else None


def _name_problem(name: str, counters: dict[str, int], key: str) -> str | None:
    if not name or len(name) > MAX_NAME:
        return f"metric name {_short(name)} is empty or longer than {MAX_NAME} characters"
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return f"metric name {_short(name)} is not valid text"
    if key not in counters and sum(1 for k in counters if k[:2] == key[:2]) >= MAX_NAMES:
        return f"more than {MAX_NAMES} metric names in one attempt"
    return None


def complete_lines(chunk: bytes, counters: dict[str, int] | None = None, source: str = "",
                   drops: Drops | None = None, full: bool = False) -> tuple[list[str], int]:
    """Whole lines in ``chunk`` and how many bytes they span (a partial tail waits).

    With ``counters`` (the attempt's persisted state): a ``full`` chunk (as many bytes
    as were asked for) without a newline is one over-long line, consumed and dropped
    whole, and so is the rest of it in the next chunk, so a giant line neither blocks
    the reader nor turns into metrics halfway through.
    """
    skip_key = f"{_SKIP}:{source}"
    used = 0
    if counters is not None and counters.get(skip_key):
        end = chunk.find(b"\n")
        if end < 0:
            if full:
                return [], len(chunk)
            return [], 0
        counters.pop(skip_key)
        used = end + 1
        chunk = chunk[used:]
    end = chunk.rfind(b"\n")
    if end < 0:
        if full and counters is not None and chunk:
            counters[skip_key] = 1
            if drops is not None:
                drops.add(f"a line longer than {len(chunk)} bytes")
            return [], used + len(chunk)
        return [], used
    lines = chunk[: end + 1].decode("utf-8", "replace").splitlines()
    return lines, used + end + 1


def _ts(raw: object, now: float) -> float:
    """A point's time: the record's own if it is a plausible Unix time, else now."""
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        try:
            ts = float(raw)
        except OverflowError:
            return now
        if 0 < ts < 1e11:  # MLflow keeps milliseconds in an int64; year 5138 is plenty
            return ts
    return now


def parse_report_lines(lines: list[str], counters: dict[str, int], now: float,
                       drops: Drops | None = None) -> list[Point]:
    """Points of ``report()`` JSON lines; anything else is dropped into ``drops``."""
    drops = drops if drops is not None else Drops()
    points: list[Point] = []
    for line in lines:
        if not line.strip():
            continue
        if len(line) > MAX_LINE:
            drops.add(f"a line longer than {MAX_LINE} characters")
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            drops.add(f"not a JSON line: {_short(line)}")
            continue
        values = record.get("metrics") if isinstance(record, dict) else None
        if not isinstance(values, dict):
            drops.add(f"not a {{\"metrics\": {{name: number}}}} object: {_short(line)}")
            continue
        step: int | None = None
        if record.get("step") is not None:
            try:
                step = as_step(record["step"])
            except ValueError as err:
                drops.add(str(err), max(len(values), 1))
                continue
        ts = _ts(record.get("ts"), now)
        for name, raw in values.items():
            key = "r:" + name
            problem = _name_problem(name, counters, key)
            if problem is None:
                try:
                    value = _value(raw)
                except ValueError as err:
                    problem = f"metric {_short(name, 40)}: {err}"
            if problem is not None:
                drops.add(problem)
                continue
            points.append(_point(counters, key, name, step, value, ts))
    return points


def warm() -> None:
    """Compile the log line patterns now (a long-lived reader, before its first log: see _regex.py)."""
    for pattern in (_PAIR, _LINE, _LEAD):
        pattern()


def parse_log_lines(lines: list[str], counters: dict[str, int], now: float,
                    drops: Drops | None = None) -> list[Point]:
    """Points of metrics log lines (:data:`LOG_FORMATS`); other lines are plain output."""
    drops = drops if drops is not None else Drops()
    points: list[Point] = []
    for line in lines:
        pairs = _log_pairs(line) if len(line) <= 2000 else None
        if not pairs:
            continue
        step_pair = next(((n, v) for n, v in pairs if n.lower() in STEP_KEYS and v is not None), None)
        step: int | None = None
        if step_pair is not None:
            try:
                step = as_step(step_pair[1])
            except ValueError:
                drops.add(f"{step_pair[0]} {step_pair[1]:g} is outside 0..{MAX_STEP} in log line {_short(line)}",
                          max(len(pairs) - 1, 1))
                continue
        for name, value in pairs:
            if step is not None and name.lower() in STEP_KEYS:
                continue
            key = "l:" + name
            problem = _name_problem(name, counters, key)
            if problem is not None:
                drops.add(problem)
                continue
            points.append(_point(counters, key, name, step, value, now))
    return points


def _log_pairs(line: str) -> list[tuple[str, float | None]] | None:
    """The (name, value) pairs of a metrics log line (see :data:`LOG_FORMATS`); None for other output."""
    text = line.strip()
    if text.startswith("{") and text.endswith("}"):
        return _json_pairs(text)
    lead = _LEAD().match(line)
    if lead is not None and lead.group(3) and _LINE().match(lead.group(3)):
        rest = [(name, _number(value)) for name, value in _PAIR().findall(lead.group(3))]
        if not any(name.lower() in STEP_KEYS for name, _ in rest):
            return [(lead.group(1), float(lead.group(2))), *rest]
    if not _LINE().match(line):
        return None
    return [(name, _number(value)) for name, value in _PAIR().findall(line)]


def _json_pairs(text: str) -> list[tuple[str, float | None]] | None:
    """The numbers of a one-line JSON object (``{"metrics": {...}, "step": N}`` too); strings,
    lists and the like are other fields of a structured log line, not metrics."""
    try:
        record = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(record, dict):
        return None
    nested = record.get("metrics")
    values: dict[str, Any] = nested if isinstance(nested, dict) else record
    pairs: list[tuple[str, float | None]] = []
    for name, raw in values.items():
        if name in _JSON_NOT_METRICS:
            continue
        if isinstance(raw, (int, float)) and not isinstance(raw, bool):
            pairs.append((name, _value(raw)))
    if values is not record:
        step = record.get("step")
        if isinstance(step, (int, float)) and not isinstance(step, bool):
            pairs.append(("step", _value(step)))
    metrics = [p for p in pairs if p[0].lower() not in STEP_KEYS]
    return pairs if metrics else None


UNSEEN_AFTER_S = 30.0  # a running trial without its objective this long gets one warning


def unseen_warning(metric: str, seconds: float) -> str:
    """The warning for a trial whose objective was not seen: what it means and how to write it."""
    name = metric[:60]
    return (f"no {metric[:60]!r} seen after {seconds:.0f}s of running, so early stopping cannot judge it: call "
            f"report(step=3, {name}=0.95) or print lines like '{name}: 0.95', 'epoch 3 {name}: 0.95' or "
            f"JSON '{{\"step\": 3, \"{name}\": 0.95}}'")


def _point(counters: dict[str, int], key: str, name: str, step: int | None, value: float | None,
           ts: float) -> Point:
    """A point at ``step``, or (none given) at the next step of this name's own counter."""
    point_step = step if step is not None else min(counters.get(key, 0), MAX_STEP)
    counters[key] = min(point_step + 1, MAX_STEP)
    return Point(name, point_step, value, ts)


def _by_name(point: Any) -> Hashable:
    return point["name"]  # type: ignore[no-any-return]


def best_source(points: Iterable[Any], key: Callable[[Any], Hashable] = _by_name,
                reported: Collection[Hashable] | None = None) -> list[Any]:
    """The rule "a reported value beats one parsed from the log", in one place.

    ``points`` are ledger ``metrics`` rows (``name``, ``source``, ...). A point parsed from
    the log (``source='log'``) is dropped when a point of the same ``key`` was reported
    with ``report()``. ``key`` is the metric's name (per job: what ``metrics`` and the
    mirror show) unless the caller narrows it (the loop: per attempt). ``reported`` gives
    the reported keys when ``points`` is only a window of the rows; by default they are
    read from ``points`` themselves. Order is kept.
    """
    points = list(points)
    if reported is None:
        reported = {key(p) for p in points if p["source"] == "report"}
    return [p for p in points if not (p["source"] == "log" and key(p) in reported)]


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
