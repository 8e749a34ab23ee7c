"""``autoresearch backends``: the backend profiles and kinds, their capabilities, and whether
each answers (like ``sky check``). Exit 0 even when some do not answer (the listing says so),
2 on a broken config.yaml.

Imported on every CLI call: argparse only at the top.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any


def add_parser(sub: Any) -> None:
    b = sub.add_parser("backends", help="list backend profiles (config.yaml) and kinds; check each answers")
    b.add_argument("--no-probe", action="store_true", help="list only; do not contact any engine")
    b.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for all probes (default 10)")
    b.add_argument("--json", action="store_true", help="print the profiles, capabilities and probe results as JSON")
    b.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from autoresearch.api import check_backends
    from autoresearch.errors import SpecError

    if not math.isfinite(args.timeout):
        raise SpecError(f"--timeout {args.timeout} is not a number of seconds", hint="e.g. --timeout 10")
    rows = check_backends(args.home, probe=not args.no_probe, timeout=args.timeout)
    if args.json:
        from autoresearch.views import to_dict

        print(json.dumps(to_dict(rows), indent=2, default=str))
        return 0
    _render(rows, probed=not args.no_probe)
    return 0


def _render(rows: list[Any], probed: bool) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table()
    for col in ("NAME", "KIND", "CAPABILITIES", "NODES", "GPUS", "STATUS"):
        table.add_column(col)
    for r in rows:
        name = escape(r.name) + (" (default)" if r.default else "") + ("" if r.profile else " [dim](kind)[/]")
        status = "-" if r.ok is None else "[green]ok[/]" if r.ok else "[red]no answer[/]"
        table.add_row(name, escape(r.kind), escape(", ".join(r.capabilities) or "-"),
                      "-" if r.nodes is None else str(r.nodes), "-" if r.gpus is None else str(r.gpus), status)
    console = Console()
    console.print(table)
    for r in rows:
        if r.ok is False:
            console.print(f"{r.name}: {r.error}", markup=False, highlight=False)
            if r.hint:
                console.print(f"  hint: {r.hint}", markup=False, highlight=False)
    if probed:
        bad = sum(1 for r in rows if r.ok is False)
        console.print(f"{len(rows) - bad} of {len(rows)} backends answer" +
                      (f"; {bad} do not (see above)" if bad else ""), highlight=False)
