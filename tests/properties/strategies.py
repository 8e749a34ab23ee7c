"""Hypothesis strategies shared by the property tests: hostile but JSON/YAML-shaped input."""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

# Modest for 2 shared cores; no deadline (subprocesses, SQLite). PROPERTY_EXAMPLES=2000 digs deeper.
FAST = settings(max_examples=int(os.environ.get("PROPERTY_EXAMPLES") or 60), deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# Text a user, an agent or a file can hold: NUL and control characters yes, lone surrogates
# no (they cannot be UTF-8 encoded, so no transport or file carries them).
TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=20)
NASTY_TEXT = st.sampled_from(["", " ", ".", "..", "../..", "/etc", "~", "a\0b", "=", "A=B", "{", "{}", "{x",
                              "'", '"', "\\", "(a+)+$", "[", "nan", "inf", "-5", "1e400", "lots", "16G", "5m",
                              "\x1b[31m", "[/bold]", "x" * 300, "é", "\u202e"])
NUMBERS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, 1, 2**31, 2**63, 10**15, 10**400, 1e308, -0.0, 1e-320]),
)
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, TEXT, NASTY_TEXT)


def values(max_leaves: int = 8) -> st.SearchStrategy[Any]:
    """Any YAML-ish value: scalars, lists and mappings of them, a little nested."""
    return st.recursive(SCALARS, lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.one_of(TEXT, NASTY_TEXT), inner, max_size=3)),
        max_leaves=max_leaves)


def json_values(max_leaves: int = 6) -> st.SearchStrategy[Any]:
    """What a JSON transport can carry (no NaN or infinity, integers of any size)."""
    scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                        st.floats(allow_nan=False, allow_infinity=False), TEXT, NASTY_TEXT)
    return st.recursive(scalars, lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.one_of(TEXT, NASTY_TEXT), inner, max_size=3)),
        max_leaves=max_leaves)


def mapping_over(keys: list[str], value: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Dicts over mostly known keys (so validation gets past the first key), now and then a stray one."""
    return st.dictionaries(st.one_of(st.sampled_from(keys), TEXT), value, max_size=len(keys) + 1)
