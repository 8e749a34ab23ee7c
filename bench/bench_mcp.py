"""MCP server benchmark: submit throughput over HTTP, status latency, stdio start-up.

    python bench/bench_mcp.py [--submits 1000] [--clients 10] [--status-calls 500] [--startup-runs 5]
    python bench/bench_mcp.py --load [--tree before=/tmp/main-copy --tree after=.] [--profile DIR]

``--load`` (issue 16's figure) starts ``autoresearch serve --http`` from each source tree
named by ``--tree`` and drives it from ``--clients`` separate client processes, once with the
real SDK client (``mcp.Client`` over streamable HTTP) and once with a minimal raw
JSON-RPC-over-HTTP client (keep-alive ``http.client``, no SDK: the server's own cost). See
bench/_mcp_load.py.

Runs a real ``autoresearch serve --http`` subprocess with bearer tokens on a scratch
AUTORESEARCH_HOME (2 fake GPU slots). A critical job holds both GPUs first, so the
submitted jobs (1 GPU each) queue: the figure is what a submit costs (validate, write
the ledger, run a scheduling pass, answer), not how fast ``sleep`` starts.
Prints a table; nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import httpx

TOKEN = "bench-token-0123456789abcdef"
BARE_SERVER = """
from mcp.server.mcpserver import MCPServer
server = MCPServer("bare")
@server.tool()
def ping() -> str:
    return "pong"
server.run()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_http(home: Path, tokens: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {**os.environ, "AUTORESEARCH_HOME": str(home), "AUTORESEARCH_GPUS": "2", "AUTORESEARCH_TOKENS": str(tokens)}
    proc = subprocess.Popen([sys.executable, "-m", "autoresearch.cli", "serve", "--http", "--port", str(port)],
                            env=env, cwd=home, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/mcp"
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(url, timeout=1)
            return proc, url
        except httpx.TransportError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit("the HTTP server did not start") from None
            time.sleep(0.1)


async def client_for(url: str) -> Any:
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    http = create_mcp_http_client(headers={"Authorization": f"Bearer {TOKEN}"})
    return http, Client(streamable_http_client(url, http_client=http))


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def bench_http(url: str, submits: int, clients: int, status_calls: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    http, admin = await client_for(url)
    async with http, admin:
        blocker = await admin.call_tool("submit", {"command": ["sleep", "600"], "gpus": 2, "priority": "critical"})
        blocker_id = blocker.structured_content["id"]

        errors: list[str] = []
        ids: list[int] = []
        per_client = submits // clients

        async def submitter() -> None:
            http_c, c = await client_for(url)
            async with http_c, c:
                for _ in range(per_client):
                    r = await c.call_tool("submit", {"command": ["sleep", "1"], "gpus": 1,
                                                     "priority": "best-effort"})
                    if r.is_error:
                        errors.append(r.content[0].text)
                    else:
                        ids.append(r.structured_content["id"])

        start = time.perf_counter()
        async with anyio.create_task_group() as group:
            for _ in range(clients):
                group.start_soon(submitter)
        out["submit_wall_s"] = time.perf_counter() - start
        out["submits"] = per_client * clients
        out["submit_errors"] = len(errors)

        latencies: list[float] = []
        status_errors = 0

        async def reader(n: int) -> None:
            nonlocal status_errors
            http_c, c = await client_for(url)
            async with http_c, c:
                for i in range(status_calls // clients):
                    t0 = time.perf_counter()
                    r = await c.call_tool("status", {"job_id": ids[(n * 97 + i) % len(ids)]})
                    latencies.append(time.perf_counter() - t0)
                    status_errors += bool(r.is_error)

        async with anyio.create_task_group() as group:
            for n in range(clients):
                group.start_soon(reader, n)
        out["status_p50_ms"] = 1000 * statistics.median(latencies)
        out["status_p99_ms"] = 1000 * pct(latencies, 0.99)
        out["status_calls"] = len(latencies)
        out["status_errors"] = status_errors

        solo: list[float] = []
        for i in range(100):
            t0 = time.perf_counter()
            await admin.call_tool("status", {"job_id": ids[i % len(ids)]})
            solo.append(time.perf_counter() - t0)
        out["status_solo_p50_ms"] = 1000 * statistics.median(solo)
        out["status_solo_p99_ms"] = 1000 * pct(solo, 0.99)
        await admin.call_tool("cancel", {"job_id": blocker_id})
    return out


async def time_initialize(command: list[str], env: dict[str, str]) -> float:
    from mcp import Client, StdioServerParameters

    params = StdioServerParameters(command=command[0], args=command[1:], env=env)
    t0 = time.perf_counter()
    async with Client(params, mode="legacy") as client:
        elapsed = time.perf_counter() - t0
        await client.list_tools()
    return elapsed


def bench_startup(home: Path, runs: int) -> dict[str, float]:
    env = {**os.environ, "AUTORESEARCH_HOME": str(home), "AUTORESEARCH_GPUS": "2"}
    ours, bare, imports = [], [], []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import mcp.server.mcpserver"], check=True, env=env)
        imports.append(time.perf_counter() - t0)
        bare.append(anyio.run(time_initialize, [sys.executable, "-c", BARE_SERVER], env))
        ours.append(anyio.run(time_initialize, [sys.executable, "-m", "autoresearch.cli", "serve"], env))
    return {"sdk_import_s": statistics.median(imports), "bare_sdk_init_s": statistics.median(bare),
            "ours_init_s": statistics.median(ours)}


def main() -> None:
    if "--load" in sys.argv or "--client" in sys.argv:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from _mcp_load import main as load_main

        load_main([a for a in sys.argv[1:] if a != "--load"])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--submits", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--status-calls", type=int, default=500)
    parser.add_argument("--startup-runs", type=int, default=5)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as scratch:
        home = Path(scratch) / "home"
        home.mkdir()
        tokens = Path(scratch) / "tokens"
        tokens.write_text(f"{TOKEN} bench\n")
        startup = bench_startup(Path(scratch) / "startup-home", args.startup_runs)
        proc, url = start_http(home, tokens)
        try:
            http = anyio.run(bench_http, url, args.submits, args.clients, args.status_calls)
        finally:
            proc.terminate()
            proc.wait(10)
            from autoresearch.api import Api

            api = Api(home)  # stop whatever is still queued or running
            active = [j.id for j in api.list_jobs(limit=1000).jobs if j.state in ("queued", "starting", "running")]
            if active:
                api.cancel(active)

    rows = [
        ("submit over HTTP", f"{http['submits']} calls, {args.clients} clients",
         f"{http['submit_wall_s']:.2f} s wall ({http['submits'] / http['submit_wall_s']:.0f}/s)",
         f"{http['submit_errors']} errors", "goal <= 10 s, 0 errors"),
        ("status over HTTP", f"{http['status_calls']} calls, {args.clients} clients",
         f"p50 {http['status_p50_ms']:.1f} ms, p99 {http['status_p99_ms']:.1f} ms",
         f"{http['status_errors']} errors", ""),
        ("status over HTTP", "100 calls, 1 client",
         f"p50 {http['status_solo_p50_ms']:.1f} ms, p99 {http['status_solo_p99_ms']:.1f} ms", "", ""),
        ("import mcp.server.mcpserver", f"median of {args.startup_runs}", f"{startup['sdk_import_s']:.2f} s", "", ""),
        ("stdio spawn -> initialized", "bare SDK server", f"{startup['bare_sdk_init_s']:.2f} s", "", ""),
        ("stdio spawn -> initialized", "autoresearch serve", f"{startup['ours_init_s']:.2f} s",
         f"+{startup['ours_init_s'] - startup['bare_sdk_init_s']:.2f} s over bare", "goal <= +0.3 s"),
    ]
    widths = [max(len(str(r[i])) for r in rows) for i in range(5)]
    header = ("what", "load", "figure", "errors / overhead", "goal")
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    for row in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))


if __name__ == "__main__":
    main()
