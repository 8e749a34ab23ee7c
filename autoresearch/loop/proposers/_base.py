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
from pathlib import Path
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
    role: str = "explore"  # explore (a proposal) | repeat (the noise floor re-running an incumbent with another seed)
    job_id: int | None = None


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
    # The model calls behind this result, for tracing (tracking.record_llm_call's keywords:
    # name, model, provider, inputs, outputs, started_at, ended_at, tokens_in/out, cost_usd).
    calls: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class ProposerContext:
    """What a proposer is built from. ``plan`` is an :class:`autoresearch.loop.plan.Plan`."""

    plan: Any
    loop_id: int = 0
    loop_name: str = ""
    home: Path | None = None  # $AUTORESEARCH_HOME: a proposer's own files go under home/loops/<loop_name>/
    runtime: Any = None  # the engine (autoresearch.engine.runtime.Runtime): its ledger, e.g. an agent's submissions
    project: str = ""  # the loop's project: warm_start reads only this project's loops
    # Trials of the plan's warm_start loops (ended ones, with their curves), loaded by make_proposer:
    # model-based proposers (tpe, bohb) take them as their prior; others ignore them.
    warm: list[TrialRecord] = field(default_factory=list)

    @property
    def state_dir(self) -> Path:
        base = self.home if self.home is not None else Path(".")
        path = base / "loops" / (self.loop_name or "loop")
        path.mkdir(parents=True, exist_ok=True)
        return path


class Proposer(abc.ABC):
    """Built once per controller run as ``cls(ctx)``; the constructor checks what it needs
    (API keys, servers) and raises an AutoresearchError before anything launches."""

    kind: str = "?"
    blocking: bool = True  # False: propose() is fast and local, so the controller calls it inline
    # False: proposals never depend on results (random, grid), so the loop queues a whole ``parallel``
    # of trials ahead of the free slots, not ``parallel // 4`` (Controller.ahead)
    learns: bool = True

    def __init__(self, ctx: ProposerContext) -> None:
        self.ctx = ctx
        self.plan = ctx.plan

    def info(self) -> ProposerInfo:
        return ProposerInfo(kind=self.kind)

    def close(self) -> None:  # noqa: B027 - optional
        """Release clients, studies, servers."""

    def workdir_for(self, trial_id: int, proposal: Proposal) -> str | None:
        """Where trial ``trial_id`` runs; None: the plan's ``trial.workdir``. A code-edit proposer
        returns a git worktree with ``proposal.patch`` applied. Called once per trial, before its
        launch decision is acted on, and again after a crash, so it must be idempotent."""
        return None

    @abc.abstractmethod
    def propose(self, history: list[TrialRecord], n: int) -> ProposeResult:
        """Up to ``n`` new proposals given everything known so far (may return fewer; 0 = exhausted)."""

    def observe(self, trial: TrialRecord) -> None:  # noqa: B027 - optional
        """A trial ended or reported; ask/tell proposers update here."""


def proposer_options(plan: Any, known: set[str] | None = None) -> dict[str, Any]:
    """``proposer.options`` of a plan (its model or plain data) as a dict; with ``known``, a key
    outside it is refused, naming the kind's keys. Every proposer reads its options through here
    and :func:`option`, so a bad option is a one-line :class:`~autoresearch.errors.PlanError`."""
    from autoresearch.errors import PlanError

    config = plan.get("proposer") if isinstance(plan, dict) else getattr(plan, "proposer", None)
    if config is None:
        return {}
    raw = config.get("options") if isinstance(config, dict) else getattr(config, "options", None)
    options = dict(raw or {}) if isinstance(raw, dict) or raw is None else None
    kind = config.get("kind") if isinstance(config, dict) else getattr(config, "kind", "?")
    if options is None:
        raise PlanError(f"proposer.options is {str(raw)[:40]!r}, not a mapping", hint="e.g. options: {key: value}")
    unknown = sorted(set(options) - known) if known is not None else []
    if unknown:
        raise PlanError(f"proposer.options: unknown key {str(unknown[0])[:40]!r} for {kind}",
                        hint=f"{kind} reads " + ", ".join(sorted(known or ())))
    return options


def option(options: dict[str, Any], key: str, default: float | None, low: float, high: float,
           integer: bool = False, kind: str = "") -> Any:
    """A numeric ``proposer.options.<key>`` checked against [low, high] (whole when ``integer``);
    ``default`` when absent (None stays None)."""
    import math

    from autoresearch.errors import PlanError

    value = options.get(key, default)
    if value is None:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        and low <= value <= high and (not integer or float(value).is_integer())
    if not ok:
        what = "a whole number" if integer else "a number"
        example = f"{default:g}" if default is not None else f"{low:g}"
        raise PlanError(f"proposer.options.{key} is {str(value)[:40]!r}; give {what} in {low:g}..{high:g}",
                        hint=f"e.g. proposer: {{kind: {kind or '...'}, options: {{{key}: {example}}}}}")
    return int(value) if integer else float(value)
