"""The LLM proposer: an Anthropic or OpenAI(-compatible) model reads the history and
proposes the next trials; with a plan's ``code:`` section it proposes code edits.

    proposer: {kind: llm, provider: anthropic, model: claude-sonnet-4-6, temperature: 0.7}
    proposer: {kind: llm, provider: openai, model: qwen2.5-7b, base_url: http://localhost:8000/v1}
    code: {files: [train.py], instructions: program.md}      # code-edit search

Every answer is structured (a forced tool call / a JSON schema), then each proposal
passes the space gate (clipped with a note or rejected with a reason) and, in
code-edit mode, becomes a patch on top of the best trial so far. When nothing valid
comes back the model is asked once more with the reasons. Provenance: provider,
model, temperature, the prompt template's name and sha256, tokens, dollars and
latency are in every :class:`ProposeResult`; the controller holds the loop to
``budget.llm_usd`` with ``cost_usd``.
"""

from __future__ import annotations

import hashlib
import json
import os
import string
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoresearch.errors import AuthError, PlanError
from autoresearch.loop.proposers import _gate, _providers
from autoresearch.loop.proposers._base import (
    Proposal,
    Proposer,
    ProposerContext,
    ProposeResult,
    ProposerInfo,
    TrialRecord,
    option,
    proposer_options,
)
from autoresearch.loop.proposers._pricing import cost_usd
from autoresearch.loop.proposers._providers import ProposerError
from autoresearch.util.paths import prompts_dir

if TYPE_CHECKING:
    from autoresearch.loop.proposers._code_git import CodeSearch

DEFAULT_MODELS = {"anthropic": "claude-sonnet-4-6", "openai": "gpt-5-mini"}
USER_MARK = "=== user ==="
FAILURE_CHARS = 1500
MAX_FAILURES = 3
BEST_SHOWN = 8


def load_prompt(name_or_path: str) -> tuple[str, str, str, str]:
    """(name, sha256, system, user template) of a prompt file in prompts/ or at a path."""
    path = Path(name_or_path).expanduser()
    if not path.is_file():
        path = prompts_dir() / (name_or_path if name_or_path.endswith(".md") else f"{name_or_path}.md")
    if not path.is_file():
        raise PlanError(f"prompt template {name_or_path!r} not found (looked in {prompts_dir()})",
                        hint="set AUTORESEARCH_PROMPTS to the prompts/ directory, or give proposer.prompt a path")
    raw = path.read_bytes()
    text = raw.decode()
    system, sep, user = text.partition(USER_MARK)
    if not sep:
        raise PlanError(f"prompt template {path} has no '{USER_MARK}' line",
                        hint="a template is the system text, a line '=== user ===', then the user text")
    lines = [ln for ln in system.strip().splitlines() if not ln.startswith("<!--")]
    return path.stem, hashlib.sha256(raw).hexdigest(), "\n".join(lines).strip(), user.strip()


class LLMProposer(Proposer):
    """Built from a plan: ``proposer`` (provider, model, base_url, temperature, max_tokens,
    api_key_env, prompt, batch; ``options``: retries, backoff_s, timeout_s, price_in,
    price_out, history_limit), ``space``, ``objective``, ``code`` and ``trial.workdir``."""

    kind = "llm"

    def __init__(self, ctx: ProposerContext, api_key: str | None = None) -> None:
        super().__init__(ctx)
        plan = _gate.as_dict(ctx.plan)
        config = dict(_gate.as_dict(plan.get("proposer")) or {})
        options = proposer_options(plan)
        self.check(plan, api_key=api_key)
        self.space = _gate.normalize(plan.get("space"))
        objective = _gate.as_dict(plan.get("objective")) or {}
        self.metric = str(objective.get("metric", "objective"))
        self.goal = str(objective.get("goal", "minimize"))
        self.provider = str(config.get("provider") or "anthropic")
        self.model = str(config.get("model") or DEFAULT_MODELS[self.provider])
        self.base_url = config.get("base_url")
        self.temperature = config.get("temperature")
        self.api_key = _api_key(config, api_key)
        self.max_tokens = int(config.get("max_tokens") or 4096)
        self.batch = config.get("batch")
        self.retries = option(options, "retries", 4, 0, 100, integer=True, kind="llm")
        self.backoff_s = option(options, "backoff_s", 1.0, 0.0, 3600.0, kind="llm")
        self.timeout_s = option(options, "timeout_s", 120.0, 0.001, 86400.0, kind="llm")
        self.history_limit = option(options, "history_limit", 30, 1, 100_000, integer=True, kind="llm")
        price_in = option(options, "price_in", None, 0.0, 1e6, kind="llm")
        price_out = option(options, "price_out", None, 0.0, 1e6, kind="llm")
        self.price = (price_in, price_out) if price_in is not None and price_out is not None else None
        code = _gate.as_dict(plan.get("code"))
        self.workdir = Path((_gate.as_dict(plan.get("trial")) or {}).get("workdir", ".")).expanduser().resolve()
        self.code: CodeSearch | None = None
        if code:
            from autoresearch.loop.proposers._code_git import CodeSearch

            self.code = CodeSearch(self.workdir, list(code.get("files") or []), code.get("instructions"))
        self.prompt_name, self.prompt_sha, self.system, self.template = load_prompt(
            config.get("prompt") or ("propose_patch" if self.code else "propose_params"))

    # -- the preflight the controller runs at plan load ------------------------------------------

    @classmethod
    def check(cls, plan: Any, api_key: str | None = None, environ: Mapping[str, str] | None = None) -> None:
        """Raise before anything launches: unknown provider, no model for a custom server,
        a missing API key (:class:`~autoresearch.errors.AuthError`, hint: ``proposer: {kind: tpe}``),
        a code section that cannot work (not a git repo, uncommitted files). ``environ``: the
        environment the controller will run with (a tenant's clean one; default: ours)."""
        plan = _gate.as_dict(plan) or {}
        config = _gate.as_dict(plan.get("proposer")) or {}
        provider = str(config.get("provider") or "anthropic")
        if provider not in _providers.PROVIDERS:
            raise PlanError(f"proposer.provider {provider!r} is not supported",
                            hint="use provider: anthropic, or provider: openai (also for vLLM / Ollama via base_url)")
        if config.get("base_url") and not config.get("model"):
            raise PlanError("proposer.base_url is set but proposer.model is not",
                            hint="name the model the server serves, e.g. model: qwen2.5-coder:7b")
        key = _api_key(config, api_key, environ)
        if _providers.resolve_key(provider, key, config.get("base_url"), environ) is None:
            env = config.get("api_key_env")
            if env:
                raise AuthError(f"the llm proposer reads its API key from ${env}, which is not set",
                                hint=f"export {env}=..., or search without an LLM: proposer: {{kind: tpe}}")
            raise _providers.missing_key_error(provider)
        code = _gate.as_dict(plan.get("code"))
        if code:
            from autoresearch.loop.proposers._code_git import CodeSearch

            workdir = (_gate.as_dict(plan.get("trial")) or {}).get("workdir", ".")
            CodeSearch.check(workdir, list(code.get("files") or []))

    def info(self) -> ProposerInfo:
        return ProposerInfo(self.kind, self.model, self.provider, self.prompt_name, self.prompt_sha, self.temperature)

    def workdir_for(self, trial_id: int, proposal: Proposal) -> str | None:
        """Code-edit trials run in their own git worktree with their patch applied."""
        if self.code is None:
            return None
        from autoresearch.loop.proposers._code_git import prepare_trial_workdir

        return str(prepare_trial_workdir(self.workdir, proposal.patch, self.worktrees / f"trial-{trial_id}"))

    @property
    def worktrees(self) -> Path:
        return self.ctx.state_dir / "worktrees"

    # -- proposing -------------------------------------------------------------------------------

    def propose(self, history: list[TrialRecord], n: int) -> ProposeResult:
        started = time.monotonic()
        result = ProposeResult([], self.info())
        if self.batch:
            n = min(n, int(self.batch))
        if n <= 0:
            return result
        base = self._incumbent(history)
        base_code = self.code.files_at(base.patch) if self.code else {}
        notes: list[str] = []
        rejected: list[str] = []
        for _ in range(2):  # one repair round when nothing valid came back
            user = self._render(history, n, base, base_code, rejected)
            called_at = time.time()
            answer = _providers.complete(
                provider=self.provider, model=self.model, system=self.system, user=user, schema=self._schema(n),
                api_key=self.api_key, base_url=self.base_url, temperature=self.temperature,
                max_tokens=self.max_tokens, timeout_s=self.timeout_s, retries=self.retries, backoff_s=self.backoff_s)
            result.tokens_in += answer.tokens_in
            result.tokens_out += answer.tokens_out
            dollars, price_note = cost_usd(answer.model or self.model, answer.tokens_in, answer.tokens_out, self.price)
            result.cost_usd += dollars
            result.calls.append({
                "name": f"propose/{self.provider}", "model": answer.model or self.model, "provider": self.provider,
                "inputs": {"system": self.system, "user": user}, "outputs": answer.data or answer.text,
                "started_at": called_at, "ended_at": time.time(), "tokens_in": answer.tokens_in,
                "tokens_out": answer.tokens_out, "cost_usd": dollars})
            if price_note and price_note not in notes:
                notes.append(price_note)
            result.rationale = str(answer.data.get("rationale") or answer.text or "").strip()
            rejected = []
            result.proposals = self._accept(answer.data.get("proposals") or [], history, base, n, notes, rejected)
            if result.proposals:
                break
        result.latency_s = time.monotonic() - started
        if rejected:
            notes.append("rejected: " + "; ".join(rejected))
        if notes:
            result.rationale = (result.rationale + "\n\n" if result.rationale else "") + "\n".join(notes)
        if not result.proposals:
            raise ProposerError(
                f"the {self.provider} model {self.model} proposed nothing valid twice: {'; '.join(rejected)[:400]}",
                hint="check the space and the prompt, or use proposer: {kind: tpe}",
                tokens_in=result.tokens_in, tokens_out=result.tokens_out, cost_usd=result.cost_usd)
        return result

    def _accept(self, items: list[Any], history: list[TrialRecord], base: TrialRecord, n: int,
                notes: list[str], rejected: list[str]) -> list[Proposal]:
        seen = {_key(t.params, t.patch) for t in history}
        out: list[Proposal] = []
        for i, item in enumerate(items, 1):
            if len(out) >= n:
                break
            if not isinstance(item, dict):
                rejected.append(f"proposal {i} is not an object")
                continue
            raw = item.get("params")
            if self.code and not raw and base.params:
                raw = dict(base.params)  # a code-only change keeps the base trial's params
            try:
                params, changes = _gate.coerce(self.space, raw if raw is not None else {})
                patch = self.code.make_patch(base.patch, item.get("edits") or []) if self.code else None
            except _gate.Rejected as why:
                rejected.append(f"proposal {i}: {why}")
                continue
            key = _key(params, patch)
            if key in seen:
                rejected.append(f"proposal {i}: already tried ({_short(params)})")
                continue
            seen.add(key)
            notes.extend(f"proposal {i}: {c}" for c in changes)
            out.append(Proposal(params, str(item.get("rationale") or "").strip(), patch,
                                base.trial_id if self.code and base.trial_id >= 0 else None))
        return out

    # -- the prompt ------------------------------------------------------------------------------

    def _schema(self, n: int) -> dict[str, Any]:
        item: dict[str, Any] = {"type": "object", "properties": {"params": _gate.params_schema(self.space),
                                                               "rationale": {"type": "string"}},
                                "required": ["params", "rationale"]}
        if self.code:
            item["properties"]["edits"] = {"type": "array", "items": {
                "type": "object", "required": ["file", "search", "replace"],
                "properties": {"file": {"type": "string", "enum": self.code.files},
                               "search": {"type": "string"}, "replace": {"type": "string"}}}}
            item["required"] = ["edits", "rationale"]
        return {"type": "object", "required": ["rationale", "proposals"],
                "properties": {"rationale": {"type": "string"},
                               "proposals": {"type": "array", "items": item, "minItems": 1, "maxItems": n}}}

    def _incumbent(self, history: list[TrialRecord]) -> TrialRecord:
        done = [t for t in history if t.state == "succeeded" and t.objective is not None]
        if not done:
            return TrialRecord(-1, {}, "base")
        sign = -1.0 if self.goal.startswith("max") else 1.0
        return min(done, key=lambda t: (sign * (t.objective or 0.0), t.trial_id))

    def _render(self, history: list[TrialRecord], n: int, base: TrialRecord, base_code: dict[str, str],
                rejected: list[str]) -> str:
        values = {
            "metric": self.metric, "goal": self.goal, "n": str(n), "n_trials": str(len(history)),
            "space": _gate.describe(self.space), "history": self._history(history) or "(none yet: this is the start)",
            "failures": self._failures(history) or "(none)",
            "instructions": self.code.instructions if self.code else "",
            "base_trial": "base (unmodified)" if base.trial_id < 0 else f"#{base.trial_id}, {self.metric}={base.objective}",
            "code": "\n\n".join(f"## {name}\n```\n{text}\n```" for name, text in base_code.items()),
        }
        text = string.Template(self.template).safe_substitute(values)
        if rejected:
            text += "\n\n# Your previous answer was rejected\n" + "\n".join(f"- {r}" for r in rejected)
            text += "\nFix these problems in your new answer."
        return text

    def _history(self, history: list[TrialRecord]) -> str:
        sign = -1.0 if self.goal.startswith("max") else 1.0
        scored = sorted((t for t in history if t.objective is not None), key=lambda t: sign * (t.objective or 0.0))
        shown = scored[:BEST_SHOWN]
        recent = [t for t in sorted(history, key=lambda t: t.trial_id) if t not in shown]
        shown += recent[-max(0, self.history_limit - len(shown)):]
        lines = []
        for t in shown:
            value = f"{self.metric}={t.objective:.6g}" if t.objective is not None else "no result"
            extra = f" — {t.rationale.splitlines()[0][:160]}" if t.rationale else ""
            parent = f" (from #{t.parent_trial})" if t.parent_trial is not None else ""
            lines.append(f"- #{t.trial_id} {t.state}: {value}; params {_short(t.params)}{parent}{extra}")
        if len(history) > len(shown):
            lines.append(f"- ... {len(history) - len(shown)} more trials not shown")
        return "\n".join(lines)

    def _failures(self, history: list[TrialRecord]) -> str:
        failed = [t for t in sorted(history, key=lambda t: t.trial_id) if t.state == "failed" and t.failure]
        blocks = []
        for t in failed[-MAX_FAILURES:]:
            tail = (t.failure or "")[-FAILURE_CHARS:]
            blocks.append(f"## trial #{t.trial_id} failed (params {_short(t.params)})\n```\n{tail}\n```")
        return "\n\n".join(blocks)


def _key(params: dict[str, Any], patch: str | None) -> str:
    return json.dumps(params, sort_keys=True, default=str) + "\0" + (patch or "")


def _short(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items()) or "-"


def _api_key(config: dict[str, Any], explicit: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    if explicit:
        return explicit
    env = config.get("api_key_env")
    return (os.environ if environ is None else environ).get(env) or None if env else None
