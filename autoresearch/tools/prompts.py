"""MCP prompts, rendered from the templates in ``prompts/`` with the job's facts filled in.

Only the prompts listed in :data:`PROMPTS` are served: the same folder also holds the
LLM proposers' templates, which are not for agents.
"""

from __future__ import annotations

import json
import string
from typing import Annotated, Any

from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS
from pydantic import Field

from autoresearch.api import prompts_dir
from autoresearch.errors import AutoresearchError
from autoresearch.tools._context import ToolContext

PROMPTS = ("diagnose_failed_job",)
FALLBACK = ("Diagnose why autoresearch job $job_id failed.\n\n$status\n\nLog tail:\n$log_excerpt\n\n"
            "Metrics:\n$metrics\n\nFind the first real error, name the cause, propose the smallest fix.")


def load_template(name: str) -> str:
    path = prompts_dir() / f"{name}.md"
    try:
        text = path.read_text()
    except OSError:
        return FALLBACK
    if text.startswith("---\n"):
        end = text.find("\n---\n", 4)
        if end != -1:
            text = text[end + 5:]
    return text.strip() + "\n"


def register(server: Any, ctx: ToolContext) -> None:
    @server.prompt(name="diagnose_failed_job", title="Diagnose a failed job")
    def diagnose_failed_job(
        job_id: Annotated[str, Field(description="The id of the failed job.")],
    ) -> str:
        """Walk through why a job failed (user vs infra), with its status, log tail and metrics filled in."""
        project = ctx.caller_project()
        try:
            view = ctx.api.status(job_id, project=project)
            rows = ctx.api.metrics(job_id, project=project)
        except AutoresearchError as err:
            # An MCPError reaches the client as is; any other exception becomes "Internal server error".
            raise MCPError(code=INVALID_PARAMS, message=f"[{err.code}] {err.render()}") from None
        attempts = "\n".join(
            f"- attempt {a.n}: {a.state} on {a.node or '-'}, exit {a.exit_code}, signal {a.signal}, "
            f"end reason {a.end_reason}" + (f" ({a.detail})" if a.detail else "")
            for a in view.attempt_list) or "- no attempt started"
        status = (f"job {view.id} '{view.name}': state {view.state}, failure class {view.failure_class or '-'}, "
                  f"exit code {view.exit_code}, end reason {view.end_reason}\ncommand: {view.command}\n"
                  f"workdir: {view.workdir}\n{attempts}")
        excerpt = view.log_excerpt
        if excerpt is None and view.attempts:
            excerpt = ctx.api.logs(job_id, tail_lines=40, max_bytes=4000, project=project).text
        metrics = json.dumps({m.name: {"last": m.last, "best": m.best, "step": m.step} for m in rows}) if rows \
            else "none reported"
        return string.Template(load_template("diagnose_failed_job")).safe_substitute(
            job_id=view.id, status=status, log_excerpt=(excerpt or "(empty log)").rstrip(), metrics=metrics)
