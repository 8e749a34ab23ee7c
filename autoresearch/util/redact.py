"""Secrets, by rule: what one is, and how it is taken out of what we show or mirror.

Stdlib only (a status read imports it). A *secret* is

* the value of a secret-named variable (:func:`is_secret`) in a job's own ``env``, or
  anywhere in a plan (``trial.env``, ...), read from the ledger, whatever its length;
* the value of a secret-looking command-line argument: ``--api-key X``, ``--api-key=X``,
  ``--token=X``, or an assignment ``OPENAI_API_KEY=X`` inside a shell command string;
* as a supplement, secret-named variables of the showing process's own environment
  (single-user mode: jobs inherit it), from 4 characters up.

Commands are redacted by rule: the value after a secret-looking flag or assignment, and
any argument equal to a secret, become ``[REDACTED]`` whatever their length. In free text
(logs, artifacts), a value of 8 characters or more is redacted wherever it appears; a
shorter one only as a whole word (not touching a letter, digit or ``_``), so a secret
``ab`` does not eat every ``ab`` in ``tab``. Logs served by byte offset are masked with
``*`` of the same byte length, so their offsets stay exact. See docs/security.md (Secrets).
"""

from __future__ import annotations

import functools
import re
import shlex
from collections.abc import Iterable, Mapping
from typing import Any

from autoresearch.util._regex import lazy

MARK = "[REDACTED]"
LONG = 8  # values this long are redacted anywhere; shorter ones only as whole words
AMBIENT_MIN = 4  # the process's own environment is a supplement: skip its tiny values
_SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "SECRETS", "PASSWORD", "PASSWORDS", "PASSWD", "PASSPHRASE",
                 "CREDENTIAL", "CREDENTIALS")
_NAMING_WORDS = ("ENV", "VAR", "NAME", "FILE", "PATH", "DIR")  # api_key_env names a variable; it is no secret
_WORD = lazy(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
_VALUE = r"""("[^"]*"|'[^']*'|[^\s"';|&]+)"""
_FLAG_EQ = lazy(r"(?<![\w-])(--?[A-Za-z][\w.-]*)=" + _VALUE)
_FLAG_SP = lazy(r"(?<![\w-])(--?[A-Za-z][\w.-]*)(\s+)" + r"""("[^"]*"|'[^']*'|[^\s"';|&-][^\s"';|&]*)""")
_ASSIGN = lazy(r"(?<![\w.$-])([A-Za-z_]\w*)=" + _VALUE)
_ARG_FLAG = lazy(r"^--?([A-Za-z][\w.-]*)(?:=(.*))?$", re.S)


@functools.lru_cache(maxsize=4096)
def is_secret(name: str) -> bool:
    """A name one of whose words (split at ``_``, ``-``, ``.`` and camelCase) ends with KEY,
    TOKEN, SECRET, PASSWORD, PASSWD, PASSPHRASE or CREDENTIAL(S): ``OPENAI_API_KEY``,
    ``hfToken``, ``--api-key``, ``APIKEY``; not ``TOKENIZERS_PARALLELISM``, ``max_tokens``,
    ``KEYBOARD`` nor ``api_key_env`` (that names a variable)."""
    words = [w.upper() for w in _WORD().findall(name)]
    if not words or words[-1] in _NAMING_WORDS:
        return False
    return any(w.endswith(_SECRET_WORDS) for w in words)


def _ordered(values: Iterable[str]) -> list[str]:
    return sorted({v for v in values if v}, key=lambda v: (-len(v), v))


def secret_values(*envs: Mapping[str, Any], min_len: int = 1) -> list[str]:
    """Values of secret-named variables, longest first (so a prefix never hides a longer one)."""
    return _ordered(str(v) for env in envs for k, v in env.items()
                    if is_secret(str(k)) and v is not None and len(str(v)) >= min_len)


_AMBIENT: tuple[object, list[str]] = (None, [])


def ambient_secrets() -> list[str]:
    """Secret-named variables of this process's environment (the supplement); found again only
    when the environment changed (every submit's view asks)."""
    global _AMBIENT
    from autoresearch.util._environ import environ

    env = environ()
    if _AMBIENT[0] is not env:
        _AMBIENT = (env, secret_values(env, min_len=AMBIENT_MIN))
    return list(_AMBIENT[1])


def _unquote(value: str) -> str:
    return value[1:-1] if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"" else value


def _shell_values(text: str) -> list[str]:
    # Each pattern needs its literal characters (a flag its "-", an assignment its "="): a text
    # without them compiles none of them (a status read of `python train.py`).
    out: list[str] = []
    if "-" in text:
        out += [_unquote(m.group(3)) for m in _FLAG_SP().finditer(text) if is_secret(m.group(1))]
        if "=" in text:
            out += [_unquote(m.group(2)) for m in _FLAG_EQ().finditer(text) if is_secret(m.group(1))]
    if "=" in text:
        out += [_unquote(m.group(2)) for m in _ASSIGN().finditer(text) if is_secret(m.group(1))]
    return out


def _argv_secret_positions(argv: list[str]) -> Iterable[tuple[int, str]]:
    """(index, value) of each argv value that a secret-looking flag carries: ``--token X`` or ``--token=X``."""
    for i, arg in enumerate(argv):
        flag = _ARG_FLAG().match(arg) if arg.startswith("-") else None
        if flag and is_secret(flag.group(1)):
            if flag.group(2) is not None:
                yield i, flag.group(2)
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                yield i + 1, argv[i + 1]


def command_secrets(command: str | list[str] | None) -> list[str]:
    """Values of secret-looking arguments of a command (an argv list or a shell string)."""
    if not command:
        return []
    if isinstance(command, str):
        return _ordered(_shell_values(command))
    argv = [str(a) for a in command]
    return _ordered([v for _, v in _argv_secret_positions(argv)] + [v for a in argv for v in _shell_values(a)])


def job_secrets(spec: Mapping[str, Any], ambient: bool = True) -> list[str]:
    """Everything to redact for one job: its env's secrets, its command's and (``ambient``)
    this process's. ``spec`` is the job's spec as stored in the ledger."""
    env = spec.get("env") if isinstance(spec.get("env"), Mapping) else {}
    found = secret_values(env or {}) + command_secrets(spec.get("command"))
    return _ordered(found + (ambient_secrets() if ambient else []))


def plan_secrets(plan: Any, ambient: bool = True) -> list[str]:
    """Values of secret-named keys anywhere in a plan, and of secret arguments of its commands."""
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, Mapping):
            for key, value in node.items():
                if isinstance(value, (str, int, float)) and not isinstance(value, bool) and is_secret(str(key)):
                    found.append(str(value))
                elif key == "command" and isinstance(value, (str, list)):
                    found.extend(command_secrets(value if isinstance(value, str) else [str(v) for v in value]))
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(plan)
    return _ordered(found + (ambient_secrets() if ambient else []))


@functools.lru_cache(maxsize=64)
def _pattern(secrets: tuple[str, ...], binary: bool) -> re.Pattern[Any] | None:
    parts = []
    for value in sorted(set(secrets), key=lambda v: (-len(v), v)):
        if not value:
            continue
        body = re.escape(value)
        if len(value) < LONG:
            body = r"(?<![A-Za-z0-9_])" + body + r"(?![A-Za-z0-9_])"
        parts.append(body)
    if not parts:
        return None
    source = "|".join(parts)
    return re.compile(source.encode() if binary else source)


def redact(text: str, secrets: Iterable[str], mark: str = MARK) -> str:
    """Free text with every secret replaced by ``mark`` (long values anywhere, short ones as words)."""
    pattern = _pattern(tuple(secrets), False)
    return text if pattern is None or not text else pattern.sub(mark, text)


def mask(data: bytes, secrets: Iterable[str]) -> bytes:
    """Bytes with every secret overwritten by ``*`` of the same length: offsets stay exact."""
    pattern = _pattern(tuple(secrets), True)
    if pattern is None or not data:
        return data
    return pattern.sub(lambda m: b"*" * len(m.group(0)), data)


def context(secrets: Iterable[str]) -> int:
    """How many bytes around a page must be read so that a secret cut by its edge is still seen."""
    return max((len(v.encode()) for v in secrets), default=0)


def redact_argv(argv: list[str], secrets: Iterable[str] = ()) -> list[str]:
    """An argv with secret arguments replaced by rule (whatever their length)."""
    known = set(secrets)
    out = [str(a) for a in argv]
    hidden = {i: v for i, v in _argv_secret_positions(out)}
    for i, arg in enumerate(out):
        if i in hidden:
            out[i] = arg[: len(arg) - len(hidden[i])] + MARK if arg != hidden[i] else MARK
        else:
            out[i] = MARK if arg in known else _redact_shell(arg, list(known))
    return out


def redact_command(command: str | list[str], secrets: Iterable[str] = ()) -> str:
    """A command for display, with secret arguments replaced by rule (whatever their length)."""
    if isinstance(command, str):
        return _redact_shell(command, list(secrets))
    return " ".join(_quote(arg) for arg in redact_argv(command, secrets))


def _quote(arg: str) -> str:
    """shlex.quote, except that a [REDACTED] alone does not force quotes (it is never run)."""
    plain = arg.replace(MARK, "REDACTED")
    return arg if plain and shlex.quote(plain) == plain else shlex.quote(arg)


def _redact_shell(text: str, secrets: list[str]) -> str:
    def sub(group: int) -> Any:
        def fn(m: re.Match[str]) -> str:
            if not is_secret(m.group(1)):
                return m.group(0)
            return m.group(0)[: m.start(group) - m.start(0)] + MARK + m.group(0)[m.end(group) - m.start(0):]
        return fn

    if "-" in text and "=" in text:  # (see _shell_values)
        text = _FLAG_EQ().sub(sub(2), text)
    if "-" in text:
        text = _FLAG_SP().sub(sub(3), text)
    if "=" in text:
        text = _ASSIGN().sub(sub(2), text)
    return redact(text, secrets)


def redact_obj(obj: Any, secrets: Iterable[str]) -> Any:
    """A JSON-like structure for an artifact: secret-named keys' values hidden, commands
    redacted by rule, every other string as free text. (The mirror walks every decision with it:
    the plain JSON types are told by their exact type first, ABC checks only for the others.)"""
    known = list(secrets)
    pattern = _pattern(tuple(known), False)

    def walk(node: Any, key: str = "") -> Any:
        kind = type(node)
        if kind in _SCALARS:
            return node
        if kind is str:
            if key == "command":
                return redact_command(node, known)
            return pattern.sub(MARK, node) if pattern is not None and node else node
        if kind is dict or kind is not list and isinstance(node, Mapping):
            return {k: (MARK if is_secret(str(k)) and not isinstance(v, (Mapping, list)) and v not in (None, "")
                        else walk(v, str(k))) for k, v in node.items()}
        if kind is list or isinstance(node, list):
            if key == "command" and all(isinstance(v, str) for v in node):
                return redact_argv(node, known)
            return [walk(v) for v in node]
        if isinstance(node, str):
            return redact_command(node, known) if key == "command" else redact(node, known)
        return node

    return walk(obj)


_SCALARS = frozenset((int, float, bool, type(None)))
