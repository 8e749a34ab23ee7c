"""Bearer tokens for the HTTP server: ``TOKEN PROJECT`` pairs from ``$AUTORESEARCH_TOKENS``.

A token sees and acts on its project's jobs only. The file is re-read when it
changes, so adding or revoking a token needs no restart. Tokens are compared in
constant time. A rejected token is logged (its length, never the token itself), at
most one line a second with a count of the others.
"""

from __future__ import annotations

import hmac
import logging
import os
import threading
import time
from pathlib import Path

from mcp.server.auth.provider import AccessToken

from autoresearch.errors import AuthError

ENV = "AUTORESEARCH_TOKENS"
MIN_TOKEN_LEN = 16
LOG_EVERY_S = 1.0
log = logging.getLogger("autoresearch.tools")


def parse_tokens(text: str, source: str = ENV) -> dict[str, str]:
    """``TOKEN PROJECT`` per line, ``#`` starts a comment; returns token -> project."""
    tokens: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2:
            raise AuthError(f"{source} line {number}: expected 'TOKEN PROJECT', got {len(parts)} field(s)",
                            hint="write one token and one project name per line, e.g. 's3cr3t-token-abcdef team-a'")
        token, project = parts
        if len(token) < MIN_TOKEN_LEN:
            raise AuthError(f"{source} line {number}: token shorter than {MIN_TOKEN_LEN} characters",
                            hint="generate one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'")
        tokens[token] = project
    return tokens


class FileTokenVerifier:
    """The SDK's ``TokenVerifier``: the project becomes the access token's ``client_id``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path).expanduser()
        self._lock = threading.Lock()
        self._stamp: tuple[float, int] | None = None
        self._tokens: dict[str, str] = {}
        self._logged_at = 0.0
        self._unlogged = 0
        self.tokens()  # fail at start-up, not on the first request

    def tokens(self) -> dict[str, str]:
        try:
            st = self.path.stat()
        except OSError as err:
            raise AuthError(f"cannot read the tokens file {self.path}: {err.strerror}",
                            hint=f"point {ENV} at a file of 'TOKEN PROJECT' lines") from None
        stamp = (st.st_mtime, st.st_size)
        with self._lock:
            if stamp != self._stamp:
                self._tokens = parse_tokens(self.path.read_text(), str(self.path))
                self._stamp = stamp
            return self._tokens

    async def verify_token(self, token: str) -> AccessToken | None:
        try:
            tokens = self.tokens()
        except AuthError as err:
            self._rejected(f"the tokens file is unusable ({err.message})")
            return None  # a broken file refuses everyone rather than crash the request
        project = None
        for known, owner in tokens.items():
            if hmac.compare_digest(known.encode(), token.encode()):
                project = owner
        if project is None:
            self._rejected(f"a bearer token of {len(token)} characters is not in {self.path}")
            return None
        return AccessToken(token=token, client_id=project, scopes=[], claims={"project": project})

    def _rejected(self, why: str) -> None:
        """Log a refused request (never the token), throttled so a flood of bad tokens is one line a second."""
        now = time.monotonic()
        with self._lock:
            if now - self._logged_at < LOG_EVERY_S:
                self._unlogged += 1
                return
            more, self._unlogged, self._logged_at = self._unlogged, 0, now
        log.warning("rejected a request: %s%s", why, f" ({more} more rejected since the last line)" if more else "")
