"""Docker backend benchmark against a private engine (backends/docker/kit.py), beside bare ``docker run``.

    python bench/bench_docker.py [--n 20]

Starts a private dockerd and imports the kit's test image (both stopped and removed at the end,
also when the kit fails to start), then prints a table measured in this run on this machine (not
a test): submit -> the program's first line (a timestamp it writes to a bind-mounted file), bare
``docker run -d`` of the same command vs ``Api.submit`` on the docker backend vs the
``autoresearch submit`` CLI; medians and p90 of ``--n`` samples, interleaved.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_engines import compiled, python_start  # bench/ is on sys.path when run as a script
from bench_runtime import pct, started_at

ROOT = Path(__file__).resolve().parents[1]


def _kit() -> Any:
    spec = importlib.util.spec_from_file_location("docker_kit", ROOT / "backends" / "docker" / "kit.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stamp(marker: Path) -> list[str]:
    return [sys.executable, "-c", f"import time; open({str(marker)!r}, 'w').write(repr(time.time()))"]


def bench_start(api: Any, host: str, image: str, n: int, tmp: Path) -> dict[str, list[float]]:
    env = {**os.environ, "DOCKER_HOST": host}
    cli_env = {**os.environ, "AUTORESEARCH_HOME": str(tmp / "home-cli"), "PYTHONPATH": str(ROOT)}
    out: dict[str, list[float]] = {"bare": [], "api": [], "cli": []}
    for i in range(n):
        for kind in out:
            marker = tmp / "marks" / f"{kind}-{i}"
            t0 = time.time()
            if kind == "bare":
                subprocess.run(["docker", "run", "-d", "--rm", "--mount", f"type=bind,source={tmp},target={tmp}",
                                image, *stamp(marker)], env=env, check=True, capture_output=True)
            elif kind == "api":
                api.submit({"command": stamp(marker), "workdir": str(tmp), "image": image})
            else:
                subprocess.run([sys.executable, "-m", "autoresearch.cli", "submit", "--backend", "box", "--image",
                                image, "--", *stamp(marker)], env=cli_env, cwd=tmp, check=True, capture_output=True)
            out[kind].append(started_at(marker, timeout=120.0) - t0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=20, help="submit->running samples per column")
    args = parser.parse_args()
    os.environ["AUTORESEARCH_SYNC"] = "off"
    compiled()
    kit = _kit()
    tmp = Path(tempfile.mkdtemp(prefix="bench-docker-"))
    (tmp / "marks").mkdir()
    try:
        host = kit.start(tmp / "kit")
        image = kit.image(tmp / "kit")
        (tmp / "home-cli").mkdir()
        (tmp / "home-cli" / "config.yaml").write_text(f"backends:\n  box: {{kind: docker, host: '{host}'}}\n")
        from autoresearch.api import Api
        from autoresearch.backends._docker import DockerBackend

        api = Api(tmp / "home", DockerBackend(host=host))
        times = bench_start(api, host, image, args.n, tmp)
        bare = statistics.median(times["bare"])
        print(f"{'submit -> program running (s), n=' + str(args.n):40} {'median':>8} {'p90':>8} {'over bare':>10}")
        for kind, label in (("bare", "bare docker run -d"), ("api", "Api.submit (docker backend)"),
                            ("cli", "autoresearch submit (CLI)")):
            med = statistics.median(times[kind])
            print(f"{label:40} {med:8.3f} {pct(times[kind], 0.9):8.3f} {med - bare:+10.3f}")
        print(f"(python -c pass: {python_start():.3f} s, load {os.getloadavg()[0]:.1f})")
    finally:
        kit.stop(tmp / "kit")
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
