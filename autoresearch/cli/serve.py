"""``autoresearch serve``: the MCP server for coding agents (:mod:`autoresearch.tools`).

Imported on every CLI call, so only argparse at the top; the SDK is imported by ``run``.
"""

from __future__ import annotations

import argparse
import os


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("serve", help="serve the MCP tools to coding agents (stdio; --http for HTTP)",
                       description="Serve submit/status/logs/metrics/cancel/list_jobs/cluster_status over MCP. "
                                   "stdio by default (for `claude mcp add autoresearch -- autoresearch serve`); "
                                   "--http serves streamable HTTP at /mcp with bearer tokens from "
                                   "$AUTORESEARCH_TOKENS ('TOKEN PROJECT' per line).")
    p.add_argument("--http", action="store_true", help="serve streamable HTTP at /mcp instead of stdio")
    p.add_argument("--host", default="127.0.0.1", help="HTTP bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8765, help="HTTP port (default 8765)")
    p.add_argument("--tokens", default=None, metavar="FILE",
                   help="tokens file (default $AUTORESEARCH_TOKENS); required off loopback")
    p.add_argument("--read-only", action="store_true", help="refuse submit and cancel, whatever the token")
    p.add_argument("--project", default=None,
                   help="stdio / tokenless HTTP: see and submit only this project's jobs (default: all jobs)")
    p.add_argument("--root", default=None,
                   help="directory that submit's workdir and mounts are relative to (default: the current one)")
    p.add_argument("--backend", default=None, metavar="NAME",
                   help="a backend profile (config.yaml) or kind that submits go to (default: "
                        "$AUTORESEARCH_BACKEND, config.yaml's default, local)")
    p.add_argument("--log-level", default="WARNING", choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                   help="server log level on stderr (default WARNING)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from autoresearch.errors import SpecError

    if not 0 < args.port < 65536:
        raise SpecError(f"--port {args.port} is not a port", hint="use 1..65535, e.g. --port 8765")
    if args.root is not None and not os.path.isdir(args.root):
        raise SpecError(f"--root {args.root!r} is not a directory", hint="pass an existing directory")
    options = {"home": args.home, "read_only": args.read_only, "project": args.project, "root": args.root,
               "log_level": args.log_level, "backend": args.backend}
    from autoresearch.tools.server import run_http, run_stdio

    if args.http:
        tokens = args.tokens or os.environ.get("AUTORESEARCH_TOKENS") or None
        run_http(host=args.host, port=args.port, tokens_file=tokens, **options)
    else:
        run_stdio(**options)
    return 0
