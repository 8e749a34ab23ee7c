"""Backend profiles: named backends in ``$AUTORESEARCH_HOME/config.yaml``.

    default: cluster                # the backend of a submit, a serve or a loop that names none
    backends:
      cluster: {kind: slurm, partition: gpu, account: ml}
      raydev:  {kind: ray, address: "http://127.0.0.1:8265"}
      box:     {kind: docker}
    # also: scheduler: (shares.py), health: (health/config.py), tenants: (grants.py)

A name is looked up as a profile first, then as a built-in (or plugged-in) kind with its
default options. The backend built from a profile carries the profile's name (``.name``),
so the ledger's ``jobs.backend`` column stores the profile and any later process (a pass
run when an attempt ends, the MLflow mirror) rebuilds the same backend from that name.

Reading the file is cheap when there is none: no YAML import on the status fast path.
A broken file is one :class:`SpecError` naming the file (and the line, for YAML errors).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoresearch.errors import SpecError
from autoresearch.util._record import NEW, record
from autoresearch.util._regex import lazy

if TYPE_CHECKING:
    from autoresearch.backends.limits import SandboxConfig
    from autoresearch.engine.grants import Tenancy
    from autoresearch.engine.scheduler import FairShare

CONFIG = "config.yaml"
NAME = lazy(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")  # a profile's name ends up in file names and the ledger
MAX_CONFIG_BYTES = 1 << 20
# scheduler: fair share and quotas (autoresearch/engine/shares.py); health: thresholds, parsed by health/config.py;
# sandbox: tenant jobs' limits (backends/limits.py); tenants: what a tokened server lends a tenant's loops
# (autoresearch/engine/grants.py)
_TOP_KEYS = ("backends", "default", "scheduler", "health", "sandbox", "tenants")


@record(frozen=True)
@dataclass(init=False, repr=False, eq=False)
class Profile:
    """A named backend of config.yaml."""

    name: str
    kind: str
    options: dict[str, Any] = field(default_factory=dict)

    def __init__(self, name: str, kind: str, options: dict[str, Any] = NEW) -> None:
        _set = object.__setattr__
        _set(self, "name", name)
        _set(self, "kind", kind)
        _set(self, "options", {} if options is NEW else options)


@record(frozen=True)
@dataclass(init=False, repr=False, eq=False)
class Config:
    """What a home's config.yaml says (nothing when it has none)."""

    path: Path
    profiles: dict[str, Profile] = field(default_factory=dict)
    default: str | None = None
    fair: Any = None  # scheduler.FairShare from the scheduler: section; None: fair share off
    sandbox: Any = None  # limits.SandboxConfig from the sandbox: section (tenant jobs); None: defaults
    tenancy: Any = None  # grants.Tenancy from the tenants: section; None: nothing lent to tenants

    def __init__(self, path: Path, profiles: dict[str, Profile] = NEW, default: str | None = None, fair: Any = None,
                 sandbox: Any = None, tenancy: Any = None) -> None:
        _set = object.__setattr__
        _set(self, "path", path)
        _set(self, "profiles", {} if profiles is NEW else profiles)
        _set(self, "default", default)
        _set(self, "fair", fair)
        _set(self, "sandbox", sandbox)
        _set(self, "tenancy", tenancy)


_cache: dict[str, tuple[tuple[int, int], Config]] = {}  # config.yaml's path -> (its stamp, what it says)


def config_path(home: str | os.PathLike[str] | None = None) -> Path:
    return Path(_config_file(home))


def _config_file(home: str | os.PathLike[str] | None) -> str:
    """config_path as a string: os.path, not pathlib (every submit and pass reads the file's stamp).
    Made absolute as the ledger's home is (Path.absolute: no ``..`` folded away, which could name
    another directory than the kernel does when a link is on the way)."""
    base = os.path.expanduser(os.fspath(home) if home else os.environ.get("AUTORESEARCH_HOME")
                              or os.path.join("~", ".autoresearch"))
    return os.path.join(os.getcwd(), base, CONFIG)  # (an absolute base drops getcwd())


def load(home: str | os.PathLike[str] | None = None) -> Config:
    """The profiles of ``home`` (none when it has no config.yaml); SpecError on a broken file."""
    file = _config_file(home)
    try:
        st = os.stat(file)
    except FileNotFoundError:
        return Config(Path(file))
    except OSError as err:
        raise _bad(Path(file), f"cannot be read: {err.strerror}", "make it readable, or remove it") from None
    stamp = (st.st_mtime_ns, st.st_size)
    cached = _cache.get(file)
    if cached and cached[0] == stamp:
        return cached[1]
    path = Path(file)
    config = _parse(path, _read_parsed(path, st))
    _cache[file] = (stamp, config)
    return config


def _read_parsed(path: Path, st: os.stat_result) -> Any:
    """config.yaml's data: from ``.config.yaml.json`` beside it when that was written from this very file
    (its mtime, size, inode and ctime: an edit changes the ctime), else parsed (yaml: ~20 ms to import, on
    every CLI start) and written there for the next process, when JSON says the same (no int keys, dates)."""
    stamp = [st.st_mtime_ns, st.st_size, st.st_ino, st.st_ctime_ns]
    saved = path.with_name(f".{path.name}.json")
    try:
        with open(saved, encoding="utf-8") as f:
            got = json.load(f)
        if isinstance(got, dict) and got.get("stamp") == stamp and "data" in got:
            return got["data"]
    except (OSError, ValueError, RecursionError):
        pass
    data = _read(path, st.st_size)
    try:
        if json.loads(json.dumps(data)) == data:  # (a value JSON cannot say as YAML did: parse it each time)
            tmp = saved.with_name(f"{saved.name}.{os.getpid()}.tmp")
            with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600), "w") as f:
                json.dump({"stamp": stamp, "data": data}, f)
            os.replace(tmp, saved)
    except (OSError, TypeError, ValueError, RecursionError):
        pass  # a home we cannot write: parsed again next time
    return data


def _read(path: Path, size: int) -> Any:
    if size > MAX_CONFIG_BYTES:
        raise _bad(path, f"is {size} bytes (at most {MAX_CONFIG_BYTES})", "keep only backends: and default: in it")
    import yaml  # only when a config file exists

    try:
        text = path.read_text(encoding="utf-8")
        return yaml.safe_load(text)
    except OSError as err:
        raise _bad(path, f"cannot be read: {err.strerror}", "make it readable, or remove it") from None
    except UnicodeDecodeError:
        raise _bad(path, "is not UTF-8 text", "save it as UTF-8") from None
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise _bad(path, f"is not valid YAML{where}: {err.problem or err}", "fix that line") from None
    except (yaml.YAMLError, ValueError, RecursionError) as err:
        raise _bad(path, f"is not valid YAML: {str(err)[:200]}", "fix the line it names") from None


def _parse(path: Path, data: Any) -> Config:
    from autoresearch.backends._registry import backend_names, check_options, is_kind

    example = "backends: {NAME: {kind: local}}, default: NAME"
    if data is None:
        return Config(path)
    if not isinstance(data, dict):
        raise _bad(path, f"must be a mapping (backends:, default:), got {type(data).__name__}", f"write {example}")
    for key in data:
        if key not in _TOP_KEYS:
            raise _bad(path, f"unknown key {str(key)[:60]!r}", _near(str(key), _TOP_KEYS, "valid keys"))
    raw = data.get("backends") or {}
    if not isinstance(raw, dict):
        raise _bad(path, f"backends must be a mapping of profile name -> {{kind: ..., options}}, got "
                   f"{type(raw).__name__}", f"write {example}")
    # A built-in kind is known without the entry-point scan (importlib.metadata reads every installed
    # distribution: ~0.17 s of a CLI submit through a profile here); the scan lists kinds for an error only.
    profiles: dict[str, Profile] = {}
    for name, body in raw.items():
        if not isinstance(name, str) or not NAME().match(name):
            raise _bad(path, f"backend profile name {str(name)[:60]!r} is not a name",
                       "use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit")
        if not isinstance(body, dict):
            raise _bad(path, f"backends.{name} must be a mapping with kind: ..., got {type(body).__name__}",
                       f"write backends: {{{name}: {{kind: local}}}}")
        kind = body.get("kind")
        if not isinstance(kind, str) or not kind:
            raise _bad(path, f"backends.{name} has no kind", f"add kind: one of {', '.join(backend_names())}")
        if not is_kind(kind):
            raise _bad(path, f"backends.{name}: unknown kind {kind[:60]!r}", _near(kind, backend_names(), "kinds"))
        options = {str(k): v for k, v in body.items() if k != "kind"}
        try:
            check_options(kind, options)
            _check_types(kind, options)
        except SpecError as err:
            raise _bad(path, f"backends.{name}: {err.message.removeprefix('backend.options: ')}", err.hint) from None
        profiles[name] = Profile(name, kind, options)
    _refuse_shared_engines(path, profiles)
    default = data.get("default")
    if default is not None:
        if not isinstance(default, str) or (default not in profiles and not is_kind(default)):
            raise _bad(path, f"default {str(default)[:60]!r} is neither a profile nor a backend kind",
                       _near(str(default), [*profiles, *backend_names()], "profiles and kinds"))
    fair = _section(path, data, "scheduler", "autoresearch.engine.shares", "docs/scheduling.md")
    sandbox = _section(path, data, "sandbox", "autoresearch.backends.limits", "docs/security.md")
    tenancy = _section(path, data, "tenants", "autoresearch.engine.grants", "docs/security.md")
    return Config(path, profiles, default, fair, sandbox, tenancy)


def engine_address(kind: str, options: dict[str, Any]) -> str | None:
    """Where a profile's engine is, for the engines whose nodes the ledger records under the profile
    (Ray's head, Slurm's controller by its slurm.conf, a Docker daemon's node); None for the others
    (Kubernetes and Databricks report no nodes: two profiles on one cluster take nothing from each other)."""
    if kind == "ray":
        from urllib.parse import urlsplit

        from autoresearch.backends.ray import DEFAULT_ADDRESS

        raw = str(options.get("address") or os.environ.get("RAY_ADDRESS") or DEFAULT_ADDRESS)
        try:
            url = urlsplit(raw.strip())
            host, port = (url.hostname or "").lower(), url.port or (443 if url.scheme == "https" else 80)
        except ValueError:
            return None  # the backend refuses it with its own message when it is built
        return f"ray head {'127.0.0.1' if host in ('localhost', '::1') else host}:{port}"
    if kind == "slurm":
        conf = str(options.get("conf") or os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf")
        return f"Slurm cluster of {os.path.realpath(os.path.expanduser(conf))}"
    if kind == "docker":  # (the node's name as the backend makes it: os.uname's, gethostname's without socket.py)
        daemon = str(options.get("host") or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock")
        node = str(options.get("node_name") or f"docker@{os.uname().nodename or 'localhost'}")
        return f"Docker daemon {daemon} as node {node}"
    return None


def _refuse_shared_engines(path: Path, profiles: dict[str, Profile]) -> None:
    """Two profiles on one engine would record its nodes each under its own name, taking them from
    each other at every pass: one profile's jobs would see no nodes and stay queued for ever."""
    seen: dict[str, str] = {}
    for profile in profiles.values():
        address = engine_address(profile.kind, profile.options)
        if address is None:
            continue
        other = seen.setdefault(address, profile.name)
        if other != profile.name:
            raise _bad(path, f"backends.{other} and backends.{profile.name} both drive the {address}",
                       f"keep one profile per engine (its nodes are recorded under one profile; two would take them "
                       f"from each other and one's jobs would wait for ever): remove backends.{profile.name} or point "
                       "it at another engine; for other partitions or queues on the same engine use that "
                       "profile's priority_partitions / priority_qos")


def _section(path: Path, data: dict[str, Any], key: str, module: str, doc: str) -> Any:
    """A top-level section parsed by its own module's ``parse`` (None when absent: the module is not imported,
    nor its dataclasses made); its error names the file and the doc."""
    if data.get(key) is None:
        return None
    import importlib

    parse = importlib.import_module(module).parse
    try:
        return parse(data[key])
    except SpecError as err:
        raise SpecError(f"{path}: {err.message}", hint=f"{err.hint} ({doc})") from None


def resolve(name: str, home: str | os.PathLike[str] | None = None) -> Profile:
    """The profile ``name``, or a kind with its default options; SpecError listing both otherwise."""
    from autoresearch.backends._registry import backend_names, is_kind

    config = load(home)
    if name in config.profiles:
        return config.profiles[name]
    if is_kind(name):
        return Profile(name, name, {})
    kinds = backend_names()
    where = f" (profiles in {config.path}: {', '.join(config.profiles)})" if config.profiles else ""
    raise SpecError(f"unknown backend {name!r}{where}",
                    hint=_near(name, [*config.profiles, *kinds], "profiles and kinds")
                    + ("" if config.profiles else f"; name your own in {config.path}"))


def fair_share(home: str | os.PathLike[str] | None = None) -> FairShare | None:
    """The home's fair share (``scheduler:``, a :class:`~autoresearch.engine.scheduler.FairShare`; None:
    off). SpecError on a broken config.yaml."""
    fair: FairShare | None = load(home).fair
    return fair


def sandbox_config(home: str | os.PathLike[str] | None = None) -> SandboxConfig:
    """The home's ``sandbox:`` section (a :class:`~autoresearch.backends.limits.SandboxConfig`; defaults
    when it has none)."""
    from autoresearch.backends.limits import SandboxConfig

    sandbox: SandboxConfig = load(home).sandbox or SandboxConfig()
    return sandbox


def tenancy(home: str | os.PathLike[str] | None = None) -> Tenancy:
    """What the home's ``tenants:`` section lends tenants (a :class:`~autoresearch.engine.grants.Tenancy`;
    nothing when it has none)."""
    from autoresearch.engine.grants import Tenancy

    lent = load(home).tenancy
    return lent if isinstance(lent, Tenancy) else Tenancy()


def default_name(home: str | os.PathLike[str] | None = None) -> str:
    """The backend to use when nobody named one: AUTORESEARCH_BACKEND, the config's default, local."""
    return os.environ.get("AUTORESEARCH_BACKEND") or load(home).default or "local"


def _check_types(kind: str, options: dict[str, Any]) -> None:
    """An option of the wrong type (a list where a name goes) is refused here, not deep in a pass.
    Only plain annotations are checked (str, int, float, bool, list[str], their unions with None)."""
    import typing

    from autoresearch.backends._registry import _factory

    factory = _factory(kind)
    try:
        hints = typing.get_type_hints(getattr(factory, "__init__") if isinstance(factory, type) else factory)  # noqa: B009
    except Exception:  # noqa: BLE001 - an annotation we cannot resolve: the backend judges its own options
        return
    for key, value in options.items():
        hint = hints.get(key)
        allowed = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, _UnionType) else (hint,)
        if hint is None or not all(_plain(t) for t in allowed):
            continue
        if not any(_fits(value, t) for t in allowed):
            names = " or ".join(_WORDS.get(t, "a list of text") for t in allowed)
            raise SpecError(f"option {key} must be {names}, got {str(value)[:60]!r}", hint=f"write {key}: <{names}>")


_UnionType = type(int | None)
_WORDS = {str: "text (one line, no NUL)", int: "a whole number", float: "a finite number", bool: "true or false",
          type(None): "null"}


def _plain(t: Any) -> bool:
    import typing

    return t in (str, int, float, bool, type(None)) or (typing.get_origin(t) is list and typing.get_args(t) == (str,))


def _fits(value: Any, t: Any) -> bool:
    import math
    import typing

    if t is type(None):
        return value is None
    if t is bool:
        return isinstance(value, bool)
    if t is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if t is float:
        return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if typing.get_origin(t) is list:
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    return isinstance(value, t) and "\0" not in str(value)


def _near(word: str, choices: Any, what: str) -> str:
    import difflib  # only for an error's hint (every command imports this module)

    choices = list(choices)
    near = difflib.get_close_matches(word, choices, n=1)
    return (f"did you mean {near[0]!r}? " if near else "") + f"{what}: {', '.join(choices) or '(none)'}"


def _bad(path: Path, what: str, hint: str) -> SpecError:
    return SpecError(f"{path}: {what}", hint=f"{hint} (the backend profiles file; docs: README, Backends)")
