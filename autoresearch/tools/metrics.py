"""The metrics tool."""

from __future__ import annotations

from typing import Annotated, Any

from mcp.types import ToolAnnotations
from pydantic import Field

from autoresearch.tools._context import ToolContext, tool_errors
from autoresearch.tools.models import Metric, MetricsResult, from_view

MAX_POINTS = 200


def register(server: Any, ctx: ToolContext) -> None:
    @server.tool(annotations=ToolAnnotations(title="Read a job's metrics", read_only_hint=True,
                                             open_world_hint=False))
    @tool_errors
    def metrics(
        job_id: Annotated[int, Field(ge=1, description="The job's id.")],
        names: Annotated[list[str] | None, Field(max_length=50, description=(
            "Only these metrics (default: all)."))] = None,
        series: Annotated[bool, Field(description="Also return each metric's history, downsampled.")] = False,
        max_points: Annotated[int, Field(ge=2, le=MAX_POINTS, description=(
            "Series length cap (first and last points are always kept)."))] = MAX_POINTS,
    ) -> MetricsResult:
        """Read the metrics a job reported: per metric the last value, the best, the step and the count.

        Metrics come from autoresearch.report(step, **metrics) calls in the job or from
        'name: value' lines it prints (e.g. 'val_loss: 0.42'). 'best' is the minimum for
        loss-like names and the maximum for accuracy-like ones ('mode' says which). Set
        series=true for the history (at most max_points points) to judge a trend.
        """
        project = ctx.caller_project()
        rows = ctx.api.metrics(job_id, names=names, series=series, max_points=max_points, project=project)
        job = ctx.api.status(job_id, project=project, refresh=False)
        unread = rows[0].unread_points if rows else 0
        if unread:
            step = (f"about {unread:,} more point(s) of its output are still being read: these values are partial; "
                    "call metrics again for the rest")
        elif rows:
            step = "" if job.state in ("succeeded", "failed", "cancelled") else \
                f"the job is {job.state}: call metrics again later for newer values"
        elif names and (known := sorted(r.name for r in ctx.api.metrics(job_id, project=project, refresh=False))):
            shown = ", ".join(repr(n[:100]) for n in names[:5])
            step = (f"job {job.id} has no metric named {shown}; its metrics: {', '.join(known[:50])}"
                    + (f" (and {len(known) - 50} more)" if len(known) > 50 else ""))
        else:
            from autoresearch.api import METRIC_FORMATS

            step = (f"no metrics yet; a job reports them with any of: {' | '.join(METRIC_FORMATS)}; "
                    f"check logs(job_id={job_id})")
        return MetricsResult(job_id=job.id, state=job.state, metrics=[from_view(Metric, r) for r in rows],
                             unread_points=unread, next_step=step)
