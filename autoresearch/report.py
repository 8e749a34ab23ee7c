"""Trial side: ``from autoresearch import report; report(step=3, loss=0.41)``.

Stdlib only and cheap to import (it is loaded inside every trial). Each call
appends one JSON line to ``$AUTORESEARCH_METRICS_FILE``, which the runtime reads
incrementally. On an engine whose files the runtime cannot read (Ray, Kubernetes: the
runtime sets ``AUTORESEARCH_METRICS_STDOUT=1``) the same line goes to stdout behind
:data:`MARK`, and the runtime reads it from the log it fetches through the engine's API.
Outside autoresearch (no such variable) it prints ``name: value`` lines instead, which
the runtime also understands, so a script runs either way.

A bad argument never crashes the trial: a value that is not a number, or a step
that is not a whole number in ``0..MAX_STEP``, is left out with a warning on
stderr (the first few only); NaN and infinities are recorded as gaps.

Inside a loop whose stopper decides at fixed steps (ASHA rungs), a report at such a step
also pokes the loop (``AUTORESEARCH_STOP_FIFO``) and waits, at most
``AUTORESEARCH_STOP_WAIT_S``, for its verdict (``AUTORESEARCH_STOP_FILE``), so a trial that
is stopped there trains no further: told to stop, it waits there for its SIGTERM, within
the same bound (see autoresearch/loop/rungsync.py).
"""

from __future__ import annotations

import json
import math
import os
import stat
import sys
import time

__all__ = ["report"]

MAX_STEP = 2**53  # steps are exact in a float64 and fit SQLite's and MLflow's int64
MARK = "@autoresearch.report "  # a log line that starts so is a report() record (autoresearch/engine/ingest.py)
_MAX_WARNINGS = 5

_file = None
_path = None
_warned = 0
_sync: tuple[frozenset[int], str, str, float, str] | None = None
_sync_read = False


def _warn(message: str) -> None:
    global _warned
    _warned += 1
    if _warned <= _MAX_WARNINGS:
        more = "" if _warned < _MAX_WARNINGS else " (further warnings are not shown)"
        print(f"autoresearch.report: {message}{more}", file=sys.stderr, flush=True)


def _step(step: object) -> int | None:
    if isinstance(step, bool):
        return None
    try:
        number = step if isinstance(step, int) else float(step)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    if isinstance(number, float) and not math.isfinite(number):
        return None
    return int(number) if 0 <= number <= MAX_STEP else None


def _private(path: str, flags: int) -> int:
    return os.open(path, flags, 0o600)


def report(step: int | None = None, **metrics: float) -> None:
    """Record metrics for ``step`` (a counter per metric name when omitted)."""
    global _file, _path
    record_step = None
    if step is not None:
        record_step = _step(step)
        if record_step is None:
            _warn(f"step={step!r} is not a whole number in 0..{MAX_STEP}; these metrics were not recorded")
            return
    clean: dict[str, float | None] = {}
    for name, raw in metrics.items():
        try:
            value = float(raw)
        except OverflowError:  # an int past 1e308: as good as infinite
            value = math.inf
        except (TypeError, ValueError):
            _warn(f"metric {name!r} must be a number, got {raw!r}; not recorded")
            continue
        clean[name] = value if math.isfinite(value) else None
    if not clean:
        return
    record: dict[str, object] = {"ts": time.time(), "metrics": clean}
    if record_step is not None:
        record["step"] = record_step
    if os.environ.get("AUTORESEARCH_METRICS_STDOUT") == "1":
        print(MARK + json.dumps(record), flush=True)
        return
    path = os.environ.get("AUTORESEARCH_METRICS_FILE")
    if path and (_file is None or _path != path):
        try:
            # line-buffered: every report is visible at once; private (0600) like every file of the home
            _file = open(path, "a", buffering=1, opener=_private)
            _path = path
        except OSError as err:
            _warn(f"cannot open {path} ({err.strerror}); printing metrics instead")
            path = None
    if not path:
        for name, shown in clean.items():
            print(f"{name}: {shown}", flush=True)
        return
    try:
        _file.write(json.dumps(record) + "\n")  # type: ignore[union-attr]
    except (OSError, ValueError) as err:  # a full disk, or a closed file, must not end the run
        _warn(f"cannot write to {path} ({err}); these metrics were not recorded")
        return
    if record_step is not None:
        _rung_wait(record_step, clean)


def _read_sync() -> tuple[frozenset[int], str, str, float, str] | None:
    env = os.environ
    steps, file, fifo = env.get("AUTORESEARCH_STOP_STEPS"), env.get("AUTORESEARCH_STOP_FILE"), env.get("AUTORESEARCH_STOP_FIFO")
    if not (steps and file and fifo):
        return None
    try:
        wait_s = min(max(float(env.get("AUTORESEARCH_STOP_WAIT_S", "5")), 0.0), 60.0)
        parsed = frozenset(int(s) for s in steps.split(",")[:64])
    except ValueError:
        return None
    metric = env.get("AUTORESEARCH_STOP_METRIC", "")
    return (parsed, file, fifo, wait_s, metric) if wait_s == wait_s else None  # NaN: no wait


def _rung_wait(step: int, metrics: dict[str, float | None]) -> None:
    """At a step where the loop decides, with its objective: poke it, then wait (bounded) for its verdict."""
    global _sync, _sync_read
    if not _sync_read:
        _sync, _sync_read = _read_sync(), True
    if _sync is None or step not in _sync[0] or _sync[4] not in metrics:
        return
    _, file, fifo, wait_s, _ = _sync
    if not _poke(fifo):
        return  # no controller to wait for
    deadline, delay = time.monotonic() + wait_s, 0.002
    while True:
        answer = _answer(file, step)
        if answer is None:  # not visible here (another machine, a sandbox): no wait
            return
        if answer:
            if answer == "stop":
                _await_the_stop(deadline)
            return  # go on
        if time.monotonic() >= deadline:
            return
        time.sleep(delay)
        delay = min(delay * 2, 0.02)


# The rung protocol's two halves, shared with the supervisor that holds a job whose *printed* lines
# reach a rung (backends/_supervisor.py: _Rungs): one copy, stdlib only.

def _poke(fifo: str) -> bool:
    """Ask the loop to judge now: one byte into its FIFO, never blocking. False when there is no
    FIFO there or nobody reads it (ENXIO): no controller to wait for."""
    try:
        if not stat.S_ISFIFO(os.stat(fifo).st_mode):
            return False
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        os.write(fd, b"r")
    except OSError:
        pass
    finally:
        os.close(fd)
    return True


def _answer(file: str, step: int) -> str | None:
    """The loop's verdict on ``step`` in its answer file (``<step>`` or ``<step> stop``, for the
    latest step judged): "go", "stop", "" while it has not answered, None when the file cannot be
    read here (another machine, a sandbox: nobody to wait for)."""
    try:
        with open(file, "rb") as f:
            words = f.read(64).split()
    except OSError:
        return None
    if words and words[0].isdigit() and int(words[0]) >= step:
        return "stop" if words[1:2] == [b"stop"] else "go"
    return ""


def _await_the_stop(deadline: float) -> None:
    """Stopped at this rung: its SIGTERM is on its way (the loop cancelled the trial before it
    answered). Wait for it here, at most until ``deadline``, rather than train another step
    before it lands: by default SIGTERM ends the process in this sleep; a handler of the trial's
    own runs in it (to save a checkpoint, say), and if that handler returns, so do we, at the deadline."""
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 0.1))
