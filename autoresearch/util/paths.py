"""Where autoresearch finds files that live beside the package rather than inside it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

SHARE = Path("share") / "autoresearch"  # where `pip install .` puts prompts/ (pyproject data-files)


def prompts_dir() -> Path:
    """The prompt templates: ``$AUTORESEARCH_PROMPTS``, else the checkout's ``prompts/``
    (an editable install), else the copy a regular install put under ``<prefix>/share``."""
    configured = os.environ.get("AUTORESEARCH_PROMPTS")
    if configured:
        return Path(configured)
    import autoresearch  # (the package's place, wherever this module lies within it)

    checkout = Path(autoresearch.__file__).resolve().parent.parent / "prompts"
    if checkout.is_dir():
        return checkout
    for prefix in (sys.prefix, sys.base_prefix, os.path.expanduser("~/.local")):
        installed = Path(prefix) / SHARE / "prompts"
        if installed.is_dir():
            return installed
    return checkout


def lock_held(path: str | os.PathLike[str]) -> bool:
    """Whether a process holds an flock on ``path`` now (a non-blocking probe). Never creates the file
    (no file: nobody holds it) nor follows a link; a file that cannot be opened reads as not held."""
    import fcntl

    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
    return False
