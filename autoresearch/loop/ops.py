"""The loop's operations behind the facade's loop half (:class:`autoresearch.api.Api`):
start a loop in the background, record an agent's proposals, stop a loop, read its
leaderboard and a trial's patch.

They take the engine (:class:`autoresearch.engine.runtime.Runtime`: its ledger, and
:mod:`autoresearch.engine.jobs` to cancel), never the facade. Their ``project`` argument is the
caller's scope (None: every loop): a loop of another project is reported exactly like a
missing one.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoresearch.engine import jobs as job_ops
from autoresearch.errors import NotFoundError, PlanError, SpecError, StateError
from autoresearch.loop.proposers import _gate
from autoresearch.loop.proposers._base import Proposal, ProposerInfo
from autoresearch.loop.proposers.agent import STOP_DECISION, SUBMIT_DECISION, proposal_key, submitted
from autoresearch.loop.store import ACTIVE_TRIAL, LoopStore
from autoresearch.util._private import private_dir


@dataclass
class Submitted:
    loop: str
    decision_id: int | None  # the agent_submit decision; None when nothing was accepted
    accepted: int
    rejected: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    controller_running: bool = True


def controller_running(home: Path, name: str) -> bool:
    """Whether a controller holds the loop's lock right now (in any process)."""
    from autoresearch.util.paths import lock_held

    return lock_held(home / "loops" / name / "controller.lock")


def _plan_of(loop: Any) -> Any:
    from autoresearch.loop.plan import Plan

    return Plan.model_validate(json.loads(loop["plan"]))


def find_loop(ledger: Any, name: str, project: str | None = None) -> Any:
    """The loop row, if ``project`` (None: any) may see it; else NotFoundError naming the visible loops."""
    loop = LoopStore.find(ledger, name)
    if loop is None or (project is not None and loop["project"] != project):
        names = LoopStore.visible_names(ledger, project)
        raise NotFoundError(f"no loop named {name!r}",
                            hint=(f"loops: {', '.join(names)}; " if names else "") + "start one with start_loop")
    return loop


def submit_proposals(runtime: Any, name: str, proposals: list[dict[str, Any]], rationale: str,
                     agent: str = "", project: str | None = None) -> Submitted:
    """Validate the agent's proposals against the loop's plan and record them as one decision.

    Each proposal is ``{params, rationale?, patch? | edits?, parent_trial?}``. ``edits`` are
    search/replace edits on top of ``parent_trial`` (default: the best trial so far);
    ``patch`` is a unified diff against the workdir's base commit. Invalid ones come back in
    ``rejected`` with the reason; valid ones are clipped into range with a note. The loop's
    controller turns the recorded proposals into trials as slots free up.
    """
    from autoresearch.loop.views import incumbent_of

    ledger = runtime.ledger
    loop = find_loop(ledger, name, project)
    if loop["state"] == "finished":
        raise StateError(f"loop {name!r} has finished; it launches nothing more",
                         hint="start_loop(plan, resume=true) with a larger budget.trials, or start a new loop")
    if not proposals:
        raise SpecError("no proposals given", hint="pass proposals=[{params: {...}, rationale: '...'}]")
    plan = _plan_of(loop)
    space = _gate.normalize(plan.space)
    store = LoopStore(ledger, loop["id"])
    trials = {r["id"]: r for r in store.trials()}
    seen = {proposal_key(json.loads(r["params"]), r["patch"]) for r in trials.values()}
    waiting = [p for _, p in submitted(ledger, loop["id"]) if proposal_key(p.params, p.patch) not in seen]
    seen |= {proposal_key(p.params, p.patch) for p in waiting}
    code = None
    if plan.code is not None:
        from autoresearch.loop.proposers.code import CodeSearch

        code = CodeSearch(plan.trial.workdir, list(plan.code.files), plan.code.instructions)
    best = incumbent_of(ledger, loop["id"])
    accepted: list[Proposal] = []
    out = Submitted(name, None, 0, controller_running=controller_running(ledger.home, name))
    for i, item in enumerate(proposals, 1):
        try:
            proposal, notes = _one(item, space, code, trials, best)
        except _gate.Rejected as why:
            out.rejected.append(f"proposal {i}: {why}")
            continue
        key = proposal_key(proposal.params, proposal.patch)
        if key in seen:
            out.rejected.append(f"proposal {i}: already tried or waiting with these params and code")
            continue
        seen.add(key)
        out.notes.extend(f"proposal {i}: {n}" for n in notes)
        accepted.append(proposal)
    launched_or_queued = len([r for r in trials.values() if r["state"] not in ("crashed", "skipped")])
    room = max(0, plan.budget.trials - launched_or_queued - len(waiting))
    if room < len(accepted):
        out.rejected.extend(f"proposal {i + 1}: over budget.trials ({plan.budget.trials})"
                            for i in range(room, len(accepted)))
        accepted = accepted[:room]
    if not accepted:
        return out
    text = rationale.strip() + ("\n" + "\n".join(out.notes) if out.notes else "")
    out.decision_id = store.decide(
        SUBMIT_DECISION, rationale=text, info=ProposerInfo(kind="agent", model=agent or None, provider="mcp"),
        inputs={"via": "mcp", "agent": agent, "asked": len(proposals), "rejected": out.rejected},
        outputs={"proposals": [{"params": p.params, "rationale": p.rationale, "patch": p.patch,
                                "parent_trial": p.parent_trial} for p in accepted]})
    out.accepted = len(accepted)
    return out


def _one(item: Any, space: dict[str, dict[str, Any]], code: Any, trials: dict[int, Any],
         best: int | None) -> tuple[Proposal, list[str]]:
    if not isinstance(item, dict):
        raise _gate.Rejected("each proposal is an object {params, rationale, patch | edits, parent_trial}")
    unknown = set(item) - {"params", "rationale", "patch", "edits", "parent_trial"}
    if unknown:
        raise _gate.Rejected(f"unknown key(s) {', '.join(sorted(unknown))}; use params, rationale, patch, edits, "
                             "parent_trial")
    parent = item.get("parent_trial")
    if parent is not None and parent not in trials:
        raise _gate.Rejected(f"parent_trial {parent} is not a trial of this loop")
    if code is None and (item.get("patch") or item.get("edits")):
        raise _gate.Rejected("this loop's plan has no code: section, so it takes params only")
    key = parent if parent is not None else best
    base = trials.get(key) if code is not None and key is not None else None
    raw = item.get("params")
    if raw is None and base is not None:
        raw = json.loads(base["params"])
    params, notes = _gate.coerce(space, raw if raw is not None else {})
    patch = None
    if code is not None:
        if item.get("edits"):
            patch = code.make_patch(base["patch"] if base is not None else None, item["edits"])
        elif item.get("patch"):
            patch = str(item["patch"])
            code.files_at(patch)  # raises Rejected when it does not apply to the base commit
        elif base is not None:
            patch = base["patch"]  # params only: same code as the parent
    parent_id = base["id"] if base is not None else parent
    return Proposal(params, str(item.get("rationale") or ""), patch, parent_id), notes


def stop_loop(runtime: Any, name: str, rationale: str = "",
              project: str | None = None) -> tuple[int | None, list[int]]:
    """Record a ``stop_loop`` decision (the controller finishes on it), skip trials not yet
    launched and stop the running ones; returns (decision id, stopped job ids).

    Idempotent: a loop that has already ended (or was stopped already) with nothing left to
    stop records nothing and returns (None, [])."""
    ledger = runtime.ledger
    loop = find_loop(ledger, name, project)
    store = LoopStore(ledger, loop["id"])
    why = rationale or "stopped by the agent"
    jobs = [r for r in store.trials(("queued", "running")) if r["job_id"] is not None]
    ended = loop["state"] != "running" or store.last_decision(STOP_DECISION) is not None
    if ended and not jobs and not store.trials(("proposed",)):
        if loop["state"] == "running" and not controller_running(ledger.home, name):
            store.set_loop(state="finished", ended_at=time.time())
        return None, []
    decision = store.decide(STOP_DECISION, inputs={"jobs": [r["job_id"] for r in jobs]}, rationale=why,
                            info=ProposerInfo(kind="agent", provider="mcp"))
    for row in store.trials(("proposed",)):
        store.update_trial(row["id"], state="skipped", failure="not launched: the loop was stopped")
    _stop_trials(runtime, store, jobs, "stop_loop", why)
    if not controller_running(ledger.home, name) and loop["state"] != "finished":
        store.set_loop(state="finished", ended_at=time.time())
    return decision, [r["job_id"] for r in jobs]


def start_loop(runtime: Any, plan_path: str | Path, resume: bool = False, wait_s: float = 10.0,
               project: str | None = None, check: Callable[[Any], None] | None = None) -> tuple[str, int, Path]:
    """Validate a plan here (one clear error before anything launches), then run its controller
    in a detached process that outlives the caller; returns (loop name, pid, controller log).

    ``project``: the caller's project; a new loop and its trial jobs belong to it (None: '').
    A loop of that name in another project is refused. ``check(plan)``: the caller's own
    refusals (the MCP server keeps trial.workdir inside its root)."""
    from autoresearch.loop.plan import load_plan
    from autoresearch.loop.proposers import resolve_kind

    plan = load_plan(plan_path, home=runtime.ledger.home)
    if check is not None:
        check(plan)
    kind = resolve_kind(plan)
    env = tenant_env(runtime, plan, project)  # None: not a tenant's loop, it inherits ours
    if kind in ("llm", "code"):
        from autoresearch.loop.proposers.llm import LLMProposer

        LLMProposer.check(plan, environ=env)
    home = Path(runtime.ledger.home)
    existing = LoopStore.find(runtime.ledger, plan.name)
    if existing is not None and project is not None and existing["project"] != project:
        raise StateError(f"the loop name {plan.name!r} is taken by another project", hint="change name: in the plan")
    if controller_running(home, plan.name):
        raise StateError(f"loop {plan.name!r} is already running", hint="follow it with loop_status / leaderboard")
    state_dir = home / "loops" / plan.name
    private_dir(home / "loops")
    private_dir(state_dir)
    log_path = state_dir / "controller.log"
    argv = [sys.executable, "-m", "autoresearch.cli", "--home", str(home), "run", str(Path(plan_path).resolve()),
            "--json", "--no-report"]
    if resume:
        argv.append("--resume")
    if project is not None:
        argv += ["--project", project]
    if plan.backend_choice()[0] is None:  # the caller's backend (serve --backend), not the detached process's default
        argv += ["--backend", runtime.backend.name]
    with open(os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600),
              "ab") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=str(Path(plan_path).resolve().parent), env=env)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        code = proc.poll()
        if code is not None and not controller_running(home, plan.name):
            loop = LoopStore.find(runtime.ledger, plan.name)
            if code == 0 and loop is not None:
                break  # finished already (the same finished plan, or a tiny budget)
            tail = log_path.read_text(errors="replace")[-1500:].strip()
            raise PlanError(f"the loop's controller exited with code {code}: {tail.splitlines()[-1] if tail else ''}",
                            hint=f"see {log_path}; fix the plan and call start_loop again")
        if controller_running(home, plan.name) and LoopStore.find(runtime.ledger, plan.name) is not None:
            break
        time.sleep(0.05)
    with contextlib.suppress(Exception):
        (state_dir / "controller.pid").write_text(f"{proc.pid}\n")
    return plan.name, proc.pid, log_path


def tenant_env(runtime: Any, plan: Any, project: str | None) -> dict[str, str] | None:
    """A tenant's loop (its project is served by a tokened server): refuse a plan that names a
    server variable or an endpoint the server does not allow (:mod:`autoresearch.engine.grants`), and
    return the clean environment its controller runs with. None for anyone else's loop."""
    from autoresearch.engine import grants
    from autoresearch.store.jobstore import JobStore

    if not project or not JobStore(runtime.ledger).project_tenant_policy(project):
        return None
    from autoresearch.backends import profiles

    tenancy = profiles.tenancy(runtime.ledger.home)
    grants.check_plan(plan, project, tenancy, str(profiles.config_path(runtime.ledger.home)))
    return grants.controller_env(os.environ, project, tenancy)


def leaderboard(runtime: Any, name: str, top: int = 10, project: str | None = None) -> tuple[Any, list[dict[str, Any]]]:
    """The loop's view and its best ``top`` succeeded trials, best first (patch summaries, not patches)."""
    from autoresearch.loop.views import loop_view, mark, ranked

    find_loop(runtime.ledger, name, project)
    view = loop_view(runtime.ledger, name)
    done = ranked(view)  # the incumbent first: what the loop kept, not merely the lowest single run
    rows = []
    patches = LoopStore(runtime.ledger, view.loop_id).patches()
    for rank, t in enumerate(done[:top], 1):
        rows.append({"rank": rank, "trial_id": t.trial_id, "job_id": t.job_id, "objective": t.objective,
                     "params": t.params, "role": t.role, "parent_trial": t.parent_trial,
                     "rationale": t.rationale[:300], "patch": patch_summary(patches.get(t.trial_id)),
                     "verdict": mark(t, view)})
    return view, rows


def patch_summary(patch: str | None) -> str:
    """'train.py +3 -1' for a diff; '' for none."""
    if not patch:
        return ""
    files: dict[str, list[int]] = {}
    current = ""
    for line in patch.splitlines():
        if line.startswith("+++ b/"):
            current = line[6:]
            files.setdefault(current, [0, 0])
        elif current and line.startswith("+") and not line.startswith("+++"):
            files[current][0] += 1
        elif current and line.startswith("-") and not line.startswith("---"):
            files[current][1] += 1
    return ", ".join(f"{f} +{a} -{d}" for f, (a, d) in files.items())


def trial_patch(runtime: Any, name: str, trial_id: int, project: str | None = None) -> str:
    loop = find_loop(runtime.ledger, name, project)
    row = LoopStore(runtime.ledger, loop["id"]).trial_patch(trial_id)
    if row is None:
        raise NotFoundError(f"loop {name!r} has no trial {trial_id}", hint="see leaderboard or loop_status")
    return str(row["patch"] or "")


def loop_status(runtime: Any, name: str, project: str | None = None) -> tuple[Any, bool]:
    """The loop's view and whether a controller is running it now."""
    from autoresearch.loop import report_later
    from autoresearch.loop.views import loop_view

    find_loop(runtime.ledger, name, project)
    view = loop_view(runtime.ledger, name)
    report = report_later.state(runtime.ledger.home, name)
    if report is not None:
        view.report_state = report["state"]
        view.report_dir = str(runtime.ledger.home / "loops" / name / "report")
    return view, controller_running(runtime.ledger.home, name)


def proposer_kind(runtime: Any, name: str) -> str | None:
    """The ``proposer.kind`` of a loop's recorded plan (None: no such loop)."""
    row = LoopStore.find(runtime.ledger, name)
    return None if row is None else json.loads(row["plan"]).get("proposer", {}).get("kind")


def stop_running(runtime: Any, name: str, reason: str = "stopped by the user") -> list[int]:
    """Stop every running trial of a loop (after an interrupt); returns their job ids."""
    loop = find_loop(runtime.ledger, name)
    store = LoopStore(runtime.ledger, loop["id"])
    rows = []
    for r in store.trials(ACTIVE_TRIAL):
        # An interrupt between a launch's submit and its trials-row write leaves the job unlinked:
        # found by its tags, as a resume would adopt it, so that it is stopped too, not orphaned.
        job_id = r["job_id"] if r["job_id"] is not None else store.job_of_trial(r["id"])
        if job_id is not None:
            rows.append({"id": r["id"], "job_id": job_id})
    # Trials queued ahead whose job never started: cancelled and skipped (not stopped: they never ran)
    waiting = set(runtime.jobs.cancel_queued([row["job_id"] for row in rows]))
    if waiting:
        store.update_trials([(row["id"], {"state": "skipped", "failure": f"not launched: {reason}",
                                          "ended_at": time.time()}) for row in rows if row["job_id"] in waiting])
    return [*sorted(waiting), *_stop_trials(runtime, store, [r for r in rows if r["job_id"] not in waiting], reason,
                                            reason)]


def _stop_trials(runtime: Any, store: LoopStore, rows: list[Any], reason: str, rationale: str) -> list[int]:
    """A stop decision per trial (write-ahead), then one cancel of their jobs; returns the job ids."""
    jobs = [row["job_id"] for row in rows]
    for row in rows:
        store.decide("stop", trial_id=row["id"], inputs={"job_id": row["job_id"], "reason": reason},
                     outputs={"action": "cancel"}, rationale=rationale)
    if jobs:
        job_ops.cancel(runtime, jobs, reason="stopped")
    return jobs
