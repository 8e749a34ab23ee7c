"""The facade (docs/architecture.md, invariant 5): the CLI, the MCP tools and Python callers all
come through :class:`Api`, get the same views and raise the same typed errors.

Two halves: jobs (submit, status, list, logs, metrics, cancel, nodes, cordon; submit,
cancel and log pages are :mod:`autoresearch.jobs`, which the loop calls too) and loops
(start, run in the foreground, status, proposals, leaderboard, patch, stop, report;
:mod:`autoresearch.loop.ops`). The engine (Runtime, ledger) is private: faces get
methods, never ``.runtime`` or ``.ledger``. The loop sits below this facade and never
calls it.

``project`` scopes every call: ``None`` sees everything (a local user), a string sees
only that project's jobs (an MCP token's project). A job outside the scope is
reported exactly like a job that does not exist.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autoresearch import jobs
from autoresearch import metrics as M
from autoresearch.errors import NotFoundError, SpecError
from autoresearch.guard import warnings_of
from autoresearch.jobs import MAX_LOG_BYTES
from autoresearch.redact import MARK, is_secret, job_secrets, redact, redact_command
from autoresearch.runtime import ACTIVE, FINAL, Runtime
from autoresearch.views import AttemptView, ClusterView, JobPage, JobView, LogPage, MetricView, NodeView

LIST_HINT = "list jobs with `autoresearch list` (MCP: list_jobs)"
EXCERPT_LINES = 20


class Api:
    def __init__(self, home: str | os.PathLike[str] | None = None, backend: Any = None) -> None:
        self._runtime = Runtime(home, backend)  # the engine; faces never reach it (no .runtime, no .ledger)
        self._ledger = self._runtime.ledger
        self._jobs = self._runtime.jobs  # the job store: the one place the facade's reads are written in SQL

    # -- writes ---------------------------------------------------------------------------

    def submit(self, spec: Any, project: str = "") -> JobView:
        """Validate, record and (if there is room) start a job (:func:`autoresearch.jobs.submit`)."""
        job_id = jobs.submit(self._runtime, spec, project)
        from autoresearch import outbox

        outbox.kick(self._ledger.home)  # background MLflow mirror (no mlflow import here)
        view = self.status(job_id, project=project, refresh=False)  # the pass above just ran
        assert isinstance(view, JobView)
        view.next_step = f"follow it with status/logs/metrics for job {job_id}; cancel it with cancel"
        return view

    def cancel(self, job_ids: list[int | str], project: str | None = None) -> list[JobView]:
        """Cancel queued jobs now; stop running ones (SIGTERM, grace, SIGKILL)."""
        ids = [self._job_row(j, project)["id"] for j in job_ids]  # all must exist before anything changes
        jobs.cancel(self._runtime, ids)
        return [self._view(self._job_row(j, project), detail=False) for j in ids]

    def cordon(self, node: str, reason: str = "", undo: bool = False) -> NodeView:
        """Take a node out of scheduling (running attempts continue), or put it back."""
        state, why = ("healthy", "") if undo else ("cordoned", reason or "cordoned by hand")
        self._jobs.set_node_state(node, state, why, "uncordon" if undo else "cordon")
        self._runtime.tick(wait=False)
        return next(n for n in self.nodes() if n.name == node)

    # -- reads ------------------------------------------------------------------------------

    def status(self, job_id: int | str | None = None, project: str | None = None, limit: int = 20,
               refresh: bool = True) -> JobView | list[JobView]:
        """One job in detail, or the most recent jobs."""
        if refresh:
            self._runtime.tick(wait=False)
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
            self._runtime.tick(wait=False)
        rows = self._jobs.jobs_page(state, experiment, project, cursor, limit + 1)
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
        return jobs.log_page(self._runtime, job, att, tail_lines, offset, max_bytes, grep)

    def metrics(self, job_id: int | str, names: list[str] | None = None, series: bool = False,
                max_points: int = 200, project: str | None = None, refresh: bool = True) -> list[MetricView]:
        """Per metric: last, best, step, count; optionally the series downsampled."""
        if refresh:
            self._runtime.tick(wait=False)  # callers read the job's state beside its metrics
        job = self._job_row(job_id, project)
        self._runtime.ingest(job["id"])
        rows = self._jobs.metric_points(job["id"])
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
        self._runtime.tick(wait=False)
        used: dict[str, set[str]] = {}
        running: dict[str, int] = {}
        for r in self._jobs.busy_gpus():
            used.setdefault(r["node"], set()).update(json.loads(r["gpu_ids"]))
            running[r["node"]] = running.get(r["node"], 0) + 1
        out = []
        for r in self._jobs.all_nodes():
            ids = json.loads(r["gpu_ids"])
            free = [g for g in ids if g not in used.get(r["name"], set())]
            out.append(NodeView(r["name"], r["backend"], r["state"], r["reason"], r["gpus"], len(free), free,
                                running.get(r["name"], 0)))
        return out

    def cluster(self, project: str | None = None) -> ClusterView:
        nodes = self.nodes()
        queued = {p: 0 for p in ("critical", "normal", "best-effort")}
        for r in self._jobs.queued_by_priority(project):
            queued[r["priority"]] = r["n"]
        running = self._jobs.running_count(project)
        return ClusterView(nodes, sum(n.gpus for n in nodes if n.state in ("healthy", "degraded")),
                           sum(n.gpus_free for n in nodes if n.state in ("healthy", "degraded")), queued,
                           running,
                           [f"{n.name}: {n.reason}" for n in nodes if n.state == "cordoned"])

    # -- the engine's passes, for a long-lived face (the MCP server) -------------------------

    def tick(self, wait: bool = True) -> bool:
        """Run one scheduling pass (reconcile, place, start); False if another pass held the lock."""
        return self._runtime.tick(wait=wait)

    def watch(self) -> Any:
        """A watcher that hears attempt endings (``wait(timeout)``, ``close()``): run :meth:`tick` on them."""
        return self._runtime.watch()

    def register_tenant(self, project: str, hide: tuple[str, ...] = ()) -> None:
        """Record ``project`` as served by a tokened server (its jobs get the tenant policy)."""
        with self._ledger.tx() as c:
            from autoresearch import isolation

            isolation.register_tenant(c, project, isolation.tenant_policy(hide))

    # -- loops (autoresearch.loop.ops; the loop itself runs on the engine, below this facade) --

    def start_loop(self, plan_path: str | Path, resume: bool = False, project: str | None = None,
                   check: Callable[[Any], None] | None = None, wait_s: float = 10.0) -> tuple[str, int, Any]:
        """Validate a plan and run its controller in a detached process; (loop name, pid, controller log)."""
        from autoresearch.loop import ops

        return ops.start_loop(self._runtime, plan_path, resume=resume, wait_s=wait_s, project=project, check=check)

    def run_loop(self, plan: Any, resume: bool = False, project: str | None = None,
                 on_update: Callable[[Any], None] | None = None) -> Any:
        """Run a plan's loop here, in the foreground, until it ends (``autoresearch plan.yaml``); its
        final LoopView. Ctrl-C raises LoopInterrupted (code ``interrupted``); see :meth:`stop_trials`."""
        from autoresearch.loop.controller import Controller

        controller = Controller(plan, runtime=self._runtime_for(plan), resume=resume, on_update=on_update,
                                project=project)
        return controller.run()

    def stop_trials(self, plan: Any, reason: str) -> list[int]:
        """Stop the running trials of a plan's loop (after an interrupt); their job ids."""
        from autoresearch.loop import ops

        return ops.stop_running(self._runtime_for(plan), plan.name, reason)

    def loop_status(self, name: str, project: str | None = None) -> tuple[Any, bool]:
        """A loop's view (LoopView) and whether a controller is running it now."""
        from autoresearch.loop import ops

        return ops.loop_status(self._runtime, name, project)

    def loop_proposer(self, name: str) -> str | None:
        """The proposer kind of a loop's plan ('agent', 'tpe', ...; None: no such loop)."""
        from autoresearch.loop import ops

        return ops.proposer_kind(self._runtime, name)

    def submit_proposals(self, name: str, proposals: list[dict[str, Any]], rationale: str, agent: str = "",
                         project: str | None = None) -> Any:
        """Validate an agent's proposals against the loop's plan and record them as one decision."""
        from autoresearch.loop import ops

        return ops.submit_proposals(self._runtime, name, proposals, rationale, agent=agent, project=project)

    def leaderboard(self, name: str, top: int = 10, project: str | None = None) -> tuple[Any, list[dict[str, Any]]]:
        """The loop's view and its best ``top`` succeeded trials, best first."""
        from autoresearch.loop import ops

        return ops.leaderboard(self._runtime, name, top, project=project)

    def trial_patch(self, name: str, trial_id: int, project: str | None = None) -> str:
        """The unified diff a trial ran with ('' for none)."""
        from autoresearch.loop import ops

        return ops.trial_patch(self._runtime, name, trial_id, project=project)

    def stop_loop(self, name: str, rationale: str = "", project: str | None = None) -> tuple[int, list[int]]:
        """Stop a loop: (the stop decision's id, the job ids stopped)."""
        from autoresearch.loop import ops

        return ops.stop_loop(self._runtime, name, rationale=rationale, project=project)

    def loop_report(self, name: str, out_dir: str | None = None) -> tuple[Any, str | None]:
        """Write a loop's plots and summary and log them to MLflow; (LoopView, MLflow run id or None)."""
        from autoresearch.loop.report import write_report
        from autoresearch.tracking import log_to_mlflow

        view = write_report(self._ledger, name, out_dir)
        return view, log_to_mlflow(self._ledger, view)

    def loop_summary(self, name: str, plot_path: str) -> tuple[str, str | None]:
        """A loop's summary (Markdown) and its best-so-far plot written to ``plot_path`` (None when no
        trial has ended): the same incumbent and figure as the report, for a short summary (CI)."""
        from autoresearch.loop.report import summary_with_plot

        text, path = summary_with_plot(self._ledger, name, plot_path)
        return text, None if path is None else str(path)

    # -- the MLflow mirror -------------------------------------------------------------------

    def mirror_status(self) -> dict[str, Any]:
        """How far the mirror is (no mlflow import): uri, runs, pending, last sync, blocked, ..."""
        from autoresearch.tracking._status import mirror_status

        return mirror_status(self._ledger)

    def mirror_lag(self) -> str | None:
        """One line when the MLflow mirror is behind, and why (None when it is not); no mlflow import."""
        from autoresearch import outbox

        if not outbox.mirror_failed(self._ledger):  # the usual case, and all a status read pays for
            return None
        from autoresearch.tracking._status import mirror_lag

        return mirror_lag(self._ledger)

    def sync(self, uri: str | None = None) -> dict[str, Any]:
        """Mirror everything pending to MLflow now (``uri``: rebind the ledger to that store first)."""
        from autoresearch.tracking._status import sync_all

        return sync_all(self._ledger, uri)

    def mlflow_ui(self, host: str, port: int, sync: bool = True) -> tuple[str, list[str] | None, str]:
        """The store's URI, the argv of ``mlflow ui`` on it (None: a server with its own UI) and the
        page to open (the newest loop's trials)."""
        from autoresearch.tracking._status import ui_argv

        return ui_argv(self._ledger, host, port, sync)

    # -- helpers ------------------------------------------------------------------------------

    def _runtime_for(self, plan: Any) -> Runtime:
        """The engine on a plan's backend (``backend:`` in the plan), sharing this facade's home."""
        from autoresearch.backends import get_backend

        return Runtime(self._ledger.home, backend=get_backend(plan.backend.kind, **plan.backend.options))

    def _job_row(self, job_id: int | str, project: str | None) -> Any:
        text = str(job_id).strip()
        if not (text.isascii() and text.isdigit()):  # '²'.isdigit() is true, int('²') raises
            raise NotFoundError(f"no job {job_id!r}: job ids are numbers", hint=LIST_HINT)
        row = self._jobs.job(int(text)) if len(text) < 19 else None
        if row is None or (project is not None and row["project"] != project):
            raise NotFoundError(f"no job {text}", hint=LIST_HINT)
        return row

    def _attempt_row(self, job: Any, attempt: int | None) -> Any:
        if attempt is None:
            return self._jobs.latest_attempt(job["id"])
        row = self._jobs.attempt(job["id"], attempt) if abs(attempt) < 2**63 else None
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
        for a in self._jobs.attempts(job["id"]):
            view.attempt_list.append(AttemptView(
                a["n"], a["state"], a["node"], json.loads(a["gpu_ids"]), a["started_at"], a["ended_at"],
                a["exit_code"], a["signal"], a["end_reason"], a["detail"] and redact(a["detail"], secrets),
                a["peak_rss_mb"]))
        view.warnings = [redact(w, secrets) for w in warnings_of(self._ledger, job["id"])]  # they quote trial output
        if job["state"] == "failed" and view.attempt_list:
            last = view.attempt_list[-1]
            view.failure_class = "infra" if last.end_reason == "infra" else "user"
            page = self.logs(job["id"], attempt=last.n, tail_lines=EXCERPT_LINES, max_bytes=2000)
            view.log_excerpt = page.text
        return view


def load_plan(path: str | Path) -> Any:
    """A validated plan.yaml (:class:`autoresearch.loop.plan.Plan`); PlanError names what is wrong."""
    from autoresearch.loop.plan import load_plan as load

    return load(path)


def schema(what: str) -> dict[str, Any]:
    """The JSON Schema of a plan (``plan``) or of a job spec (``job``)."""
    if what == "plan":
        from autoresearch.loop.plan import plan_schema

        return dict(plan_schema())
    from autoresearch.spec import JobSpec

    return JobSpec.model_json_schema()


def prompts_dir() -> Path:
    """The folder of prompt templates: the MCP prompts' and the LLM proposers' (``AUTORESEARCH_PROMPTS``
    overrides it)."""
    from autoresearch import paths

    return paths.prompts_dir()
