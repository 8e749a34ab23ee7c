"""autoresearch: a job runtime and research loop for agent-driven ML.

This module stays tiny: trials import ``report`` from here, and that must cost
well under 30 ms. Everything else is imported from its own module.
"""

from __future__ import annotations

from autoresearch.report import report

__all__ = ["report", "__version__"]
__version__ = "0.1.0"
