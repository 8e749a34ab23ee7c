"""Warm starts: the ended trials of earlier loops (``warm_start: [loop names]``) as a proposer's
prior, the common case of an agent re-running a sweep after a code change.

A loop qualifies when it belongs to the same project, measures the same objective (metric and
goal) and has a compatible space: the same parameter names, each a range in both or choices in
both. Ranges and choices may differ: a trial whose values lie outside today's space is left out.
Anything else is one :class:`~autoresearch.errors.PlanError` naming the loop and the parameters
that differ. Each trial comes with its curve (``intermediate``), so bohb learns from its rungs.
"""

from __future__ import annotations

import json
from typing import Any

from autoresearch.errors import PlanError
from autoresearch.loop.proposers._base import TrialRecord

ENDED = ("succeeded", "stopped", "failed")
HINT = "warm-start only from loops of the same objective and space, or leave warm_start: out"


def space_diff(space: dict[str, Any], old: dict[str, Any]) -> list[str]:
    """Why the space of an earlier loop (as stored: plain dicts) cannot feed today's, per parameter."""
    out = []
    for name in sorted(set(space) - set(old)):
        out.append(f"{name} (only in this plan)")
    for name in sorted(set(old) - set(space)):
        out.append(f"{name} (only in the earlier loop)")
    for name in sorted(set(space) & set(old)):
        then = old[name] if isinstance(old[name], dict) else {}
        if (space[name].choices is None) != (then.get("choices") is None):
            now_kind = "choices" if space[name].choices is not None else "a range"
            then_kind = "choices" if then.get("choices") is not None else "a range"
            out.append(f"{name} ({now_kind} here, {then_kind} there)")
    return out


def load_warm(plan: Any, ledger: Any, project: str = "") -> list[TrialRecord]:
    from autoresearch import metrics as M
    from autoresearch.jobstore import JobStore
    from autoresearch.loop.store import LoopStore, to_record

    records: list[TrialRecord] = []
    for name in plan.warm_start:
        row = LoopStore.find(ledger, name)
        if row is None or (row["project"] or "") != (project or ""):
            raise PlanError(f"warm_start: no loop named {name!r}" + (" in this project" if project else ""),
                            hint="`autoresearch loops` lists the loops; warm_start names earlier ones")
        try:
            old = json.loads(row["plan"] or "{}")
        except ValueError:
            old = {}
        objective = old.get("objective") or {}
        if objective.get("metric") != plan.objective.metric or objective.get("goal") != plan.objective.goal:
            raise PlanError(f"warm_start: loop {name!r} measures {objective.get('metric')!r} "
                            f"({objective.get('goal')}), this plan {plan.objective.metric!r} ({plan.objective.goal})",
                            hint=HINT)
        differ = space_diff(plan.space, old.get("space") or {})
        if differ:
            raise PlanError(f"warm_start: loop {name!r} has an incompatible space; parameters that differ: "
                            + ", ".join(differ), hint=HINT)
        rows = LoopStore(ledger, row["id"]).trials(ENDED)
        by_job = {r["job_id"]: r["id"] for r in rows if r["job_id"] is not None}
        curves: dict[int, list[tuple[int, float]]] = {}
        if by_job:
            points = JobStore(ledger).metric_series(plan.objective.metric, by_job)
            last: dict[int, int] = {}
            for p in points:
                last[p["job_id"]] = max(last.get(p["job_id"], 0), p["attempt"])
            for p in M.best_source(points, key=lambda p: (p["job_id"], p["attempt"])):
                if p["attempt"] == last[p["job_id"]]:
                    curves.setdefault(by_job[p["job_id"]], []).append((int(p["step"]), float(p["value"])))
        for r in rows:
            record = to_record(r, sorted(curves.get(r["id"], [])))
            record.rationale = f"warm start: trial {r['id']} of loop {name!r}"
            records.append(record)
    return records
