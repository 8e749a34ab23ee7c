"""The run maker: the mirror's helper process that creates trials' MLflow runs ahead of launch.

The loop controller records a request in the outbox (:func:`autoresearch.store.outbox.request_runs`,
``kind='trial_run'``), starts ``python -m autoresearch.tracking._prepare_runs HOME [PARENT_PID]``
on first use and pokes it with the entry's id, one per line on stdin (``0``: only warm up). For each, the run maker
creates the runs (:func:`autoresearch.tracking.prepare_runs`), which writes them to the
ledger's ``tracking_runs`` (where :func:`autoresearch.store.outbox.attempt_env` finds a trial's
``MLFLOW_RUN_ID``), marks the entry sent and answers one line on stdout; the controller then
reads the run ids from the ledger (:func:`autoresearch.store.outbox.trial_runs`). A tracking
failure is recorded in the entry (``error: ...``); the trials then run without ``MLFLOW_RUN_ID``.
An entry nobody answered (its controller was killed) is taken by the next sync pass
(:func:`autoresearch.tracking._entities.sync_run_requests`).

It exits when stdin closes, or as soon as its controller is gone (killed -9: nobody waits
for the answer, so it does not finish a multi-second mlflow import first), so it never
outlives its controller. A process of its own keeps mlflow out of the controller: its ~3 s
import and its threads, and the ``MLFLOW_HTTP_*`` settings the mirror puts in
``os.environ``, which the trials the controller launches would otherwise inherit.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from typing import Any

from autoresearch.store import outbox
from autoresearch.tracking._common import requested_trials


def _leave_with(parent: int, home: str | None) -> None:
    """Exit as soon as the controller is gone, but not in the middle of a creation (the database,
    a run: a half-made database fails every client that opens it): the creation lock first."""
    while os.getppid() == parent:
        time.sleep(0.2)
    if home is not None:
        with contextlib.suppress(OSError), outbox.creation_lock(home):
            os._exit(0)
    os._exit(0)


def answer(ledger: Any, entry_id: int) -> None:
    """Create the runs an outbox entry asks for and mark it sent (the run ids, or ``error: ...``)."""
    from autoresearch import tracking

    row = outbox.entry(ledger, entry_id)
    if row is None or row["done_at"] is not None:
        return  # a sync pass answered it meanwhile: the runs are in the ledger
    try:
        prepared = tracking.prepare_runs(ledger, requested_trials(row))
        ref = json.dumps({str(k): v for k, v in prepared.items()})
    except Exception as err:  # noqa: BLE001 - record it and stay up: the loop goes on without runs
        print(f"autoresearch: tracking: cannot create the trials' MLflow runs ({type(err).__name__}: {err})",
              file=sys.stderr, flush=True)
        ref = f"error: {type(err).__name__}: {err}"
    outbox.mark_sent(ledger, entry_id, ref)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    home = args[0] if args else None
    from autoresearch.util._private import UMASK

    os.umask(UMASK)  # the runs' artifact folders MLflow makes are private; this process runs no job
    if len(args) > 1:
        threading.Thread(target=_leave_with, args=(int(args[1]), home), daemon=True).start()
    answers = os.fdopen(os.dup(1), "w")  # the protocol's channel; anything else printed goes to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    from autoresearch import tracking
    from autoresearch.store.ledger import Ledger

    ledger = Ledger(home)
    for line in sys.stdin:
        try:
            entry_id = int(line)
            if entry_id:
                answer(ledger, entry_id)
            else:  # 0: warm up (the mlflow import, the store, the binding) while the loop proposes
                tracking.prepare_runs(ledger, [])
        except Exception as err:  # noqa: BLE001 - a ledger hiccup: the loop reads what is there and goes on
            print(f"autoresearch: tracking: cannot create the trials' MLflow runs ({type(err).__name__}: {err})",
                  file=sys.stderr, flush=True)
        try:
            answers.write("done\n")
            answers.flush()
        except BrokenPipeError:  # the controller is gone
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
