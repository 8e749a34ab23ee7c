"""A small Kubernetes API client on the stdlib (``urllib``), for ``backends/kubernetes.py``.

Only what the backend calls: JSON requests to the API server with a bearer token, a CA
bundle and a timeout, and the pod log as bytes. Where to connect comes from the backend's
options (``api``, ``token``/``token_file``, ``ca_file``, ``insecure``), else a kubeconfig
(``kubeconfig`` option, ``$KUBECONFIG``, ``~/.kube/config``: its current context, token or
client certificate), else the in-cluster service account. The ``kubernetes`` package is not
needed (invariant 7: a trial start never imports it).

Errors a user can act on are :class:`BackendError` with a hint: the API unreachable (the
address tried), 401/403 (the token), anything else the API refused (its own message).
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from autoresearch.errors import AuthError, BackendError, SpecError

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
KIT_HINT = "see backends/kubernetes/README.md to set up the namespace and Kueue queues"


@dataclass
class Connection:
    api: str
    token: str = ""
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    insecure: bool = False
    namespace: str = ""


def connection(api: str = "", token: str = "", token_file: str = "", ca_file: str = "", insecure: bool = False,
               kubeconfig: str = "", context: str = "") -> Connection:
    """Where and how to connect: explicit options win, then a kubeconfig, then in-cluster."""
    if token_file:
        token = _read_text(token_file, "token_file")
    if api:
        return Connection(api.rstrip("/"), token=token, ca_file=ca_file, insecure=insecure)
    path = kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or str(Path.home() / ".kube" / "config")
    if kubeconfig or Path(path).is_file():
        conn = _from_kubeconfig(path, context)
        conn.token = token or conn.token
        conn.ca_file = ca_file or conn.ca_file
        conn.insecure = insecure or conn.insecure
        return conn
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if host and (SERVICE_ACCOUNT / "token").is_file():
        return Connection(f"https://{host}:{port}", token=token or _read_text(str(SERVICE_ACCOUNT / "token"), "token"),
                          ca_file=ca_file or str(SERVICE_ACCOUNT / "ca.crt"),
                          namespace=_read_text(str(SERVICE_ACCOUNT / "namespace"), "namespace"))
    raise SpecError("the kubernetes backend has no API server to talk to",
                    hint="set backend option api: https://HOST:6443 (and token_file, ca_file), or point kubeconfig / "
                         "$KUBECONFIG at a kubeconfig file")


def _read_text(path: str, what: str) -> str:
    try:
        return Path(path).expanduser().read_text().strip()
    except OSError as err:
        raise SpecError(f"kubernetes {what} {path!r} cannot be read: {err.strerror}",
                        hint=f"pass a readable file as {what}") from None


def _from_kubeconfig(path: str, context: str) -> Connection:
    import yaml  # only when a kubeconfig is used

    try:
        config = yaml.safe_load(Path(path).expanduser().read_text()) or {}
    except (OSError, yaml.YAMLError) as err:
        raise SpecError(f"kubeconfig {path!r} cannot be read: {err}", hint="pass api: and token_file: instead") from None
    if not isinstance(config, dict):
        raise SpecError(f"kubeconfig {path!r} is not a mapping", hint="pass api: and token_file: instead")

    def named(kind: str, name: str) -> dict[str, Any]:
        for item in config.get(kind) or []:
            if isinstance(item, dict) and item.get("name") == name:
                return dict(item.get(kind[:-1]) or {})
        raise SpecError(f"kubeconfig {path!r} has no {kind[:-1]} {name!r}", hint="pick one with the context option")

    ctx = named("contexts", context or str(config.get("current-context") or ""))
    cluster, user = named("clusters", str(ctx.get("cluster", ""))), named("users", str(ctx.get("user", "")))
    base = Path(path).expanduser().parent
    ca = _material(cluster, "certificate-authority", base)
    return Connection(str(cluster.get("server", "")).rstrip("/"), token=str(user.get("token") or ""), ca_file=ca,
                      cert_file=_material(user, "client-certificate", base),
                      key_file=_material(user, "client-key", base),
                      insecure=bool(cluster.get("insecure-skip-tls-verify")), namespace=str(ctx.get("namespace") or ""))


def _material(section: dict[str, Any], key: str, base: Path) -> str:
    """A file path for a kubeconfig's ``key`` or ``key-data`` (base64, written to a private file)."""
    if section.get(key):
        return str(base / str(section[key]))
    data = section.get(f"{key}-data")
    if not data:
        return ""
    import base64
    import hashlib
    import tempfile

    raw = base64.b64decode(str(data))
    out = Path(tempfile.gettempdir()) / f"autoresearch-kube-{os.getuid()}-{hashlib.sha256(raw).hexdigest()[:16]}"
    if not out.exists():
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
    return str(out)


class ApiError(Exception):
    """A response the caller may handle (404, 409, 422, ...): status and the API's message."""

    def __init__(self, status: int, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.status, self.message, self.reason = status, message, reason


class Client:
    """JSON over HTTP(S) to one API server; every call bounded by ``timeout`` seconds."""

    def __init__(self, conn: Connection, timeout: float = 10.0) -> None:
        self.conn, self.timeout = conn, timeout
        self._context: ssl.SSLContext | None = None
        if conn.api.startswith("https://"):
            ctx = ssl.create_default_context(cafile=conn.ca_file or None)
            if conn.insecure:
                ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
            if conn.cert_file:
                ctx.load_cert_chain(conn.cert_file, conn.key_file or None)
            self._context = ctx

    def call(self, method: str, path: str, body: Any = None, query: dict[str, Any] | None = None,
             content_type: str = "application/json") -> Any:
        raw = self.raw(method, path, body, query, content_type)
        return json.loads(raw) if raw else {}

    def raw(self, method: str, path: str, body: Any = None, query: dict[str, Any] | None = None,
            content_type: str = "application/json", sink: BinaryIO | None = None) -> bytes:
        """The response body; with ``sink``, copied there in chunks instead (a log of any size)."""
        url = self.conn.api + path
        if query:
            url += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Accept": "application/json", "User-Agent": "autoresearch"}
        if data is not None:
            headers["Content-Type"] = content_type
        if self.conn.token:
            headers["Authorization"] = f"Bearer {self.conn.token}"
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout, context=self._context) as response:
                if sink is None:
                    out: bytes = response.read()
                    return out
                while chunk := response.read(1 << 20):
                    sink.write(chunk)
                return b""
        except urllib.error.HTTPError as err:
            raise self._error(err) from None
        except (urllib.error.URLError, OSError, ValueError) as err:
            reason = getattr(err, "reason", err)
            raise BackendError(f"the Kubernetes API server at {self.conn.api} does not answer ({reason})",
                               hint="check the api option / kubeconfig and that the cluster is up "
                                    f"(kubectl --server {self.conn.api} version); {KIT_HINT}") from None

    def _error(self, err: urllib.error.HTTPError) -> Exception:
        try:
            status = json.loads(err.read() or b"{}")
        except (ValueError, OSError):
            status = {}
        message = str(status.get("message") or err.reason or "")[:500] if isinstance(status, dict) else ""
        reason = str(status.get("reason") or "") if isinstance(status, dict) else ""
        if err.code == 401:
            return AuthError(f"the Kubernetes API server at {self.conn.api} refused the token (401 Unauthorized)",
                             hint="pass a valid bearer token (token_file, or a kubeconfig user with a token); "
                                  "a service account token: kubectl create token SERVICE_ACCOUNT")
        if err.code == 403:
            return AuthError(f"the Kubernetes API server at {self.conn.api} forbids this: {message}",
                             hint="grant the token's account the Role in backends/kubernetes/ (create/get/delete "
                                  "jobs, get/list/delete pods and pods/log in the namespace)")
        return ApiError(err.code, message, reason)
