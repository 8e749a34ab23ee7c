"""``python -m autoresearch.cli ...``: the same as the ``autoresearch`` console script."""

import sys

from autoresearch.cli import main

sys.exit(main())
