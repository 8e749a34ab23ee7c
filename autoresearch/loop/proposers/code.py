"""The code-edit proposer: the LLM proposer with a plan's ``code:`` section, keeping the best
trial's worktree and discarding the others.

The git bookkeeping (edits to patches, one worktree per trial) is
:mod:`autoresearch.loop.proposers._code_git`; its :class:`CodeSearch`, :func:`prepare_trial_workdir`,
:func:`cleanup_worktrees` and ``MARKER`` are importable from here too.
"""

from __future__ import annotations

from typing import Any

from autoresearch.errors import PlanError
from autoresearch.loop.proposers import llm as _llm
from autoresearch.loop.proposers._base import TrialRecord
from autoresearch.loop.proposers._code_git import MARKER, CodeSearch, _git, cleanup_worktrees, prepare_trial_workdir

__all__ = ["MARKER", "CodeProposer", "CodeSearch", "cleanup_worktrees", "prepare_trial_workdir"]


class CodeProposer(_llm.LLMProposer):
    """``proposer: {kind: llm}`` with a ``code:`` section: edits as patches, one worktree per trial.

    Keep/discard: the best finished trial's patch is the base of every new proposal.
    A trial that has ended and is not the best has its worktree removed (its patch
    stays in the ledger and recreates it); the best one's stays for inspection.
    """

    kind = "code"

    def __init__(self, ctx: Any, api_key: str | None = None) -> None:
        super().__init__(ctx, api_key=api_key)
        if self.code is None:
            raise PlanError("the code-edit proposer needs a code: section",
                            hint="add code: {files: [train.py], instructions: program.md}")
        self._best: tuple[float, int] | None = None

    def observe(self, trial: TrialRecord) -> None:
        if trial.state not in ("succeeded", "failed", "stopped", "crashed") or trial.trial_id < 0:
            return
        sign = -1.0 if self.goal.startswith("max") else 1.0
        candidate = (sign * trial.objective, trial.trial_id) if trial.objective is not None and \
            trial.state == "succeeded" else None
        if candidate is not None and (self._best is None or candidate < self._best):
            previous, self._best = self._best, candidate
            if previous is not None:
                self._discard(previous[1])
            return
        self._discard(trial.trial_id)

    def _discard(self, trial_id: int) -> None:
        path = self.worktrees / f"trial-{trial_id}"
        if (path / MARKER).exists():
            _git(self.code.root if self.code else self.workdir, "worktree", "remove", "--force", str(path),
                 check=False)

    def close(self) -> None:
        _git(self.workdir, "worktree", "prune", check=False)
