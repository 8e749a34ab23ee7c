"""A tool family outside the package, to test that extra families are registered."""

from __future__ import annotations

from typing import Any


def register(server: Any, ctx: Any) -> None:
    @server.tool()
    def echo_project() -> dict[str, Any]:
        """Echo the caller's project."""
        return {"project": ctx.caller_project()}
