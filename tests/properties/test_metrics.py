"""Whatever a trial writes to its metrics file or its log, the parsers return points and
never raise (issue 14, item 1: one bad line stopped ingestion for every job)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from autoresearch.engine import metrics as M
from autoresearch.errors import AutoresearchError
from tests.properties.strategies import FAST, NASTY_TEXT, TEXT, values

LOG_LINE = st.one_of(
    TEXT, NASTY_TEXT,
    st.builds(lambda k, v: f"{k}: {v}", st.one_of(TEXT, st.sampled_from(["loss", "step", "epoch", "acc"])),
              st.one_of(st.sampled_from(["1e19", "1e400", "nan", "-inf", "0.5", "9" * 400]), TEXT)),
    st.builds(lambda a, b: f"step={a} loss={b}", st.sampled_from(["1e19", "1e400", "-1", "nan", "3"]),
              st.sampled_from(["0.5", "inf", "1e-400"])),
)


def report_line(record: Any) -> str:
    try:
        return json.dumps(record)
    except (ValueError, TypeError):
        return str(record)


REPORT_LINE = st.one_of(
    TEXT,
    st.builds(report_line, values()),
    st.builds(lambda m, s, ts: report_line({"metrics": m, "step": s, "ts": ts}),
              st.one_of(values(), st.dictionaries(TEXT, values(max_leaves=2), max_size=3)), values(max_leaves=1),
              values(max_leaves=1)),
)


def total(parse: Any, lines: list[str]) -> None:
    try:
        points = parse(lines, {}, 1.0)
    except AutoresearchError:
        return
    assert isinstance(points, (list, tuple))


@FAST
@given(lines=st.lists(REPORT_LINE, max_size=5))
@example(lines=['{"metrics": {"loss": "abc"}}']).via("issue 14")
@example(lines=['{"metrics": [1]}']).via("issue 14")
@example(lines=['{"metrics": {"loss": 1}, "step": "x"}']).via("issue 14")
@example(lines=['{"metrics": {"val_loss": 1}, "step": 10000000000000000000}']).via("issue 14")
def test_metrics_file_lines_never_raise(lines: list[str]) -> None:
    total(M.parse_report_lines, lines)


@FAST
@given(lines=st.lists(LOG_LINE, max_size=5))
@example(lines=["step=1e19 loss=0.5"]).via("issue 14")
def test_log_lines_never_raise(lines: list[str]) -> None:
    total(M.parse_log_lines, lines)


@FAST
@given(chunk=st.binary(max_size=200))
def test_any_bytes_split_into_lines(chunk: bytes) -> None:
    lines, used = M.complete_lines(chunk)
    assert isinstance(lines, list) and 0 <= used <= len(chunk)
