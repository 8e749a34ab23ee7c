"""The Kubernetes API for ``backends/kubernetes.py``, through lightkube (the ``[kubernetes]`` extra).

lightkube (a maintained client on httpx) builds every request: the resource paths, the
kubeconfig (contexts, ``*-data`` material, ``exec`` credential plugins, token files re-read
when the kubelet rotates them), in-cluster service accounts, TLS and bearer auth. This module
only picks the configuration from the backend's options and turns the client's answers into
plain dicts and its failures into :class:`BackendError` / :class:`AuthError` with a hint.

Where to connect: the ``api`` option (with ``token``/``token_file``, ``ca_file``, ``insecure``),
else a kubeconfig (``kubeconfig`` option, ``$KUBECONFIG``, ``~/.kube/config``), else the
in-cluster service account. Without lightkube installed the backend refuses at its first use
with a hint to install the extra; there is no second, hand-written client to keep in step.

Invariant 7: lightkube (and httpx2, the resource models: ~0.5 s) is imported on the first API
call of a backend instance, never by importing this module, so loading profiles, submitting
to another engine or reading an ended attempt's status and log never pays for it.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from autoresearch.errors import AuthError, BackendError, SpecError

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
KIT_HINT = "see backends/kubernetes/README.md to set up the namespace and Kueue queues"
EXTRA_HINT = "pip install 'autoresearch[kubernetes]' (the lightkube client)"
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")  # what may stand in a request's path
_NO_SERVER_HINT = ("set backend option api: https://HOST:6443 (and token_file, ca_file), or point kubeconfig / "
                   "$KUBECONFIG at a kubeconfig file")


def _lightkube() -> Any:
    try:
        import lightkube
    except ImportError:
        raise SpecError("the kubernetes backend needs the lightkube package, which is not installed",
                        hint=EXTRA_HINT) from None
    return lightkube


class ApiError(Exception):
    """A response the caller may handle (404, 409, 422, ...): status and the API's message."""

    def __init__(self, status: int, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.status, self.message, self.reason = status, message, reason


def connection(api: str = "", token: str = "", token_file: str = "", ca_file: str = "", insecure: bool = False,
               kubeconfig: str = "", context: str = "") -> Any:
    """Where and how to connect (a lightkube ``SingleConfig``): explicit options win, then a
    kubeconfig, then in-cluster. A :class:`SpecError` with a hint when none is there or it is broken."""
    _lightkube()
    from lightkube.config.kubeconfig import KubeConfig
    from lightkube.config.models import Cluster, User

    if token_file:
        _read_text(token_file, "token_file")  # unreadable: refused now, with the option's name
    if api:
        user = User(token_file=str(Path(token_file).expanduser())) if token_file else User(token=token or None)
        cluster = Cluster(server=api.rstrip("/"), certificate_auth=ca_file or None, insecure=insecure)
        return KubeConfig.from_one(cluster=cluster, user=user, namespace=None).get()
    config: Any
    path = kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or str(Path.home() / ".kube" / "config")
    if kubeconfig or Path(path).expanduser().is_file():
        config = _from_kubeconfig(path, context)
    elif os.environ.get("KUBERNETES_SERVICE_HOST") and (SERVICE_ACCOUNT / "token").is_file():
        try:
            config = KubeConfig.from_service_account(SERVICE_ACCOUNT).get()
        except Exception as err:  # noqa: BLE001 - lightkube's ConfigError, KeyError, OSError
            raise SpecError(f"the in-cluster service account cannot be read: {err}", hint=_NO_SERVER_HINT) from None
    else:
        raise SpecError("the kubernetes backend has no API server to talk to", hint=_NO_SERVER_HINT)
    import msgspec

    cluster, user = config.cluster, config.user or User()
    if ca_file:
        cluster = msgspec.structs.replace(cluster, certificate_auth=ca_file, certificate_auth_data=None)
    if insecure:
        cluster = msgspec.structs.replace(cluster, insecure=True)
    if token_file:
        user = msgspec.structs.replace(user, token_file=str(Path(token_file).expanduser()), token=None)
    elif token:
        user = msgspec.structs.replace(user, token=token, token_file=None)
    return config._replace(cluster=cluster, user=user)


def _read_text(path: str, what: str) -> str:
    try:
        return Path(path).expanduser().read_text().strip()
    except (OSError, UnicodeDecodeError) as err:
        raise SpecError(f"kubernetes {what} {path!r} cannot be read: {getattr(err, 'strerror', err)}",
                        hint=f"pass a readable file as {what}") from None


def _from_kubeconfig(path: str, context: str) -> Any:
    import yaml  # only when a kubeconfig is used
    from lightkube.config.kubeconfig import KubeConfig

    try:
        raw = yaml.safe_load(Path(path).expanduser().read_text()) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise SpecError(f"kubeconfig {path!r} cannot be read: {err}", hint="pass api: and token_file: instead") from None
    if not isinstance(raw, dict):
        raise SpecError(f"kubeconfig {path!r} is not a mapping", hint="pass api: and token_file: instead")
    try:
        config = KubeConfig.from_dict({"clusters": [], "contexts": [], **raw}, fname=Path(path).expanduser())
    except Exception as err:  # noqa: BLE001 - a malformed entry: msgspec's, lightkube's or a KeyError
        raise SpecError(f"kubeconfig {path!r} is not a kubeconfig lightkube can read: {str(err)[:200]}",
                        hint="check it with kubectl config view, or pass api: and token_file: instead") from None
    name = context or config.current_context or ""
    ctx = config.contexts.get(name)
    if ctx is None:
        raise SpecError(f"kubeconfig {path!r} has no context {name!r}", hint="pick one with the context option")
    if ctx.cluster not in config.clusters:
        raise SpecError(f"kubeconfig {path!r} has no cluster {ctx.cluster!r}", hint="pick one with the context option")
    if ctx.user and ctx.user not in config.users:
        raise SpecError(f"kubeconfig {path!r} has no user {ctx.user!r}", hint="pick one with the context option")
    return config.get(name)


class Client:
    """One API server through a lightkube client; every call bounded by ``timeout`` seconds.

    Objects go in and come out as plain dicts (the manifests of ``_k8s_job.py``, the states read
    by ``_k8s_status.py``); lightkube's resource models are the typed layer in between."""

    def __init__(self, config: Any, timeout: float = 10.0) -> None:
        lightkube = _lightkube()
        import httpx2

        self.config, self.server = config, str(config.cluster.server)
        self.namespace = str(config.context.namespace or "")  # "" when the context names none
        self._httpx = httpx2
        with self.errors():
            self._lk = lightkube.Client(config=config, timeout=httpx2.Timeout(timeout), field_manager="autoresearch")

    # -- the calls the backend makes -----------------------------------------------------------

    def version(self) -> dict[str, Any]:
        with self.errors():
            response = self._lk._client._client.get("version")  # lightkube has no /version call; its httpx client
            self._lk._client.raise_for_status(response)
            answer = response.json()
        return answer if isinstance(answer, dict) else {}

    def get_job(self, ns: str, name: str) -> dict[str, Any]:
        from lightkube.resources.batch_v1 import Job

        _named(ns, name)
        with self.errors():
            return _plain(self._lk.get(Job, name, namespace=ns))

    def create_job(self, ns: str, body: dict[str, Any]) -> dict[str, Any]:
        from lightkube import codecs

        with self.errors():
            return _plain(self._lk.create(codecs.from_dict(body), namespace=ns))

    def annotate_job(self, ns: str, name: str, annotations: dict[str, str]) -> None:
        from lightkube.resources.batch_v1 import Job
        from lightkube.types import PatchType

        _named(ns, name)
        with self.errors():
            self._lk.patch(Job, name, {"metadata": {"annotations": annotations}}, namespace=ns,
                           patch_type=PatchType.MERGE)

    def delete_job(self, ns: str, name: str, grace: int | None) -> None:
        """Background propagation: the garbage collector deletes its pods (each with its own grace)."""
        from lightkube.resources.batch_v1 import Job
        from lightkube.types import CascadeType

        _named(ns, name)
        with self.errors():
            self._lk.delete(Job, name, namespace=ns, grace_period=grace, cascade=CascadeType.BACKGROUND)

    def pods(self, ns: str, labels: dict[str, str]) -> list[dict[str, Any]]:
        from lightkube.resources.core_v1 import Pod

        with self.errors():
            return [_plain(pod) for pod in self._lk.list(Pod, namespace=ns, labels=labels)]

    def delete_pod(self, ns: str, name: str, grace: int | None) -> None:
        from lightkube.resources.core_v1 import Pod

        _named(ns, name)
        with self.errors():
            self._lk.delete(Pod, name, namespace=ns, grace_period=grace)

    def create_service(self, ns: str, body: dict[str, Any]) -> None:
        from lightkube import codecs

        with self.errors():
            self._lk.create(codecs.from_dict(body), namespace=ns)

    def pod_log(self, ns: str, pod: str, container: str, limit: int | None = None,
                sink: BinaryIO | None = None) -> bytes:
        """The log as bytes (lightkube's ``log()`` yields decoded lines and has no ``limitBytes``):
        the same request lightkube's ``log()`` prepares, read raw; with ``sink``, copied there in
        chunks instead (a log of any size)."""
        from lightkube.resources.core_v1 import PodLog

        _named(ns, pod)
        inner = self._lk._client
        with self.errors():
            request = inner.prepare_request("get", PodLog, name=pod, namespace=ns,
                                            params={"container": container, "limitBytes": limit})
            response = inner.send(inner.build_adapter_request(request), stream=True)
            try:
                if response.is_error:
                    response.read()
                    inner.raise_for_status(response)
                if sink is None:
                    return response.read()
                for chunk in response.iter_bytes(1 << 20):
                    sink.write(chunk)
                return b""
            finally:
                response.close()

    # -- errors --------------------------------------------------------------------------------

    @contextlib.contextmanager
    def errors(self) -> Iterator[None]:
        """lightkube's and httpx's failures as the errors the backend handles."""
        from lightkube import ApiError as LightkubeApiError
        from lightkube import ConfigError

        httpx2 = self._httpx
        try:
            yield
        except LightkubeApiError as err:
            status = err.status
            raise self._error(int(status.code or err.response.status_code), str(status.message or ""),
                              str(status.reason or "")) from None
        except httpx2.HTTPStatusError as err:  # an answer that is not a JSON Status (a proxy, a gateway)
            raise self._error(err.response.status_code, err.response.text[:500], "") from None
        except ConfigError as err:  # a token file gone between two calls
            raise SpecError(f"the kubernetes credentials cannot be read: {err}", hint=_NO_SERVER_HINT) from None
        except ValueError as err:  # msgspec's DecodeError/ValidationError: an answer that is not the object
            raise BackendError(f"the Kubernetes API server at {self.server} answered what is not a Kubernetes "
                               f"object ({type(err).__name__}: {str(err)[:200]})",
                               hint=f"is {self.server} a Kubernetes API server (kubectl --server {self.server} "
                                    f"version)? a proxy in between? {KIT_HINT}") from None
        except (httpx2.HTTPError, OSError) as err:
            raise BackendError(f"the Kubernetes API server at {self.server} does not answer "
                               f"({type(err).__name__}: {str(err)[:200]})",
                               hint="check the api option / kubeconfig and that the cluster is up "
                                    f"(kubectl --server {self.server} version); {KIT_HINT}") from None

    def _error(self, code: int, message: str, reason: str) -> Exception:
        message = message[:500]
        if code == 401:
            return AuthError(f"the Kubernetes API server at {self.server} refused the token (401 Unauthorized)",
                             hint="pass a valid bearer token (token_file, or a kubeconfig user with a token); "
                                  "a service account token: kubectl create token SERVICE_ACCOUNT")
        if code == 403:
            return AuthError(f"the Kubernetes API server at {self.server} forbids this: {message}",
                             hint="grant the token's account the Role in backends/kubernetes/ (create/get/delete "
                                  "jobs, get/list/delete pods and pods/log in the namespace)")
        return ApiError(code, message, reason)


def _named(*names: str) -> None:
    """Names go into the request's path unescaped: one that is no object name (from a garbled
    answer: ``../``, ``?``) is an object the API does not have, not a request made elsewhere."""
    for name in names:
        if not _NAME.fullmatch(name):
            raise ApiError(404, f"{name[:80]!r} is not a Kubernetes object name", "NotFound")


def _plain(obj: Any) -> dict[str, Any]:
    out = obj.to_dict() if hasattr(obj, "to_dict") else obj
    return out if isinstance(out, dict) else {}
