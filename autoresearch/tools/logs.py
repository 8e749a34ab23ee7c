"""The logs tool and the ``autoresearch://jobs/{job_id}/logs`` resource."""

from __future__ import annotations

from typing import Annotated, Any

from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import Field

from autoresearch.errors import AutoresearchError, NotFoundError
from autoresearch.tools._context import ToolContext, tool_errors
from autoresearch.tools.models import LogResult

MAX_BYTES = 16_000  # what one result may carry: about 4k tokens
DEFAULT_BYTES = 4_096  # a default page: about 1k tokens
MAX_TAIL_LINES = 5_000
RESOURCE_TAIL_LINES = 200


def register(server: Any, ctx: ToolContext) -> None:
    @server.tool(annotations=ToolAnnotations(title="Read a job's log", read_only_hint=True, open_world_hint=False))
    @tool_errors
    def logs(
        job_id: Annotated[int, Field(ge=1, description="The job's id.")],
        tail_lines: Annotated[int, Field(ge=1, le=MAX_TAIL_LINES, description=(
            "Return the last N lines (ignored when offset is given)."))] = 200,
        offset: Annotated[int | None, Field(ge=0, description=(
            "Read from this byte offset instead of the tail: 0 is the start; pass next_offset of the previous "
            "page to read on."))] = None,
        max_bytes: Annotated[int, Field(ge=1, le=MAX_BYTES, description=(
            f"At most this many bytes of text (default {DEFAULT_BYTES}, up to {MAX_BYTES}); pages start and end "
            "at line boundaries."))] = DEFAULT_BYTES,
        grep: Annotated[str | None, Field(max_length=500, description=(
            "A regular expression: return only matching lines, each prefixed with its line number."))] = None,
        attempt: Annotated[int | None, Field(ge=1, description="Which attempt (default: the latest).")] = None,
    ) -> Annotated[CallToolResult, LogResult]:
        """Read a job's combined stdout/stderr, a page at a time (~4 KB by default, never more than ~16 KB).

        By default returns the last 200 lines of the latest attempt. Use grep to find
        errors or metric lines in a long log, offset to read from the start or continue
        where the previous page ended, attempt to read an earlier attempt. When the text
        is cut, 'truncated' is true and 'hint' (also the last line of text) says which
        call returns the rest.
        """
        page = ctx.api.logs(job_id, attempt=attempt, tail_lines=None if offset is not None else tail_lines,
                            offset=offset, max_bytes=max_bytes, grep=grep, project=ctx.caller_project())
        text = page.text
        if page.truncated and page.hint:
            text = f"{text}\n[truncated: {page.hint}]"
        if page.attempt == 0:
            text = page.hint
        result = LogResult(job_id=page.job_id, attempt=page.attempt, text=text, offset=page.offset,
                           next_offset=page.next_offset, size=page.size, truncated=page.truncated, hint=page.hint)
        # The model reads the log itself, not the log escaped inside JSON; clients that
        # understand structured output get the page's offsets as well.
        header = f"[job {page.job_id} attempt {page.attempt}: bytes {page.offset}-{page.next_offset} of {page.size}]"
        if page.hint and page.hint not in text:  # (an offset past the end: the text's reader needs it too)
            text = f"{text}\n[{page.hint}]" if text else f"[{page.hint}]"
        return CallToolResult(content=[TextContent(type="text", text=f"{header}\n{text}")],
                              structured_content=result.model_dump(mode="json"))

    @server.resource("autoresearch://jobs/{job_id}/logs", name="job-logs", mime_type="text/plain",
                     description=f"The last {RESOURCE_TAIL_LINES} lines of a job's log (latest attempt).")
    def job_logs(job_id: str) -> str:
        try:
            page = ctx.api.logs(job_id, tail_lines=RESOURCE_TAIL_LINES, max_bytes=MAX_BYTES,
                                project=ctx.caller_project())
        except NotFoundError as err:
            raise ResourceNotFoundError(err.render()) from None
        except AutoresearchError as err:
            raise ResourceError(err.render()) from None
        if page.attempt == 0:
            return page.hint
        return page.text
