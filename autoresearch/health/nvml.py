"""One NVML adapter behind a small interface: a node's GPUs as plain data (:class:`NodeSample`).

Two implementations of :class:`NvmlReader`:

* :class:`RealNvml` reads the driver through nvidia-ml-py (``pynvml``, imported lazily: a
  pass on a machine without GPUs never loads it), including Xid events from NVML's event set;
* :class:`RecordedNvml` replays device states recorded as JSON (``bench/record_nvml.py``
  writes them on a GPU machine; ``tests/fixtures/nvml/`` holds some), so every rule is
  tested without a GPU. ``AUTORESEARCH_NVML_FAKE=/path.json`` makes every reader recorded.

A JSON state is one node (``{"driver_version": ..., "gpus": [...]}``) or several
(``{"nodes": {"node-a": {...}, ...}}``); see :func:`sample_from_json` for the fields.
Stdlib only.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Protocol

FAKE_ENV = "AUTORESEARCH_NVML_FAKE"

# Clock event ("throttle") reasons, as NVML numbers them.
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
SW_THERMAL = 0x20
HW_THERMAL = 0x40
HW_POWER_BRAKE = 0x80
REASON_NAMES = {0x4: "SwPowerCap", 0x8: "HwSlowdown", 0x20: "SwThermal", 0x40: "HwThermal", 0x80: "HwPowerBrake"}
MAX_XIDS = 64  # kept per GPU per sample: a storm of events is one finding, not a flood


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One GPU as NVML reads it now."""

    index: int
    uuid: str = ""
    name: str = ""
    temperature_c: float | None = None
    slowdown_c: float | None = None  # NVML's slowdown threshold for this board
    shutdown_c: float | None = None
    ecc_volatile_uncorrected: int = 0
    ecc_aggregate_uncorrected: int = 0
    retired_pages_pending: bool = False
    row_remap_failure: bool = False
    row_remap_pending: bool = False  # a remap waits for a GPU reset
    clock_event_reasons: int = 0
    persistence_mode: bool = True
    xids: tuple[int, ...] = ()  # Xid events seen since the previous sample
    errors: tuple[str, ...] = ()  # NVML calls that failed on this GPU after open (not "not supported")


@dataclass(frozen=True, slots=True)
class NodeSample:
    """A node's GPUs as NVML reads them now (or why it could not)."""

    driver_version: str = ""
    gpus: tuple[GpuSample, ...] = ()
    error: str = ""  # NVML could not be read at all (no driver, init failed)

    @property
    def device_count(self) -> int:
        return len(self.gpus)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["device_count"] = self.device_count
        return data


class NvmlReader(Protocol):
    """Reads one node's GPUs; ``sample`` never raises (a failure is ``NodeSample.error``)."""

    def sample(self) -> NodeSample: ...


# -- recorded states ----------------------------------------------------------------------


def _int(value: Any, default: int = 0) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        return default
    return number if 0 <= number < 2**63 else default


def _temp(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if -100.0 < number < 1000.0 else None  # NaN, inf and nonsense read as "unknown"


def gpu_from_json(data: Any, position: int) -> GpuSample:
    data = data if isinstance(data, dict) else {}
    xids = data.get("xids") if isinstance(data.get("xids"), list) else []
    return GpuSample(
        index=_int(data.get("index", position), position), uuid=str(data.get("uuid") or "")[:80],
        name=str(data.get("name") or "")[:80], temperature_c=_temp(data.get("temperature_c")),
        slowdown_c=_temp(data.get("slowdown_c")), shutdown_c=_temp(data.get("shutdown_c")),
        ecc_volatile_uncorrected=_int(data.get("ecc_volatile_uncorrected")),
        ecc_aggregate_uncorrected=_int(data.get("ecc_aggregate_uncorrected")),
        retired_pages_pending=bool(data.get("retired_pages_pending")),
        row_remap_failure=bool(data.get("row_remap_failure")),
        row_remap_pending=bool(data.get("row_remap_pending")),
        clock_event_reasons=_int(data.get("clock_event_reasons")),
        persistence_mode=bool(data.get("persistence_mode", True)),
        xids=tuple(_int(x) for x in xids[:MAX_XIDS]),
        errors=tuple(str(e)[:200] for e in (data.get("errors") if isinstance(data.get("errors"), list) else [])[:8]),
    )


def sample_from_json(data: Any) -> NodeSample:
    """A node's state from recorded JSON; what is missing or malformed reads as absent, never raises."""
    if not isinstance(data, dict):
        return NodeSample(error="recorded state is not a JSON object")
    gpus: list[Any] = data["gpus"] if isinstance(data.get("gpus"), list) else []
    return NodeSample(driver_version=str(data.get("driver_version") or "")[:40],
                      gpus=tuple(gpu_from_json(g, i) for i, g in enumerate(gpus[:256])),
                      error=str(data.get("error") or "")[:300])


class RecordedNvml:
    """A reader that replays a recorded state (one node's, or ``nodes[node]`` of a fleet's)."""

    def __init__(self, data: Any, node: str | None = None) -> None:
        if isinstance(data, dict) and isinstance(data.get("nodes"), dict):
            data = data["nodes"].get(node, {"error": f"no recorded state for node {node!r}"})
        self._sample = sample_from_json(data)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], node: str | None = None) -> RecordedNvml:
        return cls(_load(str(path)), node)

    def sample(self) -> NodeSample:
        return self._sample


_LOADED: dict[str, tuple[float, Any]] = {}


def _load(path: str) -> Any:
    """A recorded state file, parsed once per change (a poll must not re-parse it)."""
    try:
        mtime = os.stat(path).st_mtime
        cached = _LOADED.get(path)
        if cached is not None and cached[0] == mtime:
            return cached[1]
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        return {"error": f"cannot read recorded state {path}: {err}", "unreadable": True}
    _LOADED[path] = (mtime, data)
    return data


def recorded_nodes(path: str | os.PathLike[str]) -> set[str] | None:
    """The node names a fleet file records, or None when it records one node (any name)."""
    data = _load(str(path))
    if isinstance(data, dict) and isinstance(data.get("nodes"), dict):
        return set(data["nodes"])
    return None


# -- the driver -----------------------------------------------------------------------------


class RealNvml:
    """nvidia-ml-py. Opened once per process; Xid events accumulate between samples."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._events: Any = None
        self._handles: list[Any] = []
        self._error = ""

    def _open(self) -> None:
        if self._nvml is not None or self._error:
            return
        try:
            import pynvml  # nvidia-ml-py: only a node that reads its GPUs pays for it

            pynvml.nvmlInit()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            self._nvml = pynvml
        except Exception as err:  # noqa: BLE001 - no library, no driver: say so in the sample
            self._error = f"NVML unavailable: {type(err).__name__}: {err}"[:300]
            return
        try:
            events = pynvml.nvmlEventSetCreate()
            for handle in self._handles:
                try:
                    pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, events)
                except pynvml.NVMLError:
                    pass  # this board cannot report Xids through events (they still reach the kernel log)
            self._events = events
        except Exception:  # noqa: BLE001 - no event set: the other checks still run
            self._events = None

    def _xids(self) -> dict[int, list[int]]:
        found: dict[int, list[int]] = {}
        if self._events is None:
            return found
        nvml = self._nvml
        by_handle = {id(h): i for i, h in enumerate(self._handles)}
        for _ in range(MAX_XIDS * 4):
            try:
                data = nvml.nvmlEventSetWait_v2(self._events, 0)
            except nvml.NVMLError:  # timeout: no more events
                break
            index = by_handle.get(id(data.device), -1)
            if index < 0:  # another handle object for the same board: match by its index
                try:
                    index = int(nvml.nvmlDeviceGetIndex(data.device))
                except nvml.NVMLError:
                    continue
            found.setdefault(index, []).append(int(data.eventData))
        return found

    def sample(self) -> NodeSample:
        self._open()
        if self._nvml is None:
            return NodeSample(error=self._error)
        nvml = self._nvml

        unsupported = {getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", 3), getattr(nvml, "NVML_ERROR_NOT_FOUND", 6)}
        errors: list[str] = []

        def read(call: Any, *args: Any, default: Any = None) -> Any:
            try:
                return call(*args)
            except Exception as err:  # noqa: BLE001 - a library that fails mid-run is a finding, not defaults
                # Not supported on this board: the field is unknown. Anything else (the GPU is lost, the
                # library or driver broke after open) is said, never read as a healthy default.
                if not (isinstance(err, nvml.NVMLError) and getattr(err, "value", None) in unsupported):
                    name = getattr(call, "__name__", "nvml")
                    errors.append(f"{name}: {type(err).__name__}: {err}"[:200])
                return default

        try:
            xids = self._xids()
        except Exception as err:  # noqa: BLE001 - (see read)
            xids, errors = {}, [f"nvmlEventSetWait: {type(err).__name__}: {err}"[:200]]
        node_errors = list(errors)
        gpus = []
        for i, h in enumerate(self._handles):
            errors = []
            pending = read(nvml.nvmlDeviceGetRetiredPagesPendingStatus, h, default=0)
            remap = read(nvml.nvmlDeviceGetRemappedRows, h, default=None)  # (corr, uncorr, pending, failure)
            reasons = read(nvml.nvmlDeviceGetCurrentClocksEventReasons, h, default=None)
            if reasons is None:
                reasons = read(nvml.nvmlDeviceGetCurrentClocksThrottleReasons, h, default=0)
            name = read(nvml.nvmlDeviceGetName, h, default="")
            uuid = read(nvml.nvmlDeviceGetUUID, h, default="")
            gpus.append(GpuSample(
                index=i, uuid=uuid.decode() if isinstance(uuid, bytes) else str(uuid or ""),
                name=name.decode() if isinstance(name, bytes) else str(name or ""),
                temperature_c=read(nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU),
                slowdown_c=read(nvml.nvmlDeviceGetTemperatureThreshold, h, nvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
                shutdown_c=read(nvml.nvmlDeviceGetTemperatureThreshold, h, nvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN),
                ecc_volatile_uncorrected=_int(read(nvml.nvmlDeviceGetTotalEccErrors, h,
                                                   nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC)),
                ecc_aggregate_uncorrected=_int(read(nvml.nvmlDeviceGetTotalEccErrors, h,
                                                    nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_AGGREGATE_ECC)),
                retired_pages_pending=bool(pending),
                row_remap_failure=bool(remap[3]) if isinstance(remap, tuple) and len(remap) >= 4 else False,
                row_remap_pending=bool(remap[2]) if isinstance(remap, tuple) and len(remap) >= 4 else False,
                clock_event_reasons=_int(reasons),
                persistence_mode=bool(read(nvml.nvmlDeviceGetPersistenceMode, h, default=1)),
                xids=tuple(xids.get(i, ())[:MAX_XIDS]),
                errors=tuple(dict.fromkeys(node_errors + errors))[:8],
            ))
        errors = []
        driver = read(nvml.nvmlSystemGetDriverVersion, default="")
        if errors and gpus:  # the driver's own call failed: every GPU's reading is in doubt
            gpus = [replace(g, errors=(*g.errors, *errors)[:8]) for g in gpus]
        return NodeSample(driver_version=driver.decode() if isinstance(driver, bytes) else str(driver or ""),
                          gpus=tuple(gpus))


# -- which reader for which node ---------------------------------------------------------------

_REAL: RealNvml | None = None


def local_node_names() -> set[str]:
    # (os.uname's name is gethostname's, without importing socket.py: ~4 ms of a pass that checks a node)
    return {n for n in (os.environ.get("AUTORESEARCH_NODE"), os.uname().nodename, "local") if n}


def reader_for(node: str | None, backend: str = "local") -> NvmlReader | None:
    """The reader of ``node``'s GPUs from this process, or None when this process cannot see
    them (a remote node: there the health program runs, ``autoresearch health --slurm-hc``)."""
    global _REAL
    fake = os.environ.get(FAKE_ENV)
    if fake:
        data = _load(fake)
        if isinstance(data, dict) and data.get("unreadable"):
            # A test double that is not there is nobody's GPU fault: no reader, not a cordoned fleet.
            import sys

            print(f"warning: {FAKE_ENV}: {data['error']}", file=sys.stderr)
            return None
        names = recorded_nodes(fake)
        if names is not None and node not in names:
            return None
        return RecordedNvml.from_file(fake, node)
    if backend != "local" or (node is not None and node not in local_node_names()):
        return None
    if (os.environ.get("AUTORESEARCH_GPUS") or "").strip():
        return None  # declared slots, not the driver's: there is nothing to read
    if _REAL is None:
        _REAL = RealNvml()
    return _REAL


def reason_names(mask: int) -> list[str]:
    return [name for bit, name in REASON_NAMES.items() if mask & bit]


