"""The default preflight probe: ``python -m autoresearch.health.probe`` (set it as ``health.probe.command``).

On the GPUs in ``CUDA_VISIBLE_DEVICES``: a short matmul on each (its result checked), and
with two or more an all-reduce across them, printing ``busbw_gbps: X`` (NCCL's bus
bandwidth formula) for the preflight to compare with ``min_busbw_gbps``. Needs torch; without
it the probe says so and passes (the NVML checks still ran). Exit 0 passes, anything else
fails the node.
"""

from __future__ import annotations

import os
import sys
import time


def main() -> int:
    try:
        import torch
    except ImportError:
        print("probe skipped: torch is not installed")
        return 0
    if not torch.cuda.is_available():
        print("probe failed: CUDA is not available to torch", file=sys.stderr)
        return 1
    count = torch.cuda.device_count()
    for i in range(count):
        with torch.cuda.device(i):
            a = torch.ones(2048, 2048, device="cuda")
            b = (a @ a).sum().item()
            if b != 2048.0 ** 3:
                print(f"probe failed: matmul on GPU {i} gave {b}, expected {2048.0 ** 3}", file=sys.stderr)
                return 1
    print(f"matmul ok on {count} GPU(s)")
    if count >= 2:
        return _all_reduce(count)
    return 0


def _all_reduce(count: int) -> int:
    import torch as t

    size = int(os.environ.get("AUTORESEARCH_PROBE_BYTES") or 256 << 20) // 4
    tensors = [t.ones(size, device=f"cuda:{i}") for i in range(count)]
    t.cuda.nccl.all_reduce(tensors)  # warm-up
    for i in range(count):
        t.cuda.synchronize(i)
    start = time.perf_counter()
    rounds = 5
    for _ in range(rounds):
        t.cuda.nccl.all_reduce(tensors)
    for i in range(count):
        t.cuda.synchronize(i)
    seconds = (time.perf_counter() - start) / rounds
    algbw = size * 4 / seconds / 1e9
    print(f"busbw_gbps: {algbw * 2 * (count - 1) / count:.1f}")
    if not all(bool(t.isfinite(x).all()) for x in tensors):
        print("probe failed: all-reduce produced non-finite values", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
