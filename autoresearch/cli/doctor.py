"""``autoresearch doctor``: whether the home's ledger opens and whose run folders the home holds;
``--move-aside`` keeps an unusable (or unwanted) ledger and its run folders in ``aside-<UTC time>/``
and starts a fresh ledger, saying what it kept. Exit 0 when the ledger opens, 1 when not.

Imported on every CLI call: argparse only at the top.
"""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: Any) -> None:
    d = sub.add_parser("doctor", help="check the home's ledger; --move-aside keeps a broken one and its run "
                                      "folders aside and starts afresh",
                       description="Check that the home's ledger opens and that its run folders are its own. "
                                   "With --move-aside, move the ledger (with its -wal and -shm) and every run "
                                   "folder (jobs/) into aside-<UTC time>/ of the home, so the next command "
                                   "starts a fresh ledger; nothing is deleted.")
    d.add_argument("--move-aside", action="store_true",
                   help="keep the ledger and jobs/ in aside-<UTC time>/ and start a fresh ledger")
    d.add_argument("--json", action="store_true", help="print the result as JSON")
    d.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from autoresearch.api import doctor

    view = doctor(args.home, move_aside=args.move_aside)
    if args.json:
        from autoresearch.cli._render import print_json

        print_json(view)
    else:
        from autoresearch.cli._render import clean

        if view.aside:
            print(clean(f"kept {', '.join(view.moved) or 'nothing'} ({view.aside_run_folders} run folder(s)) "
                        f"in {view.aside}"))
        if view.ledger_ok:
            print(clean(f"ledger ok: {view.home}/ledger.db (id {view.ledger_id}), {view.run_folders} run folder(s)"))
        else:
            print(clean(f"ledger unusable: {view.problem}"))
            if view.hint:
                print(clean(f"hint: {view.hint}"))
    return 0 if view.ledger_ok else 1
