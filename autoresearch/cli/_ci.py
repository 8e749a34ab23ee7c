"""``autoresearch plan.yaml --ci``: a sweep as a CI step (docs/ci.md).

No live display: one plain line per event on stdout (a trial launched, ended, stopped;
each decision; a budget hit), then the reports (``--json PATH``, ``--junit PATH``,
``--summary PATH``) and one exit code: 0 pass, 1 regression, 2 configuration or
infrastructure error. Everything that can be refused is refused before any trial runs
(the plan, the gate, the baseline, the report paths). Budgets are hard (every budget hit
stops the running trials) and the wall is capped (``--max-wall``, else the plan's
``budget.wall``, else 6 h), so the job ends with its report instead of hanging. SIGTERM
(a cancelled job) stops the trials and writes what there is.

On by ``--ci`` or any CI flag, or when ``CI`` is true and stdout is not a terminal
(``--no-ci`` and a bare ``--json``, as the MCP server's background loops use, keep it off).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import time
from typing import Any, TextIO

DEFAULT_MAX_WALL_S = 6 * 3600.0  # a GitHub-hosted job's limit: end before the runner kills us, with a report
_CONTROL = re.compile(r"[\x00-\x1f\x7f\x9b]+")


def wanted(args: argparse.Namespace) -> bool:
    if args.no_ci:
        return False
    if args.ci or isinstance(args.json, str) or args.junit or args.summary or args.baseline or args.max_wall:
        return True
    auto = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")
    return auto and not sys.stdout.isatty() and args.json is not True


def _line(text: Any, width: int = 200) -> str:
    text = _CONTROL.sub(" ", str(text)).strip()
    return text if len(text) <= width else text[: width - 1] + "…"


def _params(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


class EventLog:
    """One line per event, from the loop's decisions (the ledger) and its trials' endings."""

    def __init__(self, api: Any, name: str, out: TextIO) -> None:
        self.api, self.name, self.out = api, name, out
        self.after = 0
        self.ended: set[int] = set()
        self.budget_said = False
        self.t0 = time.monotonic()

    def emit(self, text: str) -> None:
        print(f"[{time.monotonic() - self.t0:8.1f}s] {_line(text, 400)}", file=self.out, flush=True)

    def update(self, view: Any) -> None:
        while True:
            batch = self.api.loop_decisions(self.name, self.after)
            for d in batch:
                self.after = d["id"]
                self._decision(d)
            if len(batch) < 200:
                break
        for t in view.trials:
            if t.ended_at and t.trial_id not in self.ended:
                self.ended.add(t.trial_id)
                self._ended(view, t)

    def _decision(self, d: dict[str, Any]) -> None:
        kind, trial, why = d["kind"], d["trial_id"], _line(d["rationale"].splitlines()[0] if d["rationale"] else "")
        if kind == "launch":
            self.emit(f"trial {trial} launched: {_params(d['inputs'].get('params') or {})}")
        elif kind == "propose":
            ids = d["outputs"].get("trial_ids") or []
            self.emit(f"decision propose: {len(ids)} trial(s) {ids}" + (f": {why}" if why else ""))
        elif kind == "stop":
            reason = d["inputs"].get("reason")
            if reason and not self.budget_said and "budget" in str(reason):
                self.budget_said = True
                self.emit(f"budget hit: {reason}; stopping the running trials")
            self.emit(f"trial {trial} stopping: {why}")
        elif kind == "promote":
            kept = "kept as the best" if d["outputs"].get("promoted") else "not kept"
            self.emit(f"decision: trial {trial} {kept}: {why}")
        elif kind == "finish":
            self.emit(f"loop finished: {_line(d['outputs'].get('reason') or why)}")
        else:
            self.emit(f"decision {kind}" + (f" (trial {trial})" if trial else "") + (f": {why}" if why else ""))

    def _ended(self, view: Any, t: Any) -> None:
        if t.state == "succeeded":
            self.emit(f"trial {t.trial_id}{_job(t.job_id)} succeeded: {view.metric}={_num(t.objective)} best={_num(t.best_so_far)}")
        elif t.state == "stopped":
            self.emit(f"trial {t.trial_id}{_job(t.job_id)} stopped at {view.metric}={_num(t.objective)}")
        else:
            first = (t.failure or "").strip().splitlines()[:1]
            self.emit(f"trial {t.trial_id}{_job(t.job_id)} {t.state}" + (f": {first[0]}" if first else ""))


def _terminate(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # the controller records the interrupt; we then stop its trials


def run(args: argparse.Namespace, plan: Any) -> int:
    """The CI run of a loaded ``plan``; every failure that is not a regression exits 2 (never 1),
    with message and hint."""
    from autoresearch.errors import AutoresearchError

    try:
        return _run(args, plan)
    except AutoresearchError as err:
        if args.debug:
            raise
        print(f"error: {err.message}", file=sys.stderr)
        if err.hint:
            print(f"hint: {err.hint}".replace("<plan.yaml>", str(args.plan)), file=sys.stderr)
        return 2
    except Exception as err:  # noqa: BLE001 - CI reads 1 as "regression": an internal failure is not one
        if args.debug:
            raise
        print(f"error: internal error: {type(err).__name__}: {_line(err)}", file=sys.stderr)
        print("hint: rerun with --debug for the traceback, and report it", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace, plan: Any) -> int:
    from autoresearch.api import duration
    from autoresearch.cli._facade import open_api
    from autoresearch.errors import AutoresearchError, SpecError

    json_path = args.json if isinstance(args.json, str) else None
    out = sys.stderr if args.json is True else sys.stdout  # a bare --json: the summary alone on stdout
    # Each refusal below (like the plan's, already loaded) comes before any trial runs.
    max_wall = duration(args.max_wall, "--max-wall") if args.max_wall else None
    if max_wall is not None and max_wall <= 0:
        raise SpecError(f"--max-wall {args.max_wall}: give a positive duration", hint="e.g. --max-wall 50m")
    if max_wall is None and plan.budget.wall is None:
        max_wall = DEFAULT_MAX_WALL_S
    paths = {"--json": json_path, "--junit": args.junit, "--summary": args.summary}
    seen: dict[str, str] = {}
    for flag, path in paths.items():
        if path:
            key = os.path.realpath(path)
            if key in seen:
                raise SpecError(f"{flag} and {seen[key]} are the same file {path}", hint="give each report its own path")
            seen[key] = flag
    api = open_api(args)
    api.check_report_paths(paths)
    baseline = api.resolve_baseline(args.baseline, plan) if args.baseline else None
    log = EventLog(api, plan.name, out)
    wall = min(w for w in (plan.budget.wall, max_wall) if w is not None)
    log.emit(f"loop {plan.name}: {plan.proposer.kind}, {plan.budget.trials} trials at parallel "
             f"{plan.budget.parallel}, {plan.objective.goal} {plan.objective.metric}; hard wall {wall:g}s"
             + (f"; gate {plan.gate.metric} max_regression {plan.gate.max_regression}" if plan.gate else "")
             + (f"; baseline {baseline.value:.6g} ({baseline.source})" if baseline is not None else ""))
    previous = signal.signal(signal.SIGTERM, _terminate)
    interrupted = ""
    try:
        view = api.run_loop(plan, resume=args.resume, on_update=log.update, project=args.project,
                            hard_budgets=True, max_wall=max_wall, backend=getattr(args, "backend", None))
        log.update(view)
    except AutoresearchError as err:
        if err.code != "interrupted":
            raise
        stopped = api.stop_trials(plan, "stopped: the CI job was cancelled", backend=getattr(args, "backend", None))
        interrupted = f"interrupted (the job was cancelled); stopped {len(stopped)} running trial(s)"
        log.emit(interrupted)
    finally:
        signal.signal(signal.SIGTERM, previous)
    code, reason, view = api.ci_reports(plan, baseline, json_path=json_path, junit_path=args.junit,
                                        summary_path=args.summary, interrupted=interrupted,
                                        plots=bool(getattr(args, "plots", False)))
    for flag, path in paths.items():
        if path:
            log.emit(f"wrote {flag[2:]} {path}")
    log.emit(f"{['PASS', 'REGRESSION', 'ERROR'][code]} (exit {code}): {reason}")
    if args.json is True:
        print(json.dumps({"exit_code": code, "reason": reason, "loop": view.name, "best_trial": view.best_trial,
                          "best_value": view.best_value, "noise_floor": view.noise_floor, "counts": view.counts}))
    return code


def _job(job_id: int | None) -> str:
    """A trial's job beside its id (the number `autoresearch logs` takes, or T<trial>)."""
    return "" if job_id is None else f" (job {job_id})"
