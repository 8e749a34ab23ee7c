"""MCP test helpers: an in-process server on the test's ledger, and a real HTTP server process."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

# A tokened server runs its tenants' jobs in a bubblewrap sandbox and refuses to start without it
# (docs/security.md): where it is not installed, their tests skip and say why (.ci/run installs it).
NEEDS_BWRAP = pytest.mark.skipif(shutil.which("bwrap") is None,
                                 reason="needs bubblewrap (bwrap): apt-get install -y bubblewrap; .ci/run installs it")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def server(api: Any, workdir: Path) -> Any:
    from autoresearch.tools.server import build_server

    return build_server(api, root=workdir)


@contextlib.asynccontextmanager
async def connect(target: Any, token: str | None = None) -> AsyncIterator[Any]:
    """An MCP client on an in-process server, or on an HTTP URL with an optional bearer token."""
    from mcp import Client

    if isinstance(target, str) and token is not None:
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
        async with http, Client(streamable_http_client(target, http_client=http)) as client:
            yield client
        return
    async with Client(target) as client:
        yield client


def text(result: Any) -> str:
    return "\n".join(getattr(block, "text", "") for block in result.content)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def http_server(home: Path, *args: str, tokens: Path | None = None, root: Path | None = None,
                gpus: int = 2) -> Iterator[str]:
    """``autoresearch serve --http`` in a subprocess; yields its /mcp URL once it answers."""
    import httpx

    port = free_port()
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "AUTORESEARCH_HOME": str(home), "AUTORESEARCH_GPUS": str(gpus)}
    env.pop("AUTORESEARCH_TOKENS", None)
    if tokens is not None and shutil.which("bwrap") is None:
        pytest.skip("a tokened server needs bubblewrap (bwrap): apt-get install -y bubblewrap; .ci/run installs it")
    if tokens is not None:
        env["AUTORESEARCH_TOKENS"] = str(tokens)
    cmd = [sys.executable, "-m", "autoresearch.cli", "serve", "--http", "--port", str(port), *args]
    proc = subprocess.Popen(cmd, env=env, cwd=root or home, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        deadline = time.monotonic() + 90  # (a start imports mcp and uvicorn: seconds on a loaded machine)
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"server exited {proc.returncode}: {proc.stderr.read().decode()[-2000:]}")
            try:
                httpx.get(url, timeout=1)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise AssertionError("HTTP server did not answer within 90 s") from None
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()
