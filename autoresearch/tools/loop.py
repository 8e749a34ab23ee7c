"""Loop tools: the coding agent runs research loops and, with ``proposer: {kind: agent}``,
is their proposer: start_loop, loop_status, propose_trials, leaderboard, trial_patch, stop_loop.

Every tool is scoped to the caller's project (``ctx.caller_project()``): a loop started
over MCP belongs to the caller's project and its trials are that project's jobs; a loop
of another project is reported exactly like a missing one.

The operations are the facade's loop half (:class:`autoresearch.api.Api`, over
:mod:`autoresearch.loop.ops`); this module is the MCP face (typed parameters, small
structured results, errors with hints).
"""

from __future__ import annotations

from typing import Annotated, Any

from mcp.types import ToolAnnotations
from pydantic import BaseModel, Field

from autoresearch.tools._context import ToolContext, tool_errors

LoopName = Annotated[str, Field(min_length=1, max_length=64, description="The loop's name (name: in its plan.yaml).")]
MAX_PATCH_CHARS = 16_000


class Edit(BaseModel):
    file: str = Field(description="A file listed in the plan's code.files (relative to trial.workdir).")
    search: str = Field(description="An exact, unique snippet of the file (whole lines, verbatim indentation).")
    replace: str = Field(description="Its new text.")


class ProposalIn(BaseModel):
    params: dict[str, Any] | None = Field(None, description=(
        "A value for every parameter of the plan's space (out-of-range numbers are clipped, with a note). "
        "Code plans may omit it to reuse the parent trial's params."))
    rationale: str = Field("", max_length=2000, description="Why this trial: one or two sentences.")
    edits: list[Edit] | None = Field(None, description=(
        "Code plans: search/replace edits applied on top of parent_trial's code (default: the best trial)."))
    patch: str | None = Field(None, max_length=200_000, description=(
        "Code plans, instead of edits: a unified diff against the workdir's committed base (git diff format)."))
    parent_trial: int | None = Field(None, ge=1, description="The trial whose code the edits build on.")


class TrialBrief(BaseModel):
    trial_id: int
    job_id: int | None
    state: str = Field(description="proposed | queued | running | succeeded | failed | stopped | crashed | "
                                   "cancelled | skipped")
    params: dict[str, Any]
    objective: float | None
    failure: str | None = Field(None, description="For failed trials: why, with the end of the log.")


class StartLoopResult(BaseModel):
    name: str
    pid: int = Field(description="The controller process (it outlives this conversation).")
    log: str = Field(description="The controller's own output file.")
    state: str
    next_step: str


class LoopStatusResult(BaseModel):
    name: str
    state: str = Field(description="running | finished | interrupted | failed")
    controller_running: bool = Field(description="Whether a controller process is driving the loop now.")
    metric: str
    goal: str
    counts: dict[str, int] = Field(description="Trials per state.")
    budget_trials: int
    best_trial: int | None
    best_value: float | None
    best_params: dict[str, Any]
    noise_floor: float | None
    noise_basis: str = Field(description="What measured noise_floor, in words (seeds of the incumbent, or a prior).")
    warm_start: str = Field(description="Which earlier loops' trials warmed the proposer, and how many ('' if none).")
    llm_usd: float
    elapsed_s: float
    eta_s: float | None
    stop_reason: str
    blocked: str = Field(default="", description=(
        "Why its queued trials do not start: every node that fits them is cordoned or down, with each "
        "one's reason and the command that brings one back ('' when nothing blocks them). The loop waits."))
    recent: list[TrialBrief] = Field(description="The most recent trials, newest last.")
    next_step: str


class ProposeTrialsResult(BaseModel):
    loop: str
    decision_id: int | None = Field(description="The decision recording the accepted proposals (None: none).")
    accepted: int = Field(description="Proposals recorded; the loop launches them as slots free up.")
    rejected: list[str] = Field(description="Proposals refused, each with the reason.")
    notes: list[str] = Field(description="Changes made to accepted proposals (clipping, rounding).")
    controller_running: bool
    next_step: str


class LeaderRow(BaseModel):
    rank: int
    trial_id: int
    job_id: int | None
    objective: float | None
    params: dict[str, Any]
    role: str
    parent_trial: int | None
    rationale: str
    patch: str = Field(description="Files changed, e.g. 'train.py +3 -1' (full diff: trial_patch).")
    verdict: str = Field("", description="What the loop made of it: 'incumbent' (the kept best, ranked first), "
                                          "'within noise' (lower but not beyond the noise floor: not kept), "
                                          "'kept earlier', 'seed of #N' (a repeat), or ''.")


class LeaderboardResult(BaseModel):
    loop: str
    metric: str
    goal: str
    incumbent: int | None = Field(description="The best trial as judged against the noise floor.")
    noise_floor: float | None
    rows: list[LeaderRow]
    next_step: str


class TrialPatchResult(BaseModel):
    loop: str
    trial_id: int
    patch: str
    truncated: bool


class StopLoopResult(BaseModel):
    loop: str
    decision_id: int | None = Field(description="The stop decision recorded (None: the loop had already ended).")
    already_ended: bool = Field(False, description="True when the loop had already ended: nothing was changed.")
    stopped_jobs: list[int]
    next_step: str


def register(server: Any, ctx: ToolContext) -> None:
    @server.tool(annotations=ToolAnnotations(title="Start a research loop", read_only_hint=False,
                                             destructive_hint=False, idempotent_hint=False, open_world_hint=False))
    @tool_errors
    def start_loop(
        plan: Annotated[str, Field(description="Path of a plan.yaml relative to the server's root, e.g. "
                                               "'examples/digits/plan.yaml'.")],
        resume: Annotated[bool, Field(description="Continue an existing loop of that name even if its plan "
                                                  "changed.")] = False,
    ) -> StartLoopResult:
        """Validate a plan.yaml and start its research loop in the background.

        The loop proposes, launches and evaluates trials until its budget is used; it keeps
        running after this conversation ends. With `proposer: {kind: agent}` in the plan you
        are the proposer: send trials with propose_trials. Errors in the plan (bad keys,
        missing API key, ...) come back at once. Follow it with loop_status and leaderboard.
        """
        ctx.require_write("start_loop")
        def inside_root(loaded: Any) -> None:  # the same rule as submit's workdir
            ctx.inside_root(loaded.trial.workdir, "the plan's trial.workdir")

        name, pid, log = ctx.api.start_loop(ctx.relative_path(plan, "plan"), resume=resume,
                                            project=ctx.caller_project(), check=inside_root)
        view, _ = ctx.api.loop_status(name)
        agent = "propose trials with propose_trials(loop=...), then " if _is_agent(ctx, name) else ""
        return StartLoopResult(name=name, pid=pid, log=str(log), state=view.state,
                               next_step=f"{agent}follow it with loop_status(loop={name!r}) and leaderboard")

    @server.tool(annotations=ToolAnnotations(title="Status of a research loop", read_only_hint=True,
                                             open_world_hint=False))
    @tool_errors
    def loop_status(
        loop: LoopName,
        recent: Annotated[int, Field(ge=0, le=50, description="How many of the latest trials to include.")] = 10,
    ) -> LoopStatusResult:
        """A research loop's progress: trial counts per state, the best trial and value, the noise
        floor, LLM spend, elapsed time and ETA, and the latest trials (failed ones with the end of
        their log). Use it to decide what to propose next or whether to stop the loop.
        """
        view, running = ctx.api.loop_status(loop, ctx.caller_project())
        briefs = [TrialBrief(trial_id=t.trial_id, job_id=t.job_id, state=t.state, params=t.params,
                             objective=t.objective, failure=(t.failure or "")[-1200:] or None)
                  for t in view.trials[-recent:]] if recent else []
        if view.state == "running" and view.blocked:
            step = f"{view.blocked}; the loop waits until a node can run its trials"
        elif view.state == "running" and not running:
            step = "no controller is running: resume it with start_loop(plan, resume=true)"
        elif view.state == "running":
            step = ("propose more with propose_trials, " if _is_agent(ctx, loop) else "") + \
                f"see leaderboard(loop={loop!r}); stop with stop_loop"
        else:
            step = f"see leaderboard(loop={loop!r}); `autoresearch report {loop}` writes plots"
        return LoopStatusResult(
            name=view.name, state=view.state, controller_running=running, metric=view.metric, goal=view.goal,
            counts=view.counts, budget_trials=view.budget_trials, best_trial=view.best_trial,
            best_value=view.best_value, best_params=view.best_params, noise_floor=view.noise_floor,
            noise_basis=view.noise_basis, warm_start=view.warm_start,
            llm_usd=round(view.llm_usd, 6), elapsed_s=round(view.elapsed_s, 1), eta_s=view.eta_s,
            stop_reason=view.stop_reason, blocked=view.blocked, recent=briefs, next_step=step)

    @server.tool(annotations=ToolAnnotations(title="Propose trials to a loop", read_only_hint=False,
                                             destructive_hint=False, idempotent_hint=False, open_world_hint=False))
    @tool_errors
    def propose_trials(
        loop: LoopName,
        proposals: Annotated[list[ProposalIn], Field(min_length=1, max_length=64, description=(
            "Trials to run: each has params (and for code plans edits or patch) and a rationale."))],
        rationale: Annotated[str, Field(max_length=4000, description=(
            "Why these trials, given the results so far: recorded as the decision's rationale."))],
        agent: Annotated[str, Field(max_length=100, description="Your name/model, recorded as the proposer "
                                                                 "identity in provenance.")] = "",
    ) -> ProposeTrialsResult:
        """Send trials to a loop: they are validated against the plan's search space (and, for code
        plans, applied as patches on top of the best trial or parent_trial), recorded as one decision
        with your rationale, and launched by the loop as soon as slots are free. Invalid proposals come
        back in 'rejected' with the reason; out-of-range values are clipped and listed in 'notes'.
        """
        ctx.require_write("propose_trials")
        items = [p.model_dump(exclude_none=True) for p in proposals]
        for item in items:
            if "edits" in item:
                item["edits"] = [dict(e) for e in item["edits"]]
        out = ctx.api.submit_proposals(loop, items, rationale, agent=agent, project=ctx.caller_project())
        if out.accepted:
            step = f"they launch as slots free up; check loop_status(loop={loop!r}) or leaderboard"
            if not out.controller_running:
                step = "recorded, but no controller is running: start_loop(plan, resume=true) launches them"
        else:
            step = "nothing was accepted: fix the rejected proposals and call again"
        return ProposeTrialsResult(loop=loop, decision_id=out.decision_id, accepted=out.accepted,
                                   rejected=out.rejected, notes=out.notes,
                                   controller_running=out.controller_running, next_step=step)

    @server.tool(annotations=ToolAnnotations(title="Leaderboard of a loop", read_only_hint=True,
                                             open_world_hint=False))
    @tool_errors
    def leaderboard(
        loop: LoopName,
        top: Annotated[int, Field(ge=1, le=100, description="How many of the best trials to return.")] = 10,
    ) -> LeaderboardResult:
        """The best finished trials of a loop, the incumbent (the trial the loop kept, noise-aware)
        first, then best value first: objective, verdict, params, rationale, the trial they
        built on and a one-line summary of their code patch. Use it to pick the parent of your next
        code edit or the region of the space to refine.
        """
        view, rows = ctx.api.leaderboard(loop, top, project=ctx.caller_project())
        return LeaderboardResult(loop=loop, metric=view.metric, goal=view.goal, incumbent=view.best_trial,
                                 noise_floor=view.noise_floor, rows=[LeaderRow(**r) for r in rows],
                                 next_step="full diff of a trial: trial_patch(loop, trial_id)")

    @server.tool(annotations=ToolAnnotations(title="A trial's code patch", read_only_hint=True,
                                             open_world_hint=False))
    @tool_errors
    def trial_patch(
        loop: LoopName,
        trial_id: Annotated[int, Field(ge=1, description="The trial's id (from leaderboard or loop_status).")],
    ) -> TrialPatchResult:
        """The unified diff a code-edit trial ran with (cumulative, against the workdir's committed base),
        capped at 16,000 characters. Empty for trials that changed no code.
        """
        patch = ctx.api.trial_patch(loop, trial_id, project=ctx.caller_project())
        return TrialPatchResult(loop=loop, trial_id=trial_id, patch=patch[:MAX_PATCH_CHARS],
                                truncated=len(patch) > MAX_PATCH_CHARS)

    @server.tool(annotations=ToolAnnotations(title="Stop a research loop", read_only_hint=False,
                                             destructive_hint=True, idempotent_hint=True, open_world_hint=False))
    @tool_errors
    def stop_loop(
        loop: LoopName,
        rationale: Annotated[str, Field(max_length=2000, description="Why you stop it (recorded).")] = "",
    ) -> StopLoopResult:
        """Stop a research loop: records the decision with your rationale, skips trials not yet
        launched and stops the running ones (SIGTERM, grace period, SIGKILL); its controller then
        finishes. The results stay readable with loop_status and leaderboard. On a loop that has
        already ended it changes nothing and says so (already_ended).
        """
        ctx.require_write("stop_loop")
        decision, jobs = ctx.api.stop_loop(loop, rationale=rationale, project=ctx.caller_project())
        if decision is None:
            view, _ = ctx.api.loop_status(loop, ctx.caller_project())
            why = f": {view.stop_reason}" if view.stop_reason else ""
            if view.state == "running":  # stopped already: its controller is finishing
                said = "the loop is already stopping (a stop was recorded; its controller is finishing)"
            else:
                said = f"the loop had already ended ({view.state}{why})"
            return StopLoopResult(loop=loop, decision_id=None, already_ended=True, stopped_jobs=[],
                                  next_step=f"{said}; nothing was recorded. See leaderboard(loop={loop!r})")
        return StopLoopResult(loop=loop, decision_id=decision, already_ended=False, stopped_jobs=jobs,
                              next_step=f"see leaderboard(loop={loop!r}); `autoresearch report {loop}` writes plots")


def _is_agent(ctx: ToolContext, name: str) -> bool:
    return bool(ctx.api.loop_proposer(name) == "agent")
