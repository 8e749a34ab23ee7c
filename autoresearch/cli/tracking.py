"""``autoresearch ui`` and ``autoresearch sync``: the MLflow mirror at the terminal.

Argparse only at import time (see autoresearch/cli/__init__.py), since every
``autoresearch`` call imports it; ``run`` imports mlflow only when it must.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any


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
    from autoresearch.cli import open_api

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
    uri, argv = api.mlflow_ui(args.host, args.port, sync=not args.no_sync)
    if argv is None:
        print(f"the tracking store is an MLflow server; its UI is at {uri}")
        return 0
    print(f"MLflow UI on http://{args.host}:{args.port} (store {uri}); Ctrl-C to stop", flush=True)
    os.environ.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")  # no background job-runner processes
    os.execv(sys.executable, argv)
    return 0  # pragma: no cover
