"""``autoresearch ui`` and ``autoresearch sync``: the MLflow mirror at the terminal.

Argparse only at import time (see autoresearch/cli/__init__.py), since every
``autoresearch`` call imports it; ``run`` imports mlflow only when it must.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import subprocess


def add_parser(sub: Any) -> None:
    ui = sub.add_parser("ui", help="open the MLflow UI on the tracking store (loopback)")
    ui.add_argument("--port", type=int, default=5000, help="port to serve the UI on (default 5000)")
    ui.add_argument("--host", default="127.0.0.1", help="interface to listen on (default loopback only)")
    ui.add_argument("--no-sync", action="store_true", help="do not mirror pending ledger rows first")
    ui.set_defaults(handler=run)

    sy = sub.add_parser("sync", help="mirror the ledger to MLflow now (the background syncer does it too)")
    sy.add_argument("--status", action="store_true", help="show how far the mirror is; no mlflow import")
    sy.add_argument("--uri", help="bind this ledger to another tracking store and mirror everything there")
    sy.add_argument("--json", action="store_true", help="print JSON for machines")
    sy.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from autoresearch.cli._facade import open_api

    api = open_api(args)
    if args.cmd == "ui":
        return _ui(api, args)
    if args.status:
        return _status(api, args.json)
    return _sync(api, args)


def _status(api: Any, as_json: bool) -> int:
    info = api.mirror_status()
    if as_json:
        print(json.dumps(info, indent=2))
        return 0
    ago = f"{time.time() - info['last_sync']:.0f}s ago" if info["last_sync"] else "never"
    print(f"store:     {info['uri']}")
    print(f"runs:      {info['runs']}   last sync: {ago}   syncer: "
          f"{'running' if info['syncer_running'] else 'idle'}{'' if info['background'] else ' (AUTORESEARCH_SYNC=off)'}")
    print(f"pending:   {info['metrics_pending']} metric points, {info['traces_pending']} LLM-call traces")
    for item in info["blocked"]:
        print(f"blocked:   {item['entity']}: {item['error']}")
    if info.get("error"):
        retry = f"; retrying in {max(0.0, info['retry_at'] - time.time()):.0f}s" if info.get("retry_at") else ""
        print(f"behind:    the last sync failed: {info['error']}{retry}")
    print(f"log:       {info['log']}")
    return 0


def _sync(api: Any, args: argparse.Namespace) -> int:
    done = api.sync(uri=args.uri)
    total, seconds = done["totals"], done["seconds"]
    if args.json:
        print(json.dumps({**total, "seconds": round(seconds, 3), "uri": done["uri"]}))
    else:
        print(f"synced to {done['uri']} in {seconds:.1f}s: " + ", ".join(f"{v} {k.replace('_', ' ')}"
                                                                         for k, v in total.items()))
    for item in done["blocked"]:
        print(f"blocked: {item['entity']}: {item['error']}", file=sys.stderr)
    return 1 if done["blocked"] else 0


def _ui(api: Any, args: argparse.Namespace) -> int:
    """Start ``mlflow ui`` on the store; print its URL once it answers (it takes a while to start)."""
    if not _port_free(args.host, args.port):
        print(f"error: port {args.port} on {args.host} is already in use", file=sys.stderr)
        print(f"hint: pass --port with a free one (e.g. --port {_free_port(args.host)}), or stop what listens "
              f"on {args.port}", file=sys.stderr)
        return 1
    uri, argv, page = api.mlflow_ui(args.host, args.port, sync=not args.no_sync)
    lag = api.mirror_lag()
    if lag:
        print(f"warning: {lag}", file=sys.stderr)
    if argv is None:
        print(f"the tracking store is an MLflow server; its UI is at {uri.rstrip('/')}{page}")
        return 0
    log_path = str(Path(api.mirror_status()["log"]).with_name("ui.log"))  # beside the mirror's log, in the home
    os.environ.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")  # no background job-runner processes
    print(f"starting the MLflow UI on {args.host}:{args.port} (store {uri}; its log: {log_path}) ...",
          file=sys.stderr, flush=True)
    import subprocess  # here, not at the top: every `autoresearch` call imports this module

    with open(log_path, "ab") as log:  # its own session: stopping us (Ctrl-C, SIGTERM) stops all of it
        proc = subprocess.Popen(argv, stdout=log, stderr=log, start_new_session=True)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    base = f"http://{'127.0.0.1' if args.host in ('0.0.0.0', '::', '') else args.host}:{args.port}"
    try:
        while not _answers(base):
            if proc.poll() is not None:
                tail = Path(log_path).read_text(errors="replace")[-2000:]
                busy = "Address already in use" in tail or "address already in use" in tail
                print(f"error: mlflow ui exited ({proc.returncode}) before it answered"
                      + (f": port {args.port} is in use" if busy else ""), file=sys.stderr)
                print(f"hint: {'pass --port with a free one' if busy else 'see ' + log_path}", file=sys.stderr)
                return 1
            time.sleep(0.5)
        print(f"MLflow UI: {base}{page}  (Ctrl-C to stop)", flush=True)
        return 0 if proc.wait() in (0, -signal.SIGINT, -signal.SIGTERM) else 1
    except KeyboardInterrupt:
        return 0
    finally:
        _stop_group(proc)


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """Stop ``mlflow ui`` and the server workers it started (its process group)."""
    import subprocess

    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(wait)
            break
        except subprocess.TimeoutExpired:
            continue


def _port_free(host: str, port: int) -> bool:
    import socket

    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server will: TIME_WAIT is not busy
            s.bind((host, port))
    except OSError:
        return False
    return True


def _free_port(host: str) -> int:
    import socket

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _answers(base: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"{base}/health", timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False
