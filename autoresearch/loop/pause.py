"""Pause/resume promotions (``early_stop: {kind: asha, pause: true}``): a trial that loses at a
rung is paused instead of killed, and resumed from its checkpoint when it is promoted, so no
epoch is trained twice.

* Pausing is the same cancel as a stop (decision ``stop`` with ``pause: true``); when the job
  ends, a trial whose ``AUTORESEARCH_CHECKPOINT_DIR`` holds files is ``paused``. A trial that
  wrote nothing there cannot be resumed: it is ``stopped``, the loop warns once (a
  ``pause_fallback`` decision and a warning on the job) and kills from then on.
* Promotion (Li et al.'s ASHA promotes rather than stops): whenever a slot frees, a paused
  trial that is now within the best ``1/reduction_factor`` at its rung (later trials did
  worse there) is resumed first (decision ``resume``): a new job for the same trial with the
  old job's checkpoint directory. Its curve keeps the points from before the pause.
* Trials still paused when the loop ends are ``stopped``.
* A restarted controller (``--resume`` after Ctrl-C or ``kill -9``) rebuilds what this module
  kept in memory from the ledger (:func:`restore`): each paused trial's curve (over all its jobs),
  the rungs the stopper already judged, trials whose pause was decided but whose job had not
  ended yet, and a fallback already taken. Paused trials are then promoted or stopped at the
  loop's end exactly as without the restart.

Trials get a per-job checkpoint directory (``trial.checkpoint: true``) when the plan names none.
"""

from __future__ import annotations

import json
import os
from typing import Any

from autoresearch.engine import jobs as job_ops
from autoresearch.errors import AutoresearchError
from autoresearch.loop.state import LoopHost
from autoresearch.store import outbox
from autoresearch.store.jobstore import JobStore


def enabled(c: LoopHost) -> bool:
    return bool(getattr(c.plan.early_stop, "pause", False)) and not c.state.pause_off


def on_end(c: LoopHost, trial_id: int, job: Any) -> str | None:
    """The state of a cancelled trial that was to be paused ("paused"), or None (kill)."""
    s = c.state
    if trial_id not in s.pause_at:
        return None
    s.pause_at.discard(trial_id)
    path = _checkpoint_of(c, job)
    if path and os.path.isdir(path) and any(os.scandir(path)):
        return "paused"
    if not s.pause_off:
        s.pause_off = True
        message = (f"trial {trial_id} wrote nothing to AUTORESEARCH_CHECKPOINT_DIR, so it cannot be resumed: "
                   "early_stop.pause falls back to stopping trials for the rest of this loop")
        s.store.decide("pause_fallback", trial_id=trial_id, inputs={"job_id": job["id"], "checkpoint_dir": path},
                       rationale=message)
        JobStore(c.ledger).warn("pause_fallback", job["id"], None,
                                message + "; hint: save a checkpoint there each epoch and load it at start")
    return None


def _checkpoint_of(c: LoopHost, job: Any) -> str | None:
    from autoresearch.engine.runtime import checkpoint_dir

    full = JobStore(c.ledger).job(job["id"])  # the row the controller polls has no spec
    try:
        spec = json.loads(full["spec"]) if full is not None else None
    except (TypeError, ValueError):
        return None
    if not isinstance(spec, dict):
        return None
    return checkpoint_dir(c.ledger.home, job["id"], spec)


def restore(c: LoopHost, rows: list[Any]) -> None:
    """After a controller restart: rebuild the pause state of the loop's trials ``rows`` (every
    trial row) from the ledger. Called before running trials are adopted (their curves read)."""
    from autoresearch.loop.series import read_series

    s = c.state
    if not getattr(c.plan.early_stop, "pause", False):
        return
    earlier: dict[int, list[int]] = {}  # trial -> its jobs before the current one (each resume made one)
    last_stop: dict[int, dict[str, Any]] = {}
    for d in s.store.trial_decisions(("stop", "resume", "pause_fallback")):
        inputs = _inputs(d["inputs"])
        if d["kind"] == "pause_fallback":
            s.pause_off = True
        elif d["kind"] == "resume" and isinstance(inputs.get("job_id"), int):
            earlier.setdefault(d["trial_id"], []).append(inputs["job_id"])
        elif d["kind"] == "stop":
            last_stop[d["trial_id"]] = inputs
    for trial_id, jobs in earlier.items():  # a resumed trial's curve goes on from its earlier jobs' points
        s.prefix.pop(trial_id, None)
        for job_id in jobs:
            read_series(c, [{"id": trial_id, "job_id": job_id}])
            if s.series.get(trial_id):
                s.prefix[trial_id] = list(s.series[trial_id])
        s.series.pop(trial_id, None)  # read again whole (prefix + its current job) where it is needed
    for row in rows:  # its pause was decided, its job had not ended: it is paused when it ends (cancelled now
        # if the kill fell between the decision and the cancel: write-ahead, the intent is carried out)
        stop = last_stop.get(row["id"])
        if (row["state"] in ("queued", "running") and stop and stop.get("pause") is True
                and stop.get("job_id") == row["job_id"]):
            s.pause_at.add(row["id"])
            s.stopping.add(row["id"])
            _stop_again(c, row["job_id"])
    paused = [r for r in rows if r["state"] == "paused" and r["job_id"] is not None]
    if not paused:
        return
    read_series(c, paused)
    read_series(c, [r for r in rows if r["state"] in ("succeeded", "stopped") and r["id"] not in s.series])
    s.history_loaded = True  # promotion compares with every trial's value at the rung
    if c.stopper is not None:
        for r in paused:  # the rungs it passed are judged already: once resumed it is judged further up
            c.stopper.adopt(r["id"], s.series.get(r["id"], []))


def _stop_again(c: LoopHost, job_id: int) -> None:
    """The controller was killed between a pause decision and the end of its cancel (write-ahead:
    the intent is carried out now): cancel the job, or stop its attempt again. A stop already
    recorded on the attempt may never have been delivered (killed between the record and the
    signal), so it is sent again; a second stop of an attempt that heard the first is harmless."""
    store = JobStore(c.ledger)
    job = store.job(job_id)
    if job is None or job["state"] not in ("queued", "starting", "running"):
        return
    if not job["cancel_requested"]:
        job_ops.cancel(c.runtime, [job_id], reason="stopped")
        return
    last = store.latest_attempt(job_id)
    if last is not None and last["state"] in ("starting", "running"):
        c.runtime.request_stop(job_id, last["n"], "stopped")


def _inputs(text: Any) -> dict[str, Any]:
    try:
        value = json.loads(text or "{}")
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def promote(c: LoopHost) -> None:
    """Resume paused trials that are now promotable, while slots are free (best first)."""
    s = c.state
    if not s.state_counts["paused"]:
        return  # nothing paused (every loop without early_stop.pause): no walk over every trial per end
    paused = [r for r in s.rows.values() if r["state"] == "paused" and r["id"] in s.series]
    if not paused or c.stopper is None or s.stop_reason:
        return
    others = dict(s.series)
    ready = [r for r in paused if c.stopper.promotable(r["id"], s.series[r["id"]], others)]
    for row in sorted(ready, key=lambda r: s.series[r["id"]][-1][1]):
        if s.window() - len(s.active) <= 0:  # (the loop's job group caps what runs; it goes before the ahead ones)
            return
        _resume(c, row)


def _resume(c: LoopHost, row: Any) -> None:
    from autoresearch.loop._launch import trial_spec

    s = c.state
    trial_id = row["id"]
    old = JobStore(c.ledger).job(row["job_id"])
    checkpoint = _checkpoint_of(c, old) if old is not None else None
    if not checkpoint:
        return
    params = json.loads(row["params"])
    command = c.plan.render_command(params, int(row["seed"] or 0), trial_id)
    spec = trial_spec(c.plan, s.store.loop_id, row, params, command, row["workdir"] or c.plan.trial.workdir)
    spec["checkpoint"] = checkpoint  # the paused job's: the trial goes on from its last epoch
    spec["tags"]["autoresearch.resumed_from_job"] = str(row["job_id"])  # its MLflow run keeps both jobs' logs
    if s.sync is not None:
        spec["env"].update(s.sync.env(trial_id))
    step = s.series[trial_id][-1][0]
    s.store.decide("resume", trial_id=trial_id, inputs={"job_id": row["job_id"], "step": step,
                                                       "checkpoint_dir": checkpoint},
                   rationale=f"promoted at step {step}: now within the best at its rung; resumed from its checkpoint")
    try:
        # In the loop's group (it counts toward the cap), in its paused job's place: before the trials queued ahead
        job_id = job_ops.submit_many(c.runtime, [spec], project=s.loop_project, group=s.job_group(),
                                     max_running=c.plan.budget.parallel, place_as=row["job_id"])[0]
    except AutoresearchError as err:
        s.update_trial(trial_id, state="stopped", failure=f"could not resume: {err.render()}")
        return
    s.prefix[trial_id] = list(s.series[trial_id])
    s.active[trial_id] = s.update_trial(trial_id, job_id=job_id, state="queued")
    outbox.trial_run_goes_on(c.ledger, trial_id)  # once its run points at the new job: that job's logs upload


def finish(c: LoopHost) -> None:
    """Trials still paused when the loop ends are stopped."""
    s = c.state
    for row in list(s.rows.values()):
        if row["state"] == "paused":
            s.update_trial(row["id"], state="stopped")
