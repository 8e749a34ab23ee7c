"""The mirror seen from the command line: how far it is, a full sync now, the MLflow UI.

Behind the facade (:meth:`autoresearch.api.Api.mirror_status`, ``sync``, ``mlflow_ui``);
``mirror_status`` reads the ledger alone (no mlflow import).
"""

from __future__ import annotations

import fcntl
import os
import sys
import time
from pathlib import Path
from typing import Any

from autoresearch.errors import SpecError, TrackingError


def mirror_status(ledger: Any) -> dict[str, Any]:
    """How far the mirror is, from the ledger alone."""
    from autoresearch import tracking
    from autoresearch.tracking._store import MirrorStore

    conn = ledger.connection()
    state, pending, unsent, blocked, runs = MirrorStore(ledger).progress()
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
        "uri": tracking.tracking_uri(ledger.home, conn), "runs": runs,
        "metrics_pending": pending, "traces_pending": unsent,
        "last_sync": last, "syncer_running": running, "blocked": blocked,
        "background": tracking.background_enabled(), "log": str(ledger.home / tracking.LOG_FILE),
        "error": state.get("error"), "error_at": _float(state.get("error_at")),
        "retry_at": _float(state.get("retry_at")),
    }


def _float(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def mirror_lag(ledger: Any) -> str | None:
    """One line when the MLflow mirror is behind, saying why (None when it is not): the last
    failed sync and when it retries, or work waiting with no syncer to do it. Reads the
    ledger alone, for ``status`` and ``ui``."""
    from autoresearch import tracking
    from autoresearch.tracking._store import MirrorStore

    if not tracking.tracking_enabled():
        return None
    store = MirrorStore(ledger)
    error = store.state("error")
    left = store.unmirrored() if error is not None else {}
    if error is not None and left:
        what = ", ".join(f"{n} {k}" for k, n in left.items())
        retry = _float(store.state("retry_at"))
        when = f"; retrying in {max(0.0, retry - time.time()):.0f}s" if retry else ""
        return (f"MLflow mirror behind ({what} unmirrored): {error}{when}. "
                "`autoresearch sync` retries now; `autoresearch sync --status` shows more")
    return None


def sync_all(ledger: Any, uri: str | None = None) -> dict[str, Any]:
    """Mirror everything pending now (``uri``: bind the ledger to that store first); the totals,
    the seconds it took, the store and the entities blocked."""
    from autoresearch.tracking._sync import Syncer, check_uri, fail_fast_http

    if uri is not None:
        try:
            check_uri(uri)
        except TrackingError as err:  # a bad --uri is a usage error (exit 2), not a failed sync
            raise SpecError(f"--uri: {err.message}",
                            hint="pass --uri http(s)://HOST:PORT or sqlite:///ABSOLUTE/PATH.db") from None
    from autoresearch.util._private import private_umask

    # what MLflow writes meanwhile (artifacts, their folders) is private, as the background syncer's is
    with fail_fast_http(), private_umask():  # our back-off, not MLflow's ~2 min of retries per request
        syncer = Syncer(ledger, uri=uri)
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
    return {"totals": total, "seconds": seconds, "uri": syncer.uri, "blocked": mirror_status(syncer.ledger)["blocked"]}


def ui_page(ledger: Any) -> str:
    """The UI's path to open: the newest loop's experiment, its trials listed with their params,
    objective and provenance (the saved view), in the model-training view."""
    from autoresearch.tracking._entities import VIEW_KEY
    from autoresearch.tracking._store import MirrorStore

    exp = MirrorStore(ledger).latest_experiment()
    if exp is None:
        return "/#/experiments?workflowType=machine_learning"
    return f"/#/experiments/{exp}/runs?viewStateShareKey={VIEW_KEY}&workflowType=machine_learning"


def ui_argv(ledger: Any, host: str, port: int, sync: bool = True) -> tuple[str, list[str] | None, str]:
    """The store's URI, the argv of ``mlflow ui`` on it (None: the store is a server with its own UI)
    and the page to open. ``sync``: mirror pending ledger rows first (a failure is a warning on stderr)."""
    from autoresearch.tracking import tracking_uri

    uri = tracking_uri(ledger.home, ledger.connection())
    if uri.startswith(("http://", "https://")):
        return uri, None, ui_page(ledger)
    from autoresearch.tracking._sync import Syncer, fail_fast_http

    with fail_fast_http():
        try:
            syncer = Syncer(ledger)  # creates the database with our artifact root when it is new
            if sync:
                syncer.run_once()
        except TrackingError as err:  # the UI still shows what is mirrored; status says why it is behind
            print(f"warning: {err.render()}", file=sys.stderr)
    # One worker: one person's browser. mlflow's default is 4 uvicorn workers, each importing the whole
    # server (~5 s of CPU): on a 2-core machine the UI answered after ~25 s, with one after ~16.
    argv = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", host, "--port", str(port),
            "--workers", "1"]
    if uri.startswith("sqlite:///"):  # artifacts beside the database, as the mirror writes them
        root = (Path(uri[len("sqlite:///"):]).resolve().parent / "mlartifacts").as_uri()
        argv += ["--default-artifact-root", root]
    return uri, argv, ui_page(ledger)
