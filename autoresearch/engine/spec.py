"""What a user hands the runtime: the job spec (pydantic), plus parsing helpers.

A :class:`JobSpec` is validated once, at submit, and stored as JSON in the ledger;
everything after that reads plain rows, so status reads never import pydantic.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import shlex
import stat
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

from autoresearch.errors import SpecError
from autoresearch.util._regex import lazy
from autoresearch.util.units import parse_duration as parse_duration  # one grammar for specs and plans
from autoresearch.util.units import parse_grace as parse_grace

if TYPE_CHECKING:
    from pydantic import ValidationError

PRIORITIES = ("critical", "normal", "best-effort")
MAX_COUNT = 2**31 - 1  # counts stay SQLite integers; no machine has more
MAX_MEMORY_MB = 2**40  # an exabyte
Priority = Literal["critical", "normal", "best-effort"]

# A mount source an engine resolves, not a host path: "pvc:claim", "uc:/Volumes/c/s/v", "emptydir:".
ENGINE_SOURCE = lazy(r"^[a-z][a-z0-9]+:(?!//)")
_MEMORY = lazy(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_MEMORY_MB = {"": 1.0, "B": 1 / 2**20, "K": 1 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0**2}


def str_values(value: object) -> object:
    """A mapping's values as strings (YAML gives ints and bools); anything else as is."""
    if isinstance(value, dict):
        return {str(k): "" if v is None else str(v) for k, v in value.items()}
    return value


def parse_memory_mb(value: object, field: str = "memory") -> int:
    """``4096`` (MB), ``"16G"``, ``"512M"``, ``"1.5GiB"`` → MB."""
    if value is None or value == "":
        return 0
    if isinstance(value, bool):
        raise SpecError(f"{field} must be a size, not {value!r}", hint='write MB (4096) or "16G", "512M"')
    if isinstance(value, (int, float)):
        mb = float(value) if not isinstance(value, int) or abs(value) < 10**300 else math.inf
    else:
        match = _MEMORY().match(str(value))
        if not match:
            raise SpecError(f"{field} {value!r} is not a size", hint='write MB (4096) or "16G", "512M"')
        unit = (match.group(2) or "").upper()[:1]
        mb = float(match.group(1)) * _MEMORY_MB[unit]
    if not math.isfinite(mb):
        raise SpecError(f"{field} must be a finite size, got {value!r}", hint='write MB (4096) or "16G", "512M"')
    if mb < 0:
        raise SpecError(f"{field} must be >= 0, got {value!r}", hint="leave it out to reserve none")
    return int(round(mb))


# The fields in order, with their defaults (a list or dict default is copied per spec).
FIELDS: dict[str, Any] = {
    "name": "", "command": None, "shell": False, "workdir": ".", "env": {}, "gpus": 0, "cpus": 0, "memory": 0,
    "nodes": 1, "priority": "normal", "max_retries": 2, "retry_on_exit_codes": [], "timeout": None, "grace": 10.0,
    "checkpoint": False, "experiment": "", "tags": {}, "mounts": {}, "image": "", "secret_env": {},
}
MAX_IMAGE = 512
# secret_env: NAME -> STORE/KEY, a secret an engine holds (a Kubernetes Secret and its key, a Databricks
# secret scope and its key); the value never passes through autoresearch.
SECRET_REF = lazy(r"^(?!\.{1,2}/)[A-Za-z0-9._@-]{1,128}/(?!\.{1,2}$)[A-Za-z0-9._-]{1,253}$")
ENV_NAME = lazy(r"^[A-Za-z_][A-Za-z0-9_]{0,254}$")


class JobSpec:
    """One validated unit of work (what :func:`make_spec` returns and the ledger stores as JSON).

    A plain object, not a pydantic model, so a submit does not import pydantic; it answers the
    pydantic calls its users make (``model_dump``, ``model_dump_json``, ``model_validate``,
    ``model_fields``, ``model_json_schema``) with the same results."""

    __slots__ = tuple(FIELDS)
    model_fields = FIELDS  # the keys a spec may have, in order

    name: str
    command: list[str] | str
    shell: bool
    workdir: str
    env: dict[str, str]
    gpus: int
    cpus: float
    memory: int
    nodes: int
    priority: str
    max_retries: int
    retry_on_exit_codes: list[int]
    timeout: float | None
    grace: float
    checkpoint: bool | str
    experiment: str
    tags: dict[str, str]
    mounts: dict[str, str]
    image: str
    secret_env: dict[str, str]

    def __init__(self, **values: Any) -> None:
        for key, default in FIELDS.items():
            value = values.get(key, default)
            setattr(self, key, value.copy() if isinstance(value, (list, dict)) else value)

    @classmethod
    def model_construct(cls, **values: Any) -> JobSpec:
        """Without validation (tests, and values already validated)."""
        return cls(**values)

    @classmethod
    def model_validate(cls, data: Any) -> JobSpec:
        """Validate without looking at paths; an invalid spec raises pydantic's ValidationError."""
        fast = _fast(data)
        if fast is not None:
            return cls(**fast)
        return cls(**pydantic_model().model_validate(data).model_dump())

    @classmethod
    def model_validate_json(cls, text: str | bytes) -> JobSpec:
        return cls.model_validate(json.loads(text))

    @staticmethod
    def model_json_schema() -> dict[str, Any]:
        return dict(pydantic_model().model_json_schema())

    def model_dump(self) -> dict[str, Any]:
        return {key: _copy(getattr(self, key)) for key in FIELDS}

    def model_dump_json(self) -> str:
        return json.dumps(self.model_dump(), ensure_ascii=False, separators=(",", ":"), allow_nan=False)

    def argv(self) -> list[str]:
        if isinstance(self.command, str):
            return ["/bin/sh", "-c", self.command]
        return list(self.command)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, JobSpec) and self.model_dump() == other.model_dump()

    __hash__ = None  # type: ignore[assignment]  # mutable, like a pydantic model

    def __repr__(self) -> str:
        return "JobSpec(" + ", ".join(f"{key}={getattr(self, key)!r}" for key in FIELDS) + ")"


def _copy(value: Any) -> Any:
    return value.copy() if isinstance(value, (list, dict)) else value


def _plain_int(value: object, low: int, high: int) -> bool:
    return type(value) is int and low <= value <= high


def _plain_text(value: object, nul: bool = True) -> bool:
    return type(value) is str and (nul or "\0" not in value)


def _fast(data: Any) -> dict[str, Any] | None:
    """The plain shapes nearly every submit has (an argv of strings, whole numbers, known keys),
    validated by hand to exactly what the pydantic model returns; ``None`` for anything else
    (then the model decides, and words any refusal). tests/properties/test_specs.py checks
    that both agree wherever this answers."""
    if type(data) is not dict or not data.keys() <= FIELDS.keys():
        return None
    out = {key: _copy(default) for key, default in FIELDS.items()}
    try:
        for key, value in data.items():
            if key in ("name", "experiment"):
                ok = _plain_text(value)
            elif key == "image":
                ok = _plain_text(value) and len(value) <= MAX_IMAGE
            elif key == "workdir":
                ok = _plain_text(value, nul=False)
            elif key == "command":
                ok = _plain_text(value, nul=False) or (type(value) is list and all(_plain_text(w, nul=False)
                                                                                  for w in value))
                value = list(value) if type(value) is list else value
            elif key == "shell":
                ok = type(value) is bool
            elif key in ("gpus", "max_retries"):
                ok = _plain_int(value, 0, MAX_COUNT)
            elif key == "nodes":
                ok = _plain_int(value, 1, MAX_COUNT)
            elif key == "cpus":
                ok = type(value) in (int, float) and math.isfinite(value) and 0 <= value <= MAX_COUNT
                value = float(value)
            elif key == "memory":
                value = parse_memory_mb(value)
                ok = value <= MAX_MEMORY_MB
            elif key == "priority":
                value = value.strip().lower().replace("_", "-") if type(value) is str else value
                value = "best-effort" if value == "besteffort" else value
                ok = value in PRIORITIES
            elif key == "retry_on_exit_codes":
                ok = type(value) is list and all(_plain_int(c, -MAX_COUNT, MAX_COUNT) for c in value)
                value = list(value) if ok else value
            elif key == "timeout":
                value = parse_duration(value, "timeout")
                ok = True
            elif key == "grace":
                value = parse_grace(value)
                ok = True
            elif key == "checkpoint":
                ok = type(value) in (bool, str)
            elif key == "secret_env":
                ok = value == {}  # (one with entries: the model checks its names and references)
                value = {}
            elif key in ("env", "tags"):
                ok = type(value) is dict and all(type(k) is str for k in value)
                value = str_values(value) if ok else value
                if ok and key == "env":
                    ok = all(k and "=" not in k and "\0" not in k and "\0" not in v for k, v in cast(dict, value).items())
            else:  # mounts
                ok = type(value) is dict and all(_plain_text(k, nul=False) and _plain_text(v, nul=False)
                                                 for k, v in value.items())
                value = dict(value) if ok else value
            if not ok:
                return None
            out[key] = value
    except (SpecError, TypeError, ValueError, AttributeError, OverflowError):
        return None  # the model words the refusal
    command = out["command"]
    if isinstance(command, str):
        if not out["shell"] or not command.strip():
            return None
    elif not command or not command[0].strip():
        return None
    if not out["name"]:
        out["name"] = _default_name(command)
    return out


def _default_name(command: list[str] | str) -> str:
    """The program's name: the first word of the command (sh judges its own quoting; the name is only a label)."""
    first = command if isinstance(command, str) else command[0]
    if isinstance(command, str):
        try:
            first = (shlex.split(first) or [first])[0]
        except ValueError:
            first = first.split()[0]
    return os.path.basename(first)[:64]


@lru_cache(maxsize=1)
def pydantic_model() -> Any:
    """The job spec as a pydantic model: the reference validator (every input the fast path of
    :func:`validate` declines, and every refusal's message) and the JSON Schema. Built on first
    use: importing pydantic and building the model costs ~150 ms, more than a whole CLI submit."""
    from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

    class JobSpecModel(BaseModel):
        """One unit of work. Field names are the contract shared by CLI, MCP and plan.yaml."""


        model_config = ConfigDict(extra="forbid", validate_assignment=False)

        name: str = Field("", description="Display name; defaults to the program's name.")
        command: list[str] | str = Field(description="argv list; a single string only with shell: true.")
        shell: bool = Field(False, description="Run command through /bin/sh -c.")
        workdir: str = Field(".", description="Directory the command runs in; must exist.")
        env: dict[str, str] = Field(default_factory=dict)
        gpus: int = Field(0, ge=0, le=MAX_COUNT, description="GPUs per node.")
        cpus: float = Field(0, ge=0, le=MAX_COUNT, allow_inf_nan=False,
                            description="CPU cores to reserve per node (0: none reserved).")
        memory: int = Field(0, ge=0, le=MAX_MEMORY_MB, description="Memory to reserve per node in MB (accepts '16G').")
        nodes: int = Field(1, ge=1, le=MAX_COUNT, description="Number of nodes.")
        priority: Priority = "normal"
        max_retries: int = Field(2, ge=0, le=MAX_COUNT, description="Retries after infrastructure failures.")
        retry_on_exit_codes: list[int] = Field(default_factory=list)
        timeout: float | None = Field(None, description="Wall-clock limit per attempt, seconds (accepts '5m').")
        grace: float = Field(10.0, description="Seconds between SIGTERM and SIGKILL (accepts '30s').")
        checkpoint: bool | str = Field(False, description="true: a stable per-job dir; or a path.")
        experiment: str = ""
        tags: dict[str, str] = Field(default_factory=dict)
        mounts: dict[str, str] = Field(default_factory=dict, description="target path -> source path.")
        image: str = Field("", max_length=512, description="Container image to run the command in (a backend "
                           "with the containers capability); empty: the host's environment.")
        secret_env: dict[str, str] = Field(default_factory=dict, description=(
            "Environment variables whose values the engine's secret store holds: NAME -> 'STORE/KEY' (a "
            "Kubernetes Secret and its key, a Databricks secret scope and its key). Backends with the secrets "
            "capability only; the value never passes through autoresearch."))

        @field_validator("priority", mode="before")
        @classmethod
        def _priority(cls, value: object) -> object:
            if isinstance(value, str):
                value = value.strip().lower().replace("_", "-")
                if value == "besteffort":
                    value = "best-effort"
                if value not in PRIORITIES:
                    raise ValueError(f"unknown priority {value!r}; use one of {', '.join(PRIORITIES)}")
            return value

        @field_validator("timeout", mode="before")
        @classmethod
        def _timeout(cls, value: object) -> float | None:
            return parse_duration(value, "timeout")

        @field_validator("grace", mode="before")
        @classmethod
        def _grace(cls, value: object) -> float:
            return parse_grace(value)

        @field_validator("memory", mode="before")
        @classmethod
        def _memory(cls, value: object) -> int:
            return parse_memory_mb(value)

        @field_validator("env", "tags", mode="before")
        @classmethod
        def _str_values(cls, value: object) -> object:
            return str_values(value)

        @field_validator("command", "workdir", "mounts", mode="after")
        @classmethod
        def _no_nul(cls, value: Any) -> Any:
            # The OS cannot pass a NUL byte to a program: refused here, not three "infra" attempts later.
            words = [value] if isinstance(value, str) else [*value.keys(), *value.values()] if isinstance(value, dict) \
                else value
            for i, word in enumerate(words):
                if "\0" in word:
                    where = f" (word {i + 1})" if isinstance(value, list) else ""
                    raise ValueError(f"contains a NUL byte{where}")
            return value

        @field_validator("env", mode="after")
        @classmethod
        def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
            for name, text in value.items():
                if not name or "=" in name or "\0" in name:
                    raise ValueError(f"{name!r} is not a valid variable name (empty, '=' or NUL)")
                if "\0" in text:
                    raise ValueError(f"the value of {name} contains a NUL byte")
            return value

        @field_validator("secret_env", mode="after")
        @classmethod
        def _secret_refs(cls, value: dict[str, str]) -> dict[str, str]:
            for name, ref in value.items():
                if not ENV_NAME().fullmatch(name):
                    raise ValueError(f"{name[:60]!r} is not a variable name (letters, digits and '_')")
                if not SECRET_REF().fullmatch(ref):
                    raise ValueError(f"{name}: {ref[:80]!r} is not a secret reference STORE/KEY")
            return value

        @model_validator(mode="after")
        def _check(self) -> JobSpecModel:
            both = sorted(set(self.env) & set(self.secret_env))
            if both:
                raise ValueError(f"{both[0]} is in both env and secret_env; give it in one of them")
            if isinstance(self.command, str):
                if not self.shell:
                    raise ValueError("command is a single string; pass an argv list, or set shell: true")
                if not self.command.strip():
                    raise ValueError("command is empty")
            elif not self.command or not self.command[0].strip():
                raise ValueError("command is empty")
            if not self.name:
                self.name = _default_name(self.command)
            return self

        def argv(self) -> list[str]:
            if isinstance(self.command, str):
                return ["/bin/sh", "-c", self.command]
            return list(self.command)

    return JobSpecModel


def _explain(err: ValidationError) -> SpecError:
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"]) or "spec"
    msg = first["msg"].removeprefix("Value error, ")
    hints = {
        "gpus": "gpus is a whole number >= 0",
        "priority": "use --priority critical|normal|best-effort",
        "command": "put the program after --, e.g. autoresearch submit -- python train.py",
        "extra_forbidden": f"valid keys: {', '.join(JobSpec.model_fields)}",
    }
    hint = hints.get("extra_forbidden" if first["type"] == "extra_forbidden" else loc.split(".")[0], "")
    if loc.split(".")[0] == "env":
        hint = "env names are letters, digits and '_' (no '=', no NUL), e.g. --env BATCH=64"
    elif loc.split(".")[0] == "secret_env" or "secret_env" in msg:
        hint = ("secret_env maps a variable to a secret the engine holds: {HF_TOKEN: hf-creds/token} "
                "(Kubernetes: Secret/key; Databricks: scope/key)")
    elif "NUL" in msg:
        hint = "remove the NUL byte (\\0): a program's arguments, environment and paths cannot carry one"
    if not hint and "command" in msg:
        hint = hints["command"]
    return SpecError(f"invalid job spec: {loc}: {msg}", hint=hint or "see `autoresearch submit --help`")


def make_spec(data: dict[str, Any], *, check_paths: bool = True, containers: bool = False,
              workdirs: dict[str, str] | None = None) -> JobSpec:
    """Validate a spec dict into a :class:`JobSpec` or raise a one-line :class:`SpecError`.

    ``containers``: the backend mounts into a container (a target is a path inside it, the
    source becomes absolute); otherwise a mount is a link made on this host. ``workdirs``: the
    workdirs already checked in this batch (as given -> resolved), filled in as it goes: a
    loop's batch of trials shares one, checked once."""
    from_fast = _fast(data)
    if from_fast is not None:
        spec = JobSpec(**from_fast)
    else:
        from pydantic import ValidationError

        try:
            spec = JobSpec(**pydantic_model().model_validate(data).model_dump())
        except ValidationError as err:
            raise _explain(err) from None
    if check_paths:
        try:
            _check_paths(spec, containers, workdirs)
        except OSError as err:  # a name too long, a loop of links, no permission
            name = str(err.filename or "a path")
            name = name if len(name) <= 80 else name[:80] + "..."
            raise SpecError(f"invalid job spec: {name}: {err.strerror}",
                            hint="pass paths that exist and that you can read") from None
    return spec


def _is_dir(path: str) -> bool:
    """Path.is_dir: False for a path that is missing, not a directory or loops; an error such as a name
    too long raises (the caller words it)."""
    try:
        return stat.S_ISDIR(os.stat(path).st_mode)
    except OSError as err:
        if err.errno in (errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP):
            return False
        raise
    except ValueError:
        return False


def _check_paths(spec: JobSpec, containers: bool = False, workdirs: dict[str, str] | None = None) -> None:
    known = workdirs.get(spec.workdir) if workdirs is not None else None
    if known is not None:
        spec.workdir = known
    else:
        # (os.path, not pathlib: Path.resolve is os.path.realpath, and every submit comes here)
        given, workdir = spec.workdir, os.path.expanduser(spec.workdir) or "."  # (Path("") is ".")
        if not _is_dir(workdir):
            raise SpecError(f"workdir {spec.workdir!r} does not exist", hint="create it, or pass an existing --workdir")
        spec.workdir = os.path.realpath(workdir)
        if workdirs is not None:
            workdirs[given] = spec.workdir
    for target, source in spec.mounts.items():
        if ENGINE_SOURCE().match(source):
            continue  # an engine's volume (pvc:claim, uc:/Volumes/...): the backend checks it (Backend.check)
        src = Path(source).expanduser()
        if not src.exists():
            raise SpecError(f"mount source {source!r} (for {target!r}) does not exist", hint="mount an existing path")
        if containers:
            if not target.startswith("/") or ":" in target or ":" in str(src.resolve()):
                raise SpecError(f"mount target {target!r} must be an absolute path inside the container, and "
                                "neither path may hold ':'", hint="write --mount /data=./data")
            spec.mounts[target] = str(src.resolve())
            continue
        # The same rule as the local backend's mount (a link at the target, made at launch):
        # an existing target that is not that link would fail every attempt as "infra".
        if not Path(target).is_absolute():  # made beneath the workdir, never through a link (runtime)
            parts = target.split("/")
            folder = os.path.realpath(os.path.join(spec.workdir, os.path.dirname(target)))
            if any(p in (".", "..") for p in parts) or (folder != spec.workdir
                                                         and not folder.startswith(spec.workdir.rstrip("/") + "/")):
                raise SpecError(f"mount target {target!r} leads outside the workdir ('..' or a link on the way)",
                                hint="name a path beneath the workdir, e.g. --mount data=/datasets/x")
        path = Path(target) if Path(target).is_absolute() else Path(spec.workdir) / target
        if (path.exists() or path.is_symlink()) and path.resolve() != src.resolve():
            raise SpecError(f"mount target {str(path)!r} exists and is not a link to {str(src.resolve())!r}",
                            hint="mount onto a path that does not exist yet (a link is made there), or remove it")


# -- job arrays (``autoresearch submit --array``: Slurm's ``sbatch --array``) ---------------------

MAX_ARRAY = 100_000  # jobs one array may hold (Slurm's MaxArraySize is 1001 by default)
MAX_ARRAY_INDEX = 10_000_000  # the largest index one may name
ARRAY_HINT = ("write it as Slurm's --array: 0-99, 1,3,5-7, 0-98:2 (every 2nd), and %N to run at most N "
              "at once, e.g. 0-99%8")


def parse_array(text: object) -> tuple[list[int], int | None]:
    """The indices of ``--array`` (sorted, each once) and its ``%N`` throttle (None: no cap).

    The grammar is Slurm's: items ``A``, ``A-B`` or ``A-B:S`` (every S-th from A to B) joined by
    commas, then ``%N``: at most N of the array's jobs start or run at once."""
    if not isinstance(text, str) or not text.strip():
        raise SpecError(f"--array needs indices, got {str(text)[:40]!r}", hint=ARRAY_HINT)
    spec = text.strip()
    shown = spec if len(spec) <= 60 else spec[:60] + "..."
    if len(spec) > 10_000:
        raise SpecError(f"--array {shown!r} is longer than 10000 characters", hint=ARRAY_HINT)
    body, pct, cap = spec.partition("%")
    throttle = None
    if pct:
        cap = cap.strip()
        if not _digits(cap) or not 1 <= int(cap) <= MAX_COUNT:
            raise SpecError(f"--array {shown!r}: after % comes how many may run at once (a whole number "
                            f"from 1), not {cap[:20]!r}", hint=ARRAY_HINT)
        throttle = int(cap)
    ranges: list[range] = []
    count = 0
    for item in body.split(","):
        span, colon, step = item.strip().partition(":")
        low, dash, high = span.partition("-")
        if not _digits(low) or (dash and not _digits(high)) or (colon and (not dash or not _digits(step))):
            raise SpecError(f"--array {shown!r}: {item.strip()[:30]!r} is not an index, a range A-B or A-B:STEP",
                            hint=ARRAY_HINT)
        first, last, every = int(low), int(high) if dash else int(low), int(step) if colon else 1
        if last > MAX_ARRAY_INDEX:
            raise SpecError(f"--array {shown!r}: index {last} is above {MAX_ARRAY_INDEX}", hint=ARRAY_HINT)
        if first > last or every < 1:
            raise SpecError(f"--array {shown!r}: {item.strip()!r} is empty (a range runs up, by a step of 1 or more)",
                            hint=ARRAY_HINT)
        ranges.append(range(first, last + 1, every))
        count += len(ranges[-1])
        if count > MAX_ARRAY:
            raise SpecError(f"--array {shown!r} names more than {MAX_ARRAY} jobs",
                            hint="split it into several arrays, or run a research loop (autoresearch plan.yaml)")
    return sorted({i for r in ranges for i in r}), throttle


def _digits(text: str) -> bool:
    """Plain ASCII digits, and few enough of them for an index ('²'.isdigit() is true; int('²') raises)."""
    return text.isascii() and text.isdigit() and len(text) <= 12


def compact_indices(indices: list[int]) -> str:
    """``[0, 1, 2, 5, 7, 9]`` -> ``0-2,5-9:2``: sorted indices as ``--array`` writes them (runs of
    consecutive ones as ``A-B``, three or more evenly spaced as ``A-B:S``)."""
    parts: list[str] = []
    i, n = 0, len(indices)
    while i < n:
        j = i
        if i + 1 < n and indices[i + 1] - indices[i] == 1:
            while j + 1 < n and indices[j + 1] - indices[j] == 1:
                j += 1
            parts.append(f"{indices[i]}-{indices[j]}")
        else:
            step = indices[i + 1] - indices[i] if i + 1 < n else 0
            # (an index that starts a consecutive run is left to it)
            while j + 1 < n and indices[j + 1] - indices[j] == step and not (
                    j + 2 < n and indices[j + 2] - indices[j + 1] == 1):
                j += 1
            if j - i < 2:
                j = i
            parts.append(f"{indices[i]}-{indices[j]}:{step}" if j > i else str(indices[i]))
        i = j + 1
    return ",".join(parts)
