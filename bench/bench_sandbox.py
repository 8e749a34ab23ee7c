"""Launch cost of a tenant's sandbox: submit -> command running, a tenant job vs a local job.

    python bench/bench_sandbox.py [--n 200] [--pause 0.15] [--programs]

Both kinds are submitted through ``Api.submit`` in turns; the command itself writes the time it
started (``date +%s.%N``: inside the sandbox for the tenant job), so the figure is submit to the
job's first instruction, the sandbox's whole setup included. Prints medians and p95 (not a test).
Goal (docs/security.md): a tenant job's median <= 15 ms over a local job's.

A root server makes a tenant's sandbox with its supervisor's own child (backends/_rootbox.py);
``--programs`` adds a third kind in the same turns: the tenant job launched through the chain of
programs (``AUTORESEARCH_ROOTBOX=off``: prlimit, bwrap as root, setpriv, bwrap), before and after
side by side in one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def started_at(marker: Path, timeout: float = 20.0) -> float:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            text = marker.read_text().strip()
            if text:
                return float(text)
        except (FileNotFoundError, PermissionError):
            pass
        time.sleep(0.001)
    raise RuntimeError(f"{marker} never written")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--pause", type=float, default=0.15, help="seconds between launches (passes settle)")
    parser.add_argument("--programs", action="store_true", help="also the tenant job through the programs' chain")
    args = parser.parse_args()
    os.environ.setdefault("AUTORESEARCH_GPUS", "2")
    base = Path(tempfile.mkdtemp(prefix="bench-sandbox-", dir="/var/tmp" if os.path.isdir("/var/tmp") else None))
    from autoresearch.api import Api
    from autoresearch.engine import isolation

    base.chmod(0o755)  # the workdir: the tenant uid must be able to enter it
    api = Api(base / "home")
    with api._ledger.tx() as c:
        isolation.register_tenant(c, "tenant", isolation.tenant_policy([]))
    out = base / "local"
    out.mkdir()
    kinds = ("local", "tenant", "tenant (programs)") if args.programs else ("local", "tenant")
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    for i in range(args.n):
        for kind in kinds:
            if kind == "tenant (programs)":
                os.environ["AUTORESEARCH_ROOTBOX"] = "off"
            else:
                os.environ.pop("AUTORESEARCH_ROOTBOX", None)
            t0 = time.time()
            if kind == "local":
                marker = out / f"m-{i}"
                api.submit({"command": ["/bin/sh", "-c", f"date +%s.%N > {marker}"], "workdir": str(base)})
            else:
                name = f"m-{i}" if kind == "tenant" else f"p-{i}"
                marker = base / "home" / "projects" / "tenant" / name
                api.submit({"command": ["/bin/sh", "-c", f"date +%s.%N > $AUTORESEARCH_PROJECT_DIR/{name}"],
                            "workdir": str(base)}, project="tenant")
            times[kind].append((started_at(marker) - t0) * 1000)
            time.sleep(args.pause)
    local, tenant = statistics.median(times["local"]), statistics.median(times["tenant"])
    print(f"{'submit -> command running (ms), n=' + str(args.n):<46} {'median':>8} {'p95':>8}")
    for kind in kinds:
        print(f"{kind + ' job':<46} {statistics.median(times[kind]):8.1f} {pct(times[kind], 0.95):8.1f}")
    print(f"{'tenant - local (medians)':<46} {tenant - local:8.1f}   (goal <= 15 ms; root: {os.geteuid() == 0})")
    if args.programs:
        programs = statistics.median(times["tenant (programs)"])
        print(f"{'tenant (programs) - local (medians)':<46} {programs - local:8.1f}")
    print(f"load average at the end: {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
