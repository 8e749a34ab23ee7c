"""Record this GPU machine's real NVML states as test fixtures, and time the real adapter.

    python bench/record_nvml.py [--out tests/fixtures/nvml] [--samples 20] [--probe]

On a machine with an NVIDIA driver (nvidia-ml-py installed): reads every GPU through
:class:`autoresearch.health.nvml.RealNvml` (ECC volatile/aggregate, retired pages pending,
row-remap failure, temperature and slowdown/shutdown thresholds, clock-event reasons,
persistence mode, driver version, Xid events from the event set), checks that the JSON
round-trips through the recorded adapter exactly, runs the preflight rules on it (and, with
``--probe``, the default probe job: a matmul and an all-reduce when torch is installed),
and writes ``recorded-<host>.json`` next to the hand-written fixtures. Prints ms per
sample (the monitor's real cost per poll) and the findings.

Exit 0 when it recorded; 2 when there is no GPU (nothing is written).
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    sys.path.insert(0, str(ROOT))
    from autoresearch.health.config import DEFAULT, Probe
    from autoresearch.health.findings import check_sample
    from autoresearch.health.nvml import RealNvml, sample_from_json
    from autoresearch.health.preflight import run_probe

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=str(ROOT / "tests" / "fixtures" / "nvml"))
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--probe", action="store_true", help="also run python -m autoresearch.health.probe")
    args = parser.parse_args()

    reader = RealNvml()
    t0 = time.perf_counter()
    first = reader.sample()
    open_ms = (time.perf_counter() - t0) * 1000
    if first.error or not first.gpus:
        print(f"no GPU to record: {first.error or 'the driver reports 0 devices'}", file=sys.stderr)
        return 2
    times = []
    for _ in range(max(1, args.samples)):
        t = time.perf_counter()
        sample = reader.sample()
        times.append((time.perf_counter() - t) * 1000)
    data = {"recorded": f"bench/record_nvml.py on {socket.gethostname()} at {time.strftime('%Y-%m-%d %H:%M:%S')}",
            **sample.to_json()}
    data.pop("device_count", None)
    assert sample_from_json(json.loads(json.dumps(data))) == sample, "the recorded twin does not round-trip"
    node = socket.gethostname().split(".")[0]
    findings = check_sample(node, sample, None, DEFAULT, time.time(), source="record")
    if args.probe:
        probe = Probe((sys.executable, "-m", "autoresearch.health.probe"), 120.0, 0.0)
        findings += run_probe(probe, node, tuple(str(g.index) for g in sample.gpus), time.time())
    out = Path(args.out) / f"recorded-{node}.json"
    out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"recorded {len(sample.gpus)} GPU(s), driver {sample.driver_version} -> {out}")
    print(f"first sample (nvmlInit + event set): {open_ms:.1f} ms; then per sample p50 "
          f"{statistics.median(times):.2f} ms, max {max(times):.2f} ms over {len(times)}")
    for f in findings:
        print(f"finding: {f.line()}")
    if not findings:
        print("no findings: healthy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
