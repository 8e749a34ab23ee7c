"""What a tokened server lends a tenant's loop: ``tenants:`` in ``$AUTORESEARCH_HOME/config.yaml``.

    tenants:
      llm_base_urls:                 # the only endpoints a tenant plan's proposer.base_url may name
        - http://127.0.0.1:8000/v1   # (a URL under one of them, at a '/' boundary, is allowed too)
      grants:                        # variables of the server's environment a project's loops get
        team-a: [OPENAI_API_KEY]

A tenant's loop controller runs our code on the tenant's plan, outside any sandbox, so the plan
must not be able to steer the server's secrets: it starts from a clean environment
(:func:`controller_env`: where programs are, the locale, autoresearch's and MLflow's own settings,
plus the project's grants), its ``proposer.api_key_env`` may name a granted variable only, and its
``proposer.base_url`` must be one of ``llm_base_urls`` (:func:`check_plan`). docs/security.md says
the whole trust model. The file is read (and cached) by ``backends/profiles.py``
(``profiles.tenancy(home)``), which calls :func:`parse`; this module never imports it.

Stdlib only, no YAML: the controller and the server import it.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from autoresearch.errors import AuthError, SpecError, check_section

_KEYS = ("llm_base_urls", "grants")
EXAMPLE = "tenants: {llm_base_urls: [http://127.0.0.1:8000/v1], grants: {PROJECT: [OPENAI_API_KEY]}}"
_VAR = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
MAX_ENTRIES = 10_000
# What a tenant's controller keeps of the server's environment besides its grants: where programs and
# our package are, who and where it runs, the locale; autoresearch's own settings (never the tokens
# file's name) and the MLflow mirror's (the server's tracking store, which no plan can redirect).
KEEP = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TERM", "SHELL", "TMPDIR",
        "PYTHONPATH", "VIRTUAL_ENV")
KEEP_PREFIXES = ("LC_", "AUTORESEARCH_", "MLFLOW_")
NEVER = ("AUTORESEARCH_TOKENS",)
_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class Tenancy:
    """The ``tenants:`` section: allowed LLM endpoints and per-project grants."""

    llm_base_urls: tuple[str, ...] = ()
    grants: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def granted(self, project: str) -> tuple[str, ...]:
        return self.grants.get(project, ())


def parse(raw: Any) -> Tenancy:
    """The ``tenants:`` section -> :class:`Tenancy`; SpecError naming the bad key."""
    if raw is None:
        return Tenancy()
    check_section(raw, "tenants", _KEYS, EXAMPLE)
    urls = raw.get("llm_base_urls") or []
    if not isinstance(urls, list) or len(urls) > MAX_ENTRIES:
        raise SpecError("tenants.llm_base_urls must be a list of http(s) URLs", hint=f"write {EXAMPLE}")
    for url in urls:
        try:
            endpoint(url)
        except ValueError as err:
            raise SpecError(f"tenants.llm_base_urls: {str(url)[:100]!r} {err}",
                            hint="write a plain URL such as http://127.0.0.1:8000/v1") from None
    grants = raw.get("grants") or {}
    if not isinstance(grants, dict) or len(grants) > MAX_ENTRIES:
        raise SpecError("tenants.grants must be a mapping of project -> [VARIABLE, ...]", hint=f"write {EXAMPLE}")
    out: dict[str, tuple[str, ...]] = {}
    for project, names in grants.items():
        if not isinstance(project, str) or not project or len(project) > 200 or any(ord(c) < 32 for c in project):
            raise SpecError(f"tenants.grants: {str(project)[:60]!r} is not a project name",
                            hint="use the project name of the token (the second field of a tokens line)")
        if names is None:
            names = []
        if not isinstance(names, list) or not all(isinstance(n, str) and _VAR.fullmatch(n) for n in names):
            raise SpecError(f"tenants.grants.{project[:60]} must be a list of environment variable names",
                            hint=f"write {project[:60]}: [OPENAI_API_KEY]")
        if any(n in NEVER for n in names):
            raise SpecError(f"tenants.grants.{project[:60]} grants AUTORESEARCH_TOKENS",
                            hint="the tokens file is never a tenant's; remove it from the grant")
        out[project] = tuple(dict.fromkeys(names))
    return Tenancy(tuple(str(u) for u in urls), out)


def endpoint(url: object) -> tuple[str, str, int, str]:
    """``url`` as (scheme, host, port, path), compared by value; ValueError for anything but a plain URL.

    Refused: other schemes, userinfo (``http://allowed@evil``), a query or fragment, percent
    escapes, backslashes, blanks and control characters, ``.``/``..`` path segments. Lower-cased
    scheme and host, one trailing dot of the host dropped, IP literals in their canonical form
    (``[0:0::1]`` is ``[::1]``), the scheme's default port made explicit."""
    if not isinstance(url, str) or not url or len(url) > 2000:
        raise ValueError("is not a URL")
    if any(ord(c) <= 32 or ord(c) == 127 for c in url) or "\\" in url or "%" in url:
        raise ValueError("holds blanks, control characters, backslashes or percent escapes")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as err:
        raise ValueError(f"is not a URL ({err})") from None
    scheme = parts.scheme.lower()
    if scheme not in _PORTS:
        raise ValueError("is not an http or https URL")
    if "@" in parts.netloc:
        raise ValueError("carries a user name or password (user@host)")
    if parts.query or parts.fragment or url.rstrip().endswith(("?", "#")):
        raise ValueError("has a query or fragment")
    host = (parts.hostname or "").lower()
    if host.endswith("."):
        host = host[:-1]
    if not host:
        raise ValueError("has no host")
    try:
        host = ipaddress.ip_address(host).compressed
    except ValueError:
        if not re.fullmatch(r"[a-z0-9-]+(\.[a-z0-9-]+)*", host):
            raise ValueError("has a host that is neither a name nor an IP address") from None
    segments = [s for s in parts.path.split("/") if s]
    if any(s in (".", "..") for s in segments):
        raise ValueError("has '.' or '..' in its path")
    return scheme, host, port if port is not None else _PORTS[scheme], "/" + "/".join(segments)


def allowed_url(url: object, allowed: tuple[str, ...]) -> bool:
    """Whether ``url`` is one of ``allowed`` or beneath one (at a ``/`` boundary)."""
    scheme, host, port, path = endpoint(url)
    for entry in allowed:
        a_scheme, a_host, a_port, a_path = endpoint(entry)
        if (scheme, host, port) == (a_scheme, a_host, a_port) and (
                path == a_path or path.startswith(a_path.rstrip("/") + "/")):
            return True
    return False


def check_plan(plan: Any, project: str, tenancy: Tenancy, where: str = "config.yaml") -> None:
    """Refuse a tenant's plan that names a server variable or an endpoint outside the allow-list."""
    data = plan.model_dump() if hasattr(plan, "model_dump") else plan
    proposer = (data or {}).get("proposer") or {}
    if not isinstance(proposer, dict):
        return
    granted = tenancy.granted(project)
    env = proposer.get("api_key_env")
    if env is not None and env not in granted:
        names = f" (granted to it: {', '.join(granted)})" if granted else ""
        raise AuthError(f"proposer.api_key_env names ${str(env)[:100]}, a variable of the server; a tenant's plan "
                        f"may name only what the server grants its project {project!r}{names}",
                        hint=f"ask the operator to add it to tenants.grants.{project} in {where}, drop "
                             "api_key_env, or search without an LLM: proposer: {kind: tpe}")
    prompt = proposer.get("prompt")
    if prompt is not None and (not isinstance(prompt, str) or not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}",
                                                                             prompt) or ".." in prompt):
        raise AuthError(f"proposer.prompt {str(prompt)[:100]!r} is a path; a tenant's plan may name only a "
                        "template of the server's prompts/ folder", hint="write a template's name, e.g. "
                        "prompt: propose_params, or ask the operator to install yours in prompts/")
    url = proposer.get("base_url")
    if url is None:
        return
    try:
        ok = allowed_url(url, tenancy.llm_base_urls)
    except ValueError as err:
        raise AuthError(f"proposer.base_url {str(url)[:200]!r} {err}",
                        hint="write a plain http(s) URL the server allows (tenants.llm_base_urls)") from None
    if not ok:
        listed = ", ".join(tenancy.llm_base_urls) or "none"
        raise AuthError(f"proposer.base_url {str(url)[:200]!r} is not an endpoint this server lets tenants call "
                        f"(allowed: {listed})",
                        hint=f"use one of the allowed endpoints, ask the operator to add it to "
                             f"tenants.llm_base_urls in {where}, or drop base_url")


def controller_env(environ: Mapping[str, str], project: str, tenancy: Tenancy) -> dict[str, str]:
    """The environment of a tenant's loop controller: :data:`KEEP` and :data:`KEEP_PREFIXES` of
    the server's, plus the variables granted to ``project``; never the tokens file's name."""
    granted = set(tenancy.granted(project))
    return {k: v for k, v in environ.items()
            if k not in NEVER and (k in KEEP or k.startswith(KEEP_PREFIXES) or k in granted)}
