"""Read model of a loop, built from the ledger alone (no controller needs to be running).

Used by the live table, ``--json``, ``autoresearch report``, and the MCP tools
(``loop_status``, ``leaderboard``). Stdlib only.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field, replace
from typing import Any

from autoresearch.engine.blocked import no_node_text
from autoresearch.errors import NotFoundError
from autoresearch.loop.noise import Floor, incumbent_floor
from autoresearch.loop.store import LoopStore
from autoresearch.store.jobstore import JobStore
from autoresearch.store.ledger import Ledger


@dataclass
class TrialRow:
    trial_id: int
    job_id: int | None
    role: str  # explore | repeat
    state: str  # proposed | queued | running | succeeded | failed | stopped | crashed | cancelled | skipped
    params: dict[str, Any]
    seed: int | None
    parent_trial: int | None
    objective: float | None
    best_so_far: float | None  # the incumbent's value once this trial ended (:func:`incumbent_sequence`)
    step: int | None = None  # last step seen while running
    value: float | None = None  # objective at that step
    created_at: float = 0.0
    started_at: float | None = None
    ended_at: float | None = None
    rationale: str = ""
    failure: str | None = None
    has_patch: bool = False
    kept: bool = False  # the loop made it the incumbent when it ended
    within_noise: bool = False  # it beat the incumbent by less than the noise floor: not kept
    incumbent_after: int | None = None  # the incumbent once it ended


# The stop reason of a loop whose first trials all failed the same way or never reported the objective
# (autoresearch/loop/_limits.py: cannot_learn); `autoresearch run` exits 1 with it.
CANNOT_LEARN = "cannot learn: "


@dataclass
class LoopView:
    name: str
    loop_id: int
    state: str  # running | finished | interrupted | failed
    metric: str
    goal: str
    trials: list[TrialRow]
    counts: dict[str, int]
    best_trial: int | None  # the incumbent
    best_value: float | None  # its mean over seeds
    best_params: dict[str, Any] = field(default_factory=dict)
    best_seeds: int = 0
    noise_floor: float | None = None  # what judges the next challenger: std of one run of the incumbent
    noise_basis: str = ""  # what measured ``noise_floor``, in words (:meth:`autoresearch.loop.noise.Floor.basis`)
    rejected_as_noise: int = 0  # gains that the noise floor did not accept
    decisions: int = 0
    llm_usd: float = 0.0
    tokens: int = 0
    elapsed_s: float = 0.0
    eta_s: float | None = None
    budget_trials: int = 0
    parallel: int = 0
    stop_reason: str = ""
    report_dir: str | None = None
    report_state: str = ""  # the background report (loop/report_later.py): writing | done | failed | interrupted
    next_step: str = ""
    curve: list[CurveStep] = field(default_factory=list)  # the incumbent sequence (:func:`incumbent_sequence`)
    not_shown: int = 0  # trials left out of ``trials``: a live view (:mod:`._live_view`) carries only what is shown
    warm_start: str = ""  # which earlier loops' trials warmed its proposer, and how many (loop/proposers/_warm.py)
    best_confirmed: bool | None = None  # its repeats (repeats.seeds) all ended; None: the plan has no repeats
    budget_spent: str = ""  # the finished loop's compute budgets, spent / given ("steps 27/20 · GPU-h 0.1/1")
    # Why its queued trials do not start: every node that fits is cordoned or down (engine/blocked.py);
    # '' when nothing blocks them. The loop waits (a node comes back) and says so once, and on a change.
    blocked: str = ""


@dataclass(frozen=True)
class Verdict:
    """The loop's keep-or-discard of one finished explore trial (a ``promote`` decision)."""

    trial_id: int
    promoted: bool
    within_noise: bool  # better than the incumbent, but not beyond the noise floor: not kept
    decided_at: float
    decision_id: int


@dataclass(frozen=True)
class CurveStep:
    """One point of the incumbent sequence: after ``trial_id`` ended (at ``at``), the incumbent
    the loop kept, its mean objective over the seeds of it that had ended by then, and the noise
    floor a challenger was judged with from then on (:func:`autoresearch.loop.noise.incumbent_floor`)."""

    trial_id: int
    at: float
    incumbent: int | None
    value: float | None
    noise: float | None = None


def verdicts(ledger: Ledger, loop_id: int) -> dict[int, Verdict]:
    """Every keep-or-discard decision of a loop, by trial (the newest one wins)."""
    out: dict[int, Verdict] = {}
    for row in LoopStore(ledger, loop_id).promotions():
        verdict = to_verdict(row)
        if verdict is not None:
            out[verdict.trial_id] = verdict
    return out


def to_verdict(row: Any) -> Verdict | None:
    """A promote decision's row (id, trial_id, outputs, created_at) as a :class:`Verdict` (None: unreadable)."""
    try:
        data = json.loads(row["outputs"])
    except (TypeError, ValueError):
        return None
    return verdict_of(data, row["trial_id"], row["created_at"], row["id"])


def verdict_of(outputs: Any, trial_id: Any, created_at: Any, decision_id: Any) -> Verdict | None:
    """A promote decision (its ``outputs``, the trial it names, when and its id) as a :class:`Verdict`
    (None: unreadable): :func:`to_verdict` of its row, and the controller's own as it writes one."""
    try:
        trial = int(outputs.get("trial_id", trial_id))
    except (TypeError, ValueError, AttributeError):
        return None
    margin = outputs.get("margin")
    promoted = bool(outputs.get("promoted"))
    within = not promoted and isinstance(margin, (int, float)) and margin > 0
    return Verdict(trial, promoted, within, float(created_at or 0.0), int(decision_id))


def incumbent_sequence(rows: list[Any], judged: dict[int, Verdict],
                       tracker: IncumbentTracker | None = None, sign: float = 1.0) -> list[CurveStep]:
    """THE answer to "what was best": the incumbent after each ended trial, as the loop kept it.

    Every view of "best" reads this (the live and final tables, the report's plots and
    summary, the MCP leaderboard, the controller on resume), so none can disagree with the
    loop's noise-aware decisions: a trial that merely scored lower, within the noise floor,
    never becomes "best" here. Trials are replayed in the order the loop judged them, on the
    trials' own clock (:func:`judged_times`: a judged trial in decision order, others at their
    end; each step's ``at``); the incumbent's value is the mean
    of its seeds (itself and its repeats) that had ended by then, with the noise floor then in
    force. ``tracker``: replay into this one (a live view goes on from it, one ended trial at a
    time); ``sign``: +1 to minimize, -1 to maximize.
    """
    ended = [r for r in rows if r["ended_at"]]
    at = judged_times(ended, judged)
    tracker = tracker or IncumbentTracker(sign)
    return [tracker.step(r, judged.get(r["id"]), at[r["id"]])
            for r in sorted(ended, key=lambda r: (at[r["id"]], _decision_of(judged, r["id"]), r["id"]))]


def judged_times(ended: list[Any], judged: dict[int, Verdict]) -> dict[int, float]:
    """When each ended trial took effect, on one clock: the trials' own (``ended_at``; on the sim
    backend simulated, where decisions are stamped with the wall clock). A judged trial takes effect
    in the order the loop judged it (decision order), never before it ended nor before a trial judged
    ahead of it; another trial at its end."""
    out = {r["id"]: float(r["ended_at"]) for r in ended}
    latest = -math.inf
    for r in sorted((r for r in ended if r["id"] in judged), key=lambda r: (judged[r["id"]].decision_id, r["id"])):
        latest = max(latest, out[r["id"]])
        out[r["id"]] = latest
    return out


def _decision_of(judged: dict[int, Verdict], trial_id: int) -> int:
    verdict = judged.get(trial_id)
    return verdict.decision_id if verdict is not None else 1 << 62


class IncumbentTracker:
    """:func:`incumbent_sequence` one ended trial at a time (the live view's, O(1) per trial)."""

    def __init__(self, sign: float = 1.0) -> None:
        self.sign = sign
        self.incumbent: int | None = None
        self.seeds: dict[int, list[float]] = {}  # config (explore trial id) -> values of its ended seeds
        self.groups: dict[int, list[float]] = {}  # the configs of ``seeds`` with repeats (:func:`seed_groups`)
        self.previous: list[int] = []  # the incumbents before this one, newest last
        self.last: CurveStep | None = None

    def step(self, r: Any, verdict: Verdict | None, at: float | None = None) -> CurveStep:
        if r["state"] == "succeeded" and r["objective"] is not None:
            if r["role"] != "repeat":
                self.seeds.setdefault(r["id"], []).append(float(r["objective"]))
            elif r["parent_trial"] in self.seeds:  # a repeat of a config that succeeded
                group = self.seeds[r["parent_trial"]]
                group.append(float(r["objective"]))
                self.groups[r["parent_trial"]] = group
        if verdict is not None and verdict.promoted:
            if self.incumbent is not None:
                self.previous.append(self.incumbent)
            self.incumbent = r["id"]
        elif r["role"] == "repeat" and r["parent_trial"] == self.incumbent and self.incumbent is not None:
            self.incumbent = kept_on_means(self.incumbent, self.previous, self.seeds, self.sign)
        values = self.seeds.get(self.incumbent) if self.incumbent is not None else None
        self.last = CurveStep(r["id"], float(r["ended_at"]) if at is None else at, self.incumbent,
                              sum(values) / len(values) if values else None, self.floor().value)
        return self.last

    def floor(self) -> Floor:
        """The noise floor that judges a challenger now (:func:`autoresearch.loop.noise.incumbent_floor`)."""
        return incumbent_floor(self.incumbent if self.incumbent in self.seeds else None, self.groups, self.sign)


def kept_on_means(incumbent: int, previous: list[int], seeds: dict[int, list[float]], sign: float = 1.0) -> int:
    """The incumbent once its repeats report: a challenger is kept on one run (beyond the incumbent's
    noise floor), but once it has two seeds or more, an earlier incumbent whose mean over its own
    seeds (two or more) is better takes its place back (popped from ``previous``): the best is
    chosen on means, not on a lucky seed."""
    while previous:
        mine, theirs = seeds.get(incumbent) or [], seeds.get(previous[-1]) or []
        if len(mine) < 2 or len(theirs) < 2 or sign * sum(theirs) / len(theirs) >= sign * sum(mine) / len(mine):
            break
        incumbent = previous.pop()
    return incumbent


def incumbent_of(ledger: Ledger, loop_id: int) -> int | None:
    """The incumbent now: the last step of :func:`incumbent_sequence`."""
    return incumbents_of(ledger, loop_id)[0]


def incumbents_of(ledger: Ledger, loop_id: int) -> tuple[int | None, list[int]]:
    """The incumbent now and the ones before it, newest last (:func:`kept_on_means` reads them)."""
    store = LoopStore(ledger, loop_id)
    loop = store.loop()
    goal = json.loads(loop["plan"]).get("objective", {}).get("goal", "minimize") if loop is not None else "minimize"
    tracker = IncumbentTracker(-1.0 if goal == "maximize" else 1.0)
    incumbent_sequence(store.trials(), verdicts(ledger, loop_id), tracker)
    return tracker.incumbent, list(tracker.previous)


def seed_groups(trials: list[Any]) -> dict[int, list[float]]:
    """Objective values per configuration that has repeats: {explore trial id: [values]}."""
    groups: dict[int, list[float]] = {}
    by_id = {t["id"]: t for t in trials}
    for t in trials:
        if t["role"] == "repeat" and t["state"] == "succeeded" and t["objective"] is not None:
            parent = by_id.get(t["parent_trial"])
            if parent is not None and parent["state"] == "succeeded" and parent["objective"] is not None:
                groups.setdefault(parent["id"], [parent["objective"]]).append(t["objective"])
    return groups


def loop_view(ledger: Ledger, name: str, live: dict[int, tuple[int, float]] | None = None,
              elapsed_s: float | None = None, rows: list[Any] | None = None,
              judged: dict[int, Verdict] | None = None) -> LoopView:
    """The loop's view, read from the ledger. ``rows`` (its trials' rows in id order) and ``judged``
    (:func:`verdicts`): what the running controller already holds, equal to what the ledger says (it
    is their only writer), so that its final view does not read and parse them again."""
    loop = LoopStore.find(ledger, name)
    if loop is None:
        names = LoopStore.recent_names(ledger)
        raise NotFoundError(f"no loop named {name!r}",
                            hint=f"loops: {', '.join(names)}" if names else "start one with: autoresearch plan.yaml")
    plan = json.loads(loop["plan"])
    goal = plan["objective"].get("goal", "minimize")
    sign = -1.0 if goal == "maximize" else 1.0
    store = LoopStore(ledger, loop["id"])
    if rows is None:
        rows = store.trials()
    live = live or {}
    if judged is None:
        judged = verdicts(ledger, loop["id"])
    curve = incumbent_sequence(rows, judged, sign=sign)
    after = {c.trial_id: c for c in curve}
    out: list[TrialRow] = []
    for r in sorted(rows, key=lambda r: r["id"]):
        step, value = live.get(r["id"], (None, None))
        verdict = judged.get(r["id"])
        point = after.get(r["id"])
        out.append(TrialRow(r["id"], r["job_id"], r["role"], r["state"], json.loads(r["params"]), r["seed"],
                            r["parent_trial"], r["objective"], point.value if point else None, step, value,
                            r["created_at"], r["started_at"], r["ended_at"], r["rationale"], r["failure"],
                            bool(r["patch"]), kept=bool(verdict and verdict.promoted),
                            within_noise=bool(verdict and verdict.within_noise),
                            incumbent_after=point.incumbent if point else None))
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["state"]] = counts.get(r["state"], 0) + 1
    groups = seed_groups(rows)
    incumbent = curve[-1].incumbent if curve else None
    floor = incumbent_floor(incumbent, groups, sign)
    inc_row = next((r for r in rows if r["id"] == incumbent), None)
    best_value = None
    if inc_row is not None and inc_row["objective"] is not None:
        values = groups.get(incumbent or -1, [inc_row["objective"]])
        best_value = sum(values) / len(values)
    view = LoopView(
        name=loop["name"], loop_id=loop["id"], state=loop["state"], metric=plan["objective"]["metric"], goal=goal,
        trials=out, counts=counts, best_trial=incumbent, curve=curve, best_value=best_value,
        best_params=json.loads(inc_row["params"]) if inc_row is not None else {},
        best_seeds=len(groups.get(incumbent or -1, [1])) if incumbent else 0,
        noise_floor=floor.value, noise_basis=floor.basis(incumbent), rejected_as_noise=store.rejected_as_noise(),
        budget_trials=int(plan["budget"]["trials"]), parallel=int(plan["budget"]["parallel"]),
    )
    view.best_confirmed = confirmed(view.best_seeds, plan) if incumbent is not None else None
    return _loop_part(view, store, loop, plan, elapsed_s)


def confirmed(seeds: int, plan: dict[str, Any]) -> bool | None:
    """Whether a best measured on ``seeds`` ended seeds is confirmed: all of the plan's ``repeats.seeds``
    ended (None: the plan has no repeats, there is nothing to confirm it with)."""
    repeats = plan.get("repeats")
    if not isinstance(repeats, dict) or not isinstance(repeats.get("seeds"), int):
        return None
    return seeds >= int(repeats["seeds"])


def confirmed_text(view: LoopView, plan: dict[str, Any] | None = None) -> str:
    """``confirmed (3 seeds)`` / ``not confirmed: 1 of 3 seeds ended`` / '' (no repeats)."""
    if view.best_confirmed is None or view.best_trial is None:
        return ""
    if view.best_confirmed:
        return f"confirmed ({view.best_seeds} seeds)"
    want = (plan or {}).get("repeats", {}).get("seeds") if plan else None
    return f"not confirmed: {view.best_seeds}" + (f" of {want}" if want else "") + " seed(s) ended"


def reread_loop(ledger: Ledger, view: LoopView, elapsed_s: float | None = None) -> LoopView:
    """``view`` with what its loop's row and decisions say now, its trials as they were: the loop's
    end (its ``finish`` decision, its state) changes nothing else, and its trials need not be read
    and replayed again. (``view`` itself is left as it was.)"""
    store = LoopStore(ledger, view.loop_id)
    loop = store.loop()
    if loop is None:
        raise NotFoundError(f"no loop with id {view.loop_id}", hint="it was deleted while it ran")
    return _loop_part(replace(view), store, loop, json.loads(loop["plan"]), elapsed_s)


def _loop_part(view: LoopView, store: LoopStore, loop: Any, plan: dict[str, Any], elapsed_s: float | None) -> LoopView:
    """Fill in what the loop's row and its decisions say (state, spend, time, end) on a view of its trials."""
    agg = store.decision_totals()
    finish = store.last_decision("finish")
    view.state = loop["state"]
    view.decisions = agg["n"] if agg else 0
    view.llm_usd = float(agg["usd"]) if agg else 0.0
    view.tokens = int(agg["tok"]) if agg else 0
    view.elapsed_s = elapsed_s if elapsed_s is not None else float(loop["elapsed_s"] or 0.0)
    view.stop_reason = (json.loads(finish["outputs"]).get("reason", "")
                        if finish and loop["state"] == "finished" else "")
    view.budget_spent = spent_text(json.loads(finish["inputs"]).get("spent")) if finish else ""
    durations = [t.ended_at - t.started_at for t in view.trials if t.ended_at and t.started_at and t.state == "succeeded"]
    launched = sum(1 for t in view.trials if t.job_id is not None and t.state not in ("crashed", "skipped"))
    remaining = max(0, view.budget_trials - launched)
    running = sum(1 for t in view.trials if t.state in ("queued", "running"))
    view.eta_s = None
    if durations and loop["state"] == "running":
        mean = sum(durations) / len(durations)
        view.eta_s = mean * (remaining / max(1, view.parallel) + (1 if running else 0))
    if plan.get("warm_start"):
        warm = store.last_decision("warm_start")
        view.warm_start = str(warm["rationale"]) if warm is not None else ""
    view.blocked = ""
    if loop["state"] == "running":
        view.blocked = blocked_text(store.ledger, [{"state": t.state, "job_id": t.job_id} for t in view.trials])
    if loop["state"] == "running":
        view.next_step = "follow with `autoresearch run <plan> --resume`; stop trials with `autoresearch cancel JOB`"
    else:
        view.next_step = f"see `autoresearch report {loop['name']}`"
    return view


BLOCKED_LOOK = 20  # queued trials' jobs read to find one still queued (the loop's trials share one shape)


def blocked_text(ledger: Ledger, trials: Any) -> str:
    """Why a loop's queued trials (rows with ``state`` and ``job_id``) do not start: every node of
    their backend that fits them is cordoned or down (:func:`autoresearch.engine.blocked.no_node_text`);
    '' when none is queued or a node can take them. Two small reads, from any process."""
    ids = [t["job_id"] for t in trials if t["state"] == "queued" and t["job_id"] is not None][:BLOCKED_LOOK]
    if not ids:
        return ""
    jobs = JobStore(ledger)
    job = next((j for j in jobs.jobs_by_ids(ids) if j["state"] == "queued"), None)
    if job is None:
        return ""
    return no_node_text(jobs.node_sizes(job["backend"]), int(job["gpus"]), int(job["nodes"]))


def spent_text(spent: Any) -> str:
    """A finish decision's ``spent`` (budget -> [spent, given]) in words: ``steps 27/20 · GPU-h 0.12/1``."""
    if not isinstance(spent, dict):
        return ""
    names = {"steps": "steps", "gpu_hours": "GPU-h", "wall_s": "wall s"}
    parts = []
    for key, label in names.items():
        pair = spent.get(key)
        if isinstance(pair, list) and len(pair) == 2 and all(isinstance(v, (int, float)) for v in pair):
            parts.append(f"{label} {pair[0]:.4g}/{pair[1]:.4g}")
    return " · ".join(parts)


def ranked(view: LoopView) -> list[TrialRow]:
    """Succeeded trials with the objective for a leaderboard: the incumbent first (the loop's
    choice, noise-aware), then the others best value first. Used by ``summary.md``, the final
    table and the MCP ``leaderboard``, so they agree with the loop on what is best."""
    sign = 1.0 if view.goal == "minimize" else -1.0
    done = [t for t in view.trials if t.state == "succeeded" and t.objective is not None]
    return sorted(done, key=lambda t: (t.trial_id != view.best_trial, sign * (t.objective or 0.0), t.trial_id))


def mark(t: TrialRow, view: LoopView) -> str:
    """What the loop made of a trial, in a word or two: incumbent, kept earlier, within noise, seed of #N."""
    if t.trial_id == view.best_trial:
        return "incumbent"
    if t.within_noise:
        return "within noise"
    if t.kept:
        return "kept earlier"
    if t.role == "repeat" and t.parent_trial is not None:
        return f"seed of #{t.parent_trial}"
    return ""


def now() -> float:
    return time.time()
