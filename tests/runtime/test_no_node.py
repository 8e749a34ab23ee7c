"""Why a queued job does not start (autoresearch/engine/blocked.py): every node that fits it is
cordoned or down, each with its reason, and the command that brings one back."""

from __future__ import annotations

from typing import Any

from autoresearch.engine.blocked import no_node_text


def node(name: str, state: str = "healthy", gpus: int = 8, reason: str = "") -> dict[str, Any]:
    return {"name": name, "gpus": gpus, "state": state, "reason": reason}


def test_a_fleet_all_cordoned_names_each_node_its_reason_and_the_uncordon() -> None:
    text = no_node_text([node("a", "cordoned", reason="Xid 79"), node("b", "cordoned", reason="by hand")], 1)
    assert text == ("no node can run this: 2 nodes cordoned (a: Xid 79; b: by hand); "
                    "uncordon with `autoresearch uncordon a`")


def test_a_usable_node_that_fits_or_none_that_fits_at_all_blocks_nothing() -> None:
    assert no_node_text([node("a", "cordoned"), node("b", "degraded")], 1) == ""  # degraded still runs jobs
    assert no_node_text([node("a", "cordoned", gpus=2)], 4) == ""  # too big for any node: refused at submit
    assert no_node_text([], 1) == ""
    # the only node that fits is cordoned; the healthy one is too small
    assert "1 node cordoned (big: ECC)" in no_node_text([node("small", gpus=1), node("big", "cordoned", reason="ECC")], 4)


def test_down_nodes_are_counted_apart_and_a_gang_needs_enough_usable_nodes() -> None:
    text = no_node_text([node("a", "cordoned", reason="Xid 48"), node("b", "down"), node("c")], 8, nodes=2)
    assert text == ("no node can run this: 1 node cordoned (a: Xid 48), 1 down (b: down); "
                    "uncordon with `autoresearch uncordon a`")
    assert no_node_text([node("b", "down", reason="not responding")], 1) == (
        "no node can run this: 1 node down (b: not responding); it starts once one is back")
    # one host: a gang's members share it
    assert no_node_text([node("vm", gpus=4)], 2, nodes=2) == ""
    assert "vm: x" in no_node_text([node("vm", "cordoned", gpus=4, reason="x")], 2, nodes=2)


def test_reasons_are_one_short_printable_line_and_a_big_fleet_is_a_count() -> None:
    rows = [node(f"n{i}", "cordoned", reason="[red]Xid[/red]\n\x1b[2J" + "z" * 1_000_000) for i in range(500)]
    text = no_node_text(rows, 1)
    assert "\n" not in text and "\x1b" not in text and len(text) < 600
    assert text.startswith("no node can run this: 500 nodes cordoned (n0: [red]Xid[/red] ")
    assert "; 497 more)" in text
    assert no_node_text([{"name": "a", "gpus": "NaN", "state": "cordoned", "reason": None}], 0) == (
        "no node can run this: 1 node cordoned (a: cordoned); uncordon with `autoresearch uncordon a`")
