"""Random search: independent uniform (or log-uniform) samples of the space."""

from __future__ import annotations

import random as _random

from autoresearch.loop.proposers._base import Proposal, Proposer, ProposeResult, ProposerInfo, TrialRecord
from autoresearch.loop.proposers._space import sample


class RandomProposer(Proposer):
    kind = "random"
    blocking = False
    learns = False

    _counted: tuple[int, int, int] = (0, -1, 0)  # (records counted, the last one's trial id, explore among them)

    def _explore_count(self, history: list[TrialRecord]) -> int:
        """Explore trials in ``history``: the loop's history grows by appending (id order), so only
        the records after those counted last time are visited (flat per call, issue 16)."""
        n, last_id, count = self._counted
        if not (0 < n <= len(history) and history[n - 1].trial_id == last_id):
            n, count = 0, 0  # another history (a test, a resumed loop): count it all
        count += sum(1 for t in history[n:] if t.role == "explore")
        if history:
            self._counted = (len(history), history[-1].trial_id, count)
        return count

    def info(self) -> ProposerInfo:
        return ProposerInfo(kind=self.kind, model=f"seed={self.plan.proposer.seed}")

    def propose(self, history: list[TrialRecord], n: int) -> ProposeResult:
        # Proposal k draws from its own seeded stream, so a resumed loop proposes what it would have.
        start = self._explore_count(history)
        seed = self.plan.proposer.seed if self.plan.proposer.seed is not None else 0
        proposals = []
        for k in range(start, start + n):
            params = sample(self.plan.space, _random.Random(f"{seed}:{k}"))
            proposals.append(Proposal(params, rationale=f"random sample #{k + 1}"))
        return ProposeResult(proposals, self.info(), rationale=f"{n} uniform random sample(s) of the space")
