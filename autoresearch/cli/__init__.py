"""The ``autoresearch`` command: the face for people at a terminal and for CI.

One module per group of commands, each with ``add_parser(sub)`` (argparse only: every
call imports them all) and ``run(args) -> int`` (which imports what it needs):
:mod:`.jobs` (submit, status, list, logs, metrics, cancel, nodes, cordon), :mod:`.loop`
(``autoresearch plan.yaml``, run, schema, report), :mod:`.serve` (the MCP server) and
:mod:`.tracking` (ui, sync), :mod:`.backends` (profiles and whether each answers). They reach the system only through
:class:`autoresearch.api.Api`; :mod:`._render` prints.

Reads print rich tables for people and JSON with ``--json``. Errors print message
and hint, exit 2 for usage/spec errors and 1 for runtime failures; tracebacks only
with ``--debug``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from autoresearch.cli import backends, jobs, loop, serve, tracking
from autoresearch.errors import AutoresearchError

COMMANDS = (jobs, backends, serve, tracking, loop)  # the order of `autoresearch --help`


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="autoresearch", description="Run ML research jobs and loops on GPUs.")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.add_argument("--home", help="state directory (default $AUTORESEARCH_HOME or ~/.autoresearch)")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")
    for module in COMMANDS:
        module.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    first = next((a for a in argv if not a.startswith("-")), "")
    if first.endswith((".yaml", ".yml")):
        argv = ["run", *argv]  # `autoresearch plan.yaml` runs the loop
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.cmd:
        parser.print_help()
        return 2
    try:
        return int(args.handler(args))
    except AutoresearchError as err:
        if args.debug:
            raise
        print(f"error: {err.message}", file=sys.stderr)
        if err.hint:
            print(f"hint: {err.hint}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        return 130


def open_api(args: argparse.Namespace) -> Any:
    """The facade for ``--home`` (imported here, not at the top: ``--help`` stays instant)."""
    from autoresearch.api import Api

    return Api(args.home, getattr(args, "backend", None))
