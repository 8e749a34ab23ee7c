"""The loop controller's helper process: creates trials' MLflow runs ahead of their launch.

``python -m autoresearch.loop._prepare_runs HOME [PARENT_PID]`` reads one JSON list of trial
ids per line on stdin and answers, per line, one JSON object ``{trial_id: run_id}`` on stdout
(``{}`` when tracking failed; the trials then run without ``MLFLOW_RUN_ID``). It exits when
stdin closes, or as soon as its controller is gone (killed -9: nobody waits for the answer, so
it does not finish a multi-second mlflow import first), so it never outlives its controller. A process of its own keeps mlflow out of the
controller: its ~3 s import and its threads, and the ``MLFLOW_HTTP_*`` settings the mirror
puts in ``os.environ``, which the trials the controller launches would otherwise inherit.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time


def _leave_with(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.2)
    os._exit(0)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    home = args[0] if args else None
    if len(args) > 1:
        threading.Thread(target=_leave_with, args=(int(args[1]),), daemon=True).start()
    answers = os.fdopen(os.dup(1), "w")  # the protocol's channel; anything else printed goes to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    from autoresearch import tracking

    for line in sys.stdin:
        try:
            ids = [int(i) for i in json.loads(line)]
            prepared = tracking.prepare_runs(home, ids)
        except Exception as err:  # noqa: BLE001 - answer {} and stay up: the loop goes on without runs
            print(f"autoresearch: tracking: cannot create the trials' MLflow runs ({type(err).__name__}: {err})",
                  file=sys.stderr, flush=True)
            prepared = {}
        try:
            answers.write(json.dumps({str(k): v for k, v in prepared.items()}) + "\n")
            answers.flush()
        except BrokenPipeError:  # the controller is gone
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
