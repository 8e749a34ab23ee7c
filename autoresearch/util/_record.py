"""Dataclasses that are cheap to make at import: the methods ``@dataclass`` would compile, written once.

Making a dataclass compiles its ``__init__``, ``__repr__`` and ``__eq__`` (and a frozen one's
``__setattr__``, ``__delattr__`` and ``__hash__``) from source text, one ``exec`` each: ~0.3 ms a
method, 1.5-3 ms a class on a 2-core VM, paid by every process that imports it. A command's start
made ~14 such classes (the backend contract's, the job views, the profiles) for ~25 ms.

A record is a ``@dataclass(init=False, repr=False, eq=False)`` (so ``dataclasses.fields``,
``replace``, ``asdict`` and pydantic see the same fields, defaults and order) whose ``__init__`` is
written in its class body, in field order with the same defaults, and to which :func:`record` adds
the rest as ``@dataclass`` would: ``__repr__`` and ``__eq__`` over every field, and for a frozen
one a ``__hash__`` of them, a ``__setattr__``/``__delattr__`` that raise ``FrozenInstanceError``
and (slotted) the ``__getstate__``/``__setstate__`` that pickling and ``copy`` need. A frozen
record's ``__init__`` sets its fields with ``object.__setattr__``; a field with a
``default_factory`` takes :data:`NEW` as its default and makes a fresh value when given none.

tests/test_records.py checks each record against the dataclass ``@dataclass`` makes of its fields.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import FrozenInstanceError
from operator import attrgetter
from typing import Any, TypeVar

T = TypeVar("T")

NEW: Any = object()  # the default of a field with a default_factory: the __init__ makes a fresh value


def record(*, frozen: bool = False) -> Callable[[type[T]], type[T]]:
    """Add ``__repr__``, ``__eq__`` (and for ``frozen``: ``__hash__``, ``__setattr__``, ``__delattr__``,
    ``__getstate__``, ``__setstate__``) over the fields of a ``@dataclass(init=False, repr=False, eq=False)``."""

    def finish(cls: type[T]) -> type[T]:
        names = tuple(cls.__dataclass_fields__)  # type: ignore[attr-defined]
        one = attrgetter(*names) if names else (lambda _: ())
        values: Callable[[Any], tuple[Any, ...]] = (lambda obj: (one(obj),)) if len(names) == 1 else one

        def __repr__(self: Any) -> str:
            parts = ", ".join([f"{name}={getattr(self, name)!r}" for name in names])
            return f"{self.__class__.__qualname__}({parts})"

        def __eq__(self: Any, other: object) -> bool:
            if other.__class__ is self.__class__:
                return bool(values(self) == values(other))
            return NotImplemented

        methods: dict[str, Any] = {"__repr__": __repr__, "__eq__": __eq__}
        if frozen:
            def __hash__(self: Any) -> int:
                return hash(values(self))

            def __setattr__(self: Any, name: str, value: Any) -> None:
                if type(self) is cls or name in names:
                    raise FrozenInstanceError(f"cannot assign to field {name!r}")
                super(cls, self).__setattr__(name, value)  # type: ignore[misc, arg-type]

            def __delattr__(self: Any, name: str) -> None:
                if type(self) is cls or name in names:
                    raise FrozenInstanceError(f"cannot delete field {name!r}")
                super(cls, self).__delattr__(name)  # type: ignore[misc, arg-type]

            methods.update(__hash__=__hash__, __setattr__=__setattr__, __delattr__=__delattr__)
            if "__slots__" in cls.__dict__:
                def __getstate__(self: Any) -> list[Any]:
                    return list(values(self))

                def __setstate__(self: Any, state: list[Any]) -> None:
                    for name, value in zip(names, state, strict=False):
                        object.__setattr__(self, name, value)

                methods.update(__getstate__=__getstate__, __setstate__=__setstate__)
        else:
            methods["__hash__"] = None  # (eq without frozen: unhashable, as @dataclass makes it)
        for name, method in methods.items():
            if method is not None:
                method.__qualname__ = f"{cls.__qualname__}.{name}"
            setattr(cls, name, method)
        return cls

    return finish
