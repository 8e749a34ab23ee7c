"""Proposing and launching, for the controller: the propose() call off the main thread,
and a proposed trial turned into a submitted job (decision first, then ``Api.submit``),
on the :class:`~autoresearch.loop.state.LoopState`."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

from autoresearch import jobs as job_ops
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
    trial_id = row["id"]
    params = json.loads(row["params"])
    job_id = s.store.job_of_trial(trial_id) if trial_id in s.launch_decided else None
    if job_id is None:
        workdir = proposer.workdir_for(trial_id, Proposal(params, row["rationale"], row["patch"],
                                                          row["parent_trial"])) or s.plan.trial.workdir
        command = s.plan.render_command(params, int(row["seed"] or 0), trial_id)
        spec = trial_spec(s.plan, s.store.loop_id, row, params, command, workdir)
        if s.sync is not None:
            spec["env"].update(s.sync.env(trial_id))
        if getattr(s.plan.early_stop, "pause", False) and not spec["checkpoint"]:
            spec["checkpoint"] = True  # a per-job checkpoint dir, to pause and resume (loop/pause.py)
        if trial_id not in s.launch_decided:
            s.launch_decided.add(trial_id)
            s.store.decide("launch", trial_id=trial_id, rationale=row["rationale"],
                           inputs={"params": params, "seed": row["seed"], "role": row["role"],
                                   "workdir": workdir, "command": command})
        try:
            job_id = job_ops.submit(runtime, spec, project=s.loop_project)  # as a job submitted by hand
        except AutoresearchError as err:
            s.update_trial(trial_id, state="failed", failure=f"could not submit: {err.render()}",
                           ended_at=time.time(), workdir=workdir)
            proposer.observe(s.records[trial_id])
            return
        from autoresearch import outbox

        outbox.kick(runtime.ledger.home)  # background MLflow mirror (no mlflow import here)
        row = s.update_trial(trial_id, job_id=job_id, state="queued", workdir=workdir)
    else:
        row = s.update_trial(trial_id, job_id=job_id, state="queued")
    s.active[trial_id] = row


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
