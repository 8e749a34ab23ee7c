"""Backends: a registry from name to implementation (SkyPilot's registry idea).

Third-party backends register under the ``autoresearch.backends`` entry point group
and must pass ``autoresearch.testing.backends.BackendConformance`` (the local and
the in-memory fake backend do: tests/runtime/test_local_backend.py, test_fake_backend.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from importlib import import_module
from types import FunctionType
from typing import Literal

from autoresearch.backends._base import AttemptStatus, Backend, Capabilities, LaunchRequest, NodeInfo, Sandbox
from autoresearch.errors import SpecError

__all__ = ["AttemptStatus", "Backend", "Capabilities", "LaunchRequest", "NodeInfo", "Sandbox", "get_backend",
           "open_backend", "backend_names", "able", "check_options"]

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


def _builtin_kinds() -> list[str]:
    return backend_names()


def is_kind(name: str) -> bool:
    """Whether ``name`` is a registered backend kind (built in first: no entry-point scan for those)."""
    return name in _BUILTIN or name in _entry_points()


def able(flag: str) -> list[str]:
    """Registered backends whose class declares capability ``flag``, for hints (imports each).

    Simulated backends (the fake) run nothing and are never named; one that fails to
    import, or whose factory is not a :class:`Backend` class, is left out.
    """
    out = []
    for name in backend_names():
        try:
            factory = _factory(name)
        except Exception:  # noqa: BLE001 - a broken plugin must not break an error message
            continue
        if isinstance(factory, type) and issubclass(factory, Backend) and not factory.simulated and getattr(
                factory.capabilities, flag, False):
            out.append(name)
    return out


def _factory(name: str) -> Callable[..., Backend]:
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
    factory: Callable[..., Backend] = getattr(import_module(module), attr)
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


def get_backend(name: str = "local", **options: object) -> Backend:
    """The backend ``name``: a profile of the default home's config.yaml, else a kind (see
    :func:`open_backend`)."""
    return open_backend(name, None, **options)


def open_backend(name: str, home: str | os.PathLike[str] | None, **options: object) -> Backend:
    """The backend ``name`` of ``home``: a profile (``backends:`` in ``home/config.yaml``: its kind,
    its options updated by ``options``), else a built-in kind with ``options``. The instance's
    ``name`` is ``name``, the word the ledger stores, so a later process rebuilds the same one."""
    from autoresearch.backends import profiles

    profile = profiles.resolve(name, home)
    merged = {**profile.options, **options}
    check_options(profile.kind, merged)
    if home is not None and "home_dir" in (backend_options(profile.kind) or ()):  # state kept in the home
        merged.setdefault("home_dir", str(home))
    try:
        backend = _factory(profile.kind)(**merged)
    except SpecError as err:  # an option the backend itself refused: say which profile holds it
        where = f"profile {name!r} ({profiles.config_path(home)})" if name != profile.kind else f"backend {name!r}"
        raise SpecError(f"{where}: {err.message}", hint=err.hint) from None
    if backend.name != name:
        backend.name = name
    return backend
