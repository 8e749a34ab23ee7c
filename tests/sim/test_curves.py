"""Curve tables (autoresearch/sim/curves.py): loading checks everything, lookup finds the nearest config."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any

import pytest

from autoresearch.errors import SpecError
from autoresearch.sim.curves import Curve, CurveTable, curve_from_function, make_curve

DATA = Path(__file__).resolve().parents[2] / "autoresearch" / "sim" / "data"


def table(**over: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "format": "autoresearch-curves/1", "workload": "w", "metric": "loss", "mode": "min",
        "space": {"lr": {"low": 1e-4, "high": 1.0, "log": True}, "units": {"low": 8, "high": 128},
                  "act": ["relu", "tanh"]},
        "step_unit": "epoch", "max_step": 3,
        "configs": [
            {"params": {"lr": 1e-4, "units": 8, "act": "relu"}, "values": [3.0, 2.0, 1.0], "seconds": [1, 1, 1]},
            {"params": {"lr": 1.0, "units": 128, "act": "tanh"}, "values": [0.5, 0.4, 0.3], "seconds": 2.0},
            {"params": {"lr": 0.01, "units": 64, "act": "relu"}, "values": [0.9, 0.8, 0.7], "seconds": 0.5},
        ]}
    data.update(over)
    return data


def write(tmp_path: Path, data: Any, gz: bool = True) -> Path:
    path = tmp_path / ("t.json.gz" if gz else "t.json")
    blob = json.dumps(data).encode()
    path.write_bytes(gzip.compress(blob) if gz else blob)
    return path


def test_load_and_exact_lookup(tmp_path: Path) -> None:
    t = CurveTable.load(write(tmp_path, table()))
    curve = t.lookup({"lr": 1.0, "units": 128, "act": "tanh"})
    assert curve.values == [0.5, 0.4, 0.3] and curve.seconds == [2.0, 2.0, 2.0]
    assert curve.at(1) == 0.5 and curve.at(3) == 0.3 and curve.at(99) == 0.3 and curve.steps == 3
    assert curve.seconds_to(2) == 4.0
    assert t.lookup({"lr": 1e-4, "units": 8, "act": "relu"}).values == [3.0, 2.0, 1.0]
    assert CurveTable.load(write(tmp_path, table(), gz=False)).max_step == 3
    with pytest.raises(ValueError):
        curve.at(0)


def test_nearest_lookup_in_the_normalized_space(tmp_path: Path) -> None:
    t = CurveTable.load(write(tmp_path, table()))
    # lr 0.02 is near 0.01 on a log scale (near 1.0 on a linear one would need lr > 0.5)
    assert t.lookup({"lr": 0.02, "units": 70, "act": "relu"}).values[0] == 0.9
    # the categorical counts: tanh + big units + high lr -> the tanh config
    assert t.lookup({"lr": 0.5, "units": 120, "act": "tanh"}).values[0] == 0.5
    # out-of-range values are clamped, never an error
    assert t.lookup({"lr": 50.0, "units": 10_000, "act": "tanh"}).values[0] == 0.5
    assert t.lookup({"lr": 1e-9, "units": -5, "act": "relu"}).values[0] == 3.0


@pytest.mark.parametrize("bad, words", [
    ({"format": "other/1"}, "format"),
    ({"mode": "sideways"}, "mode"),
    ({"metric": None}, "metric is missing"),
    ({"space": {}}, "space"),
    ({"space": {"lr": {"low": 1.0, "high": 0.1}}}, "not a range"),
    ({"space": {"lr": {"low": 0.0, "high": 1.0, "log": True}}}, "not a range"),
    ({"max_step": 0}, "max_step"),
    ({"max_step": True}, "max_step"),
    ({"configs": []}, "no configs"),
    ({"configs": [{"params": {"lr": 0.1, "units": 8, "act": "relu"}, "values": [], "seconds": 1}]}, "no steps"),
    ({"configs": [{"params": {"lr": 0.1, "units": 8, "act": "relu"}, "seconds": 1}]}, "no steps"),
    ({"configs": [{"values": [1.0], "seconds": 1}]}, "no params"),
    ({"configs": [{"params": {"lr": 0.1, "units": 8, "act": "relu"}, "values": [1, 2, 3, 4], "seconds": 1}]},
     "more than max_step"),
    ({"configs": [{"params": {"lr": 0.1, "units": 8, "act": "relu"}, "values": [float("nan")], "seconds": 1}]},
     "nan"),
    ({"configs": [{"params": {"lr": 0.1, "units": 8, "act": "relu"}, "values": [1e308 * 10], "seconds": 1}]},
     "inf"),
    ({"configs": [{"params": {"lr": 0.1, "units": 8, "act": "relu"}, "values": ["1"], "seconds": 1}]},
     "not a number"),
    ({"configs": [{"params": {"lr": 0.1, "units": 8, "act": "relu"}, "values": [1.0], "seconds": -1}]}, "outside"),
    ({"configs": [{"params": {"lr": 0.1, "units": 8, "act": "relu"}, "values": [1.0], "seconds": 1e30}]}, "outside"),
    ({"configs": [{"params": {"lr": 0.1, "units": 8, "act": "relu"}, "values": [1.0, 2.0], "seconds": [1]}]},
     "seconds for"),
    ({"configs": [{"params": {"lr": 0.1, "units": 8}, "values": [1.0], "seconds": 1}]}, "lack 'act'"),
    ({"configs": [{"params": {"lr": 0.1, "units": 8, "act": "gelu"}, "values": [1.0], "seconds": 1}]}, "choices"),
    ({"configs": [{"params": {"lr": 0.1, "units": 8, "act": "relu", "x": 1}, "values": [1.0], "seconds": 1}]},
     "not in the space"),
    ({"configs": [{"params": {"lr": "../etc", "units": 8, "act": "relu"}, "values": [1.0], "seconds": 1}]},
     "not a number"),
])
def test_a_bad_table_is_one_spec_error_with_a_hint(tmp_path: Path, bad: dict[str, Any], words: str) -> None:
    with pytest.raises(SpecError) as err:
        CurveTable.load(write(tmp_path, table(**bad)))
    assert words in err.value.message and err.value.hint


@pytest.mark.parametrize("blob", [b"", b"not json", b"\x1f\x8bbroken gzip", b"[1, 2]", b"{" * 100_000])
def test_garbage_files(tmp_path: Path, blob: bytes) -> None:
    path = tmp_path / "g.json"
    path.write_bytes(blob)
    with pytest.raises(SpecError) as err:
        CurveTable.load(path)
    assert err.value.hint
    with pytest.raises(SpecError, match="no curve table"):
        CurveTable.load(tmp_path / "missing.json.gz")


def test_lookup_refuses_params_without_a_space_key(tmp_path: Path) -> None:
    t = CurveTable.load(write(tmp_path, table()))
    with pytest.raises(SpecError, match="lack 'units'"):
        t.lookup({"lr": 0.1, "act": "relu"})
    with pytest.raises(SpecError):
        t.lookup({"lr": math.nan, "units": 8, "act": "relu"})


def fn_curve(params: dict[str, Any]) -> Any:
    return {"values": [params["x"] / k for k in range(1, 4)], "seconds": 0.5}


def fn_bad(params: dict[str, Any]) -> Any:
    return [float("inf")] if params else "no"


def test_curve_from_function() -> None:
    curve = curve_from_function("tests.sim.test_curves:fn_curve")({"x": 6.0})
    assert curve.values == [6.0, 3.0, 2.0] and curve.seconds == [0.5] * 3
    with pytest.raises(SpecError, match="inf"):
        curve_from_function("tests.sim.test_curves:fn_bad")({"x": 1})
    with pytest.raises(SpecError, match="not a curve"):
        curve_from_function("tests.sim.test_curves:fn_bad")({})
    for target in ("nocolon", "no.such.module:f", "tests.sim.test_curves:missing", ":f"):
        with pytest.raises(SpecError):
            curve_from_function(target)
    assert isinstance(make_curve([1.0], 1.0), Curve)


def test_shipped_tables_load() -> None:
    tables = sorted(DATA.glob("*.json.gz"))
    if not tables:
        pytest.skip("no tables recorded yet")
    total = sum(p.stat().st_size for p in tables)
    assert total < 8 * 1024 * 1024, f"shipped tables take {total} bytes: a few MB at most"
    for path in tables:
        t = CurveTable.load(path)
        assert len(t.curves) >= 100 and t.max_step >= 9
        assert all(c.steps == t.max_step for c in t.curves)
