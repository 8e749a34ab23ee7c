"""The metric parsers on their own: what a trial writes becomes points or counted drops, never an exception."""

from __future__ import annotations

import json
import math

import pytest

from autoresearch.engine import metrics as M
from autoresearch.report import MAX_STEP

NOW = 1_700_000_000.0


def report_lines(*records: object) -> tuple[list[M.Point], M.Drops, dict[str, int]]:
    counters: dict[str, int] = {}
    drops = M.Drops()
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    return M.parse_report_lines(lines, counters, NOW, drops), drops, counters


def log_lines(*lines: str) -> tuple[list[M.Point], M.Drops]:
    drops = M.Drops()
    return M.parse_log_lines(list(lines), {}, NOW, drops), drops


def test_report_lines_keep_steps_values_and_times() -> None:
    points, drops, counters = report_lines({"ts": 5.0, "step": 3, "metrics": {"loss": 0.5, "acc": 1}},
                                           {"metrics": {"loss": 0.25}})
    assert points == [M.Point("loss", 3, 0.5, 5.0), M.Point("acc", 3, 1.0, 5.0), M.Point("loss", 4, 0.25, NOW)]
    assert drops.count == 0 and counters["r:loss"] == 5


@pytest.mark.parametrize(("record", "reason"), [
    ({"step": 10**19, "metrics": {"loss": 1}}, "outside 0..9007199254740992"),
    ({"step": -1, "metrics": {"loss": 1}}, "outside"),
    ({"step": "x", "metrics": {"loss": 1}}, "step 'x' is not a number"),
    ({"step": float("nan"), "metrics": {"loss": 1}}, "not a finite number"),
    ({"step": True, "metrics": {"loss": 1}}, "not a number"),
    ({"step": [1], "metrics": {"loss": 1}}, "not a number"),
    ({"metrics": {"loss": "abc"}}, "value 'abc' is not a number"),
    ({"metrics": {"loss": {"nested": 1}}}, "is not a number"),
    ({"metrics": [1]}, "not a {\"metrics\""),
    ({"step": 1}, "not a {\"metrics\""),
    ([1], "not a {\"metrics\""),
    ("not json at all", "not a JSON line"),
    ("[" * 100_000, "not a JSON line"),  # nesting deep enough to blow the recursion limit
    ({"metrics": {"": 1}}, "empty or longer than 250"),
    ({"metrics": {"x" * 300: 1}}, "empty or longer than 250"),
    ('{"metrics": {"\\ud800": 1}}', "not valid text"),  # a lone surrogate SQLite cannot store
])
def test_bad_report_records_are_dropped_with_a_reason(record: object, reason: str) -> None:
    points, drops, _ = report_lines(record, {"step": 7, "metrics": {"good": 2}})
    assert points == [M.Point("good", 7, 2.0, NOW)]  # the valid line after the bad one is kept
    assert drops.count == 1 and reason in drops.reason


def test_non_finite_and_huge_values_are_gaps_not_drops() -> None:
    points, drops, _ = report_lines('{"metrics": {"a": NaN, "b": Infinity, "c": 1e400, "d": null}}',
                                    {"metrics": {"e": 10**400}})
    assert [(p.name, p.value) for p in points] == [("a", None), ("b", None), ("c", None), ("d", None), ("e", None)]
    assert drops.count == 0


def test_a_bad_point_drops_only_itself_and_counts_each() -> None:
    points, drops, _ = report_lines({"step": 1, "metrics": {"loss": 0.1, "bad": "x", "worse": [1]}})
    assert [p.name for p in points] == ["loss"]
    assert drops.count == 2 and "'bad'" in drops.reason  # the first reason is the sample


def test_bad_timestamps_fall_back_to_now() -> None:
    points, drops, _ = report_lines({"ts": "abc", "metrics": {"a": 1}}, {"ts": 1e300, "metrics": {"a": 1}},
                                    {"ts": float("inf"), "metrics": {"a": 1}}, '{"ts": 1e999, "metrics": {"a": 1}}')
    assert [p.ts for p in points] == [NOW] * 4 and drops.count == 0


def test_steps_are_bounded_ints() -> None:
    assert M.as_step(3) == 3 and M.as_step(2.9) == 2 and M.as_step("4") == 4 and M.as_step(MAX_STEP) == MAX_STEP
    for bad in (MAX_STEP + 1, 10**19, -1, "1e400", math.inf, None, False, "x"):
        with pytest.raises(ValueError):
            M.as_step(bad)


def test_log_lines_with_an_out_of_range_step_are_dropped() -> None:
    points, drops = log_lines("step=1e19 loss=0.5", "epoch=-3 acc=0.1", "step=2 loss=0.25", "plain output 12")
    assert points == [M.Point("loss", 2, 0.25, NOW)]
    assert drops.count == 2 and "step 1e+19 is outside" in drops.reason


def test_log_lines_parse_as_before() -> None:
    points, drops = log_lines("val_bpb:          0.997900", "epoch=3 val_loss=0.41", "loss=1e400", "loss: 2")
    assert points == [M.Point("val_bpb", 0, 0.9979, NOW), M.Point("val_loss", 3, 0.41, NOW),
                      M.Point("loss", 0, None, NOW), M.Point("loss", 1, 2.0, NOW)]
    assert drops.count == 0


def test_too_many_metric_names_are_dropped() -> None:
    points, drops, _ = report_lines({"metrics": {f"m{i}": i for i in range(M.MAX_NAMES + 5)}})
    assert len(points) == M.MAX_NAMES and drops.count == 5 and "more than" in drops.reason


def test_invalid_utf8_becomes_text() -> None:
    lines, used = M.complete_lines(b'{"metrics": {"a\xff": 1}}\nloss=\xfe1\npartial')
    assert used == len(b'{"metrics": {"a\xff": 1}}\nloss=\xfe1\n') and len(lines) == 2
    points, drops, _ = report_lines(lines[0])
    assert [p.name for p in points] == ["a\ufffd"] and drops.count == 0


def test_a_giant_line_is_consumed_and_dropped_whole() -> None:
    counters: dict[str, int] = {}
    drops = M.Drops()
    # A full read with no newline: one over-long line; it is consumed, not re-read forever ...
    lines, used = M.complete_lines(b"x" * 100, counters, "r", drops, full=True)
    assert (lines, used, drops.count) == ([], 100, 1)
    # ... and so is its rest in the next read, up to its newline; later lines parse again.
    lines, used = M.complete_lines(b'yyy{"metrics": {"a": 1}}\n{"metrics": {"b": 2}}\n', counters, "r", drops)
    assert lines == ['{"metrics": {"b": 2}}'] and used == 47 and drops.count == 1
    # Without a full read, a partial last line waits for more bytes.
    assert M.complete_lines(b'{"metr', counters, "r", drops) == ([], 0)


hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies
_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
                     max_leaves=12)


def _storable(points: list[M.Point]) -> None:
    """What the parsers return always fits the ledger's metrics table (no OverflowError, no encoding error)."""
    import sqlite3

    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE metrics (name TEXT NOT NULL, step INTEGER NOT NULL, value REAL, ts REAL NOT NULL)")
    db.executemany("INSERT INTO metrics VALUES (?,?,?,?)", [(p.name, p.step, p.value, p.ts) for p in points])
    for p in points:
        assert 0 <= p.step <= MAX_STEP and math.isfinite(p.ts)
        assert p.value is None or math.isfinite(p.value)


@hypothesis.given(st.binary(max_size=2000), st.booleans())
@hypothesis.settings(max_examples=300, deadline=None)
def test_any_bytes_parse_without_raising(chunk: bytes, full: bool) -> None:
    counters: dict[str, int] = {}
    drops = M.Drops()
    lines, used = M.complete_lines(chunk, counters, "r", drops, full=full)
    assert 0 <= used <= len(chunk)
    _storable(M.parse_report_lines(lines, counters, NOW, drops) + M.parse_log_lines(lines, counters, NOW, drops))


@hypothesis.given(_json, _json, _json)
@hypothesis.settings(max_examples=300, deadline=None)
def test_any_json_record_parses_without_raising(metrics: object, step: object, ts: object) -> None:
    for record in ({"metrics": metrics, "step": step, "ts": ts}, {"metrics": metrics}, metrics):
        drops = M.Drops()
        points = M.parse_report_lines([json.dumps(record)], {}, NOW, drops)
        _storable(points)
        if isinstance(metrics, dict) and metrics and record is not metrics:
            assert len(points) + drops.count == len(metrics)  # each metric is stored or counted as dropped
        elif not isinstance(record, dict) or not isinstance(record.get("metrics"), dict):
            assert (points, drops.count) == ([], 1)  # a line that is not a report record is one drop


@hypothesis.given(st.text(alphabet="stepoclsr_=: .-+eE0123456789naif\t", max_size=80))
@hypothesis.settings(max_examples=300, deadline=None)
def test_any_log_line_parses_without_raising(line: str) -> None:
    _storable(M.parse_log_lines([line], {}, NOW, M.Drops()))


def test_common_metric_line_shapes_are_heard() -> None:
    points, drops = log_lines("epoch 3 val_acc: 0.95", "val_acc=0.96 step=4", "Epoch 5/10 - val_acc: 0.97, loss: 0.1",
                              '{"step": 6, "val_acc": 0.98, "msg": "eval done", "ts": 1700000000}',
                              '{"metrics": {"val_acc": 0.99}, "step": 7}', "Step 8 | val_acc=0.991 | lr=1e-3")
    assert [(p.name, p.step, p.value) for p in points] == [
        ("val_acc", 3, 0.95), ("val_acc", 4, 0.96), ("val_acc", 5, 0.97), ("loss", 5, 0.1), ("val_acc", 6, 0.98),
        ("val_acc", 7, 0.99), ("val_acc", 8, 0.991), ("lr", 8, 0.001)]
    assert drops.count == 0


@pytest.mark.parametrize("line", ["epoch 3 finished in 12s", "step 5", "Epoch 3 of training", '{"level": "info"}',
                                  '{"step": 3}', "[1, 2, 3]", "{not json}", '{"a": true, "b": "0.5"}',
                                  "epoch 3 val_acc: 0.9 extra words"])
def test_prose_and_other_json_are_not_metrics(line: str) -> None:
    points, drops = log_lines(line)
    assert points == [] and drops.count == 0


def test_a_json_step_out_of_range_is_dropped_with_a_reason() -> None:
    points, drops = log_lines('{"step": -1, "loss": 0.5}', "epoch 9999999999999999999 loss: 1")
    assert points == [] and drops.count == 2 and "outside" in drops.reason
