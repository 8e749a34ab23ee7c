"""Job tools: submit, status, list_jobs, cancel."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import anyio
from mcp.types import ToolAnnotations
from pydantic import Field

from autoresearch.tools._batch import SubmitBatcher
from autoresearch.tools._context import ToolContext, tool_errors
from autoresearch.tools.models import (
    CancelResult,
    JobDetail,
    JobList,
    JobSummary,
    StatusResult,
    SubmitResult,
    from_view,
)

MAX_GPUS = 1024  # per node: anything above is a typo, whatever the cluster
JobId = Annotated[int, Field(ge=1, description="The job's id, as returned by submit or list_jobs.")]
State = Literal["queued", "starting", "running", "succeeded", "failed", "cancelled"]


def register(server: Any, ctx: ToolContext) -> None:
    submits = ctx.submits = SubmitBatcher(ctx.api)

    @server.tool(annotations=ToolAnnotations(title="Submit a job", read_only_hint=False, destructive_hint=False,
                                             idempotent_hint=False, open_world_hint=False))
    @tool_errors
    async def submit(
        command: Annotated[list[str], Field(min_length=1, description=(
            "The program and its arguments as an argv list, e.g. [\"python\", \"train.py\", \"--lr\", \"3e-4\"]. "
            "No shell: for pipes or redirects pass [\"sh\", \"-c\", \"...\"]."))],
        name: Annotated[str, Field(max_length=128, description="Display name; defaults to the program name.")] = "",
        gpus: Annotated[int, Field(ge=0, le=MAX_GPUS, description="GPUs per node (0 for a CPU job).")] = 0,
        nodes: Annotated[int, Field(ge=1, le=1024, description="Number of nodes.")] = 1,
        cpus: Annotated[float, Field(ge=0, le=4096, description="CPU cores to reserve (0: none reserved).")] = 0,
        memory: Annotated[str, Field(max_length=32, description="Memory to reserve, e.g. '16G' or '512M'; "
                                                                "empty: none reserved.")] = "",
        priority: Annotated[Literal["critical", "normal", "best-effort"], Field(
            description="best-effort jobs soak up spare GPUs and may be preempted (they are requeued).")] = "normal",
        workdir: Annotated[str, Field(description="Directory to run in, relative to the server's root "
                                                  "(no absolute paths, no '..').")] = ".",
        env: Annotated[dict[str, str] | None, Field(description="Extra environment variables.")] = None,
        timeout: Annotated[str | None, Field(description="Wall-clock limit per attempt: seconds ('300') or "
                                                         "'5m', '1h30m'. Empty: no limit.")] = None,
        max_retries: Annotated[int, Field(ge=0, le=100, description="Retries after infrastructure failures.")] = 2,
        retry_on_exit_codes: Annotated[list[int] | None, Field(
            description="Exit codes that mean 'retry me' (e.g. an NCCL timeout your script maps to 75).")] = None,
        checkpoint: Annotated[bool, Field(description="Give the job a stable AUTORESEARCH_CHECKPOINT_DIR shared "
                                                      "by all its attempts, to resume after a retry.")] = False,
        experiment: Annotated[str, Field(max_length=256, description="Experiment (MLflow) name to group runs.")] = "",
        tags: Annotated[dict[str, str] | None, Field(description="Free-form key/value labels.")] = None,
        mounts: Annotated[dict[str, str] | None, Field(description=(
            "{target: source}: target is linked to source inside the workdir; both relative to the server's "
            "root."))] = None,
        array: Annotated[str, Field(max_length=10_000, description=(
            "Run it as a job array (as sbatch --array): one job per index, each with $AUTORESEARCH_ARRAY_INDEX, "
            "e.g. '0-9' (10 jobs, seeds 0 to 9), '1,3,5-7', '0-98:2'; '%N' at the end runs at most N at once "
            "('0-99%8'). Empty: one job."))] = "",
    ) -> SubmitResult:
        """Submit a job (a command to run on the cluster) and return at once with its id.

        Use this to start a training run, an evaluation or any script. The job is queued and
        starts as soon as its GPUs are free; it keeps running if this conversation ends.
        Returns the job id and state; then follow it with status, logs and metrics, or stop
        it with cancel.
        """
        ctx.require_write("submit")
        # The tenant's first call registers it (a ledger write): off the event loop.
        project = ctx.submit_project() if ctx.project_known() else await anyio.to_thread.run_sync(ctx.submit_project)
        spec: dict[str, Any] = {
            "command": command, "name": name, "gpus": gpus, "nodes": nodes, "cpus": cpus, "memory": memory or 0,
            "priority": priority, "workdir": ctx.relative_path(workdir, "workdir"), "env": env or {},
            "max_retries": max_retries, "retry_on_exit_codes": retry_on_exit_codes or [], "checkpoint": checkpoint,
            "experiment": experiment, "tags": tags or {},
        }
        if timeout:
            spec["timeout"] = timeout
        if mounts:
            for target in mounts:
                ctx.relative_path(target, "mounts target")
            spec["mounts"] = {t: ctx.relative_path(s, f"mounts[{t!r}]") for t, s in mounts.items()}
        if array:  # a batch of its own: one transaction, one pass
            arr = await anyio.to_thread.run_sync(ctx.api.submit_array, spec, array, project)
            first = await anyio.to_thread.run_sync(lambda: ctx.api.status(arr.first_id, project=project, refresh=False))
            return SubmitResult(id=arr.first_id, state=first.state, name=first.name, warnings=arr.warnings,
                                last_id=arr.last_id, count=arr.count,
                                next_step=f"jobs {arr.first_id} to {arr.last_id} (indices {arr.indices}): "
                                          f"list_jobs to follow them, status(job_id=N) for one; "
                                          f"cancel(job_id={arr.first_id}, last_job_id={arr.last_id}) stops them all")
        view = await submits.submit(spec, project)  # with the submits that arrive meanwhile (tools/_batch.py)
        return SubmitResult(id=view.id, state=view.state, name=view.name, warnings=view.warnings,
                            next_step=f"call status(job_id={view.id}) to follow it, logs(job_id={view.id}) for "
                                      f"its output, metrics(job_id={view.id}) for reported metrics")

    @server.tool(annotations=ToolAnnotations(title="Job status", read_only_hint=True, open_world_hint=False))
    @tool_errors
    def status(
        job_id: Annotated[int | None, Field(ge=1, description="The job to show in detail; leave out to get the "
                                                              "most recent jobs.")] = None,
        limit: Annotated[int, Field(ge=1, le=100, description="How many recent jobs, without job_id.")] = 10,
    ) -> StatusResult:
        """Show one job in detail (state, attempts with node, exit code and end reason) or the recent jobs.

        Use it to follow a job you submitted. For a failed job the result also carries the
        failure class ('user': the program failed; 'infra': the machine's fault, retried on
        another node), why (the log line or GPU finding that decided it), a hint, and the
        last lines of its log, so you can usually diagnose it without calling logs.
        """
        project = ctx.caller_project()
        if job_id is None:
            views = ctx.api.status(None, project=project, limit=limit)
            return StatusResult(jobs=[from_view(JobSummary, v) for v in views],
                                next_step="call status(job_id=N) for one job's attempts and failure details")
        view = ctx.api.status(job_id, project=project)
        return StatusResult(job=from_view(JobDetail, view), next_step=_next_for(view.state, job_id))

    @server.tool(annotations=ToolAnnotations(title="List jobs", read_only_hint=True, open_world_hint=False))
    @tool_errors
    def list_jobs(
        state: Annotated[State | None, Field(description="Only jobs in this state.")] = None,
        experiment: Annotated[str | None, Field(description=(
            "Only jobs whose experiment contains this text, or matches this glob ('digits*'); "
            "case-insensitive."))] = None,
        limit: Annotated[int, Field(ge=1, le=200, description="Jobs per page.")] = 20,
        cursor: Annotated[int | None, Field(ge=1, description="next_cursor from the previous page, for older "
                                                              "jobs.")] = None,
    ) -> JobList:
        """List jobs newest first, optionally filtered by state or experiment, one page at a time.

        Use it to find a job id or to see what is running or queued. Returns compact job
        summaries and a next_cursor: pass it back as cursor for the next page (null means
        this is the last page).
        """
        page = ctx.api.list_jobs(state=state, experiment=experiment, project=ctx.caller_project(), limit=limit,
                                 cursor=cursor)
        return JobList(jobs=[from_view(JobSummary, v) for v in page.jobs], next_cursor=page.next_cursor)

    @server.tool(annotations=ToolAnnotations(title="Cancel a job", read_only_hint=False, destructive_hint=True,
                                             idempotent_hint=True, open_world_hint=False))
    @tool_errors
    def cancel(job_id: JobId, last_job_id: Annotated[int | None, Field(ge=1, description=(
            "Cancel job_id through last_job_id (a job array's ids, as submit returned them); every id in the "
            "range must be a job of yours, or nothing is cancelled."))] = None) -> CancelResult:
        """Cancel a job: a queued job never starts; a running one gets SIGTERM, then SIGKILL after its grace period.

        Use it to stop a run that is diverging, stuck or no longer needed. Cancelling a job
        that already ended changes nothing. Returns the job's state; 'cancelling' is true
        while the running attempt shuts down.
        """
        ctx.require_write("cancel")
        if last_job_id is not None:
            views = ctx.api.cancel([f"{job_id}-{last_job_id}"], project=ctx.caller_project())
            states: dict[str, int] = {}
            for v in views:
                key = "cancelling" if v.cancelling else v.state
                states[key] = states.get(key, 0) + 1
            return CancelResult(id=job_id, state=views[0].state, cancelling=any(v.cancelling for v in views),
                                states=states, next_step=f"call list_jobs to see jobs {job_id} to {last_job_id} "
                                                         "reach 'cancelled'")
        view = ctx.api.cancel([job_id], project=ctx.caller_project())[0]
        if view.state in ("succeeded", "failed") and not view.cancelling:
            step = f"job {job_id} had already ended ({view.state}); nothing was changed"
        else:
            step = f"call status(job_id={job_id}) to see it reach 'cancelled'"
        return CancelResult(id=view.id, state=view.state, cancelling=view.cancelling, next_step=step)


def _next_for(state: str, job_id: int) -> str:
    if state in ("queued", "starting"):
        return f"waiting for GPUs: call cluster_status to see the queue, or status(job_id={job_id}) again later"
    if state == "running":
        return f"call logs(job_id={job_id}) or metrics(job_id={job_id}) to watch it; cancel(job_id={job_id}) stops it"
    if state == "failed":
        return f"read log_excerpt above; logs(job_id={job_id}, grep='Error|Traceback') finds more"
    return f"call metrics(job_id={job_id}) for its results"
