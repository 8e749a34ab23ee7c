"""``autoresearch backends``: every profile and kind, what it can do, and whether it answers.

Like ``sky check``: each backend is built and probed (:meth:`Backend.probe`, then its
``nodes()``) in its own daemon thread under one deadline, so a hanging engine costs the
timeout once, not once per backend, and never keeps the command from exiting.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from autoresearch.backends import backend_names, open_backend
from autoresearch.backends import profiles as P
from autoresearch.errors import AutoresearchError

CAPABILITIES = ("gpus", "preemption", "multi_node", "containers", "logs_follow", "places", "sandbox")


@dataclass
class BackendCheck:
    name: str
    kind: str
    profile: bool  # from config.yaml (else a kind with its default options)
    default: bool  # what a submit that names no backend uses
    options: dict[str, Any] = field(default_factory=dict)  # secret-named values masked
    capabilities: list[str] = field(default_factory=list)  # the flags it has
    ok: bool | None = None  # None: not probed
    nodes: int | None = None
    gpus: int | None = None
    seconds: float | None = None
    error: str = ""
    hint: str = ""


def check(home: str | os.PathLike[str] | None = None, probe: bool = True, timeout: float = 10.0) -> list[BackendCheck]:
    """Profiles first (config order), then the kinds no profile shadows (simulated ones left out).

    A broken config.yaml raises its SpecError (the CLI exits 2)."""
    config = P.load(home)
    default = P.default_name(home)
    rows = [BackendCheck(p.name, p.kind, True, p.name == default, _masked(p.options)) for p in config.profiles.values()]
    for kind in backend_names():
        if kind not in config.profiles and not _simulated(kind):
            rows.append(BackendCheck(kind, kind, False, kind == default))
    threads = []
    for row in rows:
        thread = threading.Thread(target=_probe_one, args=(row, home, probe), daemon=True, name=f"probe-{row.name}")
        thread.start()
        threads.append((row, thread))
    deadline = time.monotonic() + timeout
    out = []
    for row, thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive() and probe:
            row.ok, row.seconds = False, timeout
            row.error = f"no answer within {timeout:g}s"
            row.hint = row.hint or f"is the engine up? see backends/{row.kind}/README.md to start a dev one"
        out.append(row)
    return out


def _simulated(kind: str) -> bool:
    """A test double (the fake) is never offered to a user."""
    from autoresearch.backends import _factory

    try:
        return bool(getattr(_factory(kind), "simulated", False))
    except Exception:  # noqa: BLE001 - a plugin that fails to load is listed, with its error
        return False


def _probe_one(row: BackendCheck, home: str | os.PathLike[str] | None, probe: bool) -> None:
    start = time.monotonic()
    try:
        backend = open_backend(row.name, home)
        row.capabilities = [c for c in CAPABILITIES if getattr(backend.capabilities, c, False)]
        if not probe:
            return
        backend.probe()
        nodes = backend.nodes()
        row.nodes, row.gpus = len(nodes), sum(len(n.gpu_ids) for n in nodes)
        row.ok = True
        backend.close()
    except AutoresearchError as err:
        row.ok, row.error, row.hint = False, err.message, err.hint
    except ImportError as err:
        row.ok, row.error = False, f"cannot load the {row.kind} backend: {err}"
        row.hint = f"install its extra: pip install 'autoresearch[{row.kind}]'"
    except Exception as err:  # noqa: BLE001 - a broken backend is a row of the listing, not a crash of it
        row.ok, row.error = False, f"{type(err).__name__}: {str(err)[:300]}"
        row.hint = f"see backends/{row.kind}/README.md"
    finally:
        if row.ok is not None:
            row.seconds = round(time.monotonic() - start, 3)


def _masked(options: dict[str, Any]) -> dict[str, Any]:
    from autoresearch.util.redact import MARK, is_secret

    return {k: MARK if is_secret(k) else v for k, v in options.items()}


def as_dict(row: BackendCheck) -> dict[str, Any]:
    return dataclasses.asdict(row)
