"""Warm starts: the ended trials of earlier loops (``warm_start: [loop names]``) as a proposer's
prior, the common case of an agent re-running a sweep after a code change.

``warm_start: true`` names this plan's own earlier loops (Optuna's ``load_if_exists`` on a study
name, made explicit so that a plain rerun never changes meaning): once a loop of this name has
finished, running the plan again (without ``--resume``) keeps that loop under ``NAME-N`` (the
next free N) and starts a new loop ``NAME`` (:func:`new_generation`), whose proposer starts from
the trials of the newest finished loops of the plan (up to :data:`CAP`). An unfinished loop of
the name is resumed as always. Which loops and how many trials warmed a loop is its
``warm_start`` decision (:func:`record`), shown in its view and report. Warm trials are prior
history only: the loop's counts, budgets and report hold its own trials.

A loop qualifies when it belongs to the same project, measures the same objective (metric and
goal) and has a compatible space: the same parameter names, each a range in both or choices in
both. Ranges and choices may differ: a trial whose values lie outside today's space is left out.
Anything else is one :class:`~autoresearch.errors.PlanError` naming the loop and the parameters
that differ. Each trial comes with its curve (``intermediate``), so bohb learns from its rungs.
"""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path
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


CAP = 5  # warm_start: true reads at most this many earlier loops of the plan, newest first


def new_generation(plan: Any, ledger: Any, project: str | None, resume: bool) -> str | None:
    """``warm_start: true`` and a finished loop of this plan's name (of this project): keep it as
    ``NAME-N`` so that this run is a new loop that starts from it. Returns that name (None: no
    new generation; the loop of this name, if any, is resumed or refused as usual)."""
    from autoresearch.loop.store import LoopStore

    if plan.warm_start is not True or resume:
        return None
    row = LoopStore.find(ledger, plan.name)
    if row is None or row["state"] != "finished" or (project is not None and row["project"] != project):
        return None
    check(plan, plan.name, row)  # refused before anything changes: the finished loop keeps its name
    kept = LoopStore.keep_as_generation(ledger, row["id"], plan.name)
    loops = Path(ledger.home) / "loops"
    if (loops / plan.name / "report").is_dir() and not (loops / kept).exists():  # its report goes with it
        with contextlib.suppress(OSError):
            (loops / kept).mkdir(parents=True)
            (loops / plan.name / "report").rename(loops / kept / "report")
    return kept


def earlier_loops(plan: Any, ledger: Any, project: str) -> list[str]:
    """The names :func:`load_warm` reads: the plan's list, or for ``true`` its own finished loops."""
    from autoresearch.loop.store import LoopStore

    if plan.warm_start is True:
        return LoopStore.generations(ledger, plan.name, project or "", CAP)
    return list(plan.warm_start or [])


def check(plan: Any, name: str, row: Any) -> None:
    """Refuse loop ``name`` (its ``loops`` row) as a warm start of ``plan``: another objective, or
    a space that differs (each parameter named)."""
    try:
        old = json.loads(row["plan"] or "{}")
    except ValueError:
        old = {}
    old = old if isinstance(old, dict) else {}
    objective = old.get("objective") or {}
    if objective.get("metric") != plan.objective.metric or objective.get("goal") != plan.objective.goal:
        raise PlanError(f"warm_start: loop {name!r} measures {objective.get('metric')!r} "
                        f"({objective.get('goal')}), this plan {plan.objective.metric!r} ({plan.objective.goal})",
                        hint=HINT)
    differ = space_diff(plan.space, old.get("space") or {})
    if differ:
        raise PlanError(f"warm_start: loop {name!r} has an incompatible space; parameters that differ: "
                        + ", ".join(differ), hint=HINT)


def load_warm(plan: Any, ledger: Any, project: str = "") -> list[TrialRecord]:
    from autoresearch.engine import metrics as M
    from autoresearch.loop.store import LoopStore, to_record
    from autoresearch.store.jobstore import JobStore

    records: list[TrialRecord] = []
    for name in earlier_loops(plan, ledger, project):
        row = LoopStore.find(ledger, name)
        if row is None or (row["project"] or "") != (project or ""):
            near = LoopStore.visible_names(ledger, project or "")
            raise PlanError(f"warm_start: no loop named {name!r}" + (" in this project" if project else ""),
                            hint="warm_start names earlier loops of this home"
                                 + (f" (newest: {', '.join(near[:5])})" if near else " (there are none yet)")
                                 + ", or write warm_start: true for this plan's own earlier loops")
        check(plan, name, row)
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


def record(store: Any, plan: Any, warm: list[TrialRecord], kept: str | None = None) -> None:
    """The loop's ``warm_start`` decision (once): which loops and how many of their trials warmed
    it; ``kept``: the name its finished predecessor keeps (:func:`new_generation`)."""
    if not plan.warm_start or store.last_decision("warm_start") is not None:
        return
    counts: dict[str, int] = {}
    for r in warm:  # its rationale names its loop (load_warm)
        found = re.search(r"of loop '([^']+)'$", r.rationale or "")
        if found:
            counts[found.group(1)] = counts.get(found.group(1), 0) + 1
    why = summary(counts, plan.warm_start is True and not kept)
    if kept:
        why += f"; the loop that ran this plan before is kept as {kept!r}"
    store.decide("warm_start", inputs={"warm_start": plan.warm_start, "loops": counts, "trials": len(warm),
                                       "kept_as": kept}, rationale=why)


def summary(counts: dict[str, int], first: bool) -> str:
    """``first``: ``warm_start: true`` and no earlier loop of the plan was found."""
    if not counts:
        return ("warm start: none (no earlier finished loop of this plan yet)" if first
                else "warm start: none (the earlier loops have no ended trials)")
    loops = ", ".join(f"{name} ({n})" for name, n in counts.items())
    return f"warm start: {sum(counts.values())} trial(s) of {loops}, as the proposer's prior"
