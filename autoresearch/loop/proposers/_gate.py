"""The search space as LLM proposers see it: described in a prompt, a JSON Schema for
structured output, and a gate every proposal passes before it can launch.

A space maps a parameter name to ``{low, high, log?, type: int|float, step?}`` or
``{choices: [...]}`` (plan.yaml's :class:`~autoresearch.loop.plan.Param`, or its
dict). A proposal is clipped into range with a note (an LLM asking for lr=1.2 with
high 0.3 gets 0.3) and rejected, with a reason, when it cannot be repaired: a
missing parameter, a value that is not a number, a choice that does not exist.
"""

from __future__ import annotations

import json
import math
from typing import Any


class Rejected(ValueError):
    """A proposal that cannot be made valid; ``str()`` is the reason."""


def as_dict(obj: Any) -> Any:
    """Plain data from a pydantic model or a mapping (recursively for mappings of models)."""
    if obj is None:
        return None
    if hasattr(obj, "model_dump"):
        return obj.model_dump(exclude_none=True)
    if isinstance(obj, dict):
        return {k: as_dict(v) if hasattr(v, "model_dump") else v for k, v in obj.items()}
    return obj


def normalize(space: Any) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, spec in (as_dict(space) or {}).items():
        spec = as_dict(spec)
        if isinstance(spec, list):
            spec = {"choices": spec}
        elif not isinstance(spec, dict):
            spec = {"choices": [spec]}  # a constant
        out[str(name)] = {k: v for k, v in spec.items() if v is not None}
    return out


def _is_int(spec: dict[str, Any]) -> bool:
    if spec.get("int") or spec.get("type") in ("int", "integer"):
        return True
    return "type" not in spec and all(isinstance(spec.get(k), int) and not isinstance(spec.get(k), bool)
                                      for k in ("low", "high"))


def describe(space: dict[str, dict[str, Any]]) -> str:
    lines = []
    for name, spec in space.items():
        if "choices" in spec:
            lines.append(f"- {name}: one of {json.dumps(spec['choices'])}")
        else:
            kind = "integer" if _is_int(spec) else "float"
            extra = ", log scale" if spec.get("log") else ""
            extra += f", step {spec['step']}" if spec.get("step") else ""
            lines.append(f"- {name}: {kind} in [{_fmt(spec['low'])}, {_fmt(spec['high'])}]{extra}")
    return "\n".join(lines) or "(no parameters: propose code changes only; give params as {})"


def params_schema(space: dict[str, dict[str, Any]]) -> dict[str, Any]:
    props: dict[str, Any] = {}
    for name, spec in space.items():
        if "choices" in spec:
            props[name] = {"enum": list(spec["choices"])}
        else:
            props[name] = {"type": "integer" if _is_int(spec) else "number",
                           "minimum": spec.get("low"), "maximum": spec.get("high")}
    return {"type": "object", "properties": props, "required": list(space)}


def coerce(space: dict[str, dict[str, Any]], params: Any) -> tuple[dict[str, Any], list[str]]:
    """A valid copy of ``params`` and notes on what was changed; :class:`Rejected` if hopeless."""
    if not isinstance(params, dict):
        raise Rejected(f"params must be an object, got {type(params).__name__}")
    notes = [f"dropped unknown parameter {k!r}" for k in params if k not in space]
    out: dict[str, Any] = {}
    for name, spec in space.items():
        if name not in params:
            raise Rejected(f"missing parameter {name!r}")
        value = params[name]
        if "choices" in spec:
            out[name] = _choice(name, spec["choices"], value)
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise Rejected(f"{name}={value!r} is not a number")
        try:
            number = float(value)
        except ValueError:
            raise Rejected(f"{name}={value!r} is not a number") from None
        if math.isnan(number) or math.isinf(number):
            raise Rejected(f"{name}={value!r} is not a finite number")
        low, high = float(spec.get("low", -math.inf)), float(spec.get("high", math.inf))
        clipped = min(max(number, low), high)
        if clipped != number:
            notes.append(f"clipped {name} from {value} to {_fmt(clipped)} (range [{_fmt(low)}, {_fmt(high)}])")
        if spec.get("step"):
            step = float(spec["step"])
            clipped = min(low + round((clipped - low) / step) * step, high)
        if _is_int(spec):
            rounded = int(round(clipped))
            if rounded != clipped:
                notes.append(f"rounded {name} from {_fmt(clipped)} to {rounded}")
            out[name] = rounded
        else:
            out[name] = clipped
    return out, notes


def _choice(name: str, choices: list[Any], value: Any) -> Any:
    for choice in choices:
        if choice == value and type(choice) is type(value):
            return choice
    for choice in choices:  # 64.0 for 64, but never True for 1
        if choice == value and not isinstance(choice, bool) and not isinstance(value, bool):
            return choice
    by_text = {str(c).lower(): c for c in choices}
    if str(value).lower() in by_text:  # "64" for 64, "True" for true
        return by_text[str(value).lower()]
    raise Rejected(f"{name}={value!r} is not one of {json.dumps(choices)}")


def _fmt(x: float) -> str:
    return f"{x:.6g}"
