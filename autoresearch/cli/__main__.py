"""``python -m autoresearch.cli ...``: the same as the ``autoresearch`` console script."""

from autoresearch.cli import entry

entry()
