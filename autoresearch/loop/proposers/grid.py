"""Grid search: the product of every parameter's grid values, in order, each once."""

from __future__ import annotations

import itertools
from typing import Any

from autoresearch.loop.proposers._base import Proposal, Proposer, ProposeResult, ProposerInfo, TrialRecord
from autoresearch.loop.proposers._space import canonical


class GridProposer(Proposer):
    kind = "grid"
    blocking = False
    learns = False

    def size(self) -> int:
        total = 1
        for p in self.plan.space.values():
            total *= len(p.grid_values())
        return total

    def _points(self) -> itertools.product[tuple[Any, ...]]:
        return itertools.product(*(p.grid_values() for p in self.plan.space.values()))

    def propose(self, history: list[TrialRecord], n: int) -> ProposeResult:
        names = list(self.plan.space)
        seen = {canonical(t.params) for t in history if t.role == "explore"}
        proposals = []
        for index, values in enumerate(self._points()):
            params = dict(zip(names, values, strict=True))
            if canonical(params) in seen:
                continue
            proposals.append(Proposal(params, rationale=f"grid point {index + 1} of {self.size()}"))
            if len(proposals) >= n:
                break
        why = f"next {len(proposals)} of {self.size()} grid points" if proposals else "the grid is exhausted"
        return ProposeResult(proposals, ProposerInfo(kind=self.kind), rationale=why)
