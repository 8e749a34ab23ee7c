"""A loop's report written after the command has returned: a helper process of its own.

When the last trial ends, ``autoresearch plan.yaml`` prints its summary and returns; the
plots, ``summary.md`` and ``report.html`` (:func:`autoresearch.loop.report.write_report`) and
their upload to the loop's MLflow run take seconds (matplotlib's import and five figures; the
mirror's sync), so a detached helper does them:

    python -m autoresearch.loop.report_later HOME NAME

The helper holds ``loops/NAME/report.lock`` (flock) while it writes, and keeps its state in
``loops/NAME/report.state`` (one JSON object, replaced atomically): ``pending`` (asked for),
``writing`` (pid), ``done`` (the files, when) or ``failed`` (why). The upload goes through the
outbox (:func:`autoresearch.store.outbox.record_report`): the background syncer sends the files, so
the helper never imports mlflow. A helper that died (killed, the machine rebooted) leaves
``pending``/``writing`` with nobody holding the lock: :func:`state` reads it as
``interrupted``, and ``autoresearch report NAME`` writes the report again in the foreground.

Nothing here is on a fast path: :func:`start` costs one small file write and one fork/exec;
:func:`state` one file read and one non-blocking lock probe. Stdlib only at import.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

STATE_FILE = "report.state"
LOCK_FILE = "report.lock"
LOG_FILE = "report.log"
MAX_STATE_BYTES = 64 * 1024  # a state file is a few hundred bytes; anything larger is not ours


def _loop_dir(home: Path, name: str) -> Path:
    from autoresearch.loop.plan import NAME

    if not isinstance(name, str) or not NAME.match(name):  # a loop's name as plans allow it: never `..` or a path
        raise ValueError(f"not a loop name: {str(name)[:80]!r}")
    return Path(home) / "loops" / name


def _write_state(loop_dir: Path, **fields: Any) -> None:
    loop_dir.mkdir(parents=True, exist_ok=True)
    tmp = loop_dir / f".{STATE_FILE}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump({**fields, "at": time.time()}, out)
    os.replace(tmp, loop_dir / STATE_FILE)


def _locked_by_someone(loop_dir: Path) -> bool:
    """Whether a helper holds the report lock now (a non-blocking probe; never creates the file)."""
    from autoresearch.util.paths import lock_held

    return lock_held(loop_dir / LOCK_FILE)


def state(home: str | os.PathLike[str], name: str) -> dict[str, Any] | None:
    """The background report's state: {state, at, ...} (None: never asked for here). A helper
    that left ``pending``/``writing`` behind without holding the lock reads as ``interrupted``."""
    try:
        loop_dir = _loop_dir(Path(home), name)
    except ValueError:
        return None  # (a name no loop can have: nothing was ever asked for)
    try:
        with open(loop_dir / STATE_FILE, "rb") as f:
            raw = f.read(MAX_STATE_BYTES + 1)
        data = json.loads(raw) if len(raw) <= MAX_STATE_BYTES else None
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("state") not in ("pending", "writing", "done", "failed"):
        return None
    if data["state"] in ("pending", "writing") and not _locked_by_someone(loop_dir):
        # pending: the helper may not have taken the lock yet; give it a few seconds to do so
        if data["state"] == "writing" or time.time() - float(data.get("at") or 0) > 30:
            data = {**data, "state": "interrupted"}
    return data


def describe(home: str | os.PathLike[str], name: str) -> str | None:
    """One line on the background report for a person (None: never asked for)."""
    s = state(home, name)
    if s is None:
        return None
    where = _loop_dir(Path(home), name) / "report"
    if s["state"] == "done":
        return f"report: {where}/summary.md"
    if s["state"] == "failed":
        return f"report: failed ({str(s.get('error', ''))[:200]}); `autoresearch report {name}` tries again"
    if s["state"] == "interrupted":
        return f"report: interrupted before it was written; `autoresearch report {name}` writes it"
    return f"report: being written in the background to {where}/ (`autoresearch report {name}` waits for it)"


# The helper's niceness above the command's: its start (matplotlib's import, seconds of CPU) would
# otherwise share the machine's cores with the command's last work, the answer it prints.
HELPER_NICE = 5


def ask(home: str | os.PathLike[str], name: str) -> Path:
    """Record that loop ``name``'s report is wanted (``pending``); the directory it will be written
    to. :func:`launch` starts its helper: the command asks before it prints its answer and launches
    after, so the helper's start (seconds of CPU) never shares the cores with that answer. Asked for
    and never launched (the command killed in between), it reads as ``interrupted`` after 30 s and
    ``autoresearch report NAME`` writes it."""
    loop_dir = _loop_dir(Path(home), name)
    _write_state(loop_dir, state="pending")
    return loop_dir / "report"


def launch(home: str | os.PathLike[str], name: str) -> None:
    """Start the detached helper that writes the report :func:`ask` asked for. It outlives the
    command (its own session); its messages go to ``loops/NAME/report.log``."""
    from autoresearch.backends._supervisor import spawn_detached

    loop_dir = _loop_dir(Path(home), name)
    spawn_detached([sys.executable, "-m", "autoresearch.loop.report_later", str(Path(home).absolute()), name],
                   loop_dir / LOG_FILE, cwd=None, wait=False, nice=HELPER_NICE)  # (the command returns now)


def start(home: str | os.PathLike[str], name: str) -> Path:
    """Ask for loop ``name``'s report and start its helper at once (:func:`ask`, then :func:`launch`)."""
    where = ask(home, name)
    launch(home, name)
    return where


def wait(home: str | os.PathLike[str], name: str, timeout_s: float = 120.0) -> dict[str, Any] | None:
    """Wait for a background report in progress to end (the lock released); its final state."""
    if state(home, name) is None:
        return None
    loop_dir = _loop_dir(Path(home), name)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        s = state(home, name)
        if s is None or s["state"] not in ("pending", "writing"):
            return s
        time.sleep(0.1)
    return state(home, name) if _locked_by_someone(loop_dir) else None


def write(home: str | os.PathLike[str], name: str) -> dict[str, Any]:
    """The helper's work: the report files, then the upload asked of the mirror; its final state."""
    from autoresearch.loop.report import write_report
    from autoresearch.store import outbox
    from autoresearch.store.ledger import Ledger

    try:
        loop_dir = _loop_dir(Path(home), name)
    except ValueError as err:
        return {"state": "failed", "error": str(err)}
    if not (Path(home) / "ledger.db").is_file() or not loop_dir.is_dir():
        return {"state": "failed", "error": "the home or its loop is gone"}  # a removed home stays removed
    fd = os.open(loop_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # another helper writes it now: its result stands
            return {"state": "writing", "by": "another helper"}
        _write_state(loop_dir, state="writing", pid=os.getpid())
        try:
            ledger = Ledger(home)
            view = write_report(ledger, name)
            if outbox.tracking_enabled() and view.report_dir is not None:
                outbox.record_report(ledger, view.loop_id, view.report_dir)
                outbox.kick(ledger.home)
        except Exception as err:  # noqa: BLE001 - recorded for `report`/`loop_status`; the loop's result stands
            _write_state(loop_dir, state="failed", error=f"{type(err).__name__}: {str(err)[:500]}")
            raise
        done = {"state": "done", "dir": view.report_dir}
        _write_state(loop_dir, **done)
        return done
    finally:
        os.close(fd)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m autoresearch.loop.report_later HOME NAME", file=sys.stderr)
        return 2
    from autoresearch.util._private import UMASK

    os.umask(UMASK)  # the report's files are private like the rest of the home; this process runs no job
    with contextlib.suppress(Exception):
        os.nice(5)  # the user's next command comes first
    try:
        write(args[0], args[1])
    except Exception as err:  # noqa: BLE001 - said in the log and the state file
        print(f"autoresearch: the report of loop {args[1]!r} was not written ({type(err).__name__}: {err})",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
