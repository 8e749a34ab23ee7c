"""Random search: independent uniform (or log-uniform) samples of the space."""

from __future__ import annotations

import random as _random

from autoresearch.loop.proposers._base import Proposal, Proposer, ProposeResult, ProposerInfo, TrialRecord
from autoresearch.loop.proposers._space import sample


class RandomProposer(Proposer):
    kind = "random"
    blocking = False

    def info(self) -> ProposerInfo:
        return ProposerInfo(kind=self.kind, model=f"seed={self.plan.proposer.seed}")

    def propose(self, history: list[TrialRecord], n: int) -> ProposeResult:
        # Proposal k draws from its own seeded stream, so a resumed loop proposes what it would have.
        start = sum(1 for t in history if t.role == "explore")
        seed = self.plan.proposer.seed if self.plan.proposer.seed is not None else 0
        proposals = []
        for k in range(start, start + n):
            params = sample(self.plan.space, _random.Random(f"{seed}:{k}"))
            proposals.append(Proposal(params, rationale=f"random sample #{k + 1}"))
        return ProposeResult(proposals, self.info(), rationale=f"{n} uniform random sample(s) of the space")
