"""What trials' outcomes mean for the loop, for the controller: objective curves for early
stopping (:mod:`autoresearch.loop.stopping`), a trial's end (its state, objective and
failure, observed by the proposer), and keep-or-discard against the incumbent beyond the
noise floor (:mod:`autoresearch.loop.noise`; it seeds repeats of a new incumbent).

Each function takes a :class:`~autoresearch.loop.state.LoopHost` (the controller).

Values inside the controller are signed (``sign * value``: lower is better either way);
what reaches the ledger and the proposer is in the objective's own direction.
"""

from __future__ import annotations

import json
import time
from typing import Any

from autoresearch.backends._base import DISK_FULL
from autoresearch.engine import jobs as job_ops
from autoresearch.engine import metrics as M
from autoresearch.errors import AutoresearchError
from autoresearch.loop import noise as N
from autoresearch.loop import ordered, pause
from autoresearch.loop.proposers import Proposal, ProposeResult, ProposerInfo
from autoresearch.loop.series import read_series
from autoresearch.loop.state import LoopHost
from autoresearch.loop.stopping import first_wave
from autoresearch.loop.store import to_record
from autoresearch.loop.views import kept_on_means, verdict_of
from autoresearch.store.jobstore import JobStore

LOG_TAIL_LINES = 30


def monitor(c: LoopHost) -> None:
    s = c.state
    running = [r for r in s.active.values() if r["state"] == "running"]
    fresh = read_series(c, running)
    _warn_unseen(c, running)
    _target(c, fresh)
    if c.stopper is None:
        return
    if not s.history_loaded:  # ended trials' curves, once (after a resume)
        s.history_loaded = True
        ended = [r for r in s.rows.values()
                 if r["state"] in ("succeeded", "stopped") and r["id"] not in s.series]
        read_series(c, ended)
    others = dict(s.series)
    todo = dict(fresh)
    for trial_id in list(s.held):  # trials held at a first-wave rung: judged again as their peers move
        if trial_id in s.active and trial_id not in s.stopping and s.series.get(trial_id):
            todo.setdefault(trial_id, s.series[trial_id])
        else:
            del s.held[trial_id]
    answers: dict[int, int] = {}
    at_rung: dict[int, int] = {}
    for trial_id, series in todo.items():
        answers[trial_id] = series[-1][0] if series else 0
        if trial_id not in s.stopping and trial_id in s.active and s.active[trial_id]["role"] != "repeat":
            if s.ordered:  # reproducible: judged against lower trials only, once they are in (loop/ordered.py)
                mine, lower, waiting = ordered.judge_view(c, trial_id, series)
                verdict = c.stopper.check(trial_id, mine, lower)
                if waiting is not None and verdict is None:
                    answers[trial_id] = waiting - 1  # a report() at that rung waits for its cohort
            else:
                verdict = c.stopper.check(trial_id, series, others)
                rung = c.stopper.waiting_rung(trial_id, series, others) if verdict is None and s.sync else None
                if rung is not None:
                    at_rung[trial_id] = rung
            if verdict is not None:
                if s.ordered:
                    s.stopped_at[trial_id] = verdict.step
                paused = pause.enabled(c)
                if paused:
                    s.pause_at.add(trial_id)
                c.stop_trial(trial_id, verdict.rationale, {"rule": verdict.rule, "step": verdict.step, "pause": paused,
                                                      "value": verdict.value * c.sign,
                                                      "threshold": verdict.threshold * c.sign})
    if at_rung:  # first-wave rungs (no max_steps): a lead goes on, the others wait to be judged there
        finished = {t for t in s.series if t not in s.active and (s.rows.get(t) or {}).get("state") == "succeeded"}
        busy = {t for t, r in s.active.items()
                if r["state"] == "running" and r["role"] != "repeat" and t not in s.stopping}
        for trial_id, what in first_wave(c.stopper, at_rung, others, busy, finished).items():
            if what == "lead":
                c.stopper.keep_at(trial_id, at_rung[trial_id])
            if what == "hold":
                s.held[trial_id] = at_rung[trial_id]
                answers[trial_id] = at_rung[trial_id] - 1
            else:
                s.held.pop(trial_id, None)
    for trial_id, answer in answers.items():
        if trial_id not in at_rung:
            s.held.pop(trial_id, None)
        if s.sync is not None and todo[trial_id]:  # a report() waiting at a rung goes on (or learns it is stopped)
            s.sync.answer(trial_id, answer, stop=trial_id in s.stopping)


def _target(c: LoopHost, fresh: dict[int, list[tuple[int, float]]]) -> None:
    """``objective.target`` reached by a reported point ends the loop: no more launches, the other
    trials are stopped, and the trial that got there finishes (it is the loop's best)."""
    s, target = c.state, c.plan.objective.target
    if target is None or s.stop_reason:
        return
    for trial_id, series in sorted(fresh.items()):
        hit = next((step for step, value in series if value <= c.sign * target), None)
        if hit is not None and trial_id in s.active:
            s.finishing.add(trial_id)
            s.stop_reason = f"target {target:g} reached by trial {trial_id} at step {hit}"
            return


def _warn_unseen(c: LoopHost, running: list[Any]) -> None:
    """Once per trial: a warning on its job (``status`` shows it) when it has run
    :data:`~autoresearch.engine.metrics.UNSEEN_AFTER_S` without one point of the objective."""
    s, now = c.state, time.time()
    for r in running:
        since = r["started_at"]
        if r["id"] in c.series or r["id"] in s.unseen_warned or since is None or now - since < M.UNSEEN_AFTER_S:
            continue
        s.unseen_warned.add(r["id"])
        JobStore(c.ledger).warn("metric_unseen", r["job_id"], None,
                                M.unseen_warning(c.plan.objective.metric, now - since))


def ended(c: LoopHost, trial_id: int, row: Any, job: Any) -> None:
    s = c.state
    del s.active[trial_id]
    if c.stopper is not None or c.plan.budget.steps is not None or s.ordered:
        read_series(c, [row])  # its whole curve: the stopper's rungs, bohb's levels, the steps budget
    if s.ordered:  # reproducible: it takes effect once every lower trial has (loop/ordered.py)
        s.deferred[trial_id] = (row, job)
        ordered.drain(c, take_effect)
        return
    take_effect(c, trial_id, row, job)


def take_effect(c: LoopHost, trial_id: int, row: Any, job: Any) -> None:
    """A trial's ending: its state, objective and failure, keep or discard, the proposer's observation."""
    s = c.state
    retro = ordered.retro_verdict(c, trial_id) if s.ordered and job["state"] == "succeeded" else None
    if retro is not None:  # it ended before its rung's cohort was in: stopped there, as it would have been
        s.stopped_at[trial_id] = retro.step
        s.store.decide("stop", trial_id=trial_id, inputs={"job_id": row["job_id"], "rule": retro.rule,
                                                          "step": retro.step, "value": retro.value * c.sign,
                                                          "threshold": retro.threshold * c.sign,
                                                          "retroactive": True},
                       outputs={"action": "none: the trial had ended"},
                       rationale=retro.rationale + " (decided once the trials below it were in; it had ended)")
    if s.ordered and trial_id in s.stopped_at and trial_id in s.series:
        s.series[trial_id] = ordered.effective(s, trial_id)
    for _ in range(64):  # its ending came before all its output was read (a huge output): read the rest first
        if not JobStore(c.ledger).unread_attempts(job["id"], limit=1):
            break
        c.runtime.ingest(job["id"])
    summary = final_metrics(c.ledger, job["id"])
    value = summary.get(c.plan.objective.metric)
    failure = None
    fields: dict[str, Any] = {"metrics": json.dumps(summary), "ended_at": job["ended_at"] or time.time(),
                              "started_at": row["started_at"] or job["started_at"]}
    if retro is not None:
        state, value = "stopped", retro.value * c.sign
    elif job["state"] == "succeeded":
        state = "succeeded" if value is not None else "failed"
        if value is None:
            failure = (f"exited 0 but never reported the objective {c.plan.objective.metric!r} "
                       f"(report({c.plan.objective.metric}=...) or print '{c.plan.objective.metric}: "
                       "VALUE')\n" + log_tail(c.runtime, job["id"]))
    elif job["state"] == "cancelled":
        stopped = trial_id in s.stopping or s.store.has_decision("stop", trial_id)
        state = "stopped" if stopped else "cancelled"
        if stopped and pause.on_end(c, trial_id, job) == "paused":
            state = "paused"
        series = s.series.get(trial_id)
        if (value is None or trial_id in s.stopped_at) and series:
            value = series[-1][1] * c.sign  # (ordered: its value at the rung it was stopped at)
    elif (last := JobStore(c.ledger).latest_attempt(job["id"])) is not None and (
            last["failure_class"] in ("infra", "infra-suspect", "unknown")
            or (last["failure_class"] is None and job["end_reason"] == "infra")):
        # The machine's fault (a GPU, the driver, NCCL, a lost node): say so, so that the proposer
        # does not learn to avoid a config that did nothing wrong.
        why, _, hint = str(last["failure_why"] or last["detail"] or "").partition("\nhint: ")
        if str(last["detail"] or "").startswith(DISK_FULL):  # the home's disk: say what to free
            state, failure = "crashed", (f"crashed: {why[:300]}; {hint[:400]}\n" + log_tail(c.runtime, job["id"]))
        else:
            state, failure = "crashed", (f"crashed for the machine's fault, not this config's ({why[:300]}); "
                                         "infrastructure failure after retries\n" + log_tail(c.runtime, job["id"]))
    else:
        state = "failed"
        why = "timed out" if job["end_reason"] == "timeout" else f"exited {job['exit_code']}"
        failure = f"{why}\n" + log_tail(c.runtime, job["id"])
    s.stopping.discard(trial_id)
    if s.sync is not None:
        s.sync.forget(trial_id)
    with c.ledger.tx() as conn:  # its end and the judgment of it: one transaction
        fresh = s.update_trial(trial_id, conn, state=state, objective=value, failure=failure, **fields)
        verdict = judge(c, fresh, conn) if state == "succeeded" and value is not None else None
    record = to_record(fresh, s.series.get(trial_id))
    if record.intermediate:
        record.intermediate = [(s, v * c.sign) for s, v in record.intermediate]
    if state != "paused":  # a paused trial is not over: the proposer hears of it when it ends
        c.proposer.observe(record)
    if verdict is not None and verdict.promote:
        promote(c, fresh)
    elif fresh["role"] == "repeat" and fresh["parent_trial"] == s.incumbent and s.incumbent is not None:
        # its seeds say what it is worth: an earlier incumbent with a better mean takes its place back
        s.incumbent = kept_on_means(s.incumbent, s.previous_incumbents, s.groups, c.sign)
    pause.promote(c)  # a slot is free: a paused trial that is now promotable goes first
    c.publish(force=True)


def final_metrics(ledger: Any, job_id: int) -> dict[str, float | None]:
    """Last value of every metric of an ended job (what Api.metrics reports as ``last``;
    the runtime ingested everything when the attempt ended, so one query suffices)."""
    points = JobStore(ledger).metric_points(job_id)
    out: dict[str, float | None] = {}
    for p in M.best_source(points):
        out[p["name"]] = p["value"]
    return out


def log_tail(runtime: Any, job_id: int) -> str:
    try:
        return job_ops.log_tail(runtime, job_id, LOG_TAIL_LINES, 4000)
    except AutoresearchError:
        return ""


def judge(c: LoopHost, row: Any, conn: Any = None) -> N.Judgement | None:
    """Keep or discard: a finished explore trial against the incumbent, beyond the noise floor
    (the incumbent's own seed-to-seed noise: :func:`autoresearch.loop.noise.incumbent_floor`). Its
    ``promote`` decision is written in ``conn``'s transaction when given; :func:`promote` acts on it.
    None for a repeat (it only refines the incumbent's mean and the noise floor)."""
    s = c.state
    if row["role"] == "repeat":
        return None
    groups = s.groups  # seed_groups of every trial, kept as they end (no walk over all trials per end)
    inc_value = None
    if s.incumbent is not None:
        inc = s.rows.get(s.incumbent)
        if inc is not None and inc["objective"] is not None:
            values = groups.get(s.incumbent, [inc["objective"]])
            inc_value = c.sign * sum(values) / len(values)
    floor = N.incumbent_floor(s.incumbent if inc_value is not None else None, groups, c.sign)
    basis = floor.basis(s.incumbent if inc_value is not None else None)
    verdict = N.judge(c.sign * row["objective"], inc_value, floor.value, basis)
    outputs = {"promoted": verdict.promote, "trial_id": row["id"],
               "margin": None if verdict.margin == float("inf") else verdict.margin}
    at = time.time()
    decision = s.store.decide("promote", trial_id=row["id"], rationale=verdict.rationale,
                              inputs={"candidate": row["objective"], "incumbent_trial": s.incumbent,
                                      "incumbent_value": None if inc_value is None else inc_value * c.sign,
                                      "noise_floor": floor.value, "noise_basis": basis, "noise_trial": floor.config,
                                      "noise_seeds": floor.seeds},
                              outputs=outputs, conn=conn, at=at)
    s.note_verdict(verdict_of(outputs, row["id"], at, decision))  # the final view reads none back
    return verdict


def promote(c: LoopHost, row: Any) -> None:
    """``row``'s trial is the new incumbent (its promote decision is written): the target, the repeats."""
    s = c.state
    if s.incumbent is not None:
        s.previous_incumbents.append(s.incumbent)
    s.incumbent = row["id"]
    target = c.plan.objective.target
    if target is not None and c.sign * row["objective"] <= c.sign * target:
        s.stop_reason = s.stop_reason or f"target {target:g} reached by trial {row['id']}"
    if c.plan.repeats is not None:
        seeds = list(range(1, c.plan.repeats.seeds))
        params = json.loads(row["params"])
        proposals = [Proposal(params, rationale=f"seed {s} of new incumbent #{row['id']} (noise floor)",
                              patch=row["patch"], parent_trial=row["id"]) for s in seeds]
        info = ProposerInfo(kind="noise-floor")
        ids = s.store.record_proposals(
            ProposeResult(proposals, info, rationale=f"re-run incumbent #{row['id']} with seeds {seeds} to "
                                                     "measure the noise floor"),
            proposals, inputs={"incumbent": row["id"]}, role="repeat", seeds=seeds, now=s.now_ts())
        c.proposed(ids)
