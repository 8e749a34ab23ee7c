"""A table's cell folded to its column (autoresearch/cli/_table.py): a cell that fits skips
textwrap (~2 ms to import at a command's start), and must come out exactly as textwrap.wrap
would have made it."""

from __future__ import annotations

import textwrap

from hypothesis import example, given
from hypothesis import strategies as st

from autoresearch.cli._table import _fold
from tests.properties.strategies import FAST

CELLS = st.text(alphabet="ab -\n\t\r\x0b\x0cxyz", max_size=30)


@FAST
@given(text=CELLS, width=st.integers(min_value=1, max_value=40))
@example(text="", width=5)
@example(text=" lead", width=10)
@example(text="trail ", width=10)
@example(text="a\rb", width=10)
@example(text="two  spaces", width=20)
@example(text="a\n\nb", width=3)
def test_a_cell_is_folded_as_textwrap_folds_it(text: str, width: int) -> None:
    want = [line for part in text.split("\n") for line in (textwrap.wrap(part, width) or [""])]
    assert _fold(text, width) == want
