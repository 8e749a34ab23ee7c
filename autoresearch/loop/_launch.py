"""Proposing and launching, for the controller: the propose() call off the main thread,
and a proposed trial turned into a submitted job (decision first, then ``Api.submit``),
on the :class:`~autoresearch.loop.state.LoopState`."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

from autoresearch.engine import jobs as job_ops
from autoresearch.errors import AutoresearchError
from autoresearch.loop.plan import Plan
from autoresearch.loop.proposers import Proposal, ProposeResult
from autoresearch.loop.state import LoopState


class ProposeCall(threading.Thread):
    """A propose() call off the main thread (LLMs and agents block)."""

    def __init__(self, fn: Callable[[], ProposeResult], n: int) -> None:
        super().__init__(daemon=True, name="autoresearch-propose")
        self.n = n
        self.fn, self.result, self.error = fn, None, None  # type: Callable[[], ProposeResult], ProposeResult | None, BaseException | None

    def run(self) -> None:
        try:
            self.result = self.fn()
        except BaseException as err:  # noqa: BLE001 - handed to the main thread
            self.error = err


def timed(proposer: Any, history: list[Any], n: int) -> ProposeResult:
    t0 = time.perf_counter()
    result = proposer.propose(history, n)
    if not result.latency_s:
        result.latency_s = time.perf_counter() - t0
    return result


def launch(s: LoopState, row: Any, proposer: Any, runtime: Any) -> None:
    """Submit a proposed trial's job through the engine (or adopt the one a launch decided before
    a crash did submit)."""
    launch_many(s, [row], proposer, runtime)


def launch_many(s: LoopState, rows: list[Any], proposer: Any, runtime: Any) -> None:
    """Submit proposed trials' jobs through the engine as one batch (``jobs.submit_many``: one
    ledger transaction for their launch decisions, one for the jobs, one for the trial rows),
    or adopt the jobs that launches decided before a crash did submit."""
    fresh: list[tuple[Any, dict[str, Any], str]] = []  # (row, spec, workdir) to submit
    decisions: list[tuple[int, str, dict[str, Any]]] = []
    adopted: list[tuple[int, dict[str, Any]]] = []
    for row in rows:
        trial_id = row["id"]
        params = json.loads(row["params"])
        job_id = s.store.job_of_trial(trial_id) if trial_id in s.launch_decided else None
        if job_id is not None:
            adopted.append((trial_id, {"job_id": job_id, "state": "queued"}))
            continue
        workdir = proposer.workdir_for(trial_id, Proposal(params, row["rationale"], row["patch"],
                                                          row["parent_trial"])) or s.plan.trial.workdir
        command = s.plan.render_command(params, int(row["seed"] or 0), trial_id)
        spec = trial_spec(s.plan, s.store.loop_id, row, params, command, workdir)
        if s.sync is not None:
            spec["env"].update(s.sync.env(trial_id))
        if getattr(s.plan.early_stop, "pause", False) and not spec["checkpoint"]:
            spec["checkpoint"] = True  # a per-job checkpoint dir, to pause and resume (loop/pause.py)
        fresh.append((row, spec, workdir))
        if trial_id not in s.launch_decided:
            decisions.append((trial_id, row["rationale"], {"params": params, "seed": row["seed"], "role": row["role"],
                                                           "workdir": workdir, "command": command}))
    if decisions:  # write-ahead: every launch decision before any submit, in one transaction
        with s.store.ledger.tx() as c:
            for trial_id, rationale, inputs in decisions:
                s.store.decide("launch", trial_id=trial_id, rationale=rationale, inputs=inputs, conn=c)
        s.launch_decided.update(trial_id for trial_id, _, _ in decisions)
    updates = list(adopted)
    if fresh:
        try:
            job_ids: list[int | None] = list(job_ops.submit_many(runtime, [spec for _, spec, _ in fresh],
                                                                  project=s.loop_project, group=s.job_group(),
                                                                  max_running=s.plan.budget.parallel))
        except AutoresearchError:  # a refused spec refuses the batch: one by one, to fail only that trial
            job_ids = [s.store.job_of_trial(row["id"]) or _submit_one(s, row, spec, workdir, proposer, runtime)
                       for row, spec, workdir in fresh]
        from autoresearch.store import outbox

        outbox.kick(runtime.ledger.home)  # background MLflow mirror (no mlflow import here)
        updates += [(row["id"], {"job_id": job_id, "state": "queued", "workdir": workdir})
                    for (row, _, workdir), job_id in zip(fresh, job_ids, strict=True) if job_id is not None]
    for row in s.update_trials(updates):
        s.active[row["id"]] = row


def _submit_one(s: LoopState, row: Any, spec: dict[str, Any], workdir: str, proposer: Any,
                runtime: Any) -> int | None:
    """Submit one trial's job; a refused one fails the trial (its failure says why) and returns None."""
    try:
        return job_ops.submit_many(runtime, [spec], project=s.loop_project, group=s.job_group(),
                                   max_running=s.plan.budget.parallel)[0]  # as a job submitted by hand
    except AutoresearchError as err:
        s.update_trial(row["id"], state="failed", failure=f"could not submit: {err.render()}",
                       ended_at=time.time(), workdir=workdir)
        proposer.observe(s.records[row["id"]])
        return None


def trial_spec(plan: Plan, loop_id: int, row: Any, params: dict[str, Any], command: list[str] | str,
               workdir: str) -> dict[str, Any]:
    t = plan.trial
    env = {**t.env, "AUTORESEARCH_LOOP": plan.name, "AUTORESEARCH_TRIAL_ID": str(row["id"]),
           "AUTORESEARCH_SEED": str(row["seed"] or 0), "AUTORESEARCH_PARAMS": json.dumps(params)}
    tags = {**plan.tags, "autoresearch.loop": plan.name, "autoresearch.loop_id": str(loop_id),
            "autoresearch.trial_id": str(row["id"]), "autoresearch.decision_id": str(row["decision_id"]),
            "autoresearch.role": row["role"]}
    return {"name": f"{plan.name}-t{row['id']}", "command": command, "shell": t.shell, "workdir": workdir,
            "env": env, "gpus": t.gpus, "cpus": t.cpus, "memory": t.memory, "priority": t.priority,
            "max_retries": t.max_retries, "timeout": t.timeout, "grace": t.grace, "checkpoint": t.checkpoint,
            "experiment": plan.name, "tags": tags, "image": t.image, "mounts": dict(t.mounts)}
