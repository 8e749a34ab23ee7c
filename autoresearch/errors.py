"""The one error tree of autoresearch.

Every failure a user, an agent or CI can act on is an :class:`AutoresearchError`
with a stable ``code``, a one-line ``message`` and a ``hint`` that says what to do
next. The CLI prints message and hint (exit 2 for usage, 1 for runtime failures),
MCP tools return them as an ``is_error`` result, and the Python API raises them.

    AutoresearchError                 code            exit
    ├── SpecError                     spec_invalid    2   a job spec / option is wrong
    │   └── PlanError                 plan_invalid    2   a plan.yaml is wrong
    ├── NotFoundError                 not_found       2   unknown job, node, plan
    ├── CapacityError                 capacity        2   asks for more than exists
    ├── StateError                    bad_state       1   operation not valid in this state
    ├── LedgerError                   ledger          1   ledger locked, corrupt or unwritable
    ├── BackendError                  backend         1   backend unavailable or failed
    ├── AuthError                     auth            2   missing key, token, permission
    ├── TrackingError                 tracking        1   MLflow unreachable or rejected a write
    └── ProposerError                 proposer        1   an LLM provider failed or answered nonsense

Nothing in this module imports anything heavy: it is on every fast path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class AutoresearchError(Exception):
    """Base of all errors. ``str(err)`` is ``message``; ``hint`` says what to do."""

    code = "error"
    exit_code = 1

    def __init__(self, message: str, hint: str = "", **details: object) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.details = details

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"code": self.code, "message": self.message, "hint": self.hint}
        if self.details:
            out["details"] = self.details
        return out

    def __str__(self) -> str:
        return self.message

    def render(self) -> str:
        """Message and hint as one or two lines, the way CLI and MCP show them."""
        return f"{self.message}\nhint: {self.hint}" if self.hint else self.message


class SpecError(AutoresearchError):
    code = "spec_invalid"
    exit_code = 2


class PlanError(SpecError):
    code = "plan_invalid"


class NotFoundError(AutoresearchError):
    code = "not_found"
    exit_code = 2


class CapacityError(AutoresearchError):
    code = "capacity"
    exit_code = 2


class StateError(AutoresearchError):
    code = "bad_state"


class LedgerError(AutoresearchError):
    code = "ledger"


class BackendError(AutoresearchError):
    code = "backend"


class AuthError(AutoresearchError):
    code = "auth"
    exit_code = 2


class TrackingError(AutoresearchError):
    code = "tracking"


class ProposerError(AutoresearchError):
    """The LLM provider failed or answered nonsense after all retries."""

    code = "proposer"


def check_section(raw: object, where: str, keys: tuple[str, ...], example: str,
                  near: Callable[[str, tuple[str, ...]], str] | None = None) -> dict[str, Any]:
    """A config section that must be a mapping of known keys: ``raw`` itself, or a SpecError naming
    ``where`` (``hint``: ``example``, for a key ``near(key, keys)`` or the valid keys)."""
    if not isinstance(raw, dict):
        raise SpecError(f"{where} must be a mapping, got {type(raw).__name__}", hint=f"write {example}")
    for key in raw:
        if key not in keys:
            raise SpecError(f"{where}: unknown key {str(key)[:60]!r}",
                            hint=near(str(key), keys) if near else f"valid keys: {', '.join(keys)}")
    return raw
