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
    ui.add_argument("--port", type=int, default=5000)
    ui.add_argument("--host", default="127.0.0.1", help="interface to listen on (default loopback only)")
    ui.add_argument("--no-sync", action="store_true", help="do not mirror pending ledger rows first")
    ui.set_defaults(handler=run)

    sy = sub.add_parser("sync", help="mirror the ledger to MLflow now (the background syncer does it too)")
    sy.add_argument("--status", action="store_true", help="show how far the mirror is; no mlflow import")
    sy.add_argument("--uri", help="bind this ledger to another tracking store and mirror everything there")
    sy.add_argument("--json", action="store_true")
    sy.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from autoresearch.ledger import Ledger

    ledger = Ledger(args.home)
    if args.cmd == "ui":
        return _ui(ledger, args)
    if args.status:
        return _status(ledger, args.json)
    return _sync(ledger, args)


def status(ledger: Any) -> dict[str, Any]:
    """How far the mirror is, from the ledger alone."""
    import fcntl

    from autoresearch import tracking

    conn = ledger._connect()
    state = {r["name"]: r["value"] for r in ledger.query("SELECT name, value FROM tracking_state")}
    cursor = int(state.get("metrics", 0))
    pending = ledger.one("SELECT COUNT(*) AS n FROM metrics WHERE rowid > ?", (cursor,))
    unsent = ledger.one("SELECT COUNT(*) AS n FROM tracking_outbox WHERE done_at IS NULL")
    blocked = [{"entity": r["entity"], "error": r["error"]}
               for r in ledger.query("SELECT entity, error FROM tracking_runs WHERE error IS NOT NULL")]
    runs = ledger.one("SELECT COUNT(*) AS n FROM tracking_runs WHERE run_id IS NOT NULL")
    running = False
    fd = os.open(ledger.home / tracking.LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        running = True
    finally:
        os.close(fd)
    last = float(state["last_sync"]) if "last_sync" in state else None
    return {
        "uri": tracking.tracking_uri(ledger.home, conn), "runs": runs["n"] if runs else 0,
        "metrics_pending": pending["n"] if pending else 0, "traces_pending": unsent["n"] if unsent else 0,
        "last_sync": last, "syncer_running": running, "blocked": blocked,
        "background": tracking.background_enabled(), "log": str(ledger.home / tracking.LOG_FILE),
    }


def _status(ledger: Any, as_json: bool) -> int:
    info = status(ledger)
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


def _sync(ledger: Any, args: argparse.Namespace) -> int:
    from autoresearch.errors import SpecError, TrackingError
    from autoresearch.tracking._sync import Syncer, check_uri, fail_fast_http

    if args.uri is not None:
        try:
            check_uri(args.uri)
        except TrackingError as err:  # a bad --uri is a usage error (exit 2), not a failed sync
            raise SpecError(f"--uri: {err.message}",
                            hint="pass --uri http(s)://HOST:PORT or sqlite:///ABSOLUTE/PATH.db") from None

    with fail_fast_http():  # our back-off, not MLflow's ~2 min of retries per request
        return _sync_loop(Syncer(ledger, uri=args.uri), args)


def _sync_loop(syncer: Any, args: argparse.Namespace) -> int:
    syncer.check()
    started = time.monotonic()
    total: dict[str, int] = {"runs_created": 0, "metrics": 0, "decisions": 0, "traces": 0, "artifacts": 0,
                             "finished": 0}
    while True:
        report = syncer.run_once(max_batches=200)
        for key in total:
            total[key] += getattr(report, key)
        if not report.pending:
            break
    seconds = time.monotonic() - started
    if args.json:
        print(json.dumps({**total, "seconds": round(seconds, 3), "uri": syncer.uri}))
    else:
        print(f"synced to {syncer.uri} in {seconds:.1f}s: " + ", ".join(f"{v} {k.replace('_', ' ')}"
                                                                        for k, v in total.items()))
    blocked = status(syncer.ledger)["blocked"]
    for item in blocked:
        print(f"blocked: {item['entity']}: {item['error']}", file=sys.stderr)
    return 1 if blocked else 0


def _ui(ledger: Any, args: argparse.Namespace) -> int:
    from autoresearch.errors import TrackingError
    from autoresearch.tracking import tracking_uri

    uri = tracking_uri(ledger.home, ledger._connect())
    if uri.startswith(("http://", "https://")):
        print(f"the tracking store is an MLflow server; its UI is at {uri}")
        return 0
    from autoresearch.tracking._sync import Syncer

    syncer = Syncer(ledger)  # creates the database with our artifact root when it is new
    if not args.no_sync:
        try:
            syncer.run_once()
        except TrackingError as err:
            print(f"warning: {err.render()}", file=sys.stderr)
    argv = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", args.host,
            "--port", str(args.port)]
    root = syncer.artifact_root()
    if root:
        argv += ["--default-artifact-root", root]
    print(f"MLflow UI on http://{args.host}:{args.port} (store {uri}); Ctrl-C to stop", flush=True)
    os.environ.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")  # no background job-runner processes
    os.execv(sys.executable, argv)
    return 0  # pragma: no cover
