"""Loop commands: ``autoresearch plan.yaml``, ``run``, ``schema``, ``report``.

Imported on every CLI call: argparse only at the top; everything else inside ``run``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def add_parser(sub: Any) -> None:
    r = sub.add_parser("run", help="run a research loop: autoresearch run plan.yaml (or just autoresearch plan.yaml)")
    r.add_argument("plan", nargs="?", help="plan.yaml")
    r.add_argument("--resume", action="store_true",
                   help="continue the loop of this name even if the plan changed (same plan: implied)")
    r.add_argument("--json", nargs="?", const=True, default=False, metavar="PATH",
                   help="print one JSON object (the final loop view) for machines; with PATH (CI): write the "
                        "run's summary there (a later --baseline)")
    r.add_argument("--no-report", action="store_true", help="skip the plots and summary at the end")
    r.add_argument("--project", default=None,
                   help="the project a new loop and its trial jobs belong to (default ''; MCP tokens see only "
                        "their project's loops and jobs); an existing loop keeps its own")
    r.add_argument("--backend", metavar="NAME", help="run the trials on this backend profile (config.yaml) or kind, "
                   "over the plan's backend:")
    ci = r.add_argument_group("CI (docs/ci.md)")
    ci.add_argument("--ci", action="store_true",
                    help="CI mode: one log line per event, hard budgets, exit 0 pass / 1 regression / 2 error "
                         "(also when CI=true and stdout is not a terminal, or with any flag below)")
    ci.add_argument("--no-ci", action="store_true", help="never CI mode, even when CI=true")
    ci.add_argument("--junit", metavar="PATH", help="JUnit XML: a testcase per trial and one for the gate")
    ci.add_argument("--summary", metavar="PATH", help="Markdown summary (plots in PATH-stem.files/); appended "
                                                      "to $GITHUB_STEP_SUMMARY when set")
    ci.add_argument("--plots", action="store_true", help="also draw the report's plots (with --summary: into "
                                                          "PATH-stem.files/, linked from it); off by default")
    ci.add_argument("--baseline", metavar="REF", help="gate against: a previous --json summary, an MLflow run id "
                                                      "or an MLflow experiment name (its best run)")
    ci.add_argument("--max-wall", metavar="DURATION", help="hard wall-clock stop, e.g. 50m (CI default: the plan's "
                                                           "budget.wall, else 6h)")
    r.set_defaults(handler=run)

    s = sub.add_parser("schema", help="print the JSON Schema of a plan (or a job spec)")
    s.add_argument("what", choices=["plan", "job"], help="plan (plan.yaml) or job (a job spec)")
    s.set_defaults(handler=run)

    rp = sub.add_parser("report", help="plots and a Markdown summary of a loop, logged to MLflow")
    rp.add_argument("name", help="the loop's name (name: in its plan)")
    rp.add_argument("--out", help="directory (default $AUTORESEARCH_HOME/loops/NAME/report)")
    rp.add_argument("--json", action="store_true", help="print JSON for machines")
    rp.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.cmd == "schema":
        return _schema(args)
    if args.cmd == "report":
        return _report(args)
    return _run(args)


def _schema(args: argparse.Namespace) -> int:
    from autoresearch.api import schema

    print(json.dumps(schema(args.what), indent=2))
    return 0


def _report(args: argparse.Namespace) -> int:
    from autoresearch.cli._facade import open_api
    from autoresearch.views import to_dict, with_iso

    view, run_id = open_api(args).loop_report(args.name, args.out)
    if args.json:
        out = to_dict(view)
        out["trials"] = len(view.trials)
        out["mlflow_run_id"] = run_id
        print(json.dumps(with_iso(out), indent=2, default=str))
        return 0
    print(f"report: {view.report_dir}/summary.md" + (f" (logged to MLflow run {run_id})" if run_id else ""))
    return 0


def _run(args: argparse.Namespace) -> int:
    import autoresearch.cli._ci as _ci
    from autoresearch.api import load_plan
    from autoresearch.cli._facade import open_api
    from autoresearch.errors import AutoresearchError, SpecError
    from autoresearch.views import json_ready

    if args.plan is None and isinstance(args.json, str) and args.json.endswith((".yaml", ".yml")):
        args.plan, args.json = args.json, True  # `autoresearch --json plan.yaml`
    if args.plan is None:
        raise SpecError("no plan given", hint="autoresearch run plan.yaml")
    plan = load_plan(args.plan, home=args.home)  # one clear error before anything is opened
    if _ci.wanted(args):
        return _ci.run(args, plan)
    if isinstance(args.json, str):
        raise SpecError("--json PATH writes a CI summary", hint="add --ci, or pass --json alone for the final view")
    api = open_api(args)
    live = None
    on_update = None
    if not args.json:
        from autoresearch.cli._live import LiveTable

        live = LiveTable(plan, interactive=sys.stdout.isatty())
        on_update = live.update
    try:
        if live is not None:
            with live:
                view = api.run_loop(plan, resume=args.resume, on_update=on_update, project=args.project,
                                    backend=args.backend)
        else:
            view = api.run_loop(plan, resume=args.resume, on_update=on_update, project=args.project,
                                backend=args.backend)
    except AutoresearchError as err:
        if err.code != "interrupted":
            raise
        return _interrupted(api, plan, err, args)
    if not args.no_report:  # plots and their upload take seconds: a helper writes them after we return
        view = api.loop_report_later(view, launch=False)
    try:
        if args.json:
            print(json.dumps(json_ready(view), default=str))
        elif live is not None:
            live.summary(view)
        sys.stdout.flush()
    finally:  # the helper starts once the answer is out: its start would share the cores with it
        if not args.no_report:
            api.loop_report_launch(view.name)
    from autoresearch.loop.views import CANNOT_LEARN

    if view.stop_reason.startswith(CANNOT_LEARN):  # its first trials all failed alike: say why, exit 1
        print(f"error: loop {view.name} stopped: {view.stop_reason[len(CANNOT_LEARN):]}", file=sys.stderr)
        print("hint: fix the trial (its log: autoresearch logs JOB) or the plan's objective.metric, then run it "
              "again; budget.fail_fast sets how many first trials decide (0: never stop for this)", file=sys.stderr)
        return 1
    return 0


def _interrupted(api: Any, plan: Any, err: Any, args: argparse.Namespace) -> int:
    jobs = err.running_jobs
    stop = False
    if jobs and sys.stdin.isatty() and not args.json:
        try:
            answer = input(f"\nstop the {len(jobs)} running trial(s) too? [y/N] ").strip().lower()
        except (EOFError, KeyboardInterrupt):
            answer = ""
        stop = answer in ("y", "yes")
    if stop:
        stopped = api.stop_trials(plan, "stopped by the user after Ctrl-C", backend=args.backend)
        print(f"stopped {len(stopped)} trial(s); resume later with: autoresearch run {args.plan} --resume",
              file=sys.stderr)
    else:
        print(f"loop {err.view.name} interrupted; {len(jobs)} trial(s) left running.", file=sys.stderr)
        print(f"hint: {err.hint}".replace("<plan.yaml>", args.plan), file=sys.stderr)
    return 130
