"""Compose the MCP server from the tool-family modules and run it over stdio or HTTP.

Each module in :data:`FAMILIES` exposes ``register(server, ctx)``. A family whose
module is absent (``loop`` until the loop package provides it) is skipped, so the
server always starts with what is installed. Logging goes to stderr: on stdio,
stdout belongs to the protocol.
"""

from __future__ import annotations

import inspect
import ipaddress
import json
import logging
import os
import sys
from importlib import import_module
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.inbound import X_MCP_HEADER_KEY
from mcp.types import TextContent
from pydantic import ValidationError

from autoresearch.errors import AuthError
from autoresearch.tools._context import ToolContext

FAMILIES = ("jobs", "logs", "metrics", "cluster", "prompts", "loop")
INSTRUCTIONS = """\
autoresearch runs ML jobs on GPUs. Typical flow: cluster_status (free GPUs) -> submit(command=[...], gpus=N)
-> status(job_id) until it runs -> logs(job_id) / metrics(job_id) to follow it -> cancel(job_id) if needed.
Jobs outlive this conversation. Every error says what to do next in its 'hint' line."""
log = logging.getLogger("autoresearch.tools")


class AutoresearchMCP(MCPServer[Any]):
    """The SDK server, with argument-validation errors rewritten into message + hint."""

    def _tool_input_schema(self, name: str) -> dict[str, Any] | None:
        """The schema the SDK checks a modern HTTP call's ``Mcp-Param-*`` headers against, or None
        (nothing to check) when the tool declares no ``x-mcp-header``: the SDK would otherwise walk
        the whole input schema on every call with arguments (~0.3 ms for submit's) to learn that."""
        schema = super()._tool_input_schema(name)
        if schema is None:
            return None
        cache: dict[str, tuple[Any, bool]] = self.__dict__.setdefault("_declares_headers", {})
        seen = cache.get(name)
        if seen is None or seen[0] is not schema:
            seen = cache[name] = (schema, X_MCP_HEADER_KEY in json.dumps(schema, default=str))
        return schema if seen[1] else None

    def add_tool(self, fn: Any, name: str | None = None, title: str | None = None,  # type: ignore[override]
                 description: str | None = None, **kwargs: Any) -> None:
        """As the SDK's, with a description written as a docstring sent without its indentation
        (a tool's docstring kept 8 spaces a line: ~550 characters of the tool list were spaces)."""
        text = description if description is not None else fn.__doc__
        super().add_tool(fn, name=name, title=title, description=inspect.cleandoc(text) if text else text, **kwargs)

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        tool = self._tool_manager.get_tool(name)
        if tool is not None:
            known = tool.parameters.get("properties", {})
            unknown = sorted(set(arguments) - set(known))
            if unknown:  # the SDK would drop them silently; a model should learn it misspelled one
                raise ToolError(f"Error executing tool {name}: [spec_invalid] unknown argument(s) "
                                f"{', '.join(unknown)}\nhint: valid arguments: {', '.join(known) or 'none'}")
        try:
            return compact(await super().call_tool(name, arguments, context))
        except ToolError as err:
            cause = err.__cause__
            if isinstance(cause, ValidationError):
                raise ToolError(self._explain(name, cause)) from None
            if str(err).startswith("Unknown tool"):
                tools = ", ".join(t.name for t in self._tool_manager.list_tools())
                raise ToolError(f"{err}\nhint: the tools are {tools}") from None
            raise

    def _explain(self, name: str, error: ValidationError) -> str:
        tool = self._tool_manager.get_tool(name)
        properties = (tool.parameters if tool else {}).get("properties", {})
        lines, hints = [], []
        for item in error.errors()[:5]:
            field = str(item["loc"][0]) if item["loc"] else ""
            where = ".".join(str(p) for p in item["loc"]) or "arguments"
            got = "" if item["type"] == "missing" else f" (got {repr(item.get('input'))[:60]})"
            lines.append(f"{where}: {item['msg']}{got}")
            described = properties.get(field, {}).get("description")
            if described:
                hints.append(f"{field}: {described}")
            elif field and field not in properties:
                hints.append(f"valid arguments: {', '.join(properties) or 'none'}")
        hint = "; ".join(dict.fromkeys(hints)) or "check the tool's input schema"
        return f"Error executing tool {name}: [spec_invalid] invalid arguments: " + "; ".join(lines) + f"\nhint: fix and call again. {hint}"


def compact(result: Any) -> Any:
    """A tool result whose text is the structured content as compact JSON for a model to read:
    no indentation, no null or empty fields, times as ISO 8601 only (the structured content
    keeps every field, Unix seconds beside their ``*_iso`` twins, for programs). A result
    that wrote its own text (logs) is left as it is."""
    structured = getattr(result, "structured_content", None)
    content = getattr(result, "content", None)
    if structured is None or getattr(result, "is_error", False) or not content or len(content) != 1 \
            or not isinstance(content[0], TextContent):
        return result
    try:
        same = json.loads(content[0].text) == structured
    except ValueError:
        same = False
    if not same:
        return result
    text = json.dumps(_for_model(structured), separators=(",", ":"), ensure_ascii=False, default=str)
    return result.model_copy(update={"content": [TextContent(type="text", text=text)]})


def _for_model(value: Any, top: bool = True) -> Any:
    """``value`` without null or empty fields, but for a result's first field, its answer: an empty
    list of jobs reads ``{"jobs":[]}``, not ``{}``, which says nothing."""
    if isinstance(value, list):
        return [_for_model(v, False) for v in value]
    if not isinstance(value, dict):
        return value
    out = {}
    first = next(iter(value), None) if top else None
    for key, item in value.items():
        if isinstance(key, str) and f"{key}_iso" in value:
            continue  # the ISO twin says it for a reader
        if item is None or item == "" or (key != first and (item == [] or item == {})):
            continue
        name = key[:-4] if isinstance(key, str) and key.endswith("_at_iso") else key
        out[name] = _for_model(item, False)
    return out


def build_server(api: Any = None, *, home: str | os.PathLike[str] | None = None, read_only: bool = False,
                 project: str | None = None, root: str | os.PathLike[str] | None = None,
                 token_verifier: Any = None, resource_url: str = "http://127.0.0.1:8765/mcp",
                 log_level: str = "WARNING", families: tuple[str, ...] | None = None,
                 backend: str | None = None) -> AutoresearchMCP:
    """The server with every available tool family registered on one shared :class:`Api`."""
    if api is None:
        from autoresearch.api import Api

        api = Api(home, backend)  # backend: a profile or kind (None: the home's default)
    auth = None
    if token_verifier is not None:
        from mcp.server.auth.settings import AuthSettings
        from pydantic import AnyHttpUrl

        # Static bearer tokens, no OAuth: without a resource_server_url the SDK neither serves
        # protected-resource metadata nor points a 401 at an authorization server that is not there.
        base = resource_url.rsplit("/mcp", 1)[0]
        auth = AuthSettings(issuer_url=AnyHttpUrl(base), resource_server_url=None, validate_token_resource=False)
    server = AutoresearchMCP("autoresearch", instructions=INSTRUCTIONS, token_verifier=token_verifier, auth=auth,
                             log_level=log_level.upper(), version=_version())  # type: ignore[arg-type]
    ctx = ToolContext(api=api, read_only=read_only, project=project, root=Path(root or os.getcwd()).resolve(),
                      authenticated=token_verifier is not None,
                      tenant_hide=tuple(str(p) for p in [getattr(token_verifier, "path", None)] if p))
    for name in available_families(families):
        import_module(name).register(server, ctx)
    server.autoresearch_ctx = ctx  # type: ignore[attr-defined]
    return server


def server_api(server: AutoresearchMCP) -> Any:
    return server.autoresearch_ctx.api  # type: ignore[attr-defined]


def available_families(families: tuple[str, ...] | None = None) -> list[str]:
    """Module names of the families that are installed (a bare name lives in this package)."""
    found = []
    for family in FAMILIES if families is None else families:
        name = family if "." in family else f"autoresearch.tools.{family}"
        try:
            present = find_spec(name) is not None
        except ImportError:
            present = False
        if present:
            found.append(name)
    return found


def _version() -> str:
    from autoresearch import __version__

    return __version__


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def run_passes(api: Any) -> Any:
    """A daemon thread that hears attempt endings (the runtime's watcher) and runs the pass.

    A long-lived server is the natural listener: while it runs, finishing attempts poke it
    instead of each starting an interpreter for the pass (see docs/DESIGN-NOTES.md).
    Returns the stop event; the thread closes its watcher itself once it is set.
    """
    import atexit
    import threading

    watcher = api.watch()
    stop = threading.Event()

    def loop() -> None:
        owed = False  # a pass failed after it took its pokes' names: the next one polls every attempt
        try:
            while not stop.is_set():
                try:
                    if watcher.wait(0.5):
                        named = watcher.take()  # what its pokes named: polled with the starting ones
                        only, owed = (None if owed else named), True  # (owed until this pass is done)
                        api.tick(only=only)
                        owed = False
                except Exception:  # noqa: BLE001 - keep listening; supervisors fall back on their own
                    log.exception("scheduling pass failed")
        finally:
            watcher.close()

    def last_pass() -> None:  # endings we were poked about must not wait for the next caller
        stop.set()
        try:
            api.tick(wait=False)
        except Exception:  # noqa: BLE001 - exiting anyway; supervisors fall back after ACK_WAIT_S
            pass

    atexit.register(last_pass)
    threading.Thread(target=loop, name="autoresearch-passes", daemon=True).start()
    return stop


def run_stdio(**options: Any) -> None:
    import anyio

    server = build_server(**options)
    run_passes(server_api(server))
    anyio.run(server.run_stdio_async)


def run_http(host: str = "127.0.0.1", port: int = 8765, tokens_file: str | None = None, **options: Any) -> None:
    """Streamable HTTP at ``/mcp``; bearer tokens when ``tokens_file`` is given."""
    import uvicorn

    verifier = None
    if tokens_file:
        from autoresearch.tools.auth import FileTokenVerifier

        verifier = FileTokenVerifier(tokens_file)
    elif not is_loopback(host):
        raise AuthError(f"refusing to serve HTTP on {host} without tokens: anyone who can reach it could run jobs",
                        hint="set AUTORESEARCH_TOKENS to a file of 'TOKEN PROJECT' lines, or bind --host 127.0.0.1")
    server = build_server(token_verifier=verifier, resource_url=f"http://{host}:{port}/mcp", **options)
    if verifier is not None:  # tenants' jobs run in a sandbox without privilege, or the server does not start
        server_api(server).check_tenant_sandbox()
    run_passes(server_api(server))
    app = server.streamable_http_app(host=host, json_response=True)
    level = str(options.get("log_level", "WARNING")).lower()
    print(f"autoresearch MCP server on http://{host}:{port}/mcp"
          f"{' (bearer tokens)' if verifier else ' (no auth: loopback only)'}"
          f"{' read-only' if options.get('read_only') else ''}", file=sys.stderr, flush=True)
    uvicorn.run(app, host=host, port=port, log_level=level, access_log=False)
