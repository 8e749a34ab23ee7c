"""Helpers shared by the algorithmic proposers: sampling a space, canonical params."""

from __future__ import annotations

import json
import math
import random as _random
from typing import Any


def canonical(params: dict[str, Any]) -> str:
    """One string per configuration (to find duplicates)."""
    return json.dumps(params, sort_keys=True, default=str)


def sample(space: dict[str, Any], rng: _random.Random) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, p in space.items():
        if p.choices is not None:
            out[name] = rng.choice(p.choices)
            continue
        low, high = float(p.low), float(p.high)
        if p.log:
            value = math.exp(rng.uniform(math.log(low), math.log(high)))
        else:
            value = rng.uniform(low, high)
        if p.step is not None:
            value = low + round((value - low) / p.step) * p.step
            value = min(max(value, low), high)
        if p.is_int:
            out[name] = int(round(value))
        else:
            out[name] = float(f"{value:.6g}")
    return out
