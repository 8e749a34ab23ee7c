"""A backend's options (its constructor's keywords), read off the code of a plain factory without
importing :mod:`inspect` (~15 ms of every command's start), must be exactly what
``inspect.signature`` says; any factory the code alone cannot answer for goes to :mod:`inspect`."""

from __future__ import annotations

import abc
import functools
import inspect
from typing import Any

import pytest

from autoresearch.backends import _factory, _plain_keywords, backend_names, backend_options


def by_inspect(factory: Any) -> list[str] | None:
    """The answer backend_options gave before it read the code itself."""
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


@pytest.mark.parametrize("name", backend_names())
def test_every_built_in_backend_is_read_off_its_code_as_inspect_reads_it(name: str) -> None:
    factory = _factory(name)
    assert _plain_keywords(factory) is not False, f"{name}: the code path should answer for the backends we ship"
    assert _plain_keywords(factory) == by_inspect(factory)
    assert backend_options(name) == by_inspect(factory)


class Plain:
    def __init__(self, a: int, b: int = 1, *, c: int = 2) -> None: ...


class PositionalOnly:
    def __init__(self, a: int, /, b: int, *args: int, c: int) -> None: ...


class TakesAnything:
    def __init__(self, a: int, **rest: Any) -> None: ...


class Inherits(Plain):
    pass


class Abstract(abc.ABC):
    def __init__(self, x: int, y: int = 0) -> None:
        self.x = x

    @abc.abstractmethod
    def run(self) -> None: ...


def factory_function(host: str, *, port: int = 0) -> None: ...


def decorated_init(fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
        fn(self, *args, **kwargs)
    return wrapper


class Wrapped:
    @decorated_init
    def __init__(self, a: int, b: int = 0) -> None: ...


class OwnNew:
    def __new__(cls, z: int) -> OwnNew:
        return super().__new__(cls)

    def __init__(self, z: int) -> None: ...


class Meta(type):
    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        return super().__call__(*args, **kwargs)


class WithMeta(metaclass=Meta):
    def __init__(self, q: int) -> None: ...


class Declared:
    __signature__ = inspect.Signature([inspect.Parameter("only", inspect.Parameter.KEYWORD_ONLY)])

    def __init__(self, *args: Any, **kwargs: Any) -> None: ...


class StarArgs:
    def __init__(*args: Any) -> None: ...


class NoInit:
    pass


PLAIN = [Plain, PositionalOnly, TakesAnything, Inherits, Abstract, factory_function]
OTHERS = [Wrapped, OwnNew, WithMeta, Declared, StarArgs, NoInit, functools.partial(factory_function, "h"), dict, len]


@pytest.mark.parametrize("factory", PLAIN, ids=lambda f: getattr(f, "__name__", repr(f)))
def test_a_plain_factory_is_answered_from_its_code_exactly_as_inspect_answers(factory: Any) -> None:
    assert _plain_keywords(factory) is not False
    assert _plain_keywords(factory) == by_inspect(factory)


@pytest.mark.parametrize("factory", OTHERS, ids=lambda f: getattr(f, "__name__", type(f).__name__))
def test_a_factory_the_code_cannot_answer_for_is_left_to_inspect(factory: Any) -> None:
    """A wrapper, its own __new__ or metaclass __call__, a declared signature, *args alone, a
    partial, a builtin: the code is not the whole story; inspect's answer stands."""
    assert _plain_keywords(factory) is False

