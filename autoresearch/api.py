"""The facade (docs/architecture.md, invariant 5): the CLI, the MCP tools and Python callers all
come through :class:`Api`, get the same views and raise the same typed errors.

Two halves: jobs (submit, status, list, logs, metrics, cancel, nodes, cordon; submit,
cancel and log pages are :mod:`autoresearch.engine.jobs`, which the loop calls too) and loops
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
import math
import os
from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoresearch.engine import jobs
from autoresearch.engine import metrics as M
from autoresearch.engine.blocked import no_node_text
from autoresearch.engine.guard import warnings_of
from autoresearch.engine.jobs import MAX_LOG_BYTES
from autoresearch.engine.runtime import ACTIVE, FINAL, Runtime
from autoresearch.errors import NotFoundError, SpecError
from autoresearch.util.redact import MARK, ambient_secrets, is_secret, job_secrets, redact, redact_command
from autoresearch.views import ArrayView, AttemptView, JobPage, JobView, LogPage

if TYPE_CHECKING:  # (imported where they are made: a submit needs none of them; autoresearch/views.py)
    from autoresearch.views import (
        ClusterView,
        DoctorView,
        HealthView,
        MetricView,
        NodeView,
        ProjectUsageView,
    )

LIST_HINT = "list jobs with `autoresearch list` (MCP: list_jobs)"
TRIAL_HINT = ("a loop's trials and their jobs: `autoresearch list --experiment LOOP` (trial N's job is LOOP-tN), "
              "its leaderboard: `autoresearch report LOOP` (MCP: leaderboard)")
# What a trial may write to be heard, for the faces' "no metrics" messages (autoresearch.engine.metrics).
METRIC_FORMATS = M.LOG_FORMATS
UNSEEN_AFTER_S = M.UNSEEN_AFTER_S
unseen_warning = M.unseen_warning
EXCERPT_LINES = 20


class Api:
    def __init__(self, home: str | os.PathLike[str] | None = None, backend: Any = None) -> None:
        self._runtime = Runtime(home, backend)  # the engine; faces never reach it (no .runtime, no .ledger)
        self._ledger = self._runtime.ledger
        self._jobs = self._runtime.jobs  # the job store: the one place the facade's reads are written in SQL

    # -- writes ---------------------------------------------------------------------------

    def submit(self, spec: Any, project: str = "") -> JobView:
        """Validate, record and (if there is room) start a job (:func:`autoresearch.engine.jobs.submit`)."""
        return self.submit_many([spec], project)[0]

    def submit_many(self, specs: list[Any], project: str = "", place: bool | Callable[[], bool] = True) -> list[JobView]:
        """:meth:`submit` for a batch (:func:`autoresearch.engine.jobs.submit_many`): one ledger
        transaction and one pass for all; one bad spec refuses the whole batch. ``place=False``
        (or a function that says so once they are recorded): no pass; the caller runs :meth:`tick` soon."""
        job_ids = jobs.submit_many(self._runtime, specs, project, place=place)
        from autoresearch.store import outbox

        outbox.kick(self._ledger.home)  # background MLflow mirror (no mlflow import here)
        views = []
        ambient = ambient_secrets()  # once per batch, not once per job
        for job_id in job_ids:
            view = self._view(self._job_row(job_id, project), detail=True, ambient=ambient)  # after the pass
            view.next_step = f"follow it with status/logs/metrics for job {job_id}; cancel it with cancel"
            views.append(view)
        return views

    def submit_array(self, spec: Any, array: str, project: str = "") -> ArrayView:
        """A job array (Slurm's ``sbatch --array``): one job of ``spec`` per index of ``array``
        (``0-99``, ``1,3,5-7``, ``0-98:2``; ``%N``: at most N at once), each with
        ``$AUTORESEARCH_ARRAY_INDEX``; recorded in one transaction (:func:`autoresearch.engine.jobs.submit_array`)."""
        from autoresearch.engine.spec import compact_indices

        ids, indices, cap = jobs.submit_array(self._runtime, spec, array, project)
        from autoresearch.store import outbox

        outbox.kick(self._ledger.home)
        states: dict[str, int] = {}
        for row in self._jobs.range_ends(ids[0], ids[-1], project):
            states[row["state"]] = states.get(row["state"], 0) + 1
        first = self._view(self._job_row(ids[0], project), detail=True)
        return ArrayView(array=first.tags.get("array", ""), first_id=ids[0], last_id=ids[-1], count=len(ids),
                         indices=compact_indices(indices), max_running=cap, states=states, warnings=first.warnings,
                         next_step=f"follow them with list (jobs {ids[0]}-{ids[-1]}) or status ID; cancel them "
                                   f"all with cancel {ids[0]}-{ids[-1]}")

    def cancel(self, job_ids: list[int | str], project: str | None = None) -> list[JobView]:
        """Cancel queued jobs now; stop running ones (SIGTERM, grace, SIGKILL). An id may be a range
        ``A-B`` (a job array's: ``submit --array`` prints it)."""
        ids: list[int] = []
        for j in job_ids:  # all must exist before anything changes
            span = self._id_range(j, project)
            ids.extend(span if span is not None else [self._job_row(j, project)["id"]])
        jobs.cancel(self._runtime, ids)
        if len(ids) <= 100:  # with the attempts it stopped
            return [self._view(self._job_row(j, project), detail=True) for j in ids]
        ambient = ambient_secrets()  # a whole array's: their states, read together
        return [self._view(row, detail=False, ambient=ambient) for row in self._jobs.jobs_by_ids(ids)]

    def _id_range(self, text: int | str, project: str | None) -> list[int] | None:
        """The ids of ``A-B`` when every one is a job (of ``project``), None when ``text`` is no range."""
        first, dash, last = str(text).strip().partition("-")
        if not dash or not all(p.isascii() and p.isdigit() and len(p) < 19 for p in (first, last)):
            return None
        low, high = int(first), int(last)
        from autoresearch.engine.spec import MAX_ARRAY

        if low > high or high - low >= MAX_ARRAY:
            raise SpecError(f"{text!r} is not a range of job ids: write FIRST-LAST, first up to last, "
                            f"at most {MAX_ARRAY} jobs", hint="e.g. 12-1011 (as submit --array printed it)")
        found = [row["id"] for row in self._jobs.range_ends(low, high, project)]
        if len(found) != high - low + 1:
            have = set(found)
            missing = next(i for i in range(low, high + 1) if i not in have)
            raise NotFoundError(f"no job {missing} (in {low}-{high})", hint=LIST_HINT)
        return found

    def cordon(self, node: str, reason: str = "", undo: bool = False) -> NodeView:
        """Take a node out of scheduling (running attempts continue), or put it back. Cordoning the
        last healthy node while critical jobs queue is allowed, with a warning on the view."""
        state, why = ("healthy", "") if undo else ("cordoned", reason or "by hand")  # shown after the state: no "cordoned" twice
        warning = "" if undo else self._last_node_warning(node)
        self._jobs.set_node_state(node, state, why, "uncordon" if undo else "cordon")
        # An engine that schedules itself takes the node out too (Slurm: drain): the node's own backend.
        owner = next((r["backend"] for r in self._jobs.all_nodes() if r["name"] == node), self._runtime.backend.name)
        backend = self._runtime.for_backend(owner).backend
        if undo:
            backend.uncordon(node)
        else:
            backend.cordon(node, why)
        self._runtime.tick(wait=False)
        view = next(n for n in self.nodes() if n.name == node)
        view.warning = warning
        return view

    def _last_node_warning(self, node: str) -> str:
        from autoresearch.health.store import HealthStore

        rows = self._jobs.all_nodes()
        others = [r["name"] for r in rows if r["name"] != node and r["state"] in ("healthy", "degraded")]
        if others or not any(r["name"] == node and r["state"] in ("healthy", "degraded") for r in rows):
            return ""
        critical = HealthStore(self._ledger).critical_queued()
        if not critical:
            return ""
        return (f"{node} was the last schedulable node and {critical} critical job(s) are queued: they wait until "
                f"a node is uncordoned (autoresearch uncordon {node})")

    # -- reads ------------------------------------------------------------------------------

    def status(self, job_id: int | str | None = None, project: str | None = None, limit: int = 20,
               refresh: bool = True) -> JobView | list[JobView]:
        """One job in detail, or the most recent jobs."""
        if refresh:
            self._runtime.tick_all(wait=False)
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
            self._runtime.tick_all(wait=False)
        rows = self._jobs.jobs_page(state, experiment, project, cursor, limit + 1)
        more = len(rows) > limit
        rows = rows[:limit]
        ambient = ambient_secrets()  # once per page, not once per job
        return JobPage([self._view(r, detail=False, ambient=ambient) for r in rows],
                       rows[-1]["id"] if more and rows else None)

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
        from autoresearch.views import MetricView

        if refresh:
            self._runtime.tick_all(wait=False)  # callers read the job's state beside its metrics
        job = self._job_row(job_id, project)
        self._runtime.ingest(job["id"])
        rows = self._jobs.metric_points(job["id"])
        unread = sum(a["unread_points"] for a in self._jobs.unread_attempts(job["id"]))
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
                                  M.downsample(points, max_points) if series else None, unread))
        return out

    def nodes(self) -> list[NodeView]:
        from autoresearch.views import NodeView

        self._runtime.tick_all(wait=False)
        used: dict[str, set[str]] = {}
        running: dict[str, int] = {}
        for r in self._jobs.busy_gpus():
            for node, ids in json.loads(r["alloc"]) if r["alloc"] else [(r["node"], json.loads(r["gpu_ids"]))]:
                used.setdefault(node, set()).update(ids)  # every member of a gang
                running[node] = running.get(node, 0) + 1
        from autoresearch.health.store import HealthStore

        findings: dict[str, list[str]] = {}
        for f in HealthStore(self._ledger).recent_findings():
            lines = findings.setdefault(f.node, [])
            if len(lines) < 3:
                lines.append(f.line()[:200])
        out = []
        for r in self._jobs.all_nodes():
            ids = json.loads(r["gpu_ids"])
            free = [g for g in ids if g not in used.get(r["name"], set())]
            out.append(NodeView(r["name"], r["backend"], r["state"], r["reason"], r["gpus"], len(free), free,
                                running.get(r["name"], 0), r["since"] or r["updated_at"],
                                findings.get(r["name"], [])))
        return out

    def backends(self, probe: bool = True, timeout: float = 10.0) -> list[Any]:
        """This home's backend profiles and kinds: capabilities and whether each answers (:func:`check_backends`)."""
        return check_backends(self._ledger.home, probe, timeout)

    def cluster(self, project: str | None = None) -> ClusterView:
        from autoresearch.views import ClusterView

        nodes = self.nodes()
        queued = {p: 0 for p in ("critical", "normal", "best-effort")}
        for r in self._jobs.queued_by_priority(project):
            queued[r["priority"]] = r["n"]
        running = self._jobs.running_count(project)
        return ClusterView(nodes, sum(n.gpus for n in nodes if n.state in ("healthy", "degraded")),
                           sum(n.gpus_free for n in nodes if n.state in ("healthy", "degraded")), queued,
                           running,
                           [f"{n.name}: {n.reason}" for n in nodes if n.state == "cordoned"],
                           [f"{n.name}: {n.reason}" for n in nodes if n.state == "degraded"],
                           self._project_usage(project, sum(n.gpus for n in nodes)))

    def _project_usage(self, project: str | None, fleet_gpus: int) -> list[ProjectUsageView]:
        """Each project's GPUs in use against its quota and weight (fair share), with its queue."""
        from autoresearch.backends import profiles
        from autoresearch.views import ProjectUsageView

        fair = profiles.fair_share(self._ledger.home)
        rows = {r["project"]: r for r in self._jobs.project_usage(project)}
        names = set(rows) | ({p for p in fair.projects if project is None or p == project} if fair else set())
        past: dict[str, float] = {}
        if fair is not None:  # (decayed past usage: the ledger's accumulator, plus what runs now)
            # (a read: computed in memory, nothing written; the pass alone folds endings into the ledger)
            past = self._runtime.past_usage(fair, self._runtime.running_view(), self._runtime.ledger.clock(),
                                            fold=False)
            names |= {p for p, v in past.items() if v >= 36.0 and (project is None or p == project)}  # >= 0.01 GPU-h
        span = fleet_gpus * fair.half_life / math.log(2) if fair is not None and fleet_gpus else 0.0
        out = []
        for name in sorted(names):
            r = rows.get(name)
            share = fair.share(name) if fair else None
            used = int(r["gpus_used"] or 0) if r else 0
            weight = share.weight if share else 1.0
            key = (used / fleet_gpus + past.get(name, 0.0) / span) / weight if span else 0.0
            out.append(ProjectUsageView(name, used, int(r["best_effort_gpus"] or 0) if r else 0,
                                        share.quota if share else None, weight, int(r["running"] or 0) if r else 0,
                                        int(r["queued"] or 0) if r else 0, share.guaranteed if share else 0,
                                        share.borrow if share else None, round(past.get(name, 0.0) / 3600.0, 2),
                                        round(key, 4)))
        return out

    # -- the engine's passes, for a long-lived face (the MCP server) -------------------------

    def tick(self, wait: bool = True, only: Collection[tuple[int, int]] | None = None) -> bool:
        """Run one scheduling pass (reconcile, place, start); False if another pass held the lock. ``only``:
        the attempts (job id, n) a watcher heard ending (its ``take()``), or ``()`` after submits: the pass
        polls those and the starting ones, not every running attempt (Runtime.FULL_RECONCILE_S)."""
        return self._runtime.tick(wait=wait, only=only)

    def watch(self) -> Any:
        """A watcher that hears attempt endings (``wait(timeout)``, ``close()``): run :meth:`tick` on them."""
        return self._runtime.watch()

    def check_tenant_sandbox(self) -> None:
        """Refuse (BackendError: the reason and a hint) when this home's backend cannot build the
        sandbox tenant jobs need: a tokened server calls it before it serves anyone."""
        from autoresearch.engine import isolation

        isolation.check(self._runtime.backend, self._ledger.home)

    def register_tenant(self, project: str, hide: tuple[str, ...] = ()) -> None:
        """Record ``project`` as served by a tokened server (its jobs get the tenant policy)."""
        with self._ledger.tx() as c:
            from autoresearch.engine import isolation

            isolation.register_tenant(c, project, isolation.tenant_policy(hide))

    # -- loops (autoresearch.loop.ops; the loop itself runs on the engine, below this facade) --

    def start_loop(self, plan_path: str | Path, resume: bool = False, project: str | None = None,
                   check: Callable[[Any], None] | None = None, wait_s: float = 10.0) -> tuple[str, int, Any]:
        """Validate a plan and run its controller in a detached process; (loop name, pid, controller log)."""
        from autoresearch.loop import ops

        return ops.start_loop(self._runtime, plan_path, resume=resume, wait_s=wait_s, project=project, check=check)

    def run_loop(self, plan: Any, resume: bool = False, project: str | None = None,
                 on_update: Callable[[Any], None] | None = None, hard_budgets: bool = False,
                 max_wall: float | None = None, backend: str | None = None) -> Any:
        """Run a plan's loop here, in the foreground, until it ends (``autoresearch plan.yaml``); its
        final LoopView. ``backend`` (a profile or kind) overrides the plan's. Ctrl-C raises LoopInterrupted (code ``interrupted``); see :meth:`stop_trials`.
        ``hard_budgets``/``max_wall``: CI's hard stops (every budget stops running trials; a wall cap)."""
        from autoresearch.loop.controller import Controller

        controller = Controller(plan, runtime=self._runtime_for(plan, backend), resume=resume, on_update=on_update,
                                project=project, hard_budgets=hard_budgets, max_wall=max_wall)
        return controller.run()

    def loop_decisions(self, name: str, after: int = 0, limit: int = 200) -> list[dict[str, Any]]:
        """A loop's decisions with an id above ``after``, oldest first: {id, kind, trial_id, inputs,
        outputs, rationale} (a CI log follows them; [] for a loop not created yet)."""
        from autoresearch.loop.store import LoopStore

        loop = LoopStore.find(self._ledger, name)
        if loop is None:
            return []
        return [{"id": d["id"], "kind": d["kind"], "trial_id": d["trial_id"], "inputs": json.loads(d["inputs"] or "{}"),
                 "outputs": json.loads(d["outputs"] or "{}"), "rationale": d["rationale"] or ""}
                for d in LoopStore(self._ledger, loop["id"]).decisions_since(after, limit)]

    def resolve_baseline(self, ref: str, plan: Any) -> Any:
        """The CI gate's baseline (:class:`autoresearch.loop.gate.Baseline`) for ``plan.gate``: a
        previous ``--json`` summary file, else an MLflow run id or experiment name (only then is
        mlflow imported). NotFoundError/SpecError (exit 2) when it does not exist or lacks the metric."""
        from autoresearch.loop import gate as G

        if plan.gate is None:
            raise SpecError("--baseline needs a gate: section in the plan",
                            hint=f"add `gate: {{metric: {plan.objective.metric}, max_regression: 1%}}` to the plan")
        metric, goal = plan.gate.metric, plan.objective.goal
        ref = str(ref).strip()
        if not ref or len(ref) > 4096 or "\x00" in ref:
            raise SpecError("--baseline is empty or malformed", hint="give a summary file, an MLflow run id or an "
                            "experiment name")
        path = Path(ref.removeprefix("file:"))
        if ref.startswith("file:") or path.suffix == ".json" or path.is_file():
            return G.baseline_from_summary(path, metric, goal, ref=ref)
        from autoresearch.tracking._baseline import find_baseline

        found = find_baseline(self._ledger.home, ref, metric, goal)
        return G.Baseline(ref, found["kind"], metric, found["value"], None, found["source"])

    def ci_reports(self, plan: Any, baseline: Any, json_path: str | None = None, junit_path: str | None = None,
                   summary_path: str | None = None, interrupted: str = "", plots: bool = False) -> tuple[int, str, Any]:
        """After a CI run: the loop's report (summary.md; the plots only with ``plots``), the gate's
        verdict and the requested JSON / JUnit / Markdown files; (exit code, why, LoopView).
        ``interrupted``: why the run was cut short (exit 2, whatever the gate says). The report's
        upload to MLflow is asked of the mirror (the outbox), not waited for: ``autoresearch sync``
        finishes the mirror before a runner's store is uploaded."""
        from autoresearch.loop import ci_report
        from autoresearch.loop import gate as G
        from autoresearch.loop.report import write_report
        from autoresearch.store import outbox

        out_dir = None
        if summary_path:
            target = Path(summary_path).resolve()
            out_dir = str(target.parent / f"{target.stem}.files")
        view = write_report(self._ledger, plan.name, out_dir, plots=plots)
        if outbox.tracking_enabled() and view.report_dir is not None:
            outbox.record_report(self._ledger, view.loop_id, view.report_dir)
            outbox.kick(self._ledger.home)
        result = G.evaluate(view, plan.gate, baseline) if plan.gate is not None else None
        code, reason = (2, interrupted) if interrupted else G.exit_code(view, result)
        loop_md = Path(view.report_dir, "summary.md").read_text() if summary_path and view.report_dir else ""
        ci_report.write(self._ledger, view, result, code, reason, json_path=json_path, junit_path=junit_path,
                        summary_path=summary_path, loop_md=loop_md, report_dir=out_dir)
        return code, reason, view

    @staticmethod
    def check_report_paths(paths: dict[str, str | None]) -> None:
        """Refuse report paths that cannot be written (SpecError, exit 2), before anything runs."""
        from autoresearch.loop.ci_report import check_paths

        check_paths(paths)

    def stop_trials(self, plan: Any, reason: str, backend: str | None = None) -> list[int]:
        """Stop the running trials of a plan's loop (after an interrupt); their job ids."""
        from autoresearch.loop import ops

        return ops.stop_running(self._runtime_for(plan, backend), plan.name, reason)

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

    def stop_loop(self, name: str, rationale: str = "", project: str | None = None) -> tuple[int | None, list[int]]:
        """Stop a loop: (the stop decision's id, the job ids stopped); (None, []) when it had already ended."""
        from autoresearch.loop import ops

        return ops.stop_loop(self._runtime, name, rationale=rationale, project=project)

    def loop_report(self, name: str, out_dir: str | None = None) -> tuple[Any, str | None]:
        """Write a loop's plots and summary and log them to MLflow, in the foreground (after a
        background report of the same loop in progress has ended); (LoopView, MLflow run id or None)."""
        from autoresearch.loop import report_later
        from autoresearch.loop.report import write_report
        from autoresearch.tracking import log_to_mlflow

        report_later.wait(self._ledger.home, name)
        view = write_report(self._ledger, name, out_dir)
        return view, log_to_mlflow(self._ledger, view)

    def loop_report_later(self, view: Any, launch: bool = True) -> Any:
        """Have a loop's report (plots, summary.md, report.html, their MLflow upload) written by a
        detached helper, so the command returns with the answer; the view with ``report_dir`` and
        ``report_state`` set (:mod:`autoresearch.loop.report_later`). ``launch=False`` only asks for
        it: :meth:`loop_report_launch` starts the helper once the answer is out."""
        from autoresearch.loop import report_later

        view.report_dir = str(report_later.ask(self._ledger.home, view.name))
        view.report_state = "writing"
        if launch:
            report_later.launch(self._ledger.home, view.name)
        return view

    def loop_report_launch(self, name: str) -> None:
        """Start the helper that writes the report :meth:`loop_report_later` asked for."""
        from autoresearch.loop import report_later

        report_later.launch(self._ledger.home, name)

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
        from autoresearch.store import outbox

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

    def _runtime_for(self, plan: Any, backend: str | None = None) -> Runtime:
        """The engine of a loop: ``backend``, else the plan's ``backend:``, else this facade's."""
        name, options = plan.backend_choice()
        if (backend or name) in (None, self._runtime.backend.name) and not (name and options):
            return self._runtime
        from autoresearch.engine.runtime import runtime_for_plan

        return runtime_for_plan(self._ledger.home, plan, backend)

    def _job_row(self, job_id: int | str, project: str | None) -> Any:
        text = str(job_id).strip()
        if text[:1] in ("T", "t"):  # a trial's id as the loop shows it (T48): the job that ran it
            text = self._trial_job(text[1:], project)
        if not (text.isascii() and text.isdigit()):  # '²'.isdigit() is true, int('²') raises
            raise NotFoundError(f"no job {job_id!r}: job ids are numbers (or a trial's, T48)", hint=LIST_HINT)
        row = self._jobs.job(int(text)) if len(text) < 19 else None
        if row is None or (project is not None and row["project"] != project):
            raise NotFoundError(f"no job {text}", hint=LIST_HINT)
        return row

    def _trial_job(self, number: str, project: str | None) -> str:
        """The id (as text) of the job that ran the trial numbered ``number``."""
        from autoresearch.loop.store import LoopStore

        if not (number.isascii() and number.isdigit()) or len(number) >= 19:
            raise NotFoundError(f"no trial {number!r}: trial ids are numbers (T48)", hint=TRIAL_HINT)
        job = LoopStore.job_of(self._ledger, int(number))
        if job is None:
            raise NotFoundError(f"no job for trial {int(number)}: no such trial, or it has not been launched yet",
                                hint=TRIAL_HINT)
        return str(job)

    def _attempt_row(self, job: Any, attempt: int | None) -> Any:
        if attempt is None:
            return self._jobs.latest_attempt(job["id"])
        row = self._jobs.attempt(job["id"], attempt) if abs(attempt) < 2**63 else None
        if row is None:
            raise NotFoundError(f"job {job['id']} has no attempt {attempt}",
                                hint=f"it has {job['attempts']} attempt(s), numbered from 1")
        return row

    def _view(self, job: Any, detail: bool, ambient: list[str] | None = None) -> JobView:
        spec = json.loads(job["spec"])
        secrets = job_secrets(spec) if ambient is None else sorted(
            {*job_secrets(spec, ambient=False), *ambient}, key=lambda v: (-len(v), v))  # job_secrets' order
        command = redact_command(spec["command"], secrets)
        tags = {k: MARK if is_secret(k) else redact(str(v), secrets) for k, v in (spec.get("tags") or {}).items()}
        view = JobView(
            id=job["id"], name=job["name"], state=job["state"], priority=job["priority"], gpus=job["gpus"],
            command=command, workdir=spec.get("workdir", ""), experiment=job["experiment"],
            submitted_at=job["submitted_at"], started_at=job["started_at"], ended_at=job["ended_at"],
            attempts=job["attempts"], exit_code=job["exit_code"], end_reason=job["end_reason"],
            cancelling=bool(job["cancel_requested"]) and job["state"] not in FINAL, tags=tags, backend=job["backend"],
        )
        if job["state"] == "starting":  # (one lookup by key, for starting jobs alone)
            latest = self._jobs.latest_attempt(job["id"])
            said = str((latest["detail"] if latest is not None else None) or "")
            if said.startswith("engine: "):
                view.engine_state = said.removeprefix("engine: ")[:200]
        if not detail:
            return view
        attempts = self._jobs.attempts(job["id"])
        for a in attempts:
            view.attempt_list.append(AttemptView(
                a["n"], a["state"], a["node"], json.loads(a["gpu_ids"]), a["started_at"], a["ended_at"],
                a["exit_code"], a["signal"], a["end_reason"], a["detail"] and redact(a["detail"], secrets),
                a["peak_rss_mb"], a["failure_class"], _gang_nodes(a["alloc"])))
        if attempts and job["isolation"]:  # a tenant's: what it may use, and how that is enforced
            from autoresearch.engine import isolation
            from autoresearch.store.jobstore import attempt_paths

            view.limits = isolation.limits_line(attempt_paths(self._ledger.job_path(job["id"]), attempts[-1]["n"])[0])
        view.warnings = [redact(w, secrets) for w in warnings_of(self._ledger, job["id"])]  # they quote trial output
        if job["state"] == "queued":  # why it does not start, as the nodes are now (not as they were at submit)
            waiting = no_node_text(self._jobs.node_sizes(job["backend"]), int(job["gpus"]), int(job["nodes"]))
            if waiting:
                view.warnings.insert(0, f"job: queued: {waiting}")
        for a in attempts:
            if a["unread_bytes"] > 0:
                view.unread_points += a["unread_points"]
                view.warnings.append(unread_warning(a["n"], a["unread_points"], a["unread_bytes"]))
        if job["state"] == "failed" and view.attempt_list:
            last = view.attempt_list[-1]
            view.failure_class = last.failure_class or ("infra" if last.end_reason == "infra" else "user")
            why = next((a["failure_why"] for a in self._jobs.attempts(job["id"]) if a["n"] == last.n), None)
            if why:
                text, _, hint = str(why).partition("\nhint: ")
                view.failure_why, view.failure_hint = redact(text, secrets), hint or None
            page = self.logs(job["id"], attempt=last.n, tail_lines=EXCERPT_LINES, max_bytes=2000)
            view.log_excerpt = page.text
        return view


def unread_warning(n: int, points: int, size: int) -> str:
    """The line every read shows while an ended attempt's output is still being read."""
    return (f"attempt {n}: ended before all its output was read; about {points:,} metric point(s) "
            f"({size / 2**20:.1f} MiB) are still being read: its metrics are partial until then")


def local_health(home: str | os.PathLike[str] | None = None, drain: bool = False,
                 expect_gpus: int | None = None) -> HealthView:
    """This machine's GPUs checked now (``autoresearch health``; ``--slurm-hc`` for Slurm). The
    thresholds are the home's ``health:`` settings (a bad one raises SpecError with a hint);
    ``drain``: an unhealthy Slurm node drains itself with the reason."""
    import time

    from autoresearch.health import config as health_config
    from autoresearch.health import local
    from autoresearch.health.findings import blocking
    from autoresearch.health.nvml import reason_names
    from autoresearch.store.ledger import default_home
    from autoresearch.views import GpuHealthView, HealthView

    config = health_config.load(Path(home).expanduser() if home else default_home(), strict=True)
    if expect_gpus is not None and not 0 <= expect_gpus <= 4096:
        raise SpecError(f"--expect-gpus {expect_gpus} is not a GPU count", hint="pass the node's GPU count, e.g. 8")
    node, sample, findings = local.check_here(config, expect_gpus)
    state_file = local.state_path(Path(home).expanduser() if home else default_home(), node)
    state = local.load_state(state_file)
    findings += local.kernel_here(node, config, state)  # the kernel log since the last run (its cursor)
    bad = blocking(findings)
    gpus = [GpuHealthView(g.index, g.name, g.temperature_c, g.ecc_volatile_uncorrected,
                          reason_names(g.clock_event_reasons), list(g.xids)) for g in sample.gpus]
    view = HealthView(node, not bad, sample.driver_version, gpus, [f.line()[:300] for f in findings],
                      "; ".join(f.line() for f in bad)[:400])
    if bad and drain:
        view.action = local.drain(node, local.drain_reason(bad))
        if view.action.startswith("drained"):
            state["drained_at"] = time.time()
    elif drain:  # a node this program drained itself comes back once it passes (soft causes, after the cool-down)
        view.action = local.resume_if_own(node, state, config.cooldown_s, time.time())
    local.save_state(state_file, state)
    return view


def doctor(home: str | os.PathLike[str] | None = None, move_aside: bool = False) -> DoctorView:
    """Whether ``home``'s ledger opens and how many run folders it holds (``autoresearch doctor``). With
    ``move_aside``: first keep the ledger and every run folder in ``aside-<UTC time>/`` of the home
    (StateError while an attempt still runs), so that a fresh ledger starts; the view says what moved."""
    from autoresearch.engine import runfolders
    from autoresearch.errors import LedgerError
    from autoresearch.store.ledger import Ledger, default_home
    from autoresearch.views import DoctorView

    base = (Path(home).expanduser() if home else default_home()).absolute()
    view = DoctorView(str(base), False)
    if move_aside:
        aside = runfolders.move_aside(base)
        view.aside, view.moved, view.aside_run_folders = aside.folder, aside.moved, aside.run_folders
    try:
        ledger = Ledger(base)
        view.ledger_id, view.ledger_ok = ledger.identity, True
    except LedgerError as err:
        view.problem, view.hint = err.message, err.hint or ""
    view.run_folders = runfolders.count(base)
    return view


def load_plan(path: str | Path, home: str | os.PathLike[str] | None = None) -> Any:
    """A validated plan.yaml (:class:`autoresearch.loop.plan.Plan`); PlanError names what is wrong.
    ``home``: whose config.yaml names the plan's backend profile (default $AUTORESEARCH_HOME)."""
    from autoresearch.loop.plan import load_plan as load

    return load(path, home=home)


def check_backends(home: str | os.PathLike[str] | None = None, probe: bool = True,
                   timeout: float = 10.0) -> list[Any]:
    """Every backend profile of ``home``'s config.yaml and every kind: capabilities and, with
    ``probe``, whether it answers (BackendCheck rows). No engine is opened for the home's ledger,
    so a default backend that is down or broken is reported, not raised. SpecError: a broken
    config.yaml."""
    from autoresearch.backends.check import check

    if not 0 < timeout <= 600:
        raise SpecError(f"timeout must be in (0, 600] seconds, got {timeout}", hint="e.g. --timeout 10")
    return check(home, probe, timeout)


def duration(value: object, what: str) -> float | None:
    """Seconds from '50m', '2h', '90s' or a number (SpecError naming ``what`` otherwise)."""
    from autoresearch.engine.spec import parse_duration

    return parse_duration(value, what)


def schema(what: str) -> dict[str, Any]:
    """The JSON Schema of a plan (``plan``) or of a job spec (``job``)."""
    if what == "plan":
        from autoresearch.loop.plan import plan_schema

        return dict(plan_schema())
    from autoresearch.engine.spec import JobSpec

    return JobSpec.model_json_schema()


def prompts_dir() -> Path:
    """The folder of prompt templates: the MCP prompts' and the LLM proposers' (``AUTORESEARCH_PROMPTS``
    overrides it)."""
    from autoresearch.util import paths

    return paths.prompts_dir()


def _gang_nodes(alloc: str | None) -> list[str]:
    """A gang attempt's nodes from its recorded placement ([[node, gpu ids], ...]); [] for one node."""
    try:
        members = json.loads(alloc) if alloc else []
        nodes = [str(m[0]) for m in members if isinstance(m, list) and m]
    except (TypeError, ValueError):
        return []
    return nodes if len(nodes) > 1 else []
