"""What a running loop knows, as an object of its own: :class:`LoopState`, and the seam
between the controller and its parts, :class:`LoopHost`.

The ledger stays the truth (see :mod:`autoresearch.loop.store`); :class:`LoopState` is the
controller's in-memory mirror of this loop's trial rows plus the run's own decisions so far
(the incumbent, why it stops, what was launched), rebuilt from the ledger when the
controller starts. The mirror saves O(trials) queries per event, which a 500-trial sweep
would feel.

The controller's parts take the state (:mod:`autoresearch.loop._limits`,
:mod:`autoresearch.loop._launch`) or a :class:`LoopHost` (:mod:`autoresearch.loop.outcomes`,
which also stops trials and proposes repeats), never the controller itself.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

from autoresearch.loop.plan import Plan
from autoresearch.loop.proposers import TrialRecord
from autoresearch.loop.stopping import Series, Stopper
from autoresearch.loop.store import ENDED_TRIAL, LoopStore, to_record
from autoresearch.loop.views import Verdict, seed_groups, to_verdict


@dataclass
class LoopState:
    plan: Plan
    sign: float  # +1 to minimize, -1 to maximize: signed values are "lower is better"
    store: LoopStore = field(init=False)  # set once the loop row exists (Controller.open)
    loop_project: str = ""
    rows: dict[int, dict[str, Any]] = field(default_factory=dict)  # trial id -> its trials row
    records: dict[int, TrialRecord] = field(default_factory=dict)  # the same rows, as the proposer sees them
    state_counts: Counter[str] = field(default_factory=Counter)
    active: dict[int, Any] = field(default_factory=dict)  # trial id -> row (queued/running with a job)
    series: dict[int, Series] = field(default_factory=dict)  # trial id -> signed objective series
    stopping: set[int] = field(default_factory=set)  # trials whose stop decision is out
    held: dict[int, int] = field(default_factory=dict)  # trial -> the first-wave rung it waits at (stopping.first_wave)
    sync: Any = None  # the rung handshake with trials' report() (autoresearch/loop/rungsync.py), if any
    pause_at: set[int] = field(default_factory=set)  # trials being stopped to be paused (loop/pause.py)
    pause_off: bool = False  # a trial did not checkpoint: pausing fell back to stopping
    prefix: dict[int, Series] = field(default_factory=dict)  # a resumed trial's curve before its pause
    finishing: set[int] = field(default_factory=set)  # trials a loop's stop leaves to finish (reached the target)
    launch_decided: set[int] = field(default_factory=set)  # trials with a launch decision
    incumbent: int | None = None
    # Every promote decision as a Verdict, by trial (:func:`~autoresearch.loop.views.verdicts`), and the newest
    # decision id they cover: the ones before this controller read once, its own kept as it writes them.
    verdicts: dict[int, Verdict] = field(default_factory=dict)
    verdicts_upto: int = 0
    verdicts_read: bool = False  # judged() has read the ledger's: from then on they are kept as written
    previous_incumbents: list[int] = field(default_factory=list)  # newest last (views.kept_on_means)
    ahead: int = 0  # trials queued ahead of the free slots (Controller.ahead)
    stop_reason: str = ""
    blocked: str = ""  # why its queued trials do not start, '' when nothing blocks them (views.blocked_text)
    learning_seen: bool = False  # one of the first trials reported the objective: the fail-fast check is over
    exhausted: bool = False  # the proposer returned nothing
    unseen_warned: set[int] = field(default_factory=set)  # trials warned that their objective is unseen
    history_loaded: bool = False  # ended trials' curves read for the stopper (once, after a resume)
    prior_elapsed: float = 0.0  # seconds run before this controller (a resumed loop)
    hard_budgets: bool = False  # CI: every budget hit stops the running trials too (see _limits)
    # Reproducible sweeps (a seeded --ci run; loop/ordered.py): trials' endings take effect in trial
    # order, proposals are made only as they do, and rung decisions wait for the lower trials.
    ordered: bool = False
    processed: set[int] = field(default_factory=set)  # ordered: trials whose ending took effect
    deferred: dict[int, tuple[Any, Any]] = field(default_factory=dict)  # ordered: ended, waiting for lower ids
    stopped_at: dict[int, int] = field(default_factory=dict)  # ordered: the rung a trial was stopped at
    max_wall: float | None = None  # CI: a wall limit on top of the plan's budget.wall (not in the plan's digest)
    llm_usd_spent: float = 0.0  # the budget's running sum over the decisions up to llm_looked (_limits)
    llm_looked: int = 0
    decisions_looked: int = 0  # the newest decision id the stop_loop check has read up to (_limits)
    stop_deadline: float | None = None  # hard stop: when to stop waiting for trials that do not end
    started: float = field(default_factory=time.monotonic)
    # A simulated backend's clock (autoresearch/sim/clock.py): budgets and elapsed time are then
    # simulated seconds. None: the wall clock.
    clock: Any = None
    clock_started: float = 0.0
    # Bookkeeping kept as trials change, so that no event re-reads or re-walks every trial:
    proposed: set[int] = field(default_factory=set)  # trial ids in state "proposed" (pending)
    ended_log: list[int] = field(default_factory=list)  # trial ids in the order they ended (the live view drains it)
    groups: dict[int, list[float]] = field(default_factory=dict)  # :func:`seed_groups` of the rows, kept up to date
    # ``records`` as a list in id order, kept as rows change (history() hands it out without a copy)
    _history: list[TrialRecord] = field(default_factory=list)
    _position: dict[int, int] = field(default_factory=dict)  # trial id -> its index in ``_history``

    def judged(self) -> dict[int, Verdict]:
        """:func:`~autoresearch.loop.views.verdicts` of this loop: what is kept, and any promote decision
        written past it (none while this controller holds the loop's lock and writes them all)."""
        for row in self.store.promotions(self.verdicts_upto):
            self.verdicts_upto = max(self.verdicts_upto, int(row["id"]))
            verdict = to_verdict(row)
            if verdict is not None:
                self.verdicts[verdict.trial_id] = verdict
        self.verdicts_read = True
        return self.verdicts

    def note_verdict(self, verdict: Verdict | None) -> None:
        """A promote decision this controller just wrote (with an id above every other: the loop's writer)."""
        if verdict is None or not self.verdicts_read:
            return  # (judged() reads them all then)
        if verdict.decision_id > self.verdicts_upto:
            self.verdicts_upto = verdict.decision_id
            self.verdicts[verdict.trial_id] = verdict

    def elapsed(self) -> float:
        """Seconds this loop has run: wall seconds, or simulated ones on a simulated backend."""
        if self.clock is not None:
            return self.prior_elapsed + self.clock.now() - self.clock_started
        return self.prior_elapsed + time.monotonic() - self.started

    def wall_started_at(self) -> float:
        """The wall timestamp this controller started at (whatever clock the budgets use)."""
        return time.time() - (time.monotonic() - self.started)

    def now_ts(self) -> float:
        """Now, as a ledger timestamp: a simulated backend stamps its attempts in simulated time."""
        if self.clock is not None:
            return float(self.clock.wall(self.clock.now()))
        return time.time()

    def reload(self, ids: list[int] | None = None) -> None:
        """Refresh the mirror from the ledger: every trial, or just ``ids`` (new ones: their ids
        are above every other, so ``rows`` and ``records`` stay in id order)."""
        if ids is None:
            fresh = self.store.trials()
        elif ids:
            fresh = self.store.trials_by_id(ids)
        else:
            return
        for r in fresh:
            self._put(dict(r))
        if ids is None:
            self.groups = seed_groups(list(self.rows.values()))

    def _put(self, row: dict[str, Any]) -> None:
        old = self.rows.get(row["id"])
        if old is not None:
            self.state_counts[old["state"]] -= 1
        self.rows[row["id"]] = row
        self.state_counts[row["state"]] += 1
        record = self.records[row["id"]] = to_record(row)
        at = self._position.get(row["id"])
        if at is None:  # a new trial: its id is above every other (see reload)
            self._position[row["id"]] = len(self._history)
            self._history.append(record)
        else:
            self._history[at] = record
        if row["state"] == "proposed":
            self.proposed.add(row["id"])
        else:
            self.proposed.discard(row["id"])

    def update_trial(self, trial_id: int, conn: Any = None, **fields: Any) -> dict[str, Any]:
        """Write ``fields`` to a trial's row (in ``conn``'s transaction when given), then to the mirror;
        returns the new row."""
        self.store.update_trial(trial_id, conn, **fields)
        return self._apply(trial_id, fields)

    def update_trials(self, updates: list[tuple[int, dict[str, Any]]]) -> list[dict[str, Any]]:
        """:meth:`update_trial` for several trials, in one ledger transaction."""
        self.store.update_trials(updates)
        return [self._apply(trial_id, fields) for trial_id, fields in updates]

    def _apply(self, trial_id: int, fields: dict[str, Any]) -> dict[str, Any]:
        old = self.rows[trial_id]
        row = dict(old)  # the ledger now holds exactly this (plus updated_at)
        row.update(fields, updated_at=time.time())
        self._put(row)
        if row["state"] in ENDED_TRIAL and old["state"] not in ENDED_TRIAL:
            self.ended_log.append(trial_id)
            self._seed_ended(row)
        return row

    def _seed_ended(self, row: dict[str, Any]) -> None:
        """Keep :attr:`groups` equal to :func:`seed_groups` of the rows (a repeat of a succeeded config ended)."""
        if row["role"] != "repeat" or row["state"] != "succeeded" or row["objective"] is None:
            return
        parent = self.rows.get(row["parent_trial"]) if row["parent_trial"] is not None else None
        if parent is not None and parent["state"] == "succeeded" and parent["objective"] is not None:
            self.groups.setdefault(parent["id"], [parent["objective"]]).append(row["objective"])

    def pending(self) -> list[dict[str, Any]]:
        """Proposed trials not launched yet, oldest first."""
        return [self.rows[t] for t in sorted(self.proposed)]

    def history(self) -> list[TrialRecord]:
        """Every trial as the proposer sees it, in id order, with its curve so far (``intermediate``,
        in the objective's own direction): model-based proposers learn from every rung reached.
        A curve is copied again only when it grew; only trials with a curve are visited, and the
        list is the one kept as rows change, not a copy (flat per call in a plain sweep). Copy it
        before handing it to another thread."""
        if self.ordered:  # what a proposer sees does not depend on timing: ended trials' curves only
            for trial_id in self.processed:
                record, series = self.records.get(trial_id), self.series.get(trial_id)
                if record is not None and series and len(record.intermediate or ()) != len(series):
                    record.intermediate = [(step, value * self.sign) for step, value in series]
            return self._history
        for trial_id, series in self.series.items():
            record = self.records.get(trial_id)
            if record is not None and series and len(record.intermediate or ()) != len(series):
                record.intermediate = [(step, value * self.sign) for step, value in series]
        return self._history

    def job_group(self) -> str:
        """The runtime's job group of this loop's trials: at most ``parallel`` of them run at once
        (``jobs.submit_many``'s running cap), the ones submitted ahead wait queued in it."""
        return f"loop:{self.store.loop_id}"

    def window(self) -> int:
        """Trials submitted at once: ``parallel`` running plus :attr:`ahead` queued ahead, so that
        the pass that records an ending starts the next trial at once."""
        return self.plan.budget.parallel + self.ahead

    def launched(self) -> int:
        """Trials that count against the trial budget (crashed and skipped ones do not)."""
        return sum(n for s, n in self.state_counts.items() if s not in ("proposed", "crashed", "skipped"))


class LoopHost(Protocol):
    """What the controller's parts may use of it: its state, the facade, the proposer and
    stopper, and three actions. :class:`autoresearch.loop.controller.Controller` is one."""

    @property
    def state(self) -> LoopState: ...

    @property
    def plan(self) -> Plan: ...

    @property
    def sign(self) -> float: ...

    @property
    def series(self) -> dict[int, Series]: ...

    @property
    def runtime(self) -> Any: ...  # the engine (autoresearch.engine.runtime.Runtime): the loop never calls the facade

    @property
    def ledger(self) -> Any: ...

    @property
    def proposer(self) -> Any: ...

    @property
    def stopper(self) -> Stopper | None: ...

    def stop_trial(self, trial_id: int, rationale: str, inputs: dict[str, Any]) -> None:
        """Decide to stop a running trial (a stop decision), then cancel its job."""

    def proposed(self, ids: list[int]) -> None:
        """New trials were recorded: mirror them and prepare their MLflow runs."""

    def propose_now(self) -> None:
        """Propose what is wanted now (a proposer that does not block)."""

    def publish(self, force: bool = False) -> None:
        """Persist the elapsed time and show the loop's view (at most every ``update_every_s``)."""
