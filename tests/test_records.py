"""Each record (autoresearch/util/_record.py: a dataclass whose __init__ is written in its body, cheap to
make at import) behaves as the dataclass ``@dataclass`` makes of the same fields: its signature and
defaults, a fresh value from each default_factory, repr, equality, hash, frozenness, pickling, copy,
``dataclasses.replace`` and ``asdict``. The reference is built here with ``make_dataclass`` from the
record's own fields, so a field added to a record without its __init__ (or the reverse) fails."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import math
import pickle
from typing import Any

import pytest

from autoresearch import views
from autoresearch.backends import _base, profiles
from autoresearch.engine import metrics, runfolders

# (class, frozen, slots) as each was declared with @dataclass before it became a record
RECORDS: list[tuple[type, bool, bool]] = [
    (_base.Capabilities, True, True), (_base.NodeInfo, True, True), (_base.Sandbox, True, True),
    (_base.LaunchRequest, True, True), (_base.AttemptStatus, True, True),
    (views.AttemptView, False, False), (views.JobView, False, False), (views.JobPage, False, False),
    (views.ArrayView, False, False), (views.LogPage, False, False),
    (metrics.Point, True, True), (runfolders.Aside, False, False),
    (profiles.Profile, True, False), (profiles.Config, True, False),
]
IDS = [cls.__qualname__ for cls, _, _ in RECORDS]


def reference(cls: type, frozen: bool, slots: bool) -> type:
    """The dataclass @dataclass makes of ``cls``'s fields, under the same name."""
    spec = []
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            spec.append((f.name, f.type, dataclasses.field(default=f.default)))
        elif f.default_factory is not dataclasses.MISSING:
            spec.append((f.name, f.type, dataclasses.field(default_factory=f.default_factory)))
        else:
            spec.append((f.name, f.type))
    made: type = dataclasses.make_dataclass(cls.__name__, spec, frozen=frozen, slots=slots)
    made.__qualname__ = cls.__qualname__
    return made


def required(cls: type) -> dict[str, Any]:
    return {f.name: f"v-{f.name}" for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}


def every(cls: type, salt: int) -> dict[str, Any]:
    """A value for every field: hashable ones (a tuple, a float, inf, markup, None), whatever its type."""
    odd = [("a", salt), float(salt) + 0.5, "<b>&'\"</b>", None, math.inf, -salt, (), True]
    return {f.name: odd[(i + salt) % len(odd)] for i, f in enumerate(dataclasses.fields(cls))}


@pytest.mark.parametrize(("cls", "frozen", "slots"), RECORDS, ids=IDS)
def test_a_record_is_the_dataclass_of_its_fields(cls: type, frozen: bool, slots: bool) -> None:
    ref = reference(cls, frozen, slots)
    assert cls.__doc__ and "__init__" in cls.__dict__  # (no docstring: dataclasses imports inspect to write one)
    theirs = inspect.signature(ref).parameters
    ours = inspect.signature(cls).parameters
    assert list(ours) == list(theirs)
    for name, param in theirs.items():
        field = cls.__dataclass_fields__[name]  # type: ignore[attr-defined]
        if field.default_factory is not dataclasses.MISSING:
            assert ours[name].default is not inspect.Parameter.empty
        else:
            assert ours[name].default == param.default or (ours[name].default is param.default), name
    assert getattr(cls, "__match_args__", None) == getattr(ref, "__match_args__", None)
    given = required(cls)
    a, b = cls(**given), cls(**given)
    ra = ref(**given)
    assert repr(a) == repr(ra)
    assert a == b and not a != b and a is not b
    assert (a == ra) is False and (ra == a) is False
    assert dataclasses.asdict(a) == dataclasses.asdict(ra)
    for f in dataclasses.fields(cls):
        if f.default_factory is not dataclasses.MISSING:
            assert getattr(a, f.name) == f.default_factory() and getattr(a, f.name) is not getattr(b, f.name)
    assert hasattr(a, "__dict__") == hasattr(ra, "__dict__")
    for salt in range(3):
        values = every(cls, salt)
        x, rx = cls(**values), ref(**values)
        assert repr(x) == repr(rx)
        assert dataclasses.asdict(x) == dataclasses.asdict(rx)
        assert x == cls(**values) and rx == ref(**values)
        assert dataclasses.replace(x, **given) == cls(**{**values, **given})
        first = dataclasses.fields(cls)[0].name
        assert x != dataclasses.replace(x, **{first: object()})
        if frozen:
            assert hash(x) == hash(rx) == hash(cls(**values))
            with pytest.raises(dataclasses.FrozenInstanceError) as ours_err:
                setattr(x, first, 1)
            with pytest.raises(dataclasses.FrozenInstanceError) as their_err:
                setattr(rx, first, 1)
            assert str(ours_err.value) == str(their_err.value)
            with pytest.raises(dataclasses.FrozenInstanceError) as ours_err:
                delattr(x, first)
            with pytest.raises(dataclasses.FrozenInstanceError) as their_err:
                delattr(rx, first)
            assert str(ours_err.value) == str(their_err.value)
            # (a name that is no field: FrozenInstanceError too, where a slotted frozen dataclass of
            # Python 3.11 raises a TypeError from its super() of the class it replaced)
            with pytest.raises(dataclasses.FrozenInstanceError):
                x.not_a_field = 1
            assert getattr(x, first) == values[first]
        else:
            with pytest.raises(TypeError):
                hash(x)
            setattr(x, first, "changed")
            assert getattr(x, first) == "changed"
            setattr(x, first, values[first])
        assert pickle.loads(pickle.dumps(x)) == x
        assert copy.copy(x) == x and copy.deepcopy(x) == x


def test_an_unhashable_field_makes_a_frozen_record_unhashable_as_a_dataclass() -> None:
    request = _base.LaunchRequest("1.1", ["true"], {"A": "1"}, "/w", "/l", "/r")
    with pytest.raises(TypeError):
        hash(request)
    assert hash(_base.Capabilities(gpus=True)) == hash(reference(_base.Capabilities, True, True)(gpus=True))
    assert _base.Capabilities() != _base.Capabilities(gpus=True)
