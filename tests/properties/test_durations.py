"""One duration grammar (autoresearch/util/units.py): the parser that the job spec's fast path, its
pydantic model and the plan all call, and the JSON Schema pattern of the plan, accept the very
same texts. (That the fast path agrees with the model is tests/properties/test_specs.py.)"""

from __future__ import annotations

import re

from hypothesis import example, given
from hypothesis import strategies as st

from autoresearch.engine import spec
from autoresearch.errors import SpecError
from autoresearch.loop import plan as plan_module
from autoresearch.util import units
from tests.properties.strategies import FAST, NASTY_TEXT, TEXT

DURATIONISH = st.text(alphabet="0123456789.hmsHMSdeE+-_ \t", max_size=12)


@FAST
@given(text=st.one_of(DURATIONISH, TEXT, NASTY_TEXT))
@example(text="+5").via("float() read it; the schema did not")
@example(text="1_000")
@example(text="inf")
@example(text="5mS")
@example(text="1H30M")
def test_the_schema_pattern_accepts_exactly_what_the_parser_reads(text: str) -> None:
    if text == "":
        return  # no limit: not a duration, and not refused
    try:
        units.parse_duration(text, "timeout")
        reads = True
    except SpecError as err:
        reads = "is not a duration" not in err.message  # 0s, 1e999: a duration, refused for its value
    assert (re.match(units.DURATION_PATTERN, text) is not None) == reads


def test_specs_and_plans_share_the_parser() -> None:
    assert spec.parse_duration is units.parse_duration is plan_module.parse_duration
    assert spec.parse_grace is units.parse_grace is plan_module.parse_grace
