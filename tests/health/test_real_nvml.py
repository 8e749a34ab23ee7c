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
    """pynvml's: ``value`` is NVML's return code, ``str`` its message."""

    MESSAGES = {3: "Not Supported", 10: "Timeout", 15: "GPU is lost", 999: "Unknown Error"}

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return self.MESSAGES.get(self.value, f"NVML error {self.value}")


def driver(xid_queue: list[tuple[int, int]]) -> types.ModuleType:
    m = types.ModuleType("pynvml")
    handles = [object(), object()]
    m.NVMLError = NVMLError  # type: ignore[attr-defined]
    consts = {"NVML_TEMPERATURE_GPU": 0, "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN": 1,
              "NVML_TEMPERATURE_THRESHOLD_SHUTDOWN": 0, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED": 1,
              "NVML_VOLATILE_ECC": 0, "NVML_AGGREGATE_ECC": 1, "nvmlEventTypeXidCriticalError": 8,
              "NVML_ERROR_NOT_SUPPORTED": 3, "NVML_ERROR_NOT_FOUND": 6}
    for k, v in consts.items():
        setattr(m, k, v)

    def unsupported(*_: Any) -> Any:
        raise NVMLError(3)

    def wait(events: Any, timeout_ms: int) -> Any:
        if not xid_queue:
            raise NVMLError(10)
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


def test_an_nvml_call_that_fails_mid_run_is_a_machine_finding_not_healthy_defaults(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from autoresearch.health.config import HealthConfig
    from autoresearch.health.findings import blocking, check_sample

    module = driver([])
    monkeypatch.setitem(sys.modules, "pynvml", module)
    reader = RealNvml()
    assert all(not g.errors for g in reader.sample().gpus)  # opened and read fine
    lost = module.nvmlDeviceGetHandleByIndex(1)

    def nvmlDeviceGetTotalEccErrors(h: Any, t: int, c: int) -> int:  # noqa: N802 - the library's name
        if h is lost:
            raise NVMLError(15)  # the GPU fell off the bus after open
        return 0

    def crash(*_: Any) -> Any:
        raise OSError("libnvidia-ml.so.1: cannot read")  # not even an NVMLError

    monkeypatch.setattr(module, "nvmlDeviceGetTotalEccErrors", nvmlDeviceGetTotalEccErrors)
    sample = reader.sample()
    g0, g1 = sample.gpus
    assert g0.errors == () and any("GPU is lost" in e and "nvmlDeviceGetTotalEccErrors" in e for e in g1.errors)
    found = [f for f in check_sample("n1", sample, None, HealthConfig(), 5.0) if f.signature == "nvml_error"]
    assert len(found) == 1 and found[0].gpu == "1" and found[0].owner == "machine" and not blocking(found)
    monkeypatch.setattr(module, "nvmlSystemGetDriverVersion", crash)
    assert all(any("cannot read" in e for e in g.errors) for g in reader.sample().gpus)
