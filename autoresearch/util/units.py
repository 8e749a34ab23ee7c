"""Durations, one grammar for every reader: the job spec (``spec.py``: its hand-written fast
path and its pydantic model), the plan (``loop/plan.py``: ``trial.timeout``, ``trial.grace``,
``budget.wall``) and the plan's JSON Schema (``loop/_plan_schema.py``, :data:`DURATION_PATTERN`).
Seconds (``300``, ``"300"``, ``"2.5e3"``) or hours/minutes/seconds parts (``"1h30m"``, ``"5m"``,
``"90s"``), positive and finite. Stdlib only: a submit and a status read import it.
"""

from __future__ import annotations

import math

from autoresearch.errors import SpecError
from autoresearch.util._regex import lazy

NUMBER = r"[0-9]+(?:\.[0-9]+)?"
SECONDS = r"[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?"  # what float() reads here (JSON Schema: no "inf", "nan")
HINT = 'write seconds (300) or "5m", "1h30m", "90s"'


def _parts(capture: bool) -> str:
    """``1h``, ``30m`` and ``15s``, each optional and in that order (``ms`` is not minutes)."""
    def part(unit: str, tail: str = "") -> str:
        number = f"(?P<{unit}>{NUMBER})" if capture else f"(?:{NUMBER})"
        return f"(?:{number}\\s*[{unit}{unit.upper()}]{tail})?"

    return part("h") + r"\s*" + part("m", "(?![sS])") + r"\s*" + part("s")


# The JSON Schema ``pattern`` (ECMA-262 and Python alike): what parse_duration reads from text.
DURATION_PATTERN = r"^\s*(?:" + SECONDS + r"|(?=.*[0-9])" + _parts(capture=False) + r")\s*$"
_PARTS = lazy(r"^\s*" + _parts(capture=True) + r"\s*$")
_SECONDS = lazy(r"^\s*" + SECONDS + r"\s*$")


def parse_duration(value: object, field: str = "duration") -> float | None:
    """``90``, ``"90s"``, ``"5m"``, ``"1h30m"`` → seconds; ``None`` (or ``""``) stays ``None``."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise SpecError(f"{field} must be a duration, not {value!r}", hint=HINT)
    if isinstance(value, (int, float)):
        seconds = float(value) if not isinstance(value, int) or abs(value) < 10**300 else math.inf
    else:
        text = str(value).strip()
        match = _PARTS().match(text)
        if _SECONDS().match(text):
            seconds = float(text)
        elif match and any(match.groups()):
            h, m, s = (float(match[g]) if match[g] else 0.0 for g in ("h", "m", "s"))
            seconds = h * 3600 + m * 60 + s
        else:  # the schema's pattern refuses it too ("+5", "1_0", "inf": not durations)
            raise SpecError(f"{field} {value!r} is not a duration", hint=HINT)
    if not math.isfinite(seconds):  # .nan would mean "no limit" by accident, .inf on purpose
        raise SpecError(f"{field} must be a finite duration, got {value!r}", hint="leave it out for no limit")
    if seconds <= 0:
        raise SpecError(f"{field} must be positive, got {value!r}", hint="leave it out for no limit")
    return seconds


def parse_grace(value: object, field: str = "grace") -> float:
    """Seconds between SIGTERM and SIGKILL: ``0`` means at once; empty means the 10 s default."""
    if value in (0, "0"):
        return 0.0
    return parse_duration(value, field) or 10.0
