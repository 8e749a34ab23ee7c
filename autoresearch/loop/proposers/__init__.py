"""Proposers: a registry from ``proposer.kind`` to an implementation, imported lazily.

Built in: ``random``, ``grid``, ``tpe``, ``bohb``. Other modules add kinds to ``_BUILTIN``
(``llm``, ``code``, ``agent``); third parties register under the
``autoresearch.proposers`` entry point group ("kind = module:Class"). A plan with a
``code:`` section and an ``llm`` proposer runs the ``code`` (code-edit) proposer.
"""

from __future__ import annotations

import difflib
from importlib import import_module
from importlib.metadata import entry_points
from typing import Any

from autoresearch.errors import PlanError
from autoresearch.loop.proposers._base import (
    Proposal,
    Proposer,
    ProposerContext,
    ProposeResult,
    ProposerInfo,
    TrialRecord,
)

__all__ = ["Proposal", "ProposeResult", "Proposer", "ProposerContext", "ProposerInfo", "TrialRecord",
           "check_kind", "kinds", "make_proposer", "register", "resolve_kind"]

# kind -> "module:Class"
_BUILTIN: dict[str, str] = {
    "random": "autoresearch.loop.proposers.random:RandomProposer",
    "grid": "autoresearch.loop.proposers.grid:GridProposer",
    "tpe": "autoresearch.loop.proposers.tpe:TPEProposer",
    "bohb": "autoresearch.loop.proposers.bohb:BOHBProposer",
    "llm": "autoresearch.loop.proposers.llm:LLMProposer",
    "code": "autoresearch.loop.proposers.code:CodeProposer",
    "agent": "autoresearch.loop.proposers.agent:AgentProposer",
}
_REGISTERED: dict[str, Any] = {}


def register(kind: str, target: str | type[Proposer]) -> None:
    """Add a kind at run time ("module:Class" or the class itself)."""
    _REGISTERED[kind] = target


def _entry_points() -> dict[str, str]:
    return {ep.name: ep.value for ep in entry_points(group="autoresearch.proposers")}


def kinds() -> list[str]:
    return sorted({**_entry_points(), **_BUILTIN, **_REGISTERED})


def check_kind(kind: str) -> None:
    if kind in _REGISTERED or kind in _BUILTIN or kind in _entry_points():
        return
    valid = kinds()
    near = difflib.get_close_matches(kind, valid, n=1)
    did = f"did you mean {near[0]!r}? " if near else ""
    raise PlanError(f"unknown proposer kind {kind!r}", hint=f"{did}valid kinds: {', '.join(valid)}")


def resolve_kind(plan: Any) -> str:
    """The kind that actually runs: an llm proposer with a code: section edits code."""
    kind = str(plan.proposer.kind)
    if kind == "llm" and getattr(plan, "code", None) is not None and "code" in kinds():
        return "code"
    return kind


def make_proposer(ctx: ProposerContext) -> Proposer:
    kind = resolve_kind(ctx.plan)
    check_kind(kind)
    if getattr(ctx.plan, "warm_start", None) and ctx.runtime is not None and not ctx.warm:
        from autoresearch.loop.proposers._warm import load_warm

        ctx.warm = load_warm(ctx.plan, ctx.runtime.ledger, ctx.project)
    target = _REGISTERED.get(kind) or _BUILTIN.get(kind) or _entry_points()[kind]
    if isinstance(target, str):
        module, _, attr = target.partition(":")
        target = getattr(import_module(module), attr)
    proposer = target(ctx)
    assert isinstance(proposer, Proposer), f"{target} is not a Proposer"
    return proposer
