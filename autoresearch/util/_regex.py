"""Regular expressions compiled at their first use, not at import.

A command's start pays for every module it imports (issue 16: ``status``, ``list`` and
``submit`` in <= 150 ms), and a pattern compiled at import costs 0.15-0.7 ms whether or not
the command ever matches it (a status read parses no metrics line and no duration). Stdlib
only; any module may use it.
"""

from __future__ import annotations

import re
from collections.abc import Callable


def lazy(pattern: str, flags: int = 0) -> Callable[[], re.Pattern[str]]:
    """A function that returns ``re.compile(pattern, flags)``, compiled at its first call."""
    compiled: list[re.Pattern[str]] = []

    def get() -> re.Pattern[str]:
        if not compiled:
            compiled.append(re.compile(pattern, flags))
        return compiled[0]

    return get
