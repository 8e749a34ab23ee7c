"""Health thresholds: the ``health:`` section of ``$AUTORESEARCH_HOME/config.yaml``.

Read by its own small loader (the home's config.yaml also holds ``backends:``, which is
not ours to parse): YAML is imported only when the file exists and names ``health:``,
so a pass on a home without it pays one ``stat``. ``AUTORESEARCH_HEALTH=off`` turns the
checks off. Every key, with its default::

    health:
      preflight: true            # check an attempt's GPUs before its command starts
      preflight_cache: 5m        # a node that passed is not checked again for this long
      poll_interval: 30s         # NVML polling and log scanning per node, at most this often
      cordon_after: 3            # infra failures of this many different jobs on one node within
                                 # cordon_window cordon it
      cordon_window: 1h
      degraded_for: 10m          # a node that throttled stays degraded (placed last) this long
      uncordon: manual           # or "preflight": a health cordon of a soft cause lifts when the node passes
                                 # again after the cool-down (hard causes always wait for a person)
      cooldown: 10m              # how long a soft health cordon stands before a passing check lifts it
      hang_after: 0              # no log line or metric for this long is a finding (0: off;
                                 # per job: env AUTORESEARCH_HANG_AFTER)
      on_hang: report            # or "kill": a hang is stopped, its class infra-suspect (stack dumped)
      hard_xids: [48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140]
      ecc_uncorrected_max: 0     # volatile uncorrectable ECC errors tolerated
      temperature_margin: 5      # degrees below the board's slowdown threshold that count as hot
      throttle_reasons: 0xE8     # clock-event bits that mark a node degraded (0x4 SwPowerCap is not)
      min_driver: ""             # e.g. "535.104": an older driver is a finding
      patterns:                  # extra log signatures
        - {pattern: "my fabric error", signature: fabric, class: infra}
      probe:                     # a short job run on the attempt's GPUs at preflight
        command: [python, -m, autoresearch.health.probe]
        timeout: 60s
        min_busbw_gbps: 0        # all-reduce bus bandwidth below this fails the probe
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from autoresearch.errors import SpecError

HINT = "fix the health: section of {path} (see `autoresearch health --help` for every key and its default)"
DEFAULT_HARD_XIDS = (48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140)
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([smhd]?)\s*$")


@dataclass(frozen=True, slots=True)
class Pattern:
    """A log line pattern of health.yaml: the signature it means, whose fault (infra or user) and how bad."""

    pattern: str
    signature: str
    cls: str = "infra"  # infra | user
    severity: str = "soft"  # hard | soft


@dataclass(frozen=True, slots=True)
class Probe:
    """The periodic probe health.yaml names: its command, how long it may run, the bus bandwidth it must reach."""

    command: tuple[str, ...] = ()
    timeout_s: float = 60.0
    min_busbw_gbps: float = 0.0


@dataclass(frozen=True, slots=True)
class HealthConfig:
    """The health checks' settings (health: in config.yaml, or the defaults)."""

    enabled: bool = True
    preflight: bool = True
    preflight_cache_s: float = 300.0
    poll_interval_s: float = 30.0
    cordon_after: int = 3
    cordon_window_s: float = 3600.0
    degraded_for_s: float = 600.0
    uncordon: str = "manual"
    cooldown_s: float = 600.0
    on_hang: str = "report"
    hang_after_s: float = 0.0
    hard_xids: frozenset[int] = frozenset(DEFAULT_HARD_XIDS)
    ecc_uncorrected_max: int = 0
    temperature_margin_c: float = 5.0
    throttle_reasons: int = 0x8 | 0x20 | 0x40 | 0x80
    min_driver: str = ""
    patterns: tuple[Pattern, ...] = ()
    probe: Probe = field(default_factory=Probe)


DEFAULT = HealthConfig()


def duration(value: Any, key: str, path: str) -> float:
    """Seconds from a number or '30s', '5m', '1h'; SpecError with a hint otherwise."""
    if isinstance(value, bool):
        value = None
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value)) if isinstance(value, str) else None
        seconds = float(match.group(1)) * _UNITS[match.group(2)] if match else -1.0
    if not (math.isfinite(seconds) and 0 <= seconds <= 10 * 365 * 86400):
        raise SpecError(f"health.{key}: {str(value)[:40]!r} is not a duration", hint="use seconds or '30s', '5m', '1h'")
    return seconds


def _count(value: Any, key: str, low: int, high: int) -> int:
    if isinstance(value, str):
        try:
            value = int(value, 0)
        except ValueError:
            value = None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise SpecError(f"health.{key}: {str(value)[:40]!r} is not a whole number in {low}..{high}",
                        hint=f"set health.{key} to a number from {low} to {high}")
    return value


def parse(data: Any, path: str = "config.yaml") -> HealthConfig:
    """A validated :class:`HealthConfig` from the ``health:`` mapping; SpecError names the bad key."""
    if data is None:
        return DEFAULT
    if not isinstance(data, dict):
        raise SpecError("health: must be a mapping of settings", hint=HINT.format(path=path))
    known = {"enabled", "preflight", "preflight_cache", "poll_interval", "cordon_after", "cordon_window",
             "degraded_for", "uncordon", "hang_after", "hard_xids", "ecc_uncorrected_max", "temperature_margin",
             "throttle_reasons", "min_driver", "patterns", "probe", "cooldown", "on_hang"}
    unknown = sorted(str(k) for k in data if k not in known)
    if unknown:
        raise SpecError(f"health: unknown key(s) {', '.join(unknown)[:200]}",
                        hint=f"known keys: {', '.join(sorted(known))}")
    out = DEFAULT
    for key, name in (("preflight_cache", "preflight_cache_s"), ("poll_interval", "poll_interval_s"),
                      ("cordon_window", "cordon_window_s"), ("degraded_for", "degraded_for_s"),
                      ("hang_after", "hang_after_s"), ("cooldown", "cooldown_s")):
        if key in data:
            changes: dict[str, Any] = {name: duration(data[key], key, path)}
            out = replace(out, **changes)
    for key in ("enabled", "preflight"):
        if key in data:
            if not isinstance(data[key], bool):
                raise SpecError(f"health.{key}: {str(data[key])[:40]!r} is not true or false", hint=HINT.format(path=path))
            out = replace(out, **{key: data[key]})
    if "cordon_after" in data:
        out = replace(out, cordon_after=_count(data["cordon_after"], "cordon_after", 1, 1000))
    if "ecc_uncorrected_max" in data:
        out = replace(out, ecc_uncorrected_max=_count(data["ecc_uncorrected_max"], "ecc_uncorrected_max", 0, 10**9))
    if "throttle_reasons" in data:
        out = replace(out, throttle_reasons=_count(data["throttle_reasons"], "throttle_reasons", 0, 2**32))
    if "temperature_margin" in data:
        margin = data["temperature_margin"]
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 <= margin <= 100:
            raise SpecError(f"health.temperature_margin: {str(margin)[:40]!r} is not 0..100 degrees",
                            hint="set health.temperature_margin to degrees C, e.g. 5")
        out = replace(out, temperature_margin_c=float(margin))
    if "uncordon" in data:
        if data["uncordon"] not in ("manual", "preflight"):
            raise SpecError(f"health.uncordon: {str(data['uncordon'])[:40]!r} is not manual or preflight",
                            hint="set health.uncordon to manual (only by hand) or preflight (after a passing check)")
        out = replace(out, uncordon=data["uncordon"])
    if "on_hang" in data:
        if data["on_hang"] not in ("report", "kill"):
            raise SpecError(f"health.on_hang: {str(data['on_hang'])[:40]!r} is not report or kill",
                            hint="set health.on_hang to report (a finding only) or kill (stop the hung attempt)")
        out = replace(out, on_hang=data["on_hang"])
    if "hard_xids" in data:
        xids = data["hard_xids"]
        if not isinstance(xids, list):
            raise SpecError("health.hard_xids must be a list of Xid numbers", hint="e.g. hard_xids: [48, 79, 94]")
        out = replace(out, hard_xids=frozenset(_count(x, "hard_xids", 0, 10**6) for x in xids))
    if "min_driver" in data:
        text = str(data["min_driver"] or "")
        if text and not re.fullmatch(r"[0-9]+(\.[0-9]+){0,3}", text):
            raise SpecError(f"health.min_driver: {text[:40]!r} is not a driver version", hint="e.g. min_driver: '535.104'")
        out = replace(out, min_driver=text)
    if "patterns" in data:
        out = replace(out, patterns=tuple(_pattern(p, i) for i, p in enumerate(_list(data["patterns"], "patterns"))))
    if "probe" in data:
        out = replace(out, probe=_probe(data["probe"], path))
    return out


def _list(value: Any, key: str) -> list[Any]:
    if not isinstance(value, list):
        raise SpecError(f"health.{key} must be a list", hint="e.g. patterns: [{pattern: 'fabric down', signature: fabric}]")
    if len(value) > 200:
        raise SpecError(f"health.{key} has {len(value)} entries; at most 200", hint="merge patterns with |")
    return value


def compile_pattern(pattern: str, where: str) -> re.Pattern[str]:
    """A configured signature's pattern, compiled (its validation: a pattern that does not compile is
    a SpecError with a hint); the signatures' matcher compiles with it too."""
    if len(pattern) > 500:
        raise SpecError(f"{where}: the pattern is {len(pattern)} characters; at most 500", hint="shorten it")
    try:
        return re.compile(pattern)
    except re.error as err:
        raise SpecError(f"{where}: {pattern[:80]!r} does not compile ({err})",
                        hint="write a Python regular expression; escape ( ) [ ] . * + ? with a backslash "
                             "to match them literally") from None


def _pattern(entry: Any, i: int) -> Pattern:
    if isinstance(entry, str):
        entry = {"pattern": entry}
    if not isinstance(entry, dict) or not isinstance(entry.get("pattern"), str):
        raise SpecError(f"health.patterns[{i}] needs a pattern (a regular expression)",
                        hint="e.g. {pattern: 'fabric down', signature: fabric, class: infra}")
    cls, severity = entry.get("class", "infra"), entry.get("severity", "soft")
    if cls not in ("infra", "user") or severity not in ("hard", "soft"):
        raise SpecError(f"health.patterns[{i}]: class must be infra or user, severity hard or soft",
                        hint="e.g. {pattern: 'fabric down', class: infra, severity: hard}")
    signature = str(entry.get("signature") or f"pattern_{i}")[:40]
    compile_pattern(entry["pattern"], f"health.patterns[{i}]")
    return Pattern(entry["pattern"], signature, cls, severity)


def _probe(entry: Any, path: str) -> Probe:
    if not isinstance(entry, dict):
        raise SpecError("health.probe must be a mapping", hint="e.g. probe: {command: [python, my_probe.py], timeout: 60s}")
    command = entry.get("command")
    if isinstance(command, str):
        import shlex

        command = shlex.split(command)
    if not isinstance(command, list) or not command or not all(isinstance(w, str) and w for w in command):
        raise SpecError("health.probe.command must be a command (a list of words, or a string)",
                        hint="e.g. command: [python, -m, autoresearch.health.probe]")
    busbw = entry.get("min_busbw_gbps", 0)
    if isinstance(busbw, bool) or not isinstance(busbw, (int, float)) or not 0 <= busbw < 1e6:
        raise SpecError(f"health.probe.min_busbw_gbps: {str(busbw)[:40]!r} is not a bandwidth in GB/s",
                        hint="e.g. min_busbw_gbps: 100 (0: do not compare)")
    return Probe(tuple(command), duration(entry.get("timeout", 60), "probe.timeout", path) or 60.0, float(busbw))


_CACHE: dict[str, tuple[float, HealthConfig]] = {}


def load(home: str | os.PathLike[str], strict: bool = False) -> HealthConfig:
    """The home's health settings. ``strict``: a bad section raises (SpecError with a hint);
    otherwise (a pass, which must go on) the defaults apply and the error is printed once."""
    if (os.environ.get("AUTORESEARCH_HEALTH") or "").strip().lower() in ("0", "off", "false", "no"):
        return replace(DEFAULT, enabled=False)
    name = os.path.join(home, "config.yaml")  # (not pathlib: every attempt's ingestion asks)
    try:
        mtime = os.stat(name).st_mtime
    except OSError:
        return DEFAULT
    cached = _CACHE.get(name)
    if cached is not None and cached[0] == mtime and not strict:
        return cached[1]
    try:
        config = _read(Path(name))
    except SpecError as err:
        if strict:
            raise
        import sys

        print(f"warning: {err.render()}; using the default health settings", file=sys.stderr)
        config = DEFAULT
    _CACHE[name] = (mtime, config)
    return config


def _read(path: Path) -> HealthConfig:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise SpecError(f"cannot read {path}: {err}", hint="make it readable UTF-8 YAML") from None
    if not re.search(r"^health\s*:", text, re.M):
        return DEFAULT
    import yaml  # only a home that configures health pays for it

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise SpecError(f"{path} is not valid YAML: {str(err)[:200]}", hint="check its indentation and quoting") from None
    if not isinstance(data, dict):
        return DEFAULT
    return parse(data.get("health"), str(path))
