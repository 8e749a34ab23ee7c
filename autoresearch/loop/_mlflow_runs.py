"""Trials' MLflow runs, created ahead of their launch (tracking on), for the controller.

Each batch of new trials is a request in the outbox (:func:`autoresearch.store.outbox.request_runs`);
the mirror's run maker, a helper process (:mod:`autoresearch.tracking._prepare_runs`, started
here by name: the loop never imports the mirror), creates the runs (and the loop's parent
run) and writes them to the ledger, where a trial's attempt finds its ``MLFLOW_RUN_ID``. A
worker thread pokes the helper and reads the ledger, so the event loop never blocks on
mlflow.

MLflow never holds a launch (issue 16: the first trial runs at once, not after the mirror's
mlflow import): a trial launches when it has a slot, with ``MLFLOW_RUN_ID`` if its run is
made by then (runs are asked for as soon as trials are proposed) and without it otherwise;
the mirror then creates its run and attaches the trial's metrics to it afterwards. Trials
that call MLflow themselves and need the variable can wait for their run:
``AUTORESEARCH_RUN_WAIT_S`` (seconds, at most ``PREPARE_HOLD_S``; default 0). A tracking
failure or a slow store only means later trials launch without ``MLFLOW_RUN_ID`` (the
background syncer still mirrors them).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from autoresearch.store import outbox

PREPARE_HOLD_S = 30.0  # longest a trial may wait for its MLflow run before it launches without MLFLOW_RUN_ID
WAIT_ENV = "AUTORESEARCH_RUN_WAIT_S"


def run_wait_s() -> float:
    """How long a trial waits for its MLflow run (``AUTORESEARCH_RUN_WAIT_S``): 0 unless set;
    garbage, NaN or a negative value is 0, anything above ``PREPARE_HOLD_S`` is that."""
    try:
        value = float(os.environ.get(WAIT_ENV, "") or 0.0)
    except ValueError:
        return 0.0
    return min(value, PREPARE_HOLD_S) if value > 0 else 0.0  # NaN > 0 is False


class RunMaker:
    """The mirror's helper process that answers run requests (:data:`autoresearch.store.outbox.RUN_MAKER`),
    started on first use; one request at a time (from one :class:`Prepare` thread)."""

    def __init__(self, home: Any) -> None:
        self.home = home
        self.ledger: Any = None  # opened by the worker thread on its first request
        self.proc: subprocess.Popen[str] | None = None
        self.closed = False
        self._asking = False  # an answer is awaited: its stdout is then the worker's to close
        self._lock = threading.Lock()  # close() (the event loop) vs ask() (the worker): one owner of proc

    def ask(self, ids: list[int]) -> dict[int, str]:
        """Trial id -> run id; {} once :meth:`close` has begun (the loop is ending: no message).
        ``ids`` empty: only warm the helper up."""
        with self._lock:
            if self.closed:
                return {}
        if self.ledger is None:
            from autoresearch.store.ledger import Ledger

            self.ledger = Ledger(self.home)
        entry = outbox.request_runs(self.ledger, ids) if ids else 0
        with self._lock:
            if self.closed:
                return {}
            if self.proc is None:  # its messages (mlflow's too) go where the syncer's go, not over the live table
                with open(Path(self.home) / "tracking.log", "ab") as log:
                    self.proc = subprocess.Popen(
                        [sys.executable, "-m", outbox.RUN_MAKER, str(self.home), str(os.getpid())],
                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True)
            proc = self.proc
            self._asking = True
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(f"{entry}\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
        except (OSError, ValueError):  # ValueError: close() closed stdin under us
            line = ""
            if not self.closed:
                raise
        finally:
            with self._lock:
                self._asking = False
        if not line:
            if self.closed:  # the helper was closed (ended) while we waited for its answer
                proc.stdout.close()
                return {}
            raise OSError(f"the helper exited with code {proc.wait()}")
        return outbox.trial_runs(self.ledger, ids)

    def close(self) -> None:
        """End the helper without waiting for it: its stdin closes, so it answers the request in
        hand (if any) and exits; a thread reaps it. The loop's command returns meanwhile (a
        creation in progress is never cut: the helper leaves only between creations, or holding
        the creation lock once its controller is gone); what it did not answer, the next sync
        pass creates."""
        with self._lock:
            self.closed = True
            proc, self.proc = self.proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError):
            assert proc.stdin is not None
            proc.stdin.close()  # it exits at the end of its input
        threading.Thread(target=proc.wait, daemon=True, name="autoresearch-reap-run-maker").start()


class Prepare(threading.Thread):
    """One batch of trials' MLflow runs, asked of the helper off the event loop.
    An empty batch only warms the helper up: the mlflow import, the store, the binding."""

    def __init__(self, maker: RunMaker, ids: list[int]) -> None:
        super().__init__(daemon=True, name="autoresearch-prepare-runs")
        self.maker, self.ids = maker, ids
        self.failed = False

    def run(self) -> None:
        prepared: dict[int, str] = {}
        try:
            prepared = self.maker.ask(self.ids)
        except Exception as err:  # noqa: BLE001 - tracking never stops the loop
            print(f"autoresearch: tracking: cannot create the trials' MLflow runs ({type(err).__name__}: {err}); "
                  "trials run without MLFLOW_RUN_ID, the background sync mirrors them later", file=sys.stderr)
            self.failed = True
        self.failed = self.failed or len(prepared) < len(self.ids)


class RunPreparer:
    """One worker at a time, batches queued; ``held``: trial id -> monotonic deadline, the
    trials waiting for their MLflow run (they keep their slot meanwhile)."""

    def __init__(self, ledger: Any) -> None:
        self.ledger = ledger
        self.enabled = False  # tracking on (set when the loop opens; off for good after a failure)
        self.worker: Prepare | None = None
        self.maker: RunMaker | None = None
        self.queue: list[int] = []
        self.held: dict[int, float] = {}
        self.hold_s = run_wait_s()  # 0: launches never wait for MLflow

    def prepare(self, ids: list[int], warm: bool = False) -> None:
        """Have the MLflow runs of new trials created (one worker thread, batches queued); with
        ``AUTORESEARCH_RUN_WAIT_S`` set, hold their launch until then, at most that long. ``warm``: start the worker
        even with no trial, to pay the mlflow import and open the store early."""
        if not self.enabled or not (ids or warm):
            return
        if ids and self.hold_s > 0:
            self.held.update(dict.fromkeys(ids, time.monotonic() + self.hold_s))
        self.queue.extend(ids)
        self.pump(start=warm)

    def pump(self, start: bool = False) -> None:
        """Collect a finished worker, start the next batch, release trials held too long."""
        if self.worker is not None and not self.worker.is_alive():
            done, self.worker = self.worker, None
            for trial_id in done.ids:
                self.held.pop(trial_id, None)
            if done.failed:  # the store is unusable: stop trying in this run; the syncer catches up later
                self.enabled = False
                self.queue.clear()
                self.held.clear()
        if self.worker is None and self.enabled and (self.queue or start):
            ids, self.queue = self.queue, []
            if self.maker is None:
                self.maker = RunMaker(self.ledger.home)
            self.worker = Prepare(self.maker, ids)
            self.worker.start()
        if self.held:
            now = time.monotonic()
            late = [t for t, deadline in self.held.items() if deadline <= now]
            for trial_id in late:
                del self.held[trial_id]
            if late:  # a slow store: these launch without MLFLOW_RUN_ID, and no later trial waits
                self.hold_s = 0.0

    def close(self) -> None:
        if self.enabled and self.queue:  # asked for, not yet sent: the next sync pass makes them
            with contextlib.suppress(Exception):
                outbox.request_runs(self.ledger, self.queue)
            self.queue = []
        if self.maker is not None:  # never waited for: the loop's answer does not wait on MLflow
            self.maker.close()
