"""The tokens file: TOKEN PROJECT pairs, comments, reload on change, clear errors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from autoresearch.errors import AuthError
from autoresearch.tools.auth import FileTokenVerifier, parse_tokens
from autoresearch.tools.server import is_loopback

pytestmark = pytest.mark.anyio


def test_parse_tokens_reads_pairs_and_skips_comments() -> None:
    text = "# header\n\naaaaaaaaaaaaaaaa team-a\n  bbbbbbbbbbbbbbbb   team-b # trailing comment\n"
    assert parse_tokens(text) == {"aaaaaaaaaaaaaaaa": "team-a", "bbbbbbbbbbbbbbbb": "team-b"}


@pytest.mark.parametrize(("text", "expected"), [
    ("aaaaaaaaaaaaaaaa\n", "expected 'TOKEN PROJECT'"),
    ("aaaaaaaaaaaaaaaa team extra\n", "expected 'TOKEN PROJECT'"),
    ("short team\n", "shorter than 16"),
])
def test_bad_token_lines_name_the_line_and_say_how_to_fix(text: str, expected: str) -> None:
    with pytest.raises(AuthError, match=expected) as caught:
        parse_tokens("# ok\n" + text, "tokens")
    assert "tokens line 2" in caught.value.message and caught.value.hint


async def test_verifier_maps_token_to_project_and_reloads_the_file(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text("aaaaaaaaaaaaaaaa team-a\n")
    verifier = FileTokenVerifier(path)
    token = await verifier.verify_token("aaaaaaaaaaaaaaaa")
    assert token is not None and token.client_id == "team-a"
    assert await verifier.verify_token("aaaaaaaaaaaaaaab") is None and await verifier.verify_token("") is None
    path.write_text("cccccccccccccccccccc team-c\n")  # revoke a, add c: no restart needed
    os.utime(path, (1, 1))
    assert await verifier.verify_token("aaaaaaaaaaaaaaaa") is None
    renewed = await verifier.verify_token("cccccccccccccccccccc")
    assert renewed is not None and renewed.client_id == "team-c"


def test_missing_tokens_file_fails_at_start_with_a_hint(tmp_path: Path) -> None:
    with pytest.raises(AuthError, match="cannot read the tokens file") as caught:
        FileTokenVerifier(tmp_path / "nope")
    assert "AUTORESEARCH_TOKENS" in caught.value.hint


def test_loopback_addresses() -> None:
    assert all(is_loopback(h) for h in ("127.0.0.1", "::1", "localhost", "127.0.0.2"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "10.0.0.5", "example.com"))
