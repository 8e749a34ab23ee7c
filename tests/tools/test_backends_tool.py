"""The backends tool: profiles and kinds, capabilities, who answers; a broken config is an error result."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.tools.conftest import text
from tests.tools.test_tools import call, ok

pytestmark = pytest.mark.anyio


async def test_backends_lists_profiles_with_capabilities(server: Any, home: Path) -> None:
    (home / "config.yaml").write_text("default: beta\nbackends: {beta: {kind: local, node_name: node-b}}\n")
    result = await ok(server, "backends")
    rows = {r["name"]: r for r in result["backends"]}
    assert rows["beta"]["default"] and rows["beta"]["ok"] and rows["beta"]["kind"] == "local"
    assert "gpus" in rows["beta"]["capabilities"] and "fake" not in rows
    assert "options" not in rows["beta"]  # small results: no option values over MCP


async def test_a_broken_config_is_an_error_with_a_hint(server: Any, home: Path) -> None:
    (home / "config.yaml").write_text("backends: {beta: {kind: lcal}}\n")
    result = await call(server, "backends")
    assert result.is_error and "did you mean 'local'" in text(result) and "hint" in text(result)
