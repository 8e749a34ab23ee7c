"""Read model of a loop, built from the ledger alone (no controller needs to be running).

Used by the live table, ``--json``, ``autoresearch report``, and the MCP tools
(``loop_status``, ``leaderboard``). Stdlib only.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from autoresearch.errors import NotFoundError
from autoresearch.ledger import Ledger
from autoresearch.loop.noise import noise_floor
from autoresearch.loop.store import LoopStore


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
    best_so_far: float | None  # best succeeded objective among trials ended up to this one
    step: int | None = None  # last step seen while running
    value: float | None = None  # objective at that step
    created_at: float = 0.0
    started_at: float | None = None
    ended_at: float | None = None
    rationale: str = ""
    failure: str | None = None
    has_patch: bool = False


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
    noise_floor: float | None = None
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
    next_step: str = ""


def incumbent_of(ledger: Ledger, loop_id: int) -> int | None:
    for row in LoopStore(ledger, loop_id).promotions():
        out = json.loads(row["outputs"])
        if out.get("promoted"):
            return int(out["trial_id"])
    return None


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
              elapsed_s: float | None = None) -> LoopView:
    loop = LoopStore.find(ledger, name)
    if loop is None:
        names = LoopStore.recent_names(ledger)
        raise NotFoundError(f"no loop named {name!r}",
                            hint=f"loops: {', '.join(names)}" if names else "start one with: autoresearch plan.yaml")
    plan = json.loads(loop["plan"])
    goal = plan["objective"].get("goal", "minimize")
    sign = 1.0 if goal == "minimize" else -1.0
    store = LoopStore(ledger, loop["id"])
    rows = store.trials()
    live = live or {}
    out: list[TrialRow] = []
    best: float | None = None
    for r in sorted(rows, key=lambda r: (r["ended_at"] or float("inf"), r["id"])):
        if r["state"] == "succeeded" and r["objective"] is not None and r["role"] == "explore":
            if best is None or sign * r["objective"] < sign * best:
                best = r["objective"]
        step, value = live.get(r["id"], (None, None))
        out.append(TrialRow(r["id"], r["job_id"], r["role"], r["state"], json.loads(r["params"]), r["seed"],
                            r["parent_trial"], r["objective"], best if r["ended_at"] else None, step, value,
                            r["created_at"], r["started_at"], r["ended_at"], r["rationale"], r["failure"],
                            bool(r["patch"])))
    out.sort(key=lambda t: t.trial_id)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["state"]] = counts.get(r["state"], 0) + 1
    groups = seed_groups(rows)
    incumbent = incumbent_of(ledger, loop["id"])
    inc_row = next((r for r in rows if r["id"] == incumbent), None)
    best_value = None
    if inc_row is not None and inc_row["objective"] is not None:
        values = groups.get(incumbent or -1, [inc_row["objective"]])
        best_value = sum(values) / len(values)
    agg = store.decision_totals()
    finish = store.last_decision("finish")
    elapsed = elapsed_s if elapsed_s is not None else float(loop["elapsed_s"] or 0.0)
    durations = [t.ended_at - t.started_at for t in out if t.ended_at and t.started_at and t.state == "succeeded"]
    budget = plan["budget"]
    launched = sum(1 for r in rows if r["job_id"] is not None and r["state"] not in ("crashed", "skipped"))
    remaining = max(0, int(budget["trials"]) - launched)
    running = sum(1 for r in rows if r["state"] in ("queued", "running"))
    eta = None
    if durations and loop["state"] == "running":
        mean = sum(durations) / len(durations)
        eta = mean * (remaining / max(1, int(budget["parallel"])) + (1 if running else 0))
    view = LoopView(
        name=loop["name"], loop_id=loop["id"], state=loop["state"], metric=plan["objective"]["metric"], goal=goal,
        trials=out, counts=counts, best_trial=incumbent, best_value=best_value,
        best_params=json.loads(inc_row["params"]) if inc_row is not None else {},
        best_seeds=len(groups.get(incumbent or -1, [1])) if incumbent else 0,
        noise_floor=noise_floor(list(groups.values())), rejected_as_noise=store.rejected_as_noise(),
        decisions=agg["n"] if agg else 0, llm_usd=float(agg["usd"]) if agg else 0.0,
        tokens=int(agg["tok"]) if agg else 0, elapsed_s=elapsed, eta_s=eta, budget_trials=int(budget["trials"]),
        parallel=int(budget["parallel"]),
        stop_reason=json.loads(finish["outputs"]).get("reason", "") if finish and loop["state"] == "finished" else "",
    )
    if loop["state"] == "running":
        view.next_step = "follow with `autoresearch run <plan> --resume`; stop trials with `autoresearch cancel JOB`"
    else:
        view.next_step = f"see `autoresearch report {loop['name']}`"
    return view


def now() -> float:
    return time.time()
