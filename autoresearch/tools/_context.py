"""What every tool family shares: the facade, the caller's project, and error mapping.

Tools never raise anything but :class:`ToolError` at a model: an
:class:`AutoresearchError` becomes an ``is_error`` result carrying its message and
hint; an unexpected exception is logged with its traceback on the server (stderr)
and the model sees one line saying so.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, ParamSpec, TypeVar

from mcp.server.mcpserver.exceptions import ToolError

from autoresearch.errors import AuthError, AutoresearchError, SpecError

log = logging.getLogger("autoresearch.tools")

P = ParamSpec("P")
R = TypeVar("R")


@dataclass
class ToolContext:
    """Per-server state handed to each family's ``register``.

    ``project`` is the fixed scope of a stdio server (``None``: every job). On an
    HTTP server with tokens, the caller's token decides the project per request.
    """

    api: Any  # autoresearch.api.Api; Any so mypy does not chase the runtime import
    read_only: bool = False
    project: str | None = None
    root: Path = field(default_factory=Path.cwd)
    authenticated: bool = False
    # Paths a tenant's jobs must not see (the tokens file); docs/security.md.
    tenant_hide: tuple[str, ...] = ()
    submits: Any = None  # the jobs family's SubmitBatcher (tools/_batch.py)
    _tenants: set[str] = field(default_factory=set)
    _root_memo: tuple[Path, Path] | None = None  # (root, root resolved): resolved once, not per call

    def caller_project(self) -> str | None:
        """The project this request may see: the token's, else the server's."""
        if not self.authenticated:
            return self.project
        from mcp.server.auth.middleware.auth_context import get_access_token

        token = get_access_token()
        if token is None:  # the bearer middleware refuses these before any tool runs
            raise AuthError("this request carries no valid token", hint="send Authorization: Bearer <token>")
        if token.client_id not in self._tenants and not self.read_only:
            # Before anything of this project can run: its jobs (and its loops' trials) are tenant jobs.
            self.api.register_tenant(token.client_id, self.tenant_hide)
            self._tenants.add(token.client_id)
        return token.client_id

    def submit_project(self) -> str:
        return self.caller_project() or ""

    def project_known(self) -> bool:
        """True when :meth:`caller_project` needs no ledger write (no tenant to register first):
        an async tool may then call it on the event loop."""
        if not self.authenticated or self.read_only:
            return True
        from mcp.server.auth.middleware.auth_context import get_access_token

        token = get_access_token()
        return token is None or token.client_id in self._tenants

    def require_write(self, tool: str) -> None:
        if self.read_only:
            raise AuthError(f"{tool} is refused: this server was started with --read-only",
                            hint="use the read tools (status, logs, metrics, list_jobs, cluster_status), "
                                 "or ask the operator for a server without --read-only")

    def relative_path(self, value: str, argument: str) -> str:
        """Resolve a path-like argument inside the server's root; refuse absolute paths and ``..``."""
        text = value.strip()
        if not text:
            raise SpecError(f"{argument} is empty", hint=f"pass a path relative to {self.root}, e.g. '.'")
        if "\0" in text:
            raise SpecError(f"{argument} contains a NUL byte", hint="pass a plain relative path, e.g. 'src'")
        pure = PurePosixPath(text)
        if text.startswith("~") or pure.is_absolute() or ".." in pure.parts:
            raise SpecError(f"{argument} {value!r} must be a relative path without '..'",
                            hint=f"paths are relative to the server's root {self.root}; e.g. 'src' or '.'")
        if not pure.parts:  # '.', the default of every submit: the root itself
            return str(self.resolved_root())
        return self.inside_root(self.root / pure, argument, value)

    def resolved_root(self) -> Path:
        """The root with its symlinks resolved, once (the root is fixed for the server's life)."""
        if self._root_memo is None or self._root_memo[0] is not self.root:
            self._root_memo = (self.root, self.root.resolve())
        return self._root_memo[1]

    def inside_root(self, path: str | Path, argument: str, value: object = None) -> str:
        """``path`` resolved, or a :class:`SpecError` when it (or a symlink on the way) leaves the root."""
        resolved = Path(path).resolve()
        root = self.resolved_root()
        if resolved != root and root not in resolved.parents:  # '..', an absolute path, or a symlink out
            shown = value if value is not None else str(path)
            raise SpecError(f"{argument} {shown!r} leads outside the server's root",
                            hint=f"use a path that stays inside {root}")
        return str(resolved)


def tool_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn facade errors into ``is_error`` results with the hint; never show a traceback.
    Works on a coroutine function too (the wrapper is then one)."""
    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def awrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
            try:
                return await fn(*args, **kwargs)
            except ToolError:
                raise
            except Exception as err:  # noqa: BLE001 - mapped below, never a traceback
                raise _tool_error(fn.__name__, err) from None

        return awrapper  # type: ignore[return-value]

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except ToolError:
            raise
        except Exception as err:  # noqa: BLE001 - mapped below, never a traceback
            raise _tool_error(fn.__name__, err) from None

    return wrapper


def _tool_error(name: str, err: Exception) -> ToolError:
    if isinstance(err, AutoresearchError):
        return ToolError(f"[{err.code}] {err.render()}")
    # a bug must not reach the model as a traceback
    log.error("tool %s crashed", name, exc_info=err)
    return ToolError(f"[internal] {name} failed unexpectedly ({type(err).__name__}); "
                     "the server log has the details\nhint: retry once; if it fails again, "
                     "report it with the server's stderr")
