"""The facade (docs/architecture.md, invariant 5): the CLI, the MCP tools and Python callers all
come through :class:`Api`, get the same views and raise the same typed errors.

``project`` scopes every call: ``None`` sees everything (a local user), a string sees
only that project's jobs (an MCP token's project). A job outside the scope is
reported exactly like a job that does not exist.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from autoresearch import isolation
from autoresearch import metrics as M
from autoresearch.errors import CapacityError, NotFoundError, SpecError
from autoresearch.guard import warnings_of
from autoresearch.redact import MARK, context, is_secret, job_secrets, mask, redact, redact_command
from autoresearch.runtime import ACTIVE, FINAL, Runtime, checkpoint_dir, checkpoint_problem
from autoresearch.views import AttemptView, ClusterView, JobPage, JobView, LogPage, MetricView, NodeView

LIST_HINT = "list jobs with `autoresearch list` (MCP: list_jobs)"
MAX_LOG_BYTES = 16_000
EXCERPT_LINES = 20


class Api:
    def __init__(self, home: str | os.PathLike[str] | None = None, backend: Any = None) -> None:
        self.runtime = Runtime(home, backend)
        self.ledger = self.runtime.ledger

    # -- writes ---------------------------------------------------------------------------

    def submit(self, spec: Any, project: str = "") -> JobView:
        """Validate, record and (if there is room) start a job."""
        from autoresearch.spec import JobSpec, make_spec  # pydantic stays off the read paths

        job = spec if isinstance(spec, JobSpec) else make_spec(dict(spec))
        self.runtime.backend.check(job)  # what the backend cannot do is refused here, never retried
        self._check_capacity(job.gpus, job.nodes)
        policy = isolation.job_policy(self.ledger, project, self.runtime.backend)  # fails closed
        checkpoint = checkpoint_dir(self.ledger.home, 0, job.model_dump())
        problem = checkpoint_problem(checkpoint) if checkpoint else None
        if problem:
            raise SpecError(f"checkpoint directory {checkpoint} cannot be created: {problem}",
                            hint="pass --checkpoint a writable directory, or --checkpoint alone for a per-job one")
        now = time.time()
        with self.ledger.tx() as c:
            cur = c.execute(
                "INSERT INTO jobs(name, state, priority, spec, gpus, nodes, cpus, memory, experiment, project, "
                "backend, submitted_at, updated_at, isolation) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (job.name, "queued", job.priority, job.model_dump_json(), job.gpus, job.nodes, job.cpus, job.memory,
                 job.experiment, project, self.runtime.backend.name, now, now, policy),
            )
            job_id = int(cur.lastrowid or 0)
            self.ledger.event(c, "submit", job_id, priority=job.priority, gpus=job.gpus)
        self.runtime.tick()
        from autoresearch import outbox

        outbox.kick(self.ledger.home)  # background MLflow mirror (no mlflow import here)
        view = self.status(job_id, project=project, refresh=False)  # the pass above just ran
        assert isinstance(view, JobView)
        view.next_step = f"follow it with status/logs/metrics for job {job_id}; cancel it with cancel"
        return view

    def _check_capacity(self, gpus: int, nodes: int) -> None:
        if not self.runtime.backend.capabilities.places:
            return
        self.runtime.refresh_nodes()
        # Capacity is what exists, cordoned or not (a cordoned node comes back); the wait for
        # a usable one is the queue's business, as with Slurm's drained nodes.
        rows = self.ledger.query("SELECT name, gpus, state FROM nodes WHERE backend=?", (self.runtime.backend.name,))
        largest = max((r["gpus"] for r in rows), default=0)
        if gpus > largest:
            if not largest:
                raise CapacityError(
                    f"asked for {gpus} GPU(s) but this machine has none (NVML found no GPU and AUTORESEARCH_GPUS "
                    "is unset)",
                    hint="use --gpus 0, or declare fake slots with AUTORESEARCH_GPUS=N for development",
                )
            where = ", ".join(f"{r['name']}: {r['gpus']}" for r in rows)
            raise CapacityError(f"asked for {gpus} GPU(s) per node but the largest node has {largest} ({where})",
                                hint=f"ask for at most {largest} GPUs")
        fitting = sum(1 for r in rows if r["gpus"] >= gpus)
        if nodes > fitting:
            raise CapacityError(f"asked for {nodes} node(s) with {gpus} GPU(s) each but only {fitting} exist",
                                hint=f"ask for at most {fitting} node(s)")

    def cancel(self, job_ids: list[int | str], project: str | None = None) -> list[JobView]:
        """Cancel queued jobs now; stop running ones (SIGTERM, grace, SIGKILL)."""
        ids = [self._job_row(j, project)["id"] for j in job_ids]  # all must exist before anything changes
        for job_id in ids:
            with self.ledger.tx() as c:
                job = c.execute("SELECT state FROM jobs WHERE id=?", (job_id,)).fetchone()
                if job["state"] in FINAL:
                    continue
                c.execute("UPDATE jobs SET cancel_requested=1, updated_at=? WHERE id=?", (time.time(), job_id))
                if job["state"] == "queued":
                    c.execute("UPDATE jobs SET state='cancelled', end_reason='cancelled', ended_at=? WHERE id=?",
                              (time.time(), job_id))
                self.ledger.event(c, "cancel", job_id)
            for att in self.ledger.query(
                    "SELECT n FROM attempts WHERE job_id=? AND state IN ('starting','running')", (job_id,)):
                self.runtime.request_stop(job_id, att["n"], "cancelled")
        self.runtime.tick(wait=False)
        return [self._view(self._job_row(j, project), detail=False) for j in ids]

    def cordon(self, node: str, reason: str = "", undo: bool = False) -> NodeView:
        """Take a node out of scheduling (running attempts continue), or put it back."""
        with self.ledger.tx() as c:
            row = c.execute("SELECT * FROM nodes WHERE name=?", (node,)).fetchone()
            if row is None:
                names = [r["name"] for r in c.execute("SELECT name FROM nodes")]
                raise NotFoundError(f"no node named {node!r}", hint=f"nodes: {', '.join(names) or 'none yet'}")
            state, why = ("healthy", "") if undo else ("cordoned", reason or "cordoned by hand")
            c.execute("UPDATE nodes SET state=?, reason=?, updated_at=? WHERE name=?", (state, why, time.time(), node))
            self.ledger.event(c, "uncordon" if undo else "cordon", node=node, reason=why)
        self.runtime.tick(wait=False)
        return next(n for n in self.nodes() if n.name == node)

    # -- reads ------------------------------------------------------------------------------

    def status(self, job_id: int | str | None = None, project: str | None = None, limit: int = 20,
               refresh: bool = True) -> JobView | list[JobView]:
        """One job in detail, or the most recent jobs."""
        if refresh:
            self.runtime.tick(wait=False)
        if job_id is None:
            return self.list_jobs(project=project, limit=limit, refresh=False).jobs
        return self._view(self._job_row(job_id, project), detail=True)

    def list_jobs(self, state: str | None = None, experiment: str | None = None, project: str | None = None,
                  limit: int = 50, cursor: int | None = None, refresh: bool = True) -> JobPage:
        """Newest first; ``cursor`` (a job id) continues from the previous page."""
        if state is not None and state not in (*ACTIVE, "queued", *FINAL):
            raise SpecError(f"unknown state {state!r}",
                            hint="states: queued, starting, running, succeeded, failed, cancelled")
        if limit < 1 or limit > 1000:
            raise SpecError(f"limit must be 1..1000, got {limit}", hint="use a cursor to page instead")
        if refresh:
            self.runtime.tick(wait=False)
        where, params = ["1=1"], []  # type: list[str], list[Any]
        for column, value in (("state", state), ("experiment", experiment), ("project", project)):
            if value is not None:
                where.append(f"{column}=?")
                params.append(value)
        if cursor is not None:
            where.append("id<?")
            params.append(min(int(cursor), 2**63 - 1))  # past any id: the first page
        rows = self.ledger.query(f"SELECT * FROM jobs WHERE {' AND '.join(where)} ORDER BY id DESC LIMIT ?",
                                 (*params, limit + 1))
        more = len(rows) > limit
        rows = rows[:limit]
        return JobPage([self._view(r, detail=False) for r in rows], rows[-1]["id"] if more and rows else None)

    def logs(self, job_id: int | str, attempt: int | None = None, tail_lines: int | None = None,
             offset: int | None = None, max_bytes: int = MAX_LOG_BYTES, grep: str | None = None,
             project: str | None = None) -> LogPage:
        """A page of an attempt's log: from ``offset``, the last ``tail_lines``, or lines matching ``grep``."""
        job = self._job_row(job_id, project)
        att = self._attempt_row(job, attempt)
        if att is None:
            return LogPage(job["id"], 0, "", 0, 0, 0, False, hint=f"job {job['id']} has not started yet ({job['state']})")
        if max_bytes < 1:
            raise SpecError("max_bytes must be >= 1", hint=f"use up to {MAX_LOG_BYTES}")
        if offset is not None and offset < 0:
            raise SpecError("offset must be >= 0", hint="offset 0 is the start of the log")
        if tail_lines is not None and tail_lines < 1:
            raise SpecError("tail_lines must be >= 1", hint="leave it out to read from an offset")
        backend = self.runtime.backend
        ext = att["external_id"]
        size = backend.log_size(ext)
        secrets = job_secrets(json.loads(job["spec"]))  # masked with '*' of the same length: offsets stay exact
        if grep is not None:
            from autoresearch._grep import compile_pattern, matching_lines

            compile_pattern(grep)
            data = mask(backend.read_log(ext, 0, 64 << 20), secrets)  # grep cannot probe for a secret
            lines = data.decode("utf-8", "replace").splitlines()
            hits = [f"{i + 1}: {lines[i]}" for i in matching_lines(grep, data) if i < len(lines)]
            if tail_lines:
                hits = hits[-tail_lines:]
            text, cut = _fit_tail("\n".join(hits), max_bytes)
            hint = f"{len(hits)} matching lines; showing the last ones that fit in {max_bytes} bytes" if cut else ""
            return LogPage(job["id"], att["n"], text, 0, size, size, cut, hint)
        if offset is None and tail_lines is not None:
            start = max(0, size - max(max_bytes, 1) * 4)
            raw = mask(backend.read_log(ext, start, size - start), secrets).decode("utf-8", "replace")
            lines = raw.splitlines()
            if start > 0 and lines:
                lines = lines[1:]  # drop the partial first line
            kept = lines[-tail_lines:]
            text, cut = _fit_tail("\n".join(kept), max_bytes)
            first = max(0, size - len(text.encode()) - raw.endswith("\n"))  # the join dropped the last newline
            cut = cut or first > 0
            back = f" (or offset={first - max_bytes} for the page before this one)" if first > max_bytes else ""
            hint = f"earlier output exists: call again with offset=0{back}" if cut else ""
            return LogPage(job["id"], att["n"], text, first, size, size, cut, hint)
        start = min(offset or 0, size)  # past the end: an empty page, not a seek error
        margin = context(secrets) + 1 if secrets else 0  # a secret cut by the page's edge is still seen whole
        before = min(start, margin)
        window = mask(backend.read_log(ext, start - before, before + max_bytes + margin), secrets)
        chunk = window[before:before + max_bytes]
        text = chunk.decode("utf-8", "replace")
        end = start + len(chunk)
        cut = end < size
        hint = f"more output: call again with offset={end}" if cut else ""
        if offset is not None and offset > size:
            hint = f"offset {offset} is past the end of the log ({size} bytes); read from offset={size} or less"
        return LogPage(job["id"], att["n"], text, start, end, size, cut, hint)

    def metrics(self, job_id: int | str, names: list[str] | None = None, series: bool = False,
                max_points: int = 200, project: str | None = None, refresh: bool = True) -> list[MetricView]:
        """Per metric: last, best, step, count; optionally the series downsampled."""
        if refresh:
            self.runtime.tick(wait=False)  # callers read the job's state beside its metrics
        job = self._job_row(job_id, project)
        self.runtime.ingest(job["id"])
        rows = self.ledger.query(
            "SELECT name, step, value, source, attempt FROM metrics WHERE job_id=? ORDER BY attempt, step, rowid",
            (job["id"],))
        by_name: dict[str, list[tuple[int, float | None]]] = {}
        for r in M.best_source(rows):
            if names and r["name"] not in names:
                continue
            by_name.setdefault(r["name"], []).append((r["step"], r["value"]))
        out = []
        for name, points in by_name.items():
            mode = M.guess_mode(name)
            values = [v for _, v in points if v is not None]
            best = (min(values) if mode == "min" else max(values)) if values else None
            out.append(MetricView(name, points[-1][1], best, points[-1][0], len(points), mode,
                                  M.downsample(points, max_points) if series else None))
        return out

    def nodes(self) -> list[NodeView]:
        self.runtime.tick(wait=False)
        used: dict[str, set[str]] = {}
        running: dict[str, int] = {}
        for r in self.ledger.query("SELECT node, gpu_ids FROM attempts WHERE state IN ('starting','running')"):
            used.setdefault(r["node"], set()).update(json.loads(r["gpu_ids"]))
            running[r["node"]] = running.get(r["node"], 0) + 1
        out = []
        for r in self.ledger.query("SELECT * FROM nodes ORDER BY name"):
            ids = json.loads(r["gpu_ids"])
            free = [g for g in ids if g not in used.get(r["name"], set())]
            out.append(NodeView(r["name"], r["backend"], r["state"], r["reason"], r["gpus"], len(free), free,
                                running.get(r["name"], 0)))
        return out

    def cluster(self, project: str | None = None) -> ClusterView:
        nodes = self.nodes()
        scope, params = ("AND project=?", (project,)) if project is not None else ("", ())
        queued = {p: 0 for p in ("critical", "normal", "best-effort")}
        for r in self.ledger.query(f"SELECT priority, COUNT(*) AS n FROM jobs WHERE state='queued' {scope} "
                                   "GROUP BY priority", params):
            queued[r["priority"]] = r["n"]
        running = self.ledger.one(f"SELECT COUNT(*) AS n FROM jobs WHERE state IN ('starting','running') {scope}",
                                  params)
        return ClusterView(nodes, sum(n.gpus for n in nodes if n.state in ("healthy", "degraded")),
                           sum(n.gpus_free for n in nodes if n.state in ("healthy", "degraded")), queued,
                           running["n"] if running else 0,
                           [f"{n.name}: {n.reason}" for n in nodes if n.state == "cordoned"])

    # -- helpers ------------------------------------------------------------------------------

    def _job_row(self, job_id: int | str, project: str | None) -> Any:
        text = str(job_id).strip()
        if not (text.isascii() and text.isdigit()):  # '²'.isdigit() is true, int('²') raises
            raise NotFoundError(f"no job {job_id!r}: job ids are numbers", hint=LIST_HINT)
        row = self.ledger.one("SELECT * FROM jobs WHERE id=?", (int(text),)) if len(text) < 19 else None
        if row is None or (project is not None and row["project"] != project):
            raise NotFoundError(f"no job {text}", hint=LIST_HINT)
        return row

    def _attempt_row(self, job: Any, attempt: int | None) -> Any:
        if attempt is None:
            return self.ledger.one("SELECT * FROM attempts WHERE job_id=? ORDER BY n DESC LIMIT 1", (job["id"],))
        row = self.ledger.one("SELECT * FROM attempts WHERE job_id=? AND n=?", (job["id"], attempt)) \
            if abs(attempt) < 2**63 else None
        if row is None:
            raise NotFoundError(f"job {job['id']} has no attempt {attempt}",
                                hint=f"it has {job['attempts']} attempt(s), numbered from 1")
        return row

    def _view(self, job: Any, detail: bool) -> JobView:
        spec = json.loads(job["spec"])
        secrets = job_secrets(spec)
        command = redact_command(spec["command"], secrets)
        tags = {k: MARK if is_secret(k) else redact(str(v), secrets) for k, v in (spec.get("tags") or {}).items()}
        view = JobView(
            id=job["id"], name=job["name"], state=job["state"], priority=job["priority"], gpus=job["gpus"],
            command=command, workdir=spec.get("workdir", ""), experiment=job["experiment"],
            submitted_at=job["submitted_at"], started_at=job["started_at"], ended_at=job["ended_at"],
            attempts=job["attempts"], exit_code=job["exit_code"], end_reason=job["end_reason"],
            cancelling=bool(job["cancel_requested"]) and job["state"] not in FINAL, tags=tags,
        )
        if not detail:
            return view
        for a in self.ledger.query("SELECT * FROM attempts WHERE job_id=? ORDER BY n", (job["id"],)):
            view.attempt_list.append(AttemptView(
                a["n"], a["state"], a["node"], json.loads(a["gpu_ids"]), a["started_at"], a["ended_at"],
                a["exit_code"], a["signal"], a["end_reason"], a["detail"] and redact(a["detail"], secrets),
                a["peak_rss_mb"]))
        view.warnings = warnings_of(self.ledger, job["id"])
        if job["state"] == "failed" and view.attempt_list:
            last = view.attempt_list[-1]
            view.failure_class = "infra" if last.end_reason == "infra" else "user"
            page = self.logs(job["id"], attempt=last.n, tail_lines=EXCERPT_LINES, max_bytes=2000)
            view.log_excerpt = page.text
        return view


def _fit_tail(text: str, max_bytes: int) -> tuple[str, bool]:
    data = text.encode()
    if len(data) <= max_bytes:
        return text, False
    return data[-max_bytes:].decode("utf-8", "ignore"), True
