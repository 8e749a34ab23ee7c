"""How a command reaches the system: :func:`open_api`, the facade for ``--home``.

A module of its own so that the command modules import it, not the package that assembles
them (:mod:`autoresearch.cli`), which imports every one of them.
"""

from __future__ import annotations

import argparse
from typing import Any


def open_api(args: argparse.Namespace) -> Any:
    """The facade for ``--home`` (imported here, not at the top: ``--help`` stays instant)."""
    from autoresearch.api import Api

    return Api(args.home, getattr(args, "backend", None))
