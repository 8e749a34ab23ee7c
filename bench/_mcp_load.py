"""Issue 16's MCP figure: N submits from C client processes over HTTP, and status p50 under C clients.

    python bench/bench_mcp.py --load [--tree before=/tmp/main-copy] [--tree after=.] [--clients 10]
        [--per-client 100] [--status-per-client 50] [--kinds sdk,raw[,raw-legacy]] [--profile DIR]

For each source tree (``NAME=PATH``; its ``autoresearch`` is put first on PYTHONPATH) and each
client kind, a fresh home and a fresh ``autoresearch serve --http`` with bearer tokens (2 fake
GPU slots, held by a critical job so the submitted 1-GPU jobs queue: the figure is what a submit
costs, not how fast ``sleep`` starts). Every client is a separate process that connects and
initializes first, then waits for "go" on stdin, so start-up is not in the wall time:

- ``sdk``: the real ``mcp.Client`` over ``streamable_http_client``;
- ``raw``: keep-alive ``http.client`` posting JSON-RPC, no SDK: what is left is the server's own
  cost. It speaks what the SDK client negotiates with this server (protocol 2026-07-28: one POST
  per call, no session), so both kinds load the same server path;
- ``raw-legacy``: the same over the 2025 handshake (initialize, a session and its streams).

``--status-per-client 0`` skips the status phase (e.g. to profile submits alone).

Server CPU is the server process's utime+stime over the phase (/proc); client CPU is what the
client processes spent between "go" and their last answer. ``--profile DIR`` runs each server
under cProfile (every thread) and writes DIR/<tree>-<kind>.pstats (the figures are then slower).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

TOKEN = "bench-token-0123456789abcdef"
HERE = Path(__file__).resolve().parent
SUBMIT_ARGS = {"command": ["sleep", "1"], "gpus": 1, "priority": "best-effort"}
PROFILED = """
import cProfile, os, pstats, signal, sys, threading, time
out = sys.argv.pop(1)
def stop(*_):  # uvicorn shuts down on SIGTERM, puts this handler back and raises SIGTERM again
    raise SystemExit(0)
signal.signal(signal.SIGTERM, stop)
profilers = []
_inner = threading.Thread._bootstrap_inner  # anyio's worker threads override run()
def inner(self):
    p = cProfile.Profile(time.thread_time); profilers.append(p); p.enable()
    try:
        _inner(self)
    finally:
        p.disable()
threading.Thread._bootstrap_inner = inner
main = cProfile.Profile(time.thread_time); profilers.append(main); main.enable()
try:
    from autoresearch.cli import main as cli_main  # (not the process entry: it ends without returning here)
    cli_main(sys.argv[1:])
except SystemExit:
    pass
finally:
    main.disable()
    stats = None
    for p in profilers:
        try:
            p.create_stats()
            stats = pstats.Stats(p) if stats is None else (stats.add(p) or stats)
        except Exception:
            pass
    stats.dump_stats(out)
"""


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- the raw client -----------------------------------------------------------------------------

MODERN = "2026-07-28"  # what the SDK client speaks to this server: one POST per call, no session
META = {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "raw-bench", "version": "0"}}


class Raw:
    """JSON-RPC over one keep-alive HTTP connection: the least a client can cost. ``legacy``: the
    2025 handshake (initialize, a session id, the session's streams on the server) instead of the
    per-request protocol the SDK client negotiates with this server."""

    def __init__(self, url: str, legacy: bool = False) -> None:
        parts = urlsplit(url)
        self.conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=60)
        self.path = parts.path
        self.legacy = legacy
        self.headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json",
                        "Accept": "application/json, text/event-stream"}
        self.next_id = 0
        if not legacy:
            self.headers["mcp-protocol-version"] = MODERN
            return
        init = self.rpc("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                       "clientInfo": {"name": "raw-bench", "version": "0"}})
        self.headers["mcp-protocol-version"] = init["result"]["protocolVersion"]
        self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def post(self, body: dict[str, Any], headers: dict[str, str] | None = None) -> bytes:
        headers = {**self.headers, **(headers or {})}
        try:
            self.conn.request("POST", self.path, json.dumps(body), headers)
            response = self.conn.getresponse()
        except (ConnectionError, http.client.RemoteDisconnected):  # the server closed an idle keep-alive
            self.conn.close()
            self.conn.request("POST", self.path, json.dumps(body), headers)
            response = self.conn.getresponse()
        data = response.read()
        session = response.getheader("mcp-session-id")
        if session:
            self.headers["mcp-session-id"] = session
        if response.status >= 400:
            raise RuntimeError(f"HTTP {response.status}: {data[:200]!r}")
        if (response.getheader("content-type") or "").startswith("text/event-stream"):
            lines = [ln[5:].strip() for ln in data.decode().splitlines() if ln.startswith("data:")]
            data = next((ln for ln in reversed(lines) if ln), "").encode()
        return data

    def rpc(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self.next_id += 1
        headers = None
        if not self.legacy:
            params = {**params, "_meta": META}
            headers = {"mcp-method": method, **({"mcp-name": params["name"]} if "name" in params else {})}
        answer: dict[str, Any] = json.loads(self.post({"jsonrpc": "2.0", "id": self.next_id, "method": method,
                                                       "params": params}, headers))
        return answer

    def call(self, tool: str, arguments: dict[str, Any]) -> tuple[bool, Any]:
        result = self.rpc("tools/call", {"name": tool, "arguments": arguments}).get("result", {})
        return bool(result.get("isError")), result.get("structuredContent") or result.get("content")


# -- one client process ---------------------------------------------------------------------------

def client_main(kind: str, url: str, tool: str, n: int, ids: list[int]) -> None:
    def args_for(i: int) -> dict[str, Any]:
        return SUBMIT_ARGS if tool == "submit" else {"job_id": ids[i % len(ids)]}

    def report(start: float, cpu: float, lat: list[float], errors: list[str], got: list[int]) -> None:
        print(json.dumps({"start": start, "end": time.monotonic(), "cpu": time.process_time() - cpu,
                          "lat": lat, "errors": errors[:3], "n_errors": len(errors), "ids": got}), flush=True)

    if kind in ("raw", "raw-legacy"):
        raw = Raw(url, legacy=kind == "raw-legacy")
        print("ready", flush=True)
        sys.stdin.readline()
        start, cpu = time.monotonic(), time.process_time()
        lat: list[float] = []
        errors: list[str] = []
        got: list[int] = []
        for i in range(n):
            t0 = time.perf_counter()
            is_error, out = raw.call(tool, args_for(i))
            lat.append(time.perf_counter() - t0)
            if is_error:
                errors.append(str(out)[:200])
            elif tool == "submit":
                got.append(out["id"])
        report(start, cpu, lat, errors, got)
        return

    import anyio

    async def run() -> None:
        from mcp import Client
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        http = create_mcp_http_client(headers={"Authorization": f"Bearer {TOKEN}"})
        async with http, Client(streamable_http_client(url, http_client=http)) as client:
            await client.list_tools()  # warm: schemas fetched before the clock starts
            print("ready", flush=True)
            await anyio.to_thread.run_sync(sys.stdin.readline)
            start, cpu = time.monotonic(), time.process_time()
            lat: list[float] = []
            errors: list[str] = []
            got: list[int] = []
            for i in range(n):
                t0 = time.perf_counter()
                r = await client.call_tool(tool, args_for(i))
                lat.append(time.perf_counter() - t0)
                if r.is_error:
                    errors.append(str(r.content)[:200])
                elif tool == "submit":
                    got.append(r.structured_content["id"])
            report(start, cpu, lat, errors, got)

    anyio.run(run)


# -- the driver -------------------------------------------------------------------------------------

def start_server(tree: Path, home: Path, tokens: Path, profile: Path | None) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {**os.environ, "AUTORESEARCH_HOME": str(home), "AUTORESEARCH_GPUS": "2", "AUTORESEARCH_TOKENS": str(tokens),
           "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")])}
    serve = ["serve", "--http", "--port", str(port)]
    cmd = ([sys.executable, "-c", PROFILED, str(profile), *serve] if profile
           else [sys.executable, "-m", "autoresearch.cli", *serve])
    proc = subprocess.Popen(cmd, env=env, cwd=home, stdout=subprocess.DEVNULL, stderr=open(home / "server.err", "wb"))
    url = f"http://127.0.0.1:{port}/mcp"
    deadline = time.monotonic() + 60
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return proc, url
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit(f"the HTTP server did not start: {(home / 'server.err').read_text()[-2000:]}") from None
            time.sleep(0.1)


def phase(kind: str, url: str, tool: str, clients: int, per_client: int, ids: list[int],
          server_pid: int) -> dict[str, Any]:
    cmd = [sys.executable, str(HERE / "bench_mcp.py"), "--client", kind, "--url", url, "--tool", tool,
           "--n", str(per_client), "--ids", ",".join(map(str, ids)) or "0"]
    procs = [subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for _ in range(clients)]
    for p in procs:
        line = p.stdout.readline() if p.stdout else ""
        if line.strip() != "ready":
            raise SystemExit(f"a {kind} client did not start: {line!r}")
    load = os.getloadavg()[0]
    cpu0 = proc_cpu(server_pid)
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    results = [json.loads(p.stdout.readline()) for p in procs if p.stdout]
    cpu1 = proc_cpu(server_pid)
    for p in procs:
        p.wait(30)
    lat = [x for r in results for x in r["lat"]]
    calls = len(lat)
    wall = max(r["end"] for r in results) - min(r["start"] for r in results)
    return {"wall": wall, "calls": calls, "p50": statistics.median(lat), "p95": pct(lat, 0.95),
            "server_cpu": (cpu1 - cpu0) / calls, "client_cpu": sum(r["cpu"] for r in results) / calls,
            "errors": sum(r["n_errors"] for r in results), "error_sample": [e for r in results for e in r["errors"]][:2],
            "ids": [i for r in results for i in r["ids"]], "load": load}


def run_tree(name: str, tree: Path, kind: str, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as scratch:  # jobs may still write there
        home = Path(scratch) / "home"
        home.mkdir()
        tokens = Path(scratch) / "tokens"
        tokens.write_text(f"{TOKEN} bench\n")
        profile = Path(args.profile).resolve() / f"{name}-{kind}.pstats" if args.profile else None
        proc, url = start_server(tree.resolve(), home, tokens, profile)
        try:
            admin = Raw(url)
            bad, blocker = admin.call("submit", {"command": ["sleep", "600"], "gpus": 2, "priority": "critical"})
            if bad:
                raise SystemExit(f"blocker refused: {blocker}")
            sub = phase(kind, url, "submit", args.clients, args.per_client, [], proc.pid)
            st = phase(kind, url, "status", args.clients, args.status_per_client, sub["ids"] or [blocker["id"]],
                       proc.pid) if args.status_per_client else None
        finally:
            proc.terminate()
            try:
                proc.wait(60 if profile else 15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            cancel_all(tree.resolve(), home)
        return {"tree": name, "kind": kind, "submit": sub, "status": st}


CANCEL_ALL = """
import sys
from autoresearch.api import Api
api = Api(sys.argv[1])
ids = []
for state in ("queued", "starting", "running"):  # the queue first: nothing of it starts when the blocker goes
    cursor = None
    while True:
        page = api.list_jobs(state=state, limit=1000, cursor=cursor, refresh=False)
        ids += [job.id for job in page.jobs]
        cursor = page.next_cursor
        if not cursor:
            break
api.cancel(ids)
"""


def cancel_all(tree: Path, home: Path) -> None:
    """Cancel what the run left queued and running: its 1,000 queued `sleep 1` jobs would otherwise
    start once the blocker ends and keep the machine busy for minutes after the table is printed.
    Then stop the home's MLflow syncer: it mirrors those 1,000 jobs for a minute or more (niced, but
    25-50% of a core), and the next phase was measured beside it (four of them at once by the end)."""
    subprocess.run([sys.executable, "-c", CANCEL_ALL, str(home)], env={**os.environ, "PYTHONPATH": str(tree)},
                   timeout=300, check=False)
    from autoresearch.util._lockfile import lock_holder

    syncer = lock_holder(home / "tracking.lock")
    if syncer:
        with contextlib.suppress(OSError):
            os.kill(syncer, signal.SIGTERM)


def cpu_bound(s: dict[str, Any]) -> float:
    """The wall the phase would take on 2 idle cores if only CPU mattered: the server is one
    process (one GIL: at most one core), clients and server together share two."""
    return s["calls"] * max(s["server_cpu"], (s["server_cpu"] + s["client_cpu"]) / 2)


def table(rows: list[dict[str, Any]]) -> str:
    header = ("tree", "client", "submits", "wall s", "submits/s", "p50 ms", "p95 ms", "server CPU/call ms",
              "client CPU/call ms", "CPU-bound wall s", "errors", "status p50 ms", "status server CPU/call ms", "load")
    lines = [header]
    for r in rows:
        s, t = r["submit"], r["status"] or {"errors": 0, "p50": float("nan"), "server_cpu": float("nan"), "load": float("nan")}
        lines.append((r["tree"], r["kind"], str(s["calls"]), f"{s['wall']:.2f}", f"{s['calls'] / s['wall']:.0f}",
                      f"{1000 * s['p50']:.1f}", f"{1000 * s['p95']:.1f}", f"{1000 * s['server_cpu']:.1f}",
                      f"{1000 * s['client_cpu']:.1f}", f"{cpu_bound(s):.2f}", str(s["errors"] + t["errors"]), f"{1000 * t['p50']:.1f}",
                      f"{1000 * t['server_cpu']:.1f}", f"{s['load']:.2f}/{t['load']:.2f}"))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in lines)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--client", choices=("sdk", "raw", "raw-legacy"))
    parser.add_argument("--url")
    parser.add_argument("--tool", default="submit")
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--ids", default="")
    parser.add_argument("--tree", action="append", default=[], help="NAME=PATH of a source tree (default: this one)")
    parser.add_argument("--kinds", default="sdk,raw")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--per-client", type=int, default=100)
    parser.add_argument("--status-per-client", type=int, default=50)
    parser.add_argument("--profile")
    args = parser.parse_args(argv)
    if args.client:
        client_main(args.client, args.url, args.tool, args.n, [int(i) for i in args.ids.split(",") if i])
        return
    trees = [(t.split("=", 1)[0], Path(t.split("=", 1)[1])) for t in args.tree] or [("this", HERE.parent)]
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
    rows = []
    for kind in args.kinds.split(","):
        for name, tree in trees:
            rows.append(run_tree(name, tree, kind, args))
            print(f"# {name} {kind}: {rows[-1]['submit']['wall']:.2f} s, errors "
                  f"{rows[-1]['submit']['error_sample'] + (rows[-1]['status'] or {}).get('error_sample', [])}", file=sys.stderr, flush=True)
    print(f"{args.clients} client processes x {args.per_client} submits, then x {args.status_per_client} status; "
          f"{os.cpu_count()} cores; load = 1-min load average at the start of each phase; CPU-bound wall = "
          "calls x max(server CPU, (server + client CPU) / 2): the wall on 2 idle cores if only CPU counted")
    print(table(rows))
