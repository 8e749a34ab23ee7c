"""The loop controller's helper process: creates trials' MLflow runs ahead of their launch.

``python -m autoresearch.loop._prepare_runs HOME`` reads one JSON list of trial ids per line
on stdin and answers, per line, one JSON object ``{trial_id: run_id}`` on stdout (``{}``
when tracking failed; the trials then run without ``MLFLOW_RUN_ID``). It exits when stdin
closes, so it never outlives its controller. A process of its own keeps mlflow out of the
controller: its ~3 s import and its threads, and the ``MLFLOW_HTTP_*`` settings the mirror
puts in ``os.environ``, which the trials the controller launches would otherwise inherit.
"""

from __future__ import annotations

import json
import os
import sys


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    home = args[0] if args else None
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
        answers.write(json.dumps({str(k): v for k, v in prepared.items()}) + "\n")
        answers.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
