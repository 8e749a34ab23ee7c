"""Backends: a registry from name to implementation (SkyPilot's registry idea).

Third-party backends register under the ``autoresearch.backends`` entry point group
and must pass ``autoresearch.testing.backends.BackendConformance``.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from importlib import import_module

from autoresearch.backends._base import AttemptStatus, Backend, Capabilities, LaunchRequest, NodeInfo, Sandbox
from autoresearch.errors import SpecError

__all__ = ["AttemptStatus", "Backend", "Capabilities", "LaunchRequest", "NodeInfo", "Sandbox", "get_backend", "backend_names"]

# name -> "module:Class", imported only when asked for.
_BUILTIN: dict[str, str] = {
    "local": "autoresearch.backends._local:LocalBackend",
}


def _entry_points() -> dict[str, str]:
    from importlib.metadata import entry_points  # ~20 ms: only when a name is not built in

    return {ep.name: ep.value for ep in entry_points(group="autoresearch.backends")}


def backend_names() -> list[str]:
    return sorted({**_entry_points(), **_BUILTIN})


def get_backend(name: str = "local", **options: object) -> Backend:
    target = _BUILTIN.get(name)
    if target is None:
        target = _entry_points().get(name)
    if target is None:
        names = backend_names()
        near = difflib.get_close_matches(name, names, n=1)
        hint = f"did you mean {near[0]!r}? " if near else ""
        raise SpecError(f"unknown backend {name!r}", hint=f"{hint}valid backends: {', '.join(names)}")
    module, _, attr = target.partition(":")
    factory: Callable[..., Backend] = getattr(import_module(module), attr)
    return factory(**options)
