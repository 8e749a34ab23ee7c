"""Loops, jobs and trials → MLflow runs: their params, tags, plan and patch.

One parent run per loop, one nested run per trial, one run per standalone job (see
:mod:`autoresearch.tracking._sync`). Each row is mirrored again when its ``updated_at``
passes the run's ``synced_version``; params and artifacts go up only the first time.
"""

from __future__ import annotations

import json
import time
from typing import Any

from autoresearch.errors import TrackingError
from autoresearch.store import outbox
from autoresearch.tracking._common import DEFAULT_EXPERIMENT, Mirror, SyncReport, requested_trials
from autoresearch.tracking._finish import FINAL, LOOP_FINAL
from autoresearch.tracking._metrics import backfill
from autoresearch.util.redact import is_secret, plan_secrets, redact, redact_command, redact_obj


def _flatten(params: dict[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value if isinstance(value, str) else json.dumps(value, default=str)
    return out


# -- loops ------------------------------------------------------------------------------

def loop_experiment(loop: Any) -> str:
    return loop["experiment"] or loop["name"]


def sync_loops(syncer: Mirror, report: SyncReport) -> None:
    for loop in syncer.store.loops_to_sync():
        sync_loop(syncer, loop, report)


def sync_loop(syncer: Mirror, loop: Any, report: SyncReport) -> str | None:
    entity = f"loop:{loop['id']}"
    try:
        run_id, created = syncer.ensure_run(entity, loop_experiment(loop), loop["name"], None, report,
                                             loop["created_at"])
        tags = {"autoresearch.loop_id": str(loop["id"]), "autoresearch.loop": loop["name"],
                "autoresearch.state": loop["state"], "autoresearch.kind": "loop"}
        params: dict[str, str] = {}
        secrets = loop_secrets(syncer, loop)
        if created or loop["synced_version"] is None or loop["synced_version"] < 0:
            plan = _plan(loop)
            params = {k: redact_command(v, secrets) if k.endswith("command") else v
                      for k, v in _flatten(plan if isinstance(plan, dict) else {"plan": plan}).items()
                      if not is_secret(k.rsplit(".", 1)[-1]) and v not in ("null", "{}", "[]", "")}
            params = dict(list(params.items())[:300])
            syncer.log_text(run_id, json.dumps(redact_obj(plan, secrets), indent=2, default=str), "plan.json")
            report.artifacts += 1
        _set_view(syncer, loop)
        syncer.log_batch(run_id, params=params, tags=tags, secrets=secrets)
        reopen = bool(loop["finished"]) and str(loop["state"]).lower() not in LOOP_FINAL
        if reopen:  # an ended loop resumed (--resume): its run is live again, and ends again with it
            syncer.client.update_run(run_id, status="RUNNING")
        syncer.store.loop_synced(entity, loop["updated_at"], reopen)
        return run_id
    except Exception as err:
        syncer.mark_blocked(entity, err)
        return None


VIEW_KEY = "autoresearch"  # the UI opens it with ?viewStateShareKey=autoresearch
VIEW_TAG = f"mlflow.sharedViewState.{VIEW_KEY}"
PROVENANCE = ("verdict", "trial_state", "seed", "parent_trial", "proposer", "decision_id")


def trials_view(plan: dict[str, Any]) -> dict[str, Any]:
    """The runs table of a loop's experiment as the UI's saved view: the trials listed flat (not
    folded under the loop's run), best first, with the plan's params, its objective and the
    provenance tags as columns."""
    objective = plan.get("objective")
    objective = objective if isinstance(objective, dict) else {"metric": objective} if objective else {}
    metric = str(objective.get("metric") or "")
    goal = str(objective.get("goal") or "minimize")
    space = plan.get("space")
    columns = [f"params.`{name}`" for name in list(space)[:30]] if isinstance(space, dict) else []
    columns += [f"metrics.`{metric}`"] if metric else []
    columns += [f"tags.`autoresearch.{name}`" for name in PROVENANCE]
    view: dict[str, Any] = {"searchFilter": "tags.`autoresearch.kind` = 'trial'", "selectedColumns": columns}
    if metric:
        view.update(orderByKey=f"metrics.`{metric}`", orderByAsc=not goal.lower().startswith("max"))
    return view


def _set_view(syncer: Mirror, loop: Any) -> None:
    """The experiment's saved view of the trials (kept up to date: a resumed plan may add
    parameters). A nicety: a store that refuses it warns once and blocks nothing."""
    from autoresearch.tracking._common import is_transient

    plan = _plan(loop)
    if not isinstance(plan, dict):
        return
    view = trials_view(plan)
    while len(json.dumps(view)) > 4000 and view["selectedColumns"]:  # MLflow keeps 5000 characters of a tag
        view["selectedColumns"].pop(0)
    try:
        syncer.client.set_experiment_tag(syncer.experiment_id(loop_experiment(loop)), VIEW_TAG, json.dumps(view))
    except Exception as err:
        if is_transient(err):
            raise
        syncer.warn(f"view:{loop['id']}", f"the saved view of loop {loop['id']} was not set ({err})")


def _plan(loop: Any) -> Any:
    try:
        return json.loads(loop["plan"])
    except ValueError:
        return {"plan": loop["plan"]}


def loop_secrets(syncer: Mirror, loop: Any) -> list[str]:
    """What to redact in a loop's run, its decisions and its LLM calls: its plan's secrets (and ours)."""
    return plan_secrets(_plan(loop), ambient=False) + syncer.secrets if loop is not None else syncer.secrets


def loop_run(syncer: Mirror, loop_id: int, report: SyncReport | None = None) -> str | None:
    run_id = syncer.store.loop_run_id(loop_id)
    if run_id is not None:
        return run_id
    loop = syncer.store.unsynced_loop(loop_id)
    return sync_loop(syncer, loop, report or SyncReport()) if loop is not None else None


# -- jobs and trials --------------------------------------------------------------------

def _job_target(syncer: Mirror, job: Any, trial: Any) -> tuple[str, str, str, str | None]:
    """(entity, experiment, run name, parent run id) of a job's run."""
    if trial is not None:
        loop = syncer.store.loop(trial["loop_id"])
        parent = loop_run(syncer, trial["loop_id"])
        experiment = loop_experiment(loop) if loop is not None else DEFAULT_EXPERIMENT
        if parent is None:
            raise TrackingError(f"the parent run of loop {trial['loop_id']} is not available",
                                hint="see the loop's error in `autoresearch sync --status`")
        return f"trial:{trial['id']}", experiment, f"trial-{trial['id']}", parent
    return f"job:{job['id']}", job["experiment"] or DEFAULT_EXPERIMENT, f"{job['name']}-{job['id']}", None


CHANGE_SLACK_S = 60.0  # a change is looked for this long after its time: a transaction commits after it stamps


def sync_jobs(syncer: Mirror, report: SyncReport) -> None:
    """Mirror the jobs that changed. A syncer's first pass looks at every job; later ones only
    at those changed since its last pass that went through (minus a slack for transactions in
    flight) and the blocked ones: the per-second pass is O(changes), not O(jobs) (issue 16)."""
    began = time.time()
    jobs = syncer.store.jobs_to_sync(syncer.jobs_since)
    with syncer.store.prefetch_jobs(jobs):
        _create_runs(syncer, [job for job in jobs if job["run_id"] is None], report)
        for job in jobs:
            sync_job(syncer, job, report)
    syncer.jobs_since = began - CHANGE_SLACK_S  # only once the pass went through: a failure looks again


def _create_runs(syncer: Mirror, jobs: list[Any], report: SyncReport) -> None:
    """The runs of jobs that have none, made together (one transaction into a SQLite store)."""
    from autoresearch.tracking._common import is_transient

    wanted: list[tuple[str, str, str, str | None, float | None]] = []
    for job in jobs:
        trial = syncer.store.trial(job["trial_id"]) if job["trial_id"] is not None else None
        try:
            entity, experiment, name, parent = _job_target(syncer, job, trial)
        except Exception as err:  # noqa: BLE001 - its sync_job says why (and blocks it)
            if is_transient(err):
                raise
            continue
        wanted.append((entity, experiment, name, parent, job["started_at"] or job["submitted_at"]))
    syncer.create_runs(wanted, report)


def sync_job(syncer: Mirror, job: Any, report: SyncReport) -> str | None:
    trial = syncer.store.trial(job["trial_id"]) if job["trial_id"] is not None else None
    entity = f"trial:{trial['id']}" if trial is not None else f"job:{job['id']}"
    try:
        entity, experiment, name, parent = _job_target(syncer, job, trial)
        run_id, created = syncer.ensure_run(entity, experiment, name, parent, report,
                                             job["started_at"] or job["submitted_at"])
        if trial is not None and job["state"] not in FINAL and syncer.store.reopen(entity):
            syncer.client.update_run(run_id, "RUNNING")  # a resumed trial goes on in its own run
        spec, secrets = syncer.job_spec(job["spec"])  # the job's own secrets, from the ledger, and ours
        last = syncer.store.last_node(job["id"])
        tags = {k: v for k, v in (spec.get("tags") or {}).items() if not is_secret(k)}
        tags.update({
            "autoresearch.job_id": str(job["id"]), "autoresearch.state": job["state"],
            "autoresearch.attempts": str(job["attempts"]),
            "autoresearch.node": (last["node"] or "") if last else "",
            "autoresearch.end_reason": job["end_reason"] or "", "autoresearch.priority": job["priority"],
            "autoresearch.kind": "trial" if trial is not None else "job",
            # infra (the machine's fault) or user (the program's), for a failed job (autoresearch/health/)
            "autoresearch.failure_class": ((last["failure_class"] or "") if last and job["state"] == "failed"
                                           else ""),
        })
        params: dict[str, str] = {}
        first = created or job["synced_version"] is None or job["synced_version"] < 0
        if trial is not None:
            decision = (syncer.store.decision(trial["decision_id"])
                        if trial["decision_id"] is not None else None)
            tags.update({
                "autoresearch.trial_id": str(trial["id"]), "autoresearch.loop_id": str(trial["loop_id"]),
                "autoresearch.decision_id": str(trial["decision_id"] or ""),
                "autoresearch.parent_trial": str(trial["parent_trial"] or ""),
                "autoresearch.proposer": trial["proposer"] or "", "autoresearch.trial_state": trial["state"],
                "autoresearch.seed": "" if trial["seed"] is None else str(trial["seed"]),
            })
            if trial["objective"] is not None:
                tags["autoresearch.objective"] = repr(trial["objective"])
            tags["autoresearch.verdict"] = verdict(syncer, trial)
            tags["mlflow.runName"] = trial_run_name(trial, job)
            rationale = trial["rationale"] if "rationale" in trial.keys() else ""
            if not rationale and decision is not None:
                rationale = decision["rationale"]
            if rationale:  # shown as the run's description: why this was tried
                tags["mlflow.note.content"] = rationale
            if first:
                params = {k: v for k, v in _flatten(json.loads(trial["params"] or "{}")).items()
                          if not is_secret(k)}
                if trial["patch"]:
                    syncer.log_text(run_id, redact(trial["patch"], secrets), "patch.diff")
                    report.artifacts += 1
        elif first:
            command = spec.get("command")
            params = {"command": redact_command(command if isinstance(command, str) else command or [], secrets),
                      "gpus": str(spec.get("gpus", 0)), "nodes": str(spec.get("nodes", 1)),
                      "priority": str(spec.get("priority", "")), "workdir": str(spec.get("workdir", ""))}
            params.update({f"env.{k}": v for k, v in (spec.get("env") or {}).items() if not is_secret(k)})
        if syncer.clear_error(entity):
            backfill(syncer, job["id"], run_id, report)
        version = max(job["updated_at"], trial["updated_at"] if trial is not None else 0)
        syncer.log_batch(run_id, params=dict(list(params.items())[:500]), tags=tags, secrets=secrets, entity=entity,
                         then=lambda: syncer.store.synced(entity, version))
        return run_id
    except Exception as err:
        syncer.mark_blocked(entity, err)
        return None


def verdict(syncer: Mirror, trial: Any) -> str:
    """What the loop made of a trial (its keep-or-discard decision), short enough for a runs-table
    cell: incumbent, replaced by #N, within noise (lower, but not beyond the noise floor: not
    kept), not better, seed of #N."""
    if trial["role"] == "repeat" and trial["parent_trial"] is not None:
        return f"seed of #{trial['parent_trial']}"
    own = syncer.store.verdict_of(trial["id"])
    if own is None:
        return ""
    try:
        out = json.loads(own["outputs"])
    except ValueError:
        return ""
    if out.get("promoted"):  # (the walk of the later decisions only for the few promoted: O(n) each)
        later = syncer.store.replaced_by(own["id"], trial["id"])
        return f"replaced by #{later['trial_id']}" if later is not None else "incumbent"
    margin = out.get("margin")
    return "within noise" if isinstance(margin, (int, float)) and margin > 0 else "not better"


def trial_run_name(trial: Any, job: Any | None = None) -> str:
    """``#7 succeeded lr=0.0267 hidden=64``: the trial id, its state and params, readable in the runs table."""
    try:
        params = json.loads(trial["params"] or "{}")
    except ValueError:
        params = {}
    words = [f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items()
             if not is_secret(str(k))] if isinstance(params, dict) else []
    state = trial["state"] if trial["state"] not in ("proposed", "queued") or job is None else job["state"]
    return f"trial-{trial['id']} {state} {' '.join(words)}".strip()[:120]


def ensure_job_run(syncer: Mirror, job_id: int) -> str:
    job = syncer.store.unsynced_job(job_id)
    if job is None:
        raise TrackingError(f"no job {job_id}", hint="AUTORESEARCH_JOB_ID names a job of this ledger")
    run_id = sync_job(syncer, job, SyncReport())
    if run_id is None:
        row = syncer.store.job_run_error(job_id, job["trial_id"])
        raise TrackingError(f"no MLflow run for job {job_id}: {row['error'] if row else 'unknown error'}",
                            hint="check `autoresearch sync --status`")
    return run_id


def prepare_trials(syncer: Mirror, trial_ids: list[int]) -> dict[int, str]:
    out: dict[int, str] = {}
    report = SyncReport()
    wanted: list[tuple[str, str, str, str | None, float | None]] = []
    with syncer.store.pass_reads():  # (the run maker's batch: its loop read once)
        trials = syncer.store.trials(trial_ids)  # one query, not two a trial
        for trial_id in trial_ids:  # made together first (one transaction into a SQLite store)
            trial = trials.get(trial_id)
            loop = syncer.store.loop(trial["loop_id"]) if trial is not None else None
            parent = loop_run(syncer, trial["loop_id"], report) if trial is not None else None
            if trial is not None and loop is not None and parent is not None:
                wanted.append((f"trial:{trial_id}", loop_experiment(loop), f"trial-{trial_id}", parent,
                               trial["created_at"]))
        syncer.create_runs(wanted, report)
        for trial_id in trial_ids:
            trial = trials.get(trial_id)
            if trial is None:
                continue
            parent = loop_run(syncer, trial["loop_id"], report)
            loop = syncer.store.loop(trial["loop_id"])
            if parent is None or loop is None:
                continue
            entity = f"trial:{trial_id}"
            try:
                out[trial_id], _ = syncer.ensure_run(entity, loop_experiment(loop), f"trial-{trial_id}",
                                                      parent, report, trial["created_at"])
            except Exception as err:
                syncer.mark_blocked(entity, err)
    return out


def sync_run_requests(syncer: Mirror, report: SyncReport) -> None:
    """A sync pass's share of the run maker's work (:mod:`autoresearch.tracking._prepare_runs`):
    requests left unanswered (their controller ended first)."""
    for row in outbox.pending(syncer.ledger, "trial_run"):
        prepared = prepare_trials(syncer, requested_trials(row))
        outbox.mark_sent(syncer.ledger, row["id"], json.dumps({str(k): v for k, v in prepared.items()}))
