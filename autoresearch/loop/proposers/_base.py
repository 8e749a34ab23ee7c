"""The proposer contract: history in, proposals with rationale out.

Every proposer — random, grid, optuna TPE, an LLM, a code-edit LLM, or the coding
agent over MCP — implements :class:`Proposer`. The controller calls ``propose``
whenever it has free slots (from a worker thread: implementations may block on
network calls) and ``observe`` whenever a trial ends or reports. Proposers keep no
state that matters only in memory: everything they need is in ``history``, which the
controller rebuilds from the ledger after a crash, so a resumed loop proposes as if
it had never stopped (TPE replays the history into a fresh study).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any


@dataclass
class TrialRecord:
    """What a proposer may know about one trial."""

    trial_id: int
    params: dict[str, Any]
    state: str  # queued | running | succeeded | failed | stopped (early-stopped) | crashed (infra, given up)
    objective: float | None = None  # final value of the plan's objective metric
    metrics: dict[str, float | None] = field(default_factory=dict)  # last value of every metric
    intermediate: list[tuple[int, float]] = field(default_factory=list)  # (step, objective) while running
    patch: str | None = None  # unified diff of a code-edit trial
    parent_trial: int | None = None
    seed: int | None = None
    failure: str | None = None  # for user errors: exit code + log tail, fed back to LLMs
    rationale: str = ""


@dataclass
class Proposal:
    params: dict[str, Any]
    rationale: str = ""
    patch: str | None = None
    parent_trial: int | None = None


@dataclass
class ProposerInfo:
    """Identity recorded in every decision's provenance."""

    kind: str
    model: str | None = None
    provider: str | None = None
    prompt_name: str | None = None
    prompt_sha256: str | None = None
    temperature: float | None = None


@dataclass
class ProposeResult:
    proposals: list[Proposal]
    info: ProposerInfo
    rationale: str = ""
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    latency_s: float = 0.0


class Proposer(abc.ABC):
    kind: str = "?"

    @abc.abstractmethod
    def propose(self, history: list[TrialRecord], n: int) -> ProposeResult:
        """Up to ``n`` new proposals given everything known so far (may return fewer; 0 = exhausted)."""

    def observe(self, trial: TrialRecord) -> None:  # noqa: B027 - optional
        """A trial ended or reported; ask/tell proposers update here."""
