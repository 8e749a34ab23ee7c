"""CLI start-up benchmark: wall time per command, and what each one imports.

    python bench/bench_cli.py [--runs 15] [--jobs 100] [--top 8]

Runs ``python -m autoresearch.cli COMMAND`` as a user would (bytecode caches written, as
an installed package has them) on a scratch AUTORESEARCH_HOME holding ``--jobs`` finished
jobs, and prints the median and p90 wall per command next to the bare interpreter's start
(``python -c pass``) and what the command adds to it (``over bare``: a ``.pth`` file or an
editable install's finder slows every interpreter's start, not this command's). Then one
``-X importtime`` run per command: the heaviest imports (cumulative ms of the top-level
packages it pulls in), the child's CPU ms (user+system: steadier than wall on a loaded
machine) and the heavy packages it loads (pydantic, rich, yaml, mlflow, mcp). Goal (issue 16):
status, list and submit <= 150 ms on a quiet machine. Prints tables; nothing is asserted
(tests/runtime/test_cli_imports.py asserts what each command does not import).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_runtime import pct  # noqa: E402

HEAVY = ("pydantic", "rich", "yaml", "mlflow", "mcp", "pynvml", "anthropic", "openai")


def commands(job: int) -> list[tuple[str, list[str]]]:
    return [
        ("--help", ["--help"]),
        ("status", ["status"]),
        ("status ID", ["status", str(job)]),
        ("status ID --json", ["status", str(job), "--json"]),
        ("list", ["list"]),
        ("list --json", ["list", "--json"]),
        ("metrics ID", ["metrics", str(job)]),
        ("logs ID", ["logs", str(job)]),
        ("submit -- true", ["submit", "--", "true"]),
        ("submit --json -- true", ["submit", "--json", "--", "true"]),
    ]


def seed(home: Path, jobs: int) -> int:
    """``jobs`` finished jobs in the ledger; the id of the last one."""
    code = (
        "import sys, time\n"
        "from autoresearch.api import Api\n"
        "api = Api(sys.argv[1])\n"
        "ids = [api.submit({'command': ['sh', '-c', 'echo loss: 0.5'], 'workdir': '/tmp'}).id "
        "for _ in range(int(sys.argv[2]))]\n"
        "deadline = time.time() + 120\n"
        "while time.time() < deadline and any(api.status(i).state not in ('succeeded', 'failed') for i in ids[-5:]):\n"
        "    time.sleep(0.2)\n"
        "print(ids[-1])\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(home), str(jobs)], check=True, capture_output=True,
                         text=True, env=_env(home))
    return int(out.stdout.split()[-1])


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # an install has its .pyc
    env["AUTORESEARCH_HOME"] = str(home)
    env["COLUMNS"] = "120"
    env["AUTORESEARCH_SYNC"] = "off"  # no background MLflow syncer per scratch home (the kick itself still runs)
    return env


def wall(argv: list[str], env: dict[str, str], runs: int, cpu: list[float] | None = None) -> list[float]:
    """Wall ms per run; ``cpu`` gets the child's user+system ms (less sensitive to a loaded machine)."""
    out = []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        out.append((time.perf_counter() - t0) * 1000)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if cpu is not None:
            cpu.append((after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) * 1000)
    return out


def importtime(args: list[str], env: dict[str, str]) -> tuple[float, list[tuple[str, float]], list[str]]:
    """(total ms of imports, the heaviest top-level imports, the heavy packages loaded)."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "autoresearch.cli", *args], env=env,
                          capture_output=True, text=True, check=False)
    top: dict[str, float] = {}
    total = 0.0
    loaded = set()
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line or "cumulative" in line:
            continue
        _self, cumulative, name = line[len("import time:"):].split("|")
        name = name[1:]  # "| pkg" at the top level, "|   pkg" nested (its parent's cumulative counts it)
        root = name.strip().split(".")[0]
        if root in HEAVY:
            loaded.add(root)
        if name.startswith(" "):
            continue
        ms = int(cumulative) / 1000
        total += ms
        key = name.strip() if root == "autoresearch" else root
        top[key] = top.get(key, 0.0) + ms
    return total, sorted(top.items(), key=lambda kv: -kv[1]), sorted(loaded)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--jobs", type=int, default=100)
    ap.add_argument("--top", type=int, default=6)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_cli_", ignore_cleanup_errors=True) as tmp:
        home = Path(tmp) / "home"
        env = _env(home)
        job = seed(home, a.jobs)
        exe = [sys.executable, "-m", "autoresearch.cli"]
        cmds = commands(job)
        for _, args in cmds:  # write the bytecode caches once
            subprocess.run([*exe, *args], env=env, capture_output=True, check=False)
        load = os.getloadavg()[0]
        print(f"CLI wall, {a.runs} runs per command, {a.jobs} jobs in the ledger, load {load:.1f} "
              f"on {os.cpu_count()} cores ({sys.executable})")
        bare_cpu: list[float] = []
        bare = wall([sys.executable, "-c", "pass"], env, a.runs, bare_cpu)
        print(f"{'command':<24} {'median ms':>10} {'over bare':>10} {'p90 ms':>8} {'CPU ms':>7} {'imports ms':>11}  heavy loaded")
        print(f"{'(python -c pass)':<24} {statistics.median(bare):>10.0f} {'':>10} {pct(bare, 0.9):>8.0f} "
              f"{statistics.median(bare_cpu):>7.0f}")
        offenders = []
        for label, args in cmds:
            cpu: list[float] = []
            times = wall([*exe, *args], env, a.runs, cpu)
            total, top, heavy = importtime(args, env)
            offenders.append((label, top))
            own = statistics.median(times) - statistics.median(bare)  # what the command adds to any interpreter's start
            print(f"{label:<24} {statistics.median(times):>10.0f} {own:>+10.0f} {pct(times, 0.9):>8.0f} {statistics.median(cpu):>7.0f} "
                  f"{total:>11.0f}  "
                  f"{','.join(heavy) or '-'}")
        print("\nheaviest imports per command (-X importtime, cumulative ms, one run)")
        for label, top in offenders:
            print(f"{label:<24} " + ", ".join(f"{name} {ms:.0f}" for name, ms in top[:a.top]))


if __name__ == "__main__":
    main()
