"""The simulated fleet's configuration: node types, fault rates, seed and clock, validated once.

Everything is checked before anything runs (invariant 8): a bad value is a
:class:`~autoresearch.errors.SpecError` whose hint says what to write instead::

    nodes: [{name: h100, count: 64, gpus: 8, speed: 1.0}]   # cpus: 12 per GPU, memory: 128 GB per GPU
    faults: {node_loss: 0.0005, xid: 0.0003, nccl_hang: 0.0005, thermal: 0.002,   # per node-hour
             repair: 4h, unattended_repair: 24h, hang_timeout: 10m, thermal_for: 2h, thermal_slowdown: 1.5}
    seed: 7
    clock: {mode: wall, speed: 60}    # or events
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from autoresearch.errors import SpecError

MAX_NODES = 100_000
MAX_GPUS = 64  # per node
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([smhd]?)\s*$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$")
FAULT_KINDS = ("node_loss", "xid", "nccl_hang", "thermal")


def number(value: Any, where: str, low: float = 0.0, high: float = 1e12, hint: str = "") -> float:
    """A finite number in ``low..high``; SpecError naming ``where`` otherwise."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not math.isfinite(float(value)) or not low <= float(value) <= high:
        raise SpecError(f"sim: {where} is {str(value)[:40]!r}; it must be a number from {low:g} to {high:g}",
                        hint=hint or f"set {where} to a number from {low:g} to {high:g}")
    return float(value)


def count(value: Any, where: str, low: int = 1, high: int = MAX_NODES) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise SpecError(f"sim: {where} is {str(value)[:40]!r}; it must be a whole number from {low} to {high}",
                        hint=f"set {where} to a whole number from {low} to {high}")
    return value


def duration(value: Any, where: str) -> float:
    """Seconds from a number or '30s', '5m', '1h', '2d'."""
    if isinstance(value, str):
        match = _DURATION.match(value)
        if match is None:
            raise SpecError(f"sim: {where} is {value[:40]!r}, not a duration", hint="use seconds or '30s', '5m', '1h', '2d'")
        value = float(match.group(1)) * _UNITS[match.group(2)]
    return number(value, where, 0.0, 10 * 365 * 86400.0, hint="use seconds or '30s', '5m', '1h', '2d'")


def mapping(value: Any, where: str, keys: tuple[str, ...]) -> dict[str, Any]:
    """A dict with only ``keys``; SpecError naming the unknown one otherwise."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SpecError(f"sim: {where} must be a mapping, got {type(value).__name__}",
                        hint=f"write {where} as {{key: value}} with keys {', '.join(keys)}")
    for key in value:
        if key not in keys:
            raise SpecError(f"sim: {where}: unknown key {str(key)[:40]!r}", hint=f"valid keys: {', '.join(keys)}")
    return value


@dataclass(frozen=True, slots=True)
class NodeType:
    name: str
    count: int
    gpus: int
    speed: float = 1.0  # steps run at speed x the trial's pace
    cpus: float = 96.0
    memory: int = 1 << 20  # MB


@dataclass(frozen=True, slots=True)
class Faults:
    """Rates per node-hour, and how long a fault lasts (simulated seconds)."""

    node_loss: float = 0.0
    xid: float = 0.0
    nccl_hang: float = 0.0
    thermal: float = 0.0
    repair: float = 4 * 3600.0  # a lost node comes back, a cordoned sick node is fixed, this long after
    unattended_repair: float = 24 * 3600.0  # a sick node nobody cordoned is noticed and fixed this long after
    hang_timeout: float = 600.0  # a hung collective ends the attempt this long after (NCCL's watchdog)
    thermal_for: float = 2 * 3600.0
    thermal_slowdown: float = 1.5  # steps take this many times longer while a node throttles
    sick_crash_after: float = 30.0  # an attempt started on a node with a failed GPU crashes this soon

    @property
    def any(self) -> bool:
        return any(getattr(self, k) > 0 for k in FAULT_KINDS)


@dataclass(frozen=True, slots=True)
class Clock:
    mode: str = "wall"  # wall | events
    speed: float = 1.0


@dataclass(frozen=True, slots=True)
class Fleet:
    types: tuple[NodeType, ...]
    faults: Faults = field(default_factory=Faults)
    seed: int = 0
    clock: Clock = field(default_factory=Clock)

    @property
    def node_names(self) -> list[str]:
        return [name for name, _ in self.nodes()]

    def nodes(self) -> list[tuple[str, NodeType]]:
        """Every node with its type: ``<type>-<i>``."""
        return [(f"{t.name}-{i}", t) for t in self.types for i in range(t.count)]

    def type_of(self, node: str) -> NodeType | None:
        name, _, index = node.rpartition("-")
        for t in self.types:
            if t.name == name and index.isdigit() and int(index) < t.count:
                return t
        return None

    @property
    def max_gpus(self) -> int:
        return max(t.gpus for t in self.types)

    @property
    def total_gpus(self) -> int:
        return sum(t.gpus * t.count for t in self.types)

    def ident(self) -> str:
        """A short name for this fleet (nodes, faults, seed): the directory of its persisted clock."""
        data = json.dumps({"types": [asdict(t) for t in self.types], "faults": asdict(self.faults),
                           "seed": self.seed, "clock": asdict(self.clock)}, sort_keys=True)
        return hashlib.sha256(data.encode()).hexdigest()[:12]

    def check_job(self, gpus: int, nodes: int) -> None:
        """Refuse a job this fleet can never hold: more GPUs per node than any type has, or a gang
        larger than the nodes that could hold it."""
        if gpus > self.max_gpus:
            raise SpecError(f"sim: a job asks for {gpus} GPUs per node; the largest node type has {self.max_gpus}",
                            hint=f"ask for at most {self.max_gpus} GPUs per node, or add a node type with more")
        fit = sum(t.count for t in self.types if t.gpus >= gpus)
        if nodes > fit:
            raise SpecError(f"sim: a gang job asks for {nodes} nodes with {gpus} GPUs each; the fleet has {fit} such nodes",
                            hint=f"ask for at most {fit} nodes, or add nodes to the fleet")


def parse(nodes: Any = None, faults: Any = None, seed: Any = 0, clock: Any = None) -> Fleet:
    """The fleet from a plan's ``backend:`` options; SpecError with a hint on anything wrong."""
    if nodes is None:
        nodes = [{"name": "sim", "count": 2, "gpus": 8}]
    if isinstance(nodes, int) and not isinstance(nodes, bool):
        nodes = [{"name": "sim", "count": nodes, "gpus": 8}]
    if not isinstance(nodes, list) or not nodes:
        raise SpecError("sim: nodes must be a non-empty list of node types",
                        hint="write nodes: [{name: h100, count: 64, gpus: 8, speed: 1.0}]")
    types: list[NodeType] = []
    for i, raw in enumerate(nodes[:1000]):
        where = f"nodes[{i}]"
        spec = mapping(raw, where, ("name", "count", "gpus", "speed", "cpus", "memory"))
        name = spec.get("name", f"sim{i}" if i else "sim")
        if not isinstance(name, str) or not _NAME.match(name):
            raise SpecError(f"sim: {where}.name {str(name)[:40]!r} is not a node type name",
                            hint="use letters, digits, '_', '.', '-' (at most 40), e.g. h100")
        if any(t.name == name for t in types):
            raise SpecError(f"sim: node type {name!r} is named twice", hint="give each node type its own name")
        gpus = count(spec.get("gpus", 8), f"{where}.gpus", 0, MAX_GPUS)
        types.append(NodeType(name, count(spec.get("count", 1), f"{where}.count"), gpus,
                              number(spec.get("speed", 1.0), f"{where}.speed", 1e-3, 1e3),
                              # a GPU server's share of cores and memory unless told: a job asking for
                              # some must fit (0 would refuse every job that names cpus or memory)
                              number(spec.get("cpus", max(8, 12 * gpus)), f"{where}.cpus", 1.0, 1e5),
                              int(number(spec.get("memory", max(32768, 131072 * gpus)), f"{where}.memory",
                                         1024, 1e9))))
    if sum(t.count for t in types) > MAX_NODES:
        raise SpecError(f"sim: the fleet has more than {MAX_NODES} nodes", hint="simulate fewer nodes")
    f = mapping(faults, "faults", (*FAULT_KINDS, "repair", "unattended_repair", "hang_timeout", "thermal_for",
                                   "thermal_slowdown", "sick_crash_after"))
    rates = {k: number(f.get(k, 0.0), f"faults.{k}", 0.0, 10.0,
                       hint=f"faults.{k} is a rate per node-hour: 0 (never) up to 10, e.g. 0.001") for k in FAULT_KINDS}
    times = {k: duration(f[k], f"faults.{k}") for k in ("repair", "unattended_repair", "hang_timeout", "thermal_for",
                                                        "sick_crash_after") if k in f}
    slow = number(f.get("thermal_slowdown", 1.5), "faults.thermal_slowdown", 1.0, 100.0)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise SpecError(f"sim: seed is {str(seed)[:40]!r}; it must be a whole number >= 0", hint="set seed: 7")
    c = mapping(clock, "clock", ("mode", "speed"))
    mode = c.get("mode", "wall")
    if mode not in ("wall", "events"):
        raise SpecError(f"sim: clock.mode is {str(mode)[:40]!r}", hint="use clock.mode: wall (speed x real time) "
                        "or events (time jumps to the next event)")
    speed = number(c.get("speed", 1.0), "clock.speed", 1e-3, 1e7)
    return Fleet(tuple(types), Faults(**rates, **times, thermal_slowdown=slow), seed, Clock(mode, speed))
