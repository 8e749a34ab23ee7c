"""``views.to_dict`` is ``dataclasses.asdict`` without its deep copy of every leaf (a 5,000-trial loop's
final ``--json`` view was ~1 s of the command's tail): the same result for every shape a view holds."""

from __future__ import annotations

import dataclasses
import math

from autoresearch.loop.views import CurveStep, LoopView, TrialRow
from autoresearch.views import iso, to_dict, with_iso


def _view(n: int) -> LoopView:
    trials = [TrialRow(i, i + 100, "explore" if i % 3 else "repeat", "succeeded",
                       {"lr": 10.0 ** -(i % 5), "layers": [i, {"deep": (1, 2)}], "nan": math.nan, "s": "<b>x</b>"},
                       i % 3 or None, None, float(i), float(i) / 2, i, 0.5, 1.7e9 + i, None, 1.7e9 + i + 1,
                       "why " * 3, None, bool(i % 2)) for i in range(n)]
    return LoopView("v", 1, "finished", "loss", "minimize", trials, {"succeeded": n}, 3, 0.25,
                    best_params={"lr": 0.1, "nested": {"a": [1, (2, 3)]}}, curve=[CurveStep(1, 2.0, 1, 0.5, None)])


def test_to_dict_is_asdict_for_every_shape_a_view_holds() -> None:
    view = _view(50)
    got, want = to_dict(view), dataclasses.asdict(view)
    assert repr(got) == repr(want)  # repr: NaN != NaN, but prints the same; tuples stay tuples
    got["best_params"]["nested"]["a"].append(9)  # a copy: the view is untouched
    assert view.best_params["nested"]["a"] == [1, (2, 3)]
    assert repr(to_dict([view])) == repr([want])


def test_a_large_final_view_converts_to_what_asdict_makes_with_iso_twins() -> None:
    view = _view(3000)
    plain = to_dict(view)
    assert repr(plain) == repr(dataclasses.asdict(view))  # (its speed: bench/bench_sweep.py --only users)
    out = with_iso(plain)
    assert out["trials"][0]["created_at_iso"] and out["trials"][0]["started_at_iso"] is None


def test_iso_is_the_same_on_its_fast_path_and_refuses_what_is_not_a_time() -> None:
    import datetime as dt
    import random

    rng = random.Random(7)
    for ts in [0, 0.999, 1.7e9, 1.7e9 + 0.5, 253402300799.9] + [rng.uniform(0, 2.5e11) for _ in range(2000)]:
        want = dt.datetime.fromtimestamp(ts, dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        assert iso(ts) == want, ts
    assert iso(-1.5) == "1969-12-31T23:59:58Z"  # before 1970: datetime's path, floored like it
    for bad in (math.nan, math.inf, -math.inf, 1e30, 253402300800, None, True, "1", [1]):
        assert iso(bad) is None  # type: ignore[arg-type]


def test_json_ready_is_with_iso_of_to_dict_in_one_walk() -> None:
    """The loop command's ``--json`` answer converts its final view in one walk: the same data as
    ``with_iso(to_dict(view))``, twins included, for every shape a view holds (and a list of views,
    dicts with non-string keys, a field whose twin is taken, tuples left as to_dict leaves them)."""
    from autoresearch.views import json_ready

    @dataclasses.dataclass
    class Odd:
        done_at: float | None
        done_at_iso: str  # a twin already there: not overwritten
        seen_at: bool
        when: dict[object, object]

    view = _view(300)
    assert repr(json_ready(view)) == repr(with_iso(to_dict(view)))
    assert repr(json_ready([view, None, 3])) == repr(with_iso(to_dict([view, None, 3])))
    odd = Odd(1.7e9, "kept", True, {1: {"x_at": 2.5}, "y_at": None, "z_at": "text", "t": ({"a_at": 1},)})
    got = json_ready(odd)
    assert repr(got) == repr(with_iso(to_dict(odd)))
    assert got["done_at_iso"] == "kept" and got["when"][1]["x_at_iso"] == iso(2.5) and "z_at_iso" not in got["when"]
    assert got["when"]["y_at_iso"] is None and got["when"]["t"] == ({"a_at": 1},)
    out = json_ready(view)
    out["trials"][0]["params"]["layers"][1]["deep"] = None  # a copy: the view is untouched
    assert view.trials[0].params["layers"][1]["deep"] == (1, 2)
