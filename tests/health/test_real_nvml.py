"""The real NVML adapter's mapping of driver answers to a sample, against a stand-in ``pynvml``
module (no GPU on this machine; bench/record_nvml.py checks the same on real hardware and
records fixtures). Unsupported fields read as unknown; Xids come from the event set."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from autoresearch.health.nvml import RealNvml


class NVMLError(Exception):
    pass


def driver(xid_queue: list[tuple[int, int]]) -> types.ModuleType:
    m = types.ModuleType("pynvml")
    handles = [object(), object()]
    m.NVMLError = NVMLError  # type: ignore[attr-defined]
    consts = {"NVML_TEMPERATURE_GPU": 0, "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN": 1,
              "NVML_TEMPERATURE_THRESHOLD_SHUTDOWN": 0, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED": 1,
              "NVML_VOLATILE_ECC": 0, "NVML_AGGREGATE_ECC": 1, "nvmlEventTypeXidCriticalError": 8}
    for k, v in consts.items():
        setattr(m, k, v)

    def unsupported(*_: Any) -> Any:
        raise NVMLError("Not Supported")

    def wait(events: Any, timeout_ms: int) -> Any:
        if not xid_queue:
            raise NVMLError("Timeout")
        index, xid = xid_queue.pop(0)
        return types.SimpleNamespace(device=handles[index], eventData=xid)

    funcs = {
        "nvmlInit": lambda: None, "nvmlDeviceGetCount": lambda: 2, "nvmlDeviceGetHandleByIndex": handles.__getitem__,
        "nvmlEventSetCreate": lambda: "events", "nvmlDeviceRegisterEvents": lambda h, t, e: None,
        "nvmlEventSetWait_v2": wait, "nvmlDeviceGetIndex": handles.index,
        "nvmlDeviceGetRetiredPagesPendingStatus": lambda h: int(h is handles[1]),
        "nvmlDeviceGetRemappedRows": lambda h: (0, 1, 0, 1) if h is handles[1] else (0, 0, 0, 0),
        "nvmlDeviceGetCurrentClocksEventReasons": lambda h: 0x4 | 0x40 if h is handles[0] else 0,
        "nvmlDeviceGetName": lambda h: b"NVIDIA H200", "nvmlDeviceGetUUID": lambda h: f"GPU-{handles.index(h)}",
        "nvmlDeviceGetTemperature": lambda h, s: 83,
        "nvmlDeviceGetTemperatureThreshold": lambda h, kind: 87 if kind == 1 else 92,
        "nvmlDeviceGetTotalEccErrors": lambda h, t, c: (3 if c == 0 else 7) if h is handles[1] else 0,
        "nvmlDeviceGetPersistenceMode": unsupported, "nvmlSystemGetDriverVersion": lambda: "550.54.15",
    }
    for k, v in funcs.items():
        setattr(m, k, v)
    return m


def test_the_real_adapter_maps_every_field_and_reads_xids_from_the_event_set(monkeypatch: pytest.MonkeyPatch) -> None:
    queue = [(1, 79), (0, 13)]
    monkeypatch.setitem(sys.modules, "pynvml", driver(queue))
    sample = RealNvml().sample()
    assert sample.error == "" and sample.driver_version == "550.54.15" and sample.device_count == 2
    g0, g1 = sample.gpus
    assert (g0.name, g0.uuid, g0.temperature_c, g0.slowdown_c, g0.shutdown_c) == ("NVIDIA H200", "GPU-0", 83, 87, 92)
    assert g0.clock_event_reasons == 0x44 and g0.xids == (13,) and g0.persistence_mode  # unsupported: assumed on
    assert (g1.ecc_volatile_uncorrected, g1.ecc_aggregate_uncorrected) == (3, 7)
    assert g1.retired_pages_pending and g1.row_remap_failure and g1.xids == (79,)


def test_without_a_driver_the_sample_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    broken = types.ModuleType("pynvml")

    def init() -> None:
        raise RuntimeError("NVML Shared Library Not Found")

    broken.nvmlInit = init  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", broken)
    sample = RealNvml().sample()
    assert sample.gpus == () and "NVML Shared Library Not Found" in sample.error
