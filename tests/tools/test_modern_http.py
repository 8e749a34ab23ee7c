"""The per-request HTTP path (protocol 2026-07-28, what the SDK client speaks) in process: the
real ASGI app, no sockets. The server skips the SDK's per-call walk of a tool's input schema for
``Mcp-Param-*`` headers when the tool declares none (submit's: ~0.3 ms a call), and still checks
them for a tool that does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import Field

pytestmark = pytest.mark.anyio
META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "0"}}


async def post(app: Any, tool: str, arguments: dict[str, Any], headers: dict[str, str] | None = None) -> tuple[int, Any]:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                       "params": {"name": tool, "arguments": arguments, "_meta": META}}).encode()
    sent = [(b"host", b"127.0.0.1:8765"), (b"content-type", b"application/json"),
            (b"accept", b"application/json, text/event-stream"), (b"mcp-protocol-version", b"2026-07-28"),
            (b"mcp-method", b"tools/call"), (b"mcp-name", tool.encode()), (b"content-length", str(len(body)).encode())]
    sent += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/mcp", "raw_path": b"/mcp", "query_string": b"", "root_path": "", "headers": sent,
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8765)}
    out: list[dict[str, Any]] = []
    done = False

    async def receive() -> dict[str, Any]:
        nonlocal done
        if done:
            return {"type": "http.disconnect"}
        done = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        out.append(message)

    await app(scope, receive, send)
    data = b"".join(m.get("body", b"") for m in out[1:])
    return out[0]["status"], json.loads(data) if data else None


async def test_param_headers_are_checked_only_where_a_tool_declares_them(server: Any, workdir: Path) -> None:
    @server.tool()
    def routed(region: Annotated[str, Field(json_schema_extra={"x-mcp-header": "Region"})]) -> str:
        return region

    assert server._tool_input_schema("submit") is None  # declares no header: nothing to walk per call
    assert server._tool_input_schema("routed")["properties"]["region"]["x-mcp-header"] == "Region"
    app = server.streamable_http_app(host="127.0.0.1", json_response=True)
    async with app.router.lifespan_context(app):
        status, answer = await post(app, "routed", {"region": "eu"}, {"Mcp-Param-Region": "us"})
        assert status == 400 and "Mcp-Param-Region" in answer["error"]["message"]  # the SDK still checks
        status, answer = await post(app, "routed", {"region": "eu"}, {"Mcp-Param-Region": "eu"})
        assert status == 200 and answer["result"]["structuredContent"] == {"result": "eu"}
        status, answer = await post(app, "status", {"limit": 1}, {"Mcp-Param-Region": "us"})
        assert status == 200 and not answer["result"].get("isError")  # no declared header: none to match


async def test_workdir_dot_is_the_resolved_root(server: Any, workdir: Path, tmp_path: Path) -> None:
    from autoresearch.tools._context import ToolContext

    link = tmp_path / "link"
    link.symlink_to(workdir)
    ctx = ToolContext(api=None, root=link)
    assert ctx.relative_path(".", "workdir") == ctx.relative_path("./", "workdir") == str(workdir.resolve())
    (workdir / "src").mkdir()
    assert ctx.relative_path("src", "workdir") == str((workdir / "src").resolve())
    with pytest.raises(Exception, match="outside the server's root"):
        (workdir / "out").symlink_to(tmp_path)
        ctx.relative_path("out", "workdir")
