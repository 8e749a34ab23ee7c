"""Backends: a registry from name to implementation (SkyPilot's registry idea: backends/_registry.py,
re-exported here), and :func:`open_backend`, which builds one from a name (a profile, else a kind).

Third-party backends register under the ``autoresearch.backends`` entry point group
and must pass ``autoresearch.testing.backends.BackendConformance`` (the local and
the in-memory fake backend do: tests/runtime/test_local_backend.py, test_fake_backend.py).
"""

from __future__ import annotations

import os

from autoresearch.backends._base import AttemptStatus, Backend, Capabilities, LaunchRequest, NodeInfo, Sandbox, able
from autoresearch.backends._registry import (
    _factory,
    _plain_keywords,
    backend_names,
    backend_options,
    check_options,
    is_kind,
)
from autoresearch.errors import SpecError

__all__ = ["AttemptStatus", "Backend", "Capabilities", "LaunchRequest", "NodeInfo", "Sandbox", "get_backend",
           "open_backend", "backend_names", "backend_options", "able", "check_options", "is_kind", "_factory",
           "_plain_keywords"]


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
