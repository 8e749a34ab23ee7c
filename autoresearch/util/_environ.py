"""This process's environment as a dict, decoded again only when it changed.

Below everything that reads it (the runtime's launch, the secrets of ``redact``, the zygote's
requests): stdlib only, and it imports nothing of autoresearch.
"""

from __future__ import annotations

import os

_environ: tuple[object, dict[str, str]] = (None, {})


def environ() -> dict[str, str]:
    """``dict(os.environ)``, decoded again only when it changed (a launch needs it twice and a
    submit's view once: ~0.1 ms each). Keyed by the raw bytes: a C-level copy. Do not change it."""
    global _environ
    raw = getattr(os.environ, "_data", None)
    if not isinstance(raw, dict):
        return dict(os.environ)
    key = tuple(raw.items())
    if key != _environ[0]:
        _environ = (key, dict(os.environ))
    return _environ[1]
