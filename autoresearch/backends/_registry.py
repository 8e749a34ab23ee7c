"""The backend registry: a name to its implementation (SkyPilot's registry idea), the options each
takes, and refusing an option before anything is recorded.

Built in: ``_BUILTIN``; third-party backends register under the ``autoresearch.backends`` entry point
group. Re-exported by :mod:`autoresearch.backends`, which also builds a backend from a name
(:func:`~autoresearch.backends.open_backend`: a profile of config.yaml, else a kind). This module
imports neither that package, nor the profiles, nor the backend contract (backends/_base.py), which
all ask it.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from types import FunctionType
from typing import Any, Literal

from autoresearch.errors import SpecError

# name -> "module:Class", imported only when asked for.
_BUILTIN: dict[str, str] = {
    "local": "autoresearch.backends._local:LocalBackend",
    "fake": "autoresearch.backends.fake:FakeBackend",  # in memory, for tests (backends/fake.py)
    "kubernetes": "autoresearch.backends.kubernetes:KubernetesBackend",  # a batch/v1 Job per attempt (+ Kueue)
    "databricks": "autoresearch.backends.databricks:DatabricksBackend",  # the databricks CLI's AI Runtime (air)
    "docker": "autoresearch.backends._docker:DockerBackend",
    "slurm": "autoresearch.backends._slurm:SlurmBackend",  # one sbatch per attempt (backends/slurm/ starts a dev cluster)
    "ray": "autoresearch.backends.ray:RayBackend",  # a Ray cluster's Jobs API (backends/ray/ starts a local head)
    "sim": "autoresearch.backends.sim:SimBackend",  # a simulated fleet with faults, in simulated time (docs/sim.md)
}


def _entry_points() -> dict[str, str]:
    from importlib.metadata import entry_points  # ~20 ms: only when a name is not built in

    return {ep.name: ep.value for ep in entry_points(group="autoresearch.backends")}


def backend_names() -> list[str]:
    return sorted({**_entry_points(), **_BUILTIN})


def is_kind(name: str) -> bool:
    """Whether ``name`` is a registered backend kind (built in first: no entry-point scan for those)."""
    return name in _BUILTIN or name in _entry_points()


def _factory(name: str) -> Callable[..., Any]:  # (a Backend: backends/_base.py, which imports this)
    target = _BUILTIN.get(name)
    if target is None:
        target = _entry_points().get(name)
    if target is None:
        import difflib  # only for an error's hint (every command imports this module)

        names = backend_names()
        near = difflib.get_close_matches(name, names, n=1)
        hint = f"did you mean {near[0]!r}? " if near else ""
        raise SpecError(f"unknown backend {name!r}", hint=f"{hint}valid backends: {', '.join(names)}")
    module, _, attr = target.partition(":")
    factory: Callable[..., Any] = getattr(import_module(module), attr)
    return factory


def backend_options(name: str) -> list[str] | None:
    """The options (constructor keywords) backend ``name`` takes; None when it judges its own."""
    factory = _factory(name)
    plain = _plain_keywords(factory)
    if plain is not False:
        return plain
    import inspect  # (~15 ms of a command's start: the code says it for the plain classes we ship)

    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # a builtin or C factory: let it judge its own options
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


_VAR_KEYWORDS = 0x08  # inspect.CO_VARKEYWORDS: the code takes **kwargs


def _plain_keywords(factory: object) -> list[str] | None | Literal[False]:
    """What :func:`backend_options` answers from ``inspect.signature``, read off the code of a plain
    factory: a class of no metaclass ``__call__`` nor ``__new__`` of its own whose ``__init__`` is a
    plain function, or a plain function. False for any other (a wrapped or partial one, a declared
    ``__signature__``, a builtin): :mod:`inspect` knows those (tests/runtime/test_backend_options.py)."""
    def plain(fn: object) -> bool:
        return type(fn) is FunctionType and not any(
            hasattr(fn, attr) for attr in ("__wrapped__", "__signature__", "_partialmethod"))

    if isinstance(factory, type):
        init: object = factory.__init__  # type: ignore[misc]  # (the class's own, which is what we read)
        if (type(factory).__call__ is not type.__call__ or factory.__new__ is not object.__new__
                or hasattr(factory, "__wrapped__") or getattr(factory, "__signature__", None) is not None
                or not plain(init)):
            return False
        skip = 1  # self
    elif plain(factory):
        init, skip = factory, 0
    else:
        return False
    code = init.__code__  # type: ignore[attr-defined]
    if code.co_argcount < skip:
        return False  # (def __init__(*args): inspect's business)
    if code.co_flags & _VAR_KEYWORDS:
        return None
    names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
    return list(names[max(skip, code.co_posonlyargcount):])


def check_options(name: str, options: dict[str, object]) -> None:
    """Refuse a backend name or option the backend does not take, before anything is recorded."""
    valid = backend_options(name)
    validate = getattr(_factory(name), "validate_options", None)  # values, too, where the backend can say
    if valid is None:
        if validate is not None:
            validate(options)
        return
    for key in options:
        if key not in valid:
            import difflib

            near = difflib.get_close_matches(str(key), valid, n=1)
            what = f"did you mean {near[0]!r}? " if near else ""
            raise SpecError(f"backend.options: unknown key {key!r} for backend {name!r}",
                            hint=f"{what}valid options: {', '.join(valid)}" if valid else
                            f"the {name} backend takes no options; remove backend.options")
    if validate is not None:
        validate(options)
