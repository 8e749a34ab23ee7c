"""The agent proposer: the coding agent connected over MCP is the proposer.

``proposer: {kind: agent}`` runs the loop's controller as usual (launch, evaluate,
early stop, noise floor, budgets) but the ideas come from the agent. Its
``propose_trials`` call validates the proposals against the plan (space gate, code
edits turned into patches on top of the best trial) and records them as one
``agent_submit`` decision in the ledger, before anything else happens. The
controller's :class:`AgentProposer` turns recorded submissions into trials: its
``propose`` (run in the controller's worker thread) returns the submitted
proposals that are not trials yet, and otherwise waits. "Not a trial yet" is read
from the history alone (same params and patch), so a crash anywhere loses or
duplicates nothing. ``propose`` returns nothing — which ends the loop once the
running trials finish — when the agent called ``stop_loop``, the wall budget is
used, or the agent stayed silent for ``proposer.options.idle_timeout`` (default
30 min).

The operations that record those submissions (and start, stop and read loops) live in
:mod:`autoresearch.loop.ops`, behind the facade's loop half.
"""

from __future__ import annotations

import json
import time
from typing import Any

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
from autoresearch.loop.store import LoopStore

POLL_S = 0.1
IDLE_TIMEOUT_S = 1800.0
STOP_DECISION = "stop_loop"
SUBMIT_DECISION = "agent_submit"


class AgentProposer(Proposer):
    kind = "agent"
    blocking = True

    def __init__(self, ctx: ProposerContext) -> None:
        super().__init__(ctx)
        self.idle_timeout = option(proposer_options(self.plan), "idle_timeout", IDLE_TIMEOUT_S, 0.0, 1e9, kind="agent")
        self.since = time.time()  # a stop_loop decision older than this run belongs to an earlier run
        self._code: Any = None
        if getattr(self.plan, "code", None) is not None:
            from autoresearch.loop.proposers.code import CodeSearch

            self._code = CodeSearch(self.plan.trial.workdir, list(self.plan.code.files), self.plan.code.instructions)

    def info(self) -> ProposerInfo:
        return ProposerInfo(kind="agent", provider="mcp")

    def workdir_for(self, trial_id: int, proposal: Proposal) -> str | None:
        if self._code is None:
            return None
        from autoresearch.loop.proposers.code import prepare_trial_workdir

        dest = self.ctx.state_dir / "worktrees" / f"trial-{trial_id}"
        return str(prepare_trial_workdir(self.plan.trial.workdir, proposal.patch, dest))

    def propose(self, history: list[TrialRecord], n: int) -> ProposeResult:
        """The agent's submitted proposals that are not trials yet (up to ``n``); wait for some."""
        ledger = self.ctx.runtime.ledger
        tried = {proposal_key(t.params, t.patch) for t in history}
        wall = getattr(self.plan.budget, "wall", None)
        loop = LoopStore.find(ledger, self.ctx.loop_name)
        loop_id = int(loop["id"]) if loop else self.ctx.loop_id
        store = LoopStore(ledger, loop_id)
        started, prior_elapsed = time.monotonic(), float(loop["elapsed_s"] or 0.0) if loop else 0.0
        while True:
            waiting = [(d, p) for d, p in submitted(ledger, loop_id) if proposal_key(p.params, p.patch) not in tried]
            if waiting:
                chosen = waiting[:n]
                first = chosen[0][0]
                ids = sorted({d["id"] for d, _ in chosen})
                agent = json.loads(first["proposer"] or "{}").get("model")
                why = "\n".join(dict.fromkeys(d["rationale"] for d, _ in chosen if d["rationale"]))
                return ProposeResult([p for _, p in chosen], ProposerInfo(kind="agent", model=agent, provider="mcp"),
                                     rationale=f"from agent submission(s) {', '.join(f'#{i}' for i in ids)}: {why}")
            why = ""
            stop = store.last_decision(STOP_DECISION)
            if stop is not None and stop["created_at"] >= self.since:
                why = f"the agent stopped the loop: {stop['rationale'] or 'no reason given'}"
            elif wall is not None and prior_elapsed + time.monotonic() - started >= wall:
                why = f"wall budget {wall:g}s used"
            else:
                idle_since = max(self.since, store.last_decision_at(SUBMIT_DECISION))
                if time.time() - idle_since >= self.idle_timeout:
                    why = f"no proposal from the agent for {self.idle_timeout:g}s"
            if why:
                return ProposeResult([], self.info(), rationale=why)
            time.sleep(POLL_S)


def submitted(ledger: Any, loop_id: int) -> list[tuple[Any, Proposal]]:
    """Every proposal the agent has submitted to a loop, oldest first, with its decision row."""
    out = []
    for d in LoopStore(ledger, loop_id).decisions_of(SUBMIT_DECISION):
        for p in json.loads(d["outputs"]).get("proposals", []):
            out.append((d, Proposal(p["params"], p.get("rationale", ""), p.get("patch"), p.get("parent_trial"))))
    return out


def proposal_key(params: dict[str, Any], patch: str | None) -> str:
    return json.dumps(params, sort_keys=True, default=str) + "\0" + (patch or "")

