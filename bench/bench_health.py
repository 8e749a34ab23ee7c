"""Health checks benchmark: monitor cost per node, preflight cost on the start path.

    python bench/bench_health.py [--n 200]

Prints a table of medians / p95 measured in this run on this machine (not a test), with
8 GPUs' recorded NVML states (tests/fixtures/nvml/): a recorded sample costs a JSON read,
not the driver calls a real node makes (bench/record_nvml.py measures those on a GPU
machine). Goals (issue 10): a warm (cached) preflight adds <= 2 ms to submit->running.

* monitor poll: one node's round of the monitor (NVML sample, findings, dedupe against the
  ledger, the policy) — per poll in ms, and CPU % at the default poll interval (30 s);
* pass overhead: a scheduling pass with one running attempt when no poll is due;
* preflight: cached (a row look-up) and uncached (sample + record + review);
* submit->running: ``Api.submit`` to the attempt recorded as started, on the in-process fake
  backend (no process spawn, so the difference is the health checks'), health on vs off.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "nvml"


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def timed(fn: Any, n: int) -> tuple[list[float], list[float]]:
    """Wall and CPU ms of ``n`` calls."""
    wall, cpu = [], []
    for _ in range(n):
        w, c = time.perf_counter(), time.process_time()
        fn()
        cpu.append((time.process_time() - c) * 1000)
        wall.append((time.perf_counter() - w) * 1000)
    return wall, cpu


def fleet(path: Path, states: dict[str, str]) -> None:
    path.write_text(json.dumps({"nodes": {n: json.loads((FIXTURES / f"{s}.json").read_text())
                                          for n, s in states.items()}}))


def setup(home: Path, nodes: int = 1) -> tuple[Any, Any]:
    from autoresearch.api import Api
    from autoresearch.backends.fake import FakeBackend

    fake = FakeBackend(nodes=nodes, gpus=8)
    return Api(home, backend=fake), fake


def bench_monitor(tmp: Path, n: int, state: str) -> tuple[list[float], list[float]]:
    fleet(tmp / f"fleet-{state}.json", {"fake-0": state})
    os.environ["AUTORESEARCH_NVML_FAKE"] = str(tmp / f"fleet-{state}.json")
    api, _ = setup(tmp / f"home-monitor-{state}")
    api._runtime.refresh_nodes()
    health = api._runtime.health
    config = health.config
    return timed(lambda: health._poll("fake-0", [], config, time.time()), n)


def bench_pass(tmp: Path, n: int, on: bool) -> list[float]:
    fleet(tmp / "fleet-pass.json", {"fake-0": "healthy"})
    os.environ["AUTORESEARCH_NVML_FAKE"] = str(tmp / "fleet-pass.json")
    os.environ["AUTORESEARCH_HEALTH"] = "on" if on else "off"
    api, _ = setup(tmp / f"home-pass-{on}")
    api.submit({"command": ["train"], "workdir": str(tmp), "gpus": 1})
    api._runtime.tick()  # the first poll: the next is not due for poll_interval
    wall, _ = timed(lambda: api._runtime.tick(), n)
    return wall


def bench_preflight(tmp: Path, n: int) -> tuple[list[float], list[float]]:
    fleet(tmp / "fleet-pre.json", {"fake-0": "healthy"})
    os.environ["AUTORESEARCH_NVML_FAKE"] = str(tmp / "fleet-pre.json")
    os.environ["AUTORESEARCH_HEALTH"] = "on"
    api, _ = setup(tmp / "home-pre")
    api._runtime.refresh_nodes()
    health, jobs = api._runtime.health, api._runtime.jobs

    def row() -> Any:
        return next(r for r in jobs.nodes("fake") if r["name"] == "fake-0")

    health.preflight("fake-0", ("0",), row())
    warm_row = row()
    cached, _ = timed(lambda: health.preflight("fake-0", ("0",), warm_row), n)
    cold_row = {**dict(warm_row), "checked_at": None}
    uncached, _ = timed(lambda: health.preflight("fake-0", ("0",), cold_row), max(10, n // 5))
    return cached, uncached


def bench_submit(tmp: Path, n: int) -> tuple[list[float], list[float], list[float]]:
    """Interleaved (off, on, off, on...) in one home, so the machine's load hits both alike."""
    fleet(tmp / "fleet-submit.json", {"fake-0": "healthy"})
    os.environ["AUTORESEARCH_NVML_FAKE"] = str(tmp / "fleet-submit.json")
    api, fake = setup(tmp / "home-submit")
    runtime = api._runtime
    spent = [0.0]
    for name in ("preflight", "monitor"):  # time the health checks inside the submit's pass
        original = getattr(runtime, name)

        def wrapped(*a: Any, _original: Any = original) -> Any:
            t = time.perf_counter()
            try:
                return _original(*a)
            finally:
                spent[0] += time.perf_counter() - t

        setattr(runtime, name, wrapped)
    out: dict[bool, list[float]] = {False: [], True: []}
    inside: list[float] = []
    for i in range(2 * n + 6):
        on = bool(i % 2)
        os.environ["AUTORESEARCH_HEALTH"] = "on" if on else "off"
        spent[0] = 0.0
        t0 = time.perf_counter()
        view = api.submit({"command": ["train"], "workdir": str(tmp), "gpus": 1})
        elapsed = (time.perf_counter() - t0) * 1000
        health_ms = spent[0] * 1000
        assert view.state in ("starting", "running"), view.state
        fake.finish(f"{view.id}.1", 0)
        runtime.tick()
        if i >= 6:  # the first ones pay imports and the first (uncached) preflight
            out[on].append(elapsed)
            if on:
                inside.append(health_ms)
    return out[False], out[True], inside


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=200)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("AUTORESEARCH_SYNC", "off")
    rows: list[tuple[str, str, str, str]] = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for state in ("healthy", "thermal"):
            wall, cpu = bench_monitor(tmp, args.n, state)
            rows.append((f"monitor poll, 8 GPUs, {state}", f"{statistics.median(wall):.2f} ms",
                         f"{pct(wall, 0.95):.2f} ms",
                         f"CPU {statistics.median(cpu):.2f} ms = {statistics.median(cpu) / 30_000 * 100:.4f} % at 30 s"))
        off, on = bench_pass(tmp, args.n, False), bench_pass(tmp, args.n, True)
        rows.append(("pass, 1 running, no poll due: off", f"{statistics.median(off):.2f} ms", f"{pct(off, 0.95):.2f} ms", ""))
        rows.append(("pass, 1 running, no poll due: on", f"{statistics.median(on):.2f} ms", f"{pct(on, 0.95):.2f} ms",
                     f"+{statistics.median(on) - statistics.median(off):.2f} ms"))
        cached, uncached = bench_preflight(tmp, args.n)
        rows.append(("preflight cached (row look-up)", f"{statistics.median(cached) * 1000:.1f} us",
                     f"{pct(cached, 0.95) * 1000:.1f} us", "the warm start path"))
        rows.append(("preflight uncached (sample+record)", f"{statistics.median(uncached):.2f} ms",
                     f"{pct(uncached, 0.95):.2f} ms", "once per node per preflight_cache"))
        off_s, on_s, inside = bench_submit(tmp, args.n // 2)
        rows.append(("submit->running (fake): health off", f"{statistics.median(off_s):.2f} ms",
                     f"{pct(off_s, 0.95):.2f} ms", "interleaved with the next row; SQLite commits dominate"))
        rows.append(("submit->running (fake): on, warm", f"{statistics.median(on_s):.2f} ms", f"{pct(on_s, 0.95):.2f} ms",
                     f"{statistics.median(on_s) - statistics.median(off_s):+.2f} ms (noise of a loaded machine)"))
        rows.append(("  of which health (preflight+monitor)", f"{statistics.median(inside):.3f} ms",
                     f"{pct(inside, 0.95):.3f} ms", "what the checks add to a warm start (goal <= 2 ms)"))
    width = max(len(r[0]) for r in rows)
    print(f"{'what':<{width}}  {'p50':>10}  {'p95':>10}  note")
    for what, p50, p95, note in rows:
        print(f"{what:<{width}}  {p50:>10}  {p95:>10}  {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
