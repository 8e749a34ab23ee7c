"""Trial side: ``from autoresearch import report; report(step=3, loss=0.41)``.

Stdlib only and cheap to import (it is loaded inside every trial). Each call
appends one JSON line to ``$AUTORESEARCH_METRICS_FILE``, which the runtime reads
incrementally. Outside autoresearch (no such variable) it prints ``name: value``
lines instead, which the runtime also understands, so a script runs either way.
"""

from __future__ import annotations

import json
import math
import os
import time

__all__ = ["report"]

_file = None
_path = None


def report(step: int | None = None, **metrics: float) -> None:
    """Record metrics for ``step`` (a counter per metric name when omitted)."""
    global _file, _path
    clean: dict[str, float | None] = {}
    for name, raw in metrics.items():
        try:
            value = float(raw)
        except (TypeError, ValueError):
            raise TypeError(f"metric {name!r} must be a number, got {raw!r}") from None
        clean[name] = value if math.isfinite(value) else None
    path = os.environ.get("AUTORESEARCH_METRICS_FILE")
    if not path:
        for name, shown in clean.items():
            print(f"{name}: {shown}", flush=True)
        return
    if _file is None or _path != path:
        _file = open(path, "a", buffering=1)  # line-buffered: every report is visible at once
        _path = path
    record = {"ts": time.time(), "metrics": clean}
    if step is not None:
        record["step"] = int(step)
    _file.write(json.dumps(record) + "\n")
