"""Submit -> running per engine that has a real instance here, over the engine's own bare submit.

    nice -n 19 python bench/bench_engines.py [--n 20] [--engines local,slurm,ray] [--gang 5]

For each engine, ``--n`` jobs of each kind, interleaved (job i of every kind, then job i+1), so
the machine's load drifts over all kinds alike. Every job runs ``date +%s.%N > MARKER``; a figure
is the time from the submit call to the time the program wrote (its first line running):

* bare: the engine's own submit: ``sh -c`` started by Popen (local), ``sbatch --wrap`` (the Slurm
  kit, backends/slurm/kit.py, 2 nodes), ``POST /api/jobs/`` (the Ray kit, backends/ray/start.sh);
* api: ``Api.submit`` in this process (our pass launches it);
* cli: ``autoresearch submit`` in a fresh process (Python's start, the CLI's imports, the same pass).

Plus a 2-node gang on the Slurm kit: ``sbatch --nodes=2 --wrap 'srun ...'`` against
``Api.submit(nodes=2)`` (wrap.py, the members' ranks and MASTER_PORT), until both members ran.
It starts the kits it needs in a temporary directory and stops them at the end, also when one
fails to start. Medians of one run; the overhead columns subtract the bare median. Each row also
prints a bare ``python -c pass``'s wall time and the load average at that moment, so a reader can
judge what the machine's load did to every start. The package is byte-compiled first (as an
installed one is), so the CLI column never pays for compiling this checkout.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WRITE = "date +%s.%N > {marker}"


def started_at(marker: Path, timeout: float = 120.0) -> float:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            text = marker.read_text().strip()
            if text:
                return float(text)
        except (FileNotFoundError, ValueError):
            pass
        time.sleep(0.002)
    raise RuntimeError(f"{marker} never written")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _kit() -> Any:
    spec = importlib.util.spec_from_file_location("slurm_kit", ROOT / "backends" / "slurm" / "kit.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextmanager
def slurm_kit(tmp: Path) -> Iterator[str]:
    kit = _kit()
    try:
        conf = str(kit.start(tmp / "slurm", gpus=2, nodes=2))
        yield conf
    finally:
        kit.stop(tmp / "slurm")


@contextmanager
def ray_kit(tmp: Path) -> Iterator[str]:
    where = Path(tempfile.mkdtemp(prefix="arb-", dir="/tmp"))  # Ray's socket paths must stay short
    dash = _free_port()
    try:
        started = subprocess.run([str(ROOT / "backends/ray/start.sh"), "--dir", str(where), "--num-cpus", "4",
                                  "--port", str(_free_port()), "--dashboard-port", str(dash), "--wait", "400"],
                                 capture_output=True, text=True, timeout=500)
        if started.returncode != 0:
            log = where / "head.log"
            tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
            raise RuntimeError(f"the Ray kit did not start: {started.stderr.strip()[-500:]}\n{tail}")
        yield f"http://127.0.0.1:{dash}"
    finally:
        subprocess.run([str(ROOT / "backends/ray/stop.sh"), "--dir", str(where), "--kill"], capture_output=True,
                       timeout=120)
        shutil.rmtree(where, ignore_errors=True)


def _cli(home: Path, backend: str, env: dict[str, str], command: str, workdir: Path, *extra: str) -> None:
    subprocess.run([sys.executable, "-m", "autoresearch.cli", "submit", "--backend", backend, "--workdir",
                    str(workdir), *extra, "--", "sh", "-c", command],
                   env={**os.environ, **env, "AUTORESEARCH_HOME": str(home)}, check=True, capture_output=True)


def measure(n: int, kinds: dict[str, Callable[[Path], None]], tmp: Path) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {k: [] for k in kinds}
    for i in range(n):
        for kind, submit in kinds.items():
            marker = tmp / f"{kind}-{i}-{time.monotonic_ns()}"
            t0 = time.time()
            submit(marker)
            out[kind].append(started_at(marker) - t0)
    return out


def engine_kinds(engine: str, tmp: Path, address: str) -> tuple[dict[str, Callable[[Path], None]], Any]:
    from autoresearch.api import Api

    home = tmp / f"home-{engine}"
    if engine == "local":
        api, env, backend = Api(home), {}, "local"

        def bare(marker: Path) -> None:
            subprocess.Popen(["sh", "-c", WRITE.format(marker=marker)], cwd=tmp)
    elif engine == "slurm":
        from autoresearch.backends._slurm import SlurmBackend

        api, env, backend = Api(home, SlurmBackend(conf=address)), {"SLURM_CONF": address}, "slurm"

        def bare(marker: Path) -> None:
            subprocess.run(["sbatch", "--parsable", "-o", "/dev/null", "--wrap", WRITE.format(marker=marker)],
                           check=True, capture_output=True)
    else:
        from autoresearch.backends.ray import RayBackend

        api, env, backend = Api(home, RayBackend(address=address)), {"RAY_ADDRESS": address}, "ray"

        def bare(marker: Path) -> None:
            body = json.dumps({"entrypoint": WRITE.format(marker=marker)}).encode()
            request = urllib.request.Request(f"{address}/api/jobs/", data=body, method="POST",
                                             headers={"Content-Type": "application/json"})
            urllib.request.urlopen(request, timeout=30).read()

    def through_api(marker: Path) -> None:
        api.submit({"command": WRITE.format(marker=marker), "shell": True, "workdir": str(tmp)})

    def through_cli(marker: Path) -> None:
        _cli(home, backend, env, WRITE.format(marker=marker), tmp)

    return {"bare": bare, "api": through_api, "cli": through_cli}, api


def gang(n: int, conf: str, tmp: Path) -> tuple[list[float], list[float]]:
    from autoresearch.api import Api
    from autoresearch.backends._slurm import SlurmBackend

    api = Api(tmp / "home-gang", SlurmBackend(conf=conf))
    bare, ours = [], []
    for i in range(n):
        for kind in ("bare", "ours"):
            base = tmp / f"gang-{kind}-{i}"
            t0 = time.time()
            if kind == "bare":
                inner = f"date +%s.%N > {base}-$SLURM_PROCID"
                subprocess.run(["sbatch", "--parsable", "-o", "/dev/null", "--nodes=2", "--ntasks-per-node=1", "--wrap",
                                f"srun sh -c '{inner}'"], check=True, capture_output=True)
            else:
                api.submit({"command": f"date +%s.%N > {base}-$RANK", "shell": True, "nodes": 2,
                            "workdir": str(tmp)})
            done = max(started_at(Path(f"{base}-{rank}")) for rank in (0, 1))
            (bare if kind == "bare" else ours).append(done - t0)
    return bare, ours


def compiled() -> None:
    """Byte-compile the package once: an installed package has its .pyc files, and a CLI started with
    PYTHONDONTWRITEBYTECODE=1 (some sandboxes set it) would otherwise compile ~30 modules at every start
    (0.3-0.6 s of CPU here), which is this checkout's cost, not the CLI's."""
    import compileall

    compileall.compile_dir(str(ROOT / "autoresearch"), quiet=1)


def python_start(n: int = 5) -> float:
    """A bare ``python -c pass``'s wall time now (median of ``n``): what the machine's load does to a start."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=20, help="jobs of each kind per engine")
    parser.add_argument("--engines", default="local,slurm,ray")
    parser.add_argument("--gang", type=int, default=5, help="2-node gangs on the Slurm kit (0: none)")
    args = parser.parse_args()
    os.environ["AUTORESEARCH_SYNC"] = "off"
    os.environ.pop("AUTORESEARCH_BACKEND", None)
    compiled()
    tmp = Path(tempfile.mkdtemp(prefix="bench-engines-"))
    med = statistics.median
    print(f"submit -> program running, median of {args.n} per column (s); one run, a loaded 2-core machine")
    print(f"{'engine':22} {'bare':>8} {'api':>8} {'cli':>8} {'api-bare':>9} {'cli-api':>8}", flush=True)

    def row(name: str, got: dict[str, list[float]]) -> None:  # printed as each engine is done
        b, a, c = med(got["bare"]), med(got["api"]), med(got["cli"])
        print(f"{name:22} {b:8.3f} {a:8.3f} {c:8.3f} {a - b:+9.3f} {c - a:+8.3f}   (python -c pass: "
              f"{python_start():.3f} s, load {os.getloadavg()[0]:.1f})", flush=True)

    try:
        for engine in args.engines.split(","):
            try:
                if engine == "local":
                    row("local", measure(args.n, engine_kinds("local", tmp, "")[0], tmp))
                elif engine == "slurm":
                    with slurm_kit(tmp) as conf:
                        os.environ["SLURM_CONF"] = conf
                        row("slurm (kit, 2 nodes)", measure(args.n, engine_kinds("slurm", tmp, conf)[0], tmp))
                        if args.gang:
                            bare, ours = gang(args.gang, conf, tmp)
                            print(f"{'2-node gang, slurm':22} {med(bare):8.3f} {med(ours):8.3f} {'':>8} "
                                  f"{med(ours) - med(bare):+9.3f}   (api; both members ran; median of {len(bare)})",
                                  flush=True)
                elif engine == "ray":
                    with ray_kit(tmp) as address:
                        row("ray (kit head)", measure(args.n, engine_kinds("ray", tmp, address)[0], tmp))
            except (RuntimeError, SystemExit, subprocess.SubprocessError) as err:  # one engine's kit: the others go on
                print(f"{engine:22} not measured: {str(err)[:2000]}", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
