"""Why a queued job cannot start: every node that could hold it is cordoned or down.

A pure function of the nodes' rows (name, gpus, state, reason), so the loop's live output,
``loop_status`` (read from the ledger by any process) and a job's ``status`` say the same
words. Nothing here decides to wait or to give up: a cordoned node comes back (``autoresearch
uncordon NODE``, a passing health check), so a job that fits the fleet queues, and the user is
told why it does not start. Stdlib only (the fast reads import it).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

USABLE = ("healthy", "degraded")  # node states the scheduler places onto
SHOWN = 3  # nodes named with their reason; the rest are a count
REASON_CHARS = 80  # a node's reason is a health check's or a person's text: a line, not a page


def no_node_text(rows: Iterable[Any], gpus: int, nodes: int = 1) -> str:
    """'' when enough usable nodes fit a job of ``nodes`` node(s) with ``gpus`` GPUs each, or no
    node fits at all (a capacity error, refused at submit); otherwise one line saying which nodes
    are out and how to bring one back::

        no node can run this: 2 nodes cordoned (a: Xid 79; b: by hand); uncordon with `autoresearch uncordon a`

    A backend with a single node row is one host: a gang's members share it (``gpus * nodes``)."""
    rows = list(rows)
    if len(rows) == 1 and nodes > 1:
        gpus, nodes = gpus * nodes, 1
    fitting = [r for r in rows if _int(r["gpus"]) >= gpus]
    if not fitting or sum(1 for r in fitting if r["state"] in USABLE) >= nodes:
        return ""
    out = [r for r in fitting if r["state"] not in USABLE]
    by_state: dict[str, list[Any]] = {}
    for r in out:
        by_state.setdefault(str(r["state"]) if r["state"] in ("cordoned", "down") else "unavailable", []).append(r)
    parts: list[str] = []
    for state, group in sorted(by_state.items(), key=lambda kv: kv[0] != "cordoned"):
        named = "; ".join(f"{_clean(r['name'], 40)}: {_clean(_reason(r), REASON_CHARS) or state}"
                          for r in group[:SHOWN])
        more = f"; {len(group) - SHOWN} more" if len(group) > SHOWN else ""
        count = f"{len(group)} node{'s' if len(group) != 1 else ''} " if not parts else f"{len(group)} "
        parts.append(f"{count}{state} ({named}{more})")
    cordoned = by_state.get("cordoned")
    hint = (f"uncordon with `autoresearch uncordon {_clean(cordoned[0]['name'], 40)}`" if cordoned
            else "it starts once one is back")
    return f"no node can run this: {', '.join(parts)}; {hint}"


def _reason(row: Any) -> str:
    try:
        return str(row["reason"] or "")
    except (IndexError, KeyError):
        return ""


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _clean(text: Any, limit: int) -> str:
    """One printable line of at most ``limit`` characters (a reason may hold anything)."""
    line = " ".join("".join(c if c.isprintable() else " " for c in str(text)).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"
