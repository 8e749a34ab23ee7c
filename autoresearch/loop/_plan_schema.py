"""``autoresearch schema plan``: the JSON Schema of what the loader *accepts*, not of the model it builds.

pydantic describes a :class:`~autoresearch.loop.plan.Plan` after validation (``timeout`` a
number of seconds, ``space`` values objects). A plan as written may say ``timeout: 2m``,
``grace: 5s``, ``memory: 16G``, ``hidden: [16, 32]`` (choices), ``proposer: tpe``,
``early_stop: asha`` or ``goal: max``: each before-validator of the models is mirrored
here, so an editor or a CI check with this schema agrees with :func:`load_plan`
(tests/loop/test_plan_schema.py runs both on every example and the bad-plan corpus).

What JSON Schema cannot say is listed in the schema's ``description`` and checked by the
loader alone: command placeholders naming space keys, ``low <= high``, a range too wide to
sample, a step that moves a value, grid sizes.
"""

from __future__ import annotations

from typing import Any

from autoresearch.util.units import DURATION_PATTERN as DURATION  # the parser's own grammar (spec.parse_duration)

NO_NUL = "^[^\\u0000]*$"
# spec.parse_memory_mb: MB (4096) or a size with a unit ("16G", "512M", "1.5GiB")
SIZE = r"^\s*[0-9]+(\.[0-9]+)?\s*([KMGTkmgt][iI]?[bB]?|[bB])?\s*$"
GOAL = r"^\s*([mM][iI][nN]([iI][mM][iI][sSzZ][eE])?|[mM][aA][xX]([iI][mM][iI][sSzZ][eE])?)\s*$"
# "{lr:.3f}" / "{lr!r}": values arrive as text, so a placeholder takes no format spec or conversion
FORMAT_SPEC = r"(^|[^{])(\{\{)*\{[^{}:!]*[:!]"
# shlex.split (shell: false): every quote closed, no trailing backslash
SHELL_WORDS = r"""^([^'"\\]|\\[\s\S]|'[^']*'|"([^"\\]|\\[\s\S])*")*$"""
FINITE = {"type": "number", "minimum": -1.7976931348623157e308, "maximum": 1.7976931348623157e308}
BEYOND_SCHEMA = ("Also checked by the loader (beyond JSON Schema): every {placeholder} in trial.command is a "
                 "key of space (or seed, trial_id, loop); in space, low <= high, high - low is finite "
                 "(not too wide to sample), a step moves a value (not too small) and makes at most 100000 "
                 "points; a prior's guess lies inside the range or among the choices; warm_start names earlier "
                 "loops (or is true: this plan's own finished ones), not the loop itself (that they exist, measure the same objective and have a compatible "
                 "space is checked when the loop starts).")


def _duration(positive: bool = True) -> dict[str, Any]:
    number = {"type": "number", "exclusiveMinimum": 0, "maximum": FINITE["maximum"]} if positive else \
        {"type": "number", "minimum": 0, "maximum": FINITE["maximum"]}
    return {"anyOf": [number, {"type": "string", "pattern": DURATION}, {"type": "null"}],
            "description": "seconds, or a duration such as '90s', '5m', '1h30m'"}


def input_schema(schema: dict[str, Any], stop_kinds: list[str], backends: dict[str, list[str] | None]) -> dict[str, Any]:
    """Rewrite pydantic's schema of :class:`Plan` into the schema of what ``load_plan`` accepts."""
    defs = schema["$defs"]
    props = schema["properties"]
    props["name"].update(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    props["space"]["additionalProperties"] = {"anyOf": [
        {"$ref": "#/$defs/Param"},
        {"type": "array", "minItems": 1, "description": "shorthand for {choices: [...]}"}]}
    props["proposer"] = {"anyOf": [{"type": "string"}, {"$ref": "#/$defs/Proposer"}],
                         "description": "a kind ('tpe') or the full section"}
    props["early_stop"] = {"anyOf": [{"type": "string", "enum": stop_kinds}, {"$ref": "#/$defs/EarlyStop"},
                                     {"type": "null"}], "description": "a kind ('asha') or the full section"}
    defs["EarlyStop"]["if"] = {"required": ["pause"], "properties": {"pause": {"const": True}}}
    defs["EarlyStop"]["then"] = {"properties": {"kind": {"enum": ["asha", "hyperband"]}}}  # promotion is at rungs
    defs["Objective"]["properties"]["goal"] = {"type": "string", "pattern": GOAL, "default": "minimize",
                                               "description": "minimize | maximize (also min, max)"}

    trial = defs["Trial"]["properties"]
    trial["command"].update(pattern="^(?=.*\\S)[^\\u0000]*$", minLength=1, **{"not": {"pattern": FORMAT_SPEC}})
    defs["Trial"]["if"] = {"not": {"required": ["shell"], "properties": {"shell": {"const": True}}}}
    defs["Trial"]["then"] = {"properties": {"command": {"pattern": SHELL_WORDS}}}
    trial["workdir"].update(pattern=NO_NUL)
    trial["timeout"] = _duration()
    trial["grace"] = {**_duration(positive=False), "description": "seconds (0: at once), or '5s', '1m'"}
    trial["memory"] = {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 2**40},
                                 {"type": "number", "minimum": 0, "maximum": 2**40},
                                 {"type": "string", "pattern": SIZE}, {"type": "null"}],
                       "description": "MB (4096), or a size such as '16G', '512M'"}
    trial["cpus"] = {**FINITE, "minimum": 0, "default": 0}
    trial["env"] = {"type": "object", "propertyNames": {"pattern": "^[^=\\u0000]+$"},
                    "additionalProperties": {"anyOf": [{"type": "string", "pattern": NO_NUL},
                                                       {"type": ["number", "boolean", "null"]}]}}
    defs["Budget"]["properties"]["wall"] = _duration()
    for key in ("trials", "parallel"):  # 0 is refused with its own message; a bool is not a count
        defs["Budget"]["properties"][key]["minimum"] = 1
    loop_name = {"type": "string", "pattern": props["name"]["pattern"]}
    props["warm_start"] = {"anyOf": [{"type": "boolean"}, loop_name, {"type": "array", "items": loop_name}],
                           "description": props["warm_start"].get("description", ""), "default": []}

    param = defs["Param"]
    for key in ("low", "high", "step"):
        param["properties"][key] = {"anyOf": [FINITE, {"type": "null"}]}
    param["properties"]["step"]["anyOf"][0] = {**FINITE, "exclusiveMinimum": 0}
    param["properties"]["choices"] = {"anyOf": [{"type": "array", "minItems": 1}, {"type": "null"}]}
    param["oneOf"] = [
        {"required": ["choices"], "properties": {"choices": {"type": "array"}, "low": {"type": "null"},
                                                 "high": {"type": "null"}}},
        {"required": ["low", "high"], "properties": {"low": {"type": "number"}, "high": {"type": "number"},
                                                     "choices": {"type": "null"}}},
    ]
    param["properties"]["prior"] = {"anyOf": [{"$ref": "#/$defs/Prior"}, {"type": ["number", "string", "boolean"]},
                                              {"type": "null"}],
                                    "description": "{guess: VALUE, confidence: 0..1}, or just the guess"}
    defs["Prior"]["required"] = ["guess"]
    param["if"] = {"required": ["log"], "properties": {"log": {"const": True}}}
    param["then"] = {"properties": {"low": {"exclusiveMinimum": 0}}}

    ref = defs["BackendRef"]
    ref["properties"]["kind"].update(enum=sorted(backends))
    ref["additionalProperties"] = True  # {kind: K, option: value, ...}: a kind's options inline, as the loader takes
    ref["allOf"] = [{"if": {"properties": {"kind": {"const": kind}}, **({"required": ["kind"]} if kind != "local" else {})},
                     "then": {"properties": {"options": {"propertyNames": {"enum": options}}},
                              "propertyNames": {"enum": ["kind", "options", *options]}}}
                    for kind, options in sorted(backends.items()) if options is not None]
    defs["Code"]["properties"]["files"]["minItems"] = 1
    # An empty space needs a code: section or a proposer that invents its own trials.
    schema["anyOf"] = [
        {"required": ["space"], "properties": {"space": {"minProperties": 1}}},
        {"required": ["code"], "properties": {"code": {"type": "object"}}},
        {"required": ["proposer"], "properties": {"proposer": {"anyOf": [
            {"enum": ["agent", "llm"]}, {"required": ["kind"], "properties": {"kind": {"enum": ["agent", "llm"]}}}]}}},
    ]
    schema["description"] = BEYOND_SCHEMA
    schema["title"] = "autoresearch plan"
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema
