"""The MCP server for coding agents: a thin layer over :class:`autoresearch.api.Api`.

One module per tool family, each exposing ``register(server, ctx)``; ``server.py``
composes them (and ``loop.py`` when the loop package provides it). Importing this
package is free: the SDK is imported only by the modules that build a server.
"""
