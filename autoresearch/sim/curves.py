"""Tabular learning curves: recorded once from real training runs, replayed by the search
benchmark (:mod:`autoresearch.sim.replay`) and by simulated trials.

A table is JSON, optionally gzipped (``.json.gz``)::

    {"format": "autoresearch-curves/1", "workload": "digits-mlp", "metric": "val_error",
     "mode": "min", "space": {<a plan's space: syntax>}, "step_unit": "epoch", "max_step": 27,
     "configs": [{"params": {...}, "values": [v1, v2, ...], "seconds": [s1, s2, ...] | s}]}

``values[i]`` is the metric after step ``i + 1``; ``seconds`` the wall time of each step (one
number: every step took that long). A file is untrusted (invariant 8): anything malformed,
non-finite, out of range or too large is one :class:`~autoresearch.errors.SpecError` with a
hint, never a traceback. :meth:`CurveTable.lookup` answers any params with the nearest recorded
config in the normalized space (log ranges on a log scale; a categorical counts 0 or 1), exactly
when the config is in the table. Stdlib only: a backend may import this.
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from typing import Any

from autoresearch.errors import SpecError

FORMAT = "autoresearch-curves/1"
MAX_BYTES = 256 * 1024 * 1024  # decompressed: a gzip bomb is refused, not expanded
MAX_CONFIGS = 200_000
MAX_STEPS = 100_000
MAX_POINTS = 20_000_000
MAX_SECONDS = 1e7  # one step longer than ~4 months is a unit mistake
_HINT = "record tables with bench/record_curves.py; the format is in autoresearch/sim/curves.py"


@dataclass(frozen=True)
class Curve:
    """One config's curve: ``values[i]`` after step ``i + 1``, ``seconds[i]`` the wall time of that step."""

    values: list[float]
    seconds: list[float]
    params: dict[str, Any] | None = None

    @property
    def steps(self) -> int:
        return len(self.values)

    def at(self, step: int) -> float:
        """The value after ``step`` (1-based); a step past the end is the last value."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 1:
            raise ValueError(f"step must be an int >= 1, got {step!r}")
        return self.values[min(step, len(self.values)) - 1]

    def seconds_to(self, step: int) -> float:
        """Wall time of steps 1..``step``."""
        return sum(self.seconds[: max(0, step)])


def _number(value: object, where: str, *, low: float = -math.inf, high: float = math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(f"{where} is {str(value)[:40]!r}, not a number", hint=_HINT)
    number = float(value)
    if not math.isfinite(number):
        raise SpecError(f"{where} is {number}", hint="replace a diverged value with a finite worst value, or cut "
                                                     "the curve before it; " + _HINT)
    if not low <= number <= high:
        raise SpecError(f"{where} is {number:g}, outside {low:g}..{high:g}", hint=_HINT)
    return number


def _check_space(space: object) -> dict[str, dict[str, Any]]:
    """A plan's ``space:`` syntax (a list is choices), checked without the loop's models."""
    if not isinstance(space, dict) or not space:
        raise SpecError("the table's space is missing or empty", hint=_HINT)
    out: dict[str, dict[str, Any]] = {}
    for name, raw in space.items():
        where = f"space.{str(name)[:40]}"
        p = {"choices": raw} if isinstance(raw, list) else raw
        if not isinstance(p, dict):
            raise SpecError(f"{where} is not a range or a list of choices", hint=_HINT)
        if p.get("choices") is not None:
            if not isinstance(p["choices"], list) or not p["choices"]:
                raise SpecError(f"{where}.choices is empty or not a list", hint=_HINT)
            out[str(name)] = {"choices": list(p["choices"])}
            continue
        low = _number(p.get("low"), f"{where}.low")
        high = _number(p.get("high"), f"{where}.high")
        log = bool(p.get("log", False))
        if low > high or (log and low <= 0) or not math.isfinite(high - low):
            raise SpecError(f"{where}: {low:g}..{high:g} is not a range" + (" on a log scale" if log else ""),
                            hint="low <= high, and low > 0 with log: true")
        out[str(name)] = {"low": low, "high": high, "log": log, "int": p.get("type") == "int"
                          or (isinstance(p.get("low"), int) and isinstance(p.get("high"), int))}
    return out


def _coords(space: dict[str, dict[str, Any]], params: dict[str, Any]) -> list[Any]:
    """Each parameter in [0, 1] (ranges, clamped) or as itself (categoricals)."""
    out: list[Any] = []
    for name, p in space.items():
        if name not in params:
            raise SpecError(f"params lack {name!r}", hint=f"give every parameter of the space: {', '.join(space)}")
        value = params[name]
        if "choices" in p:
            out.append(json.dumps(value, sort_keys=True, default=str))
            continue
        v = _number(value, f"param {name}")
        low, high = p["low"], p["high"]
        if p["log"]:
            v, low, high = math.log(max(v, 1e-300)), math.log(low), math.log(high)
        out.append(0.0 if high == low else min(1.0, max(0.0, (v - low) / (high - low))))
    return out


class CurveTable:
    """The curves of one workload; :meth:`load` a file, :meth:`lookup` a config's curve."""

    def __init__(self, data: dict[str, Any], source: str = "curves") -> None:
        self.source = source
        if not isinstance(data, dict):
            raise SpecError(f"{source}: not a curve table (a JSON object)", hint=_HINT)
        if data.get("format") != FORMAT:
            raise SpecError(f"{source}: format is {str(data.get('format'))[:40]!r}, not {FORMAT!r}", hint=_HINT)
        for key in ("workload", "metric"):
            if not isinstance(data.get(key), str) or not data[key]:
                raise SpecError(f"{source}: {key} is missing", hint=_HINT)
        self.workload, self.metric = str(data["workload"])[:200], str(data["metric"])[:200]
        if data.get("mode") not in ("min", "max"):
            raise SpecError(f"{source}: mode is {str(data.get('mode'))[:20]!r}", hint="mode: min or max")
        self.mode: str = data["mode"]
        self.step_unit = str(data.get("step_unit", "epoch"))[:40]
        self.space = _check_space(data.get("space"))
        self.raw_space: dict[str, Any] = data["space"]
        max_step = data.get("max_step")
        if isinstance(max_step, bool) or not isinstance(max_step, int) or not 1 <= max_step <= MAX_STEPS:
            raise SpecError(f"{source}: max_step is {str(max_step)[:20]!r}", hint=f"an int in 1..{MAX_STEPS}")
        self.max_step = max_step
        configs = data.get("configs")
        if not isinstance(configs, list) or not configs:
            raise SpecError(f"{source}: no configs", hint=_HINT)
        if len(configs) > MAX_CONFIGS or len(configs) * max_step > MAX_POINTS:
            raise SpecError(f"{source}: {len(configs)} configs x {max_step} steps is too large",
                            hint=f"at most {MAX_CONFIGS} configs and {MAX_POINTS} points")
        self.curves: list[Curve] = []
        self._coords: list[list[Any]] = []
        self._exact: dict[str, int] = {}
        for i, config in enumerate(configs):
            curve = self._curve(config, f"{source}: configs[{i}]")
            self._coords.append(_coords(self.space, curve.params or {}))
            self._exact.setdefault(json.dumps(self._coords[-1]), i)
            self.curves.append(curve)

    def _curve(self, config: object, where: str) -> Curve:
        if not isinstance(config, dict) or not isinstance(config.get("params"), dict):
            raise SpecError(f"{where} has no params", hint=_HINT)
        params = config["params"]
        extra = sorted(set(params) - set(self.space))
        if extra:
            raise SpecError(f"{where}: params {', '.join(map(str, extra))[:80]} are not in the space", hint=_HINT)
        for name, p in self.space.items():
            if "choices" in p and name in params and params[name] not in p["choices"]:
                raise SpecError(f"{where}: {name}={str(params[name])[:40]!r} is not one of its choices", hint=_HINT)
        curve = make_curve(config.get("values"), config.get("seconds"), where, max_step=self.max_step)
        return Curve(curve.values, curve.seconds, dict(params))

    @classmethod
    def load(cls, path: str | Path) -> CurveTable:
        """Read a table (``.json`` or ``.json.gz``); anything wrong is a SpecError with a hint."""
        path = Path(path)
        try:
            with path.open("rb") as f:
                head = f.read(2)
                f.seek(0)
                stream: Any = gzip.GzipFile(fileobj=f) if head == b"\x1f\x8b" else f
                blob = stream.read(MAX_BYTES + 1)
        except FileNotFoundError:
            raise SpecError(f"no curve table at {str(path)[:200]}", hint=_HINT) from None
        except (OSError, EOFError, gzip.BadGzipFile) as err:
            raise SpecError(f"cannot read the curve table {path.name[:100]}: {err}", hint=_HINT) from None
        if len(blob) > MAX_BYTES:
            raise SpecError(f"{path.name[:100]} is larger than {MAX_BYTES >> 20} MB", hint=_HINT)
        try:
            data = json.loads(blob)
        except (ValueError, RecursionError) as err:
            raise SpecError(f"{path.name[:100]} is not JSON ({str(err)[:80]})", hint=_HINT) from None
        return cls(data, path.name[:100])

    def lookup(self, params: dict[str, Any]) -> Curve:
        """The curve of ``params``: the recorded config itself, else the nearest one."""
        if not isinstance(params, dict):
            raise SpecError("params must be a mapping of parameter -> value", hint=_HINT)
        coords = _coords(self.space, params)
        exact = self._exact.get(json.dumps(coords))
        if exact is not None:
            return self.curves[exact]
        best, best_d = 0, math.inf
        for i, other in enumerate(self._coords):
            d = 0.0
            for a, b in zip(coords, other, strict=True):
                d += (a - b) ** 2 if isinstance(a, float) else float(a != b)
                if d >= best_d:
                    break
            if d < best_d:
                best, best_d = i, d
        return self.curves[best]

    def finals(self) -> list[float]:
        """Every config's value at its last step."""
        return [c.values[-1] for c in self.curves]


def make_curve(values: object, seconds: object, where: str = "curve", max_step: int = MAX_STEPS) -> Curve:
    """A checked :class:`Curve` from a list of values and per-step seconds (a list, or one number)."""
    if not isinstance(values, list) or not values:
        raise SpecError(f"{where} has no steps (values is empty or missing)", hint="a curve needs >= 1 value")
    if len(values) > max_step:
        raise SpecError(f"{where} has {len(values)} steps, more than max_step {max_step}", hint=_HINT)
    vals = [_number(v, f"{where} value {i + 1}", low=-1e300, high=1e300) for i, v in enumerate(values)]
    if isinstance(seconds, list):
        if len(seconds) != len(vals):
            raise SpecError(f"{where}: {len(seconds)} seconds for {len(vals)} values", hint="one per step")
        secs = [_number(s, f"{where} seconds {i + 1}", low=0, high=MAX_SECONDS) for i, s in enumerate(seconds)]
    else:
        secs = [_number(seconds, f"{where} seconds", low=0, high=MAX_SECONDS)] * len(vals)
    return Curve(vals, secs)


def curve_from_function(target: str) -> Callable[[dict[str, Any]], Curve]:
    """``"module:func"`` -> a callable params -> :class:`Curve`. ``func(params)`` returns a Curve,
    a list of values (1 s a step), or ``{"values": [...], "seconds": [...] | s}``; checked each call."""
    module, _, attr = str(target).partition(":")
    if not module or not attr:
        raise SpecError(f"curve function {str(target)[:100]!r} is not 'module:function'",
                        hint="e.g. mypkg.curves:digits")
    try:
        fn = getattr(import_module(module), attr)
    except (ImportError, AttributeError, ValueError) as err:
        raise SpecError(f"cannot import the curve function {str(target)[:100]!r}: {err}",
                        hint="check the module is importable (PYTHONPATH) and the function name") from None
    if not callable(fn):
        raise SpecError(f"{str(target)[:100]} is not callable", hint="name a function params -> curve")

    def curve(params: dict[str, Any]) -> Curve:
        out = fn(params)
        if isinstance(out, Curve):
            return make_curve(list(out.values), list(out.seconds), target)
        if isinstance(out, list):
            return make_curve(out, 1.0, target)
        if isinstance(out, dict):
            return make_curve(out.get("values"), out.get("seconds", 1.0), target)
        raise SpecError(f"{str(target)[:100]} returned {type(out).__name__}, not a curve",
                        hint="return a list of values or {'values': [...], 'seconds': [...]}")

    return curve
