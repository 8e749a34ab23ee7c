"""Job commands: submit, status, list, logs, metrics, cancel, nodes, cordon, uncordon.

argparse only at import time (every ``autoresearch`` call imports this module).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from autoresearch.errors import SpecError

JSON_HELP = "print JSON for machines (times as Unix seconds with an ISO 8601 *_iso twin)"


def add_parser(sub: Any) -> None:
    s = sub.add_parser("submit", help="submit a job: autoresearch submit [options] -- CMD ARGS...")
    s.add_argument("-f", "--file", help="job spec YAML; options below override it")
    s.add_argument("--name", help="display name (default: the program's name)")
    s.add_argument("--gpus", type=int, help="GPUs per node (default 0: a CPU job)")
    s.add_argument("--cpus", type=float, help="CPU cores to reserve (default: none reserved)")
    s.add_argument("--memory", help="memory to reserve, e.g. 16G")
    s.add_argument("--nodes", type=int, help="number of nodes (default 1)")
    s.add_argument("--priority", help="critical | normal | best-effort (best-effort may be preempted)")
    s.add_argument("--env", action="append", metavar="K=V", help="an environment variable for the job (repeatable)")
    s.add_argument("--tag", action="append", metavar="K=V", help="a free-form label (repeatable)")
    s.add_argument("--secret-env", action="append", metavar="NAME=STORE/KEY",
                   help="a variable whose value the engine's secret store holds: a Kubernetes Secret and its key, "
                        "a Databricks secret scope and its key (repeatable; kubernetes and databricks only)")
    s.add_argument("--mount", action="append", metavar="TARGET=SOURCE",
                   help="link TARGET inside the workdir to SOURCE (repeatable)")
    s.add_argument("--workdir", help="directory to run in (default: the current one)")
    s.add_argument("--timeout", help="wall-clock limit per attempt, e.g. 300, 5m, 1h30m")
    s.add_argument("--grace", help="SIGTERM to SIGKILL, e.g. 30s")
    s.add_argument("--retries", type=int, help="retries after infrastructure failures (default 2)")
    s.add_argument("--retry-on-exit-code", type=int, action="append", dest="retry_codes", metavar="CODE",
                   help="an exit code that means 'retry me' (repeatable)")
    s.add_argument("--experiment", help="experiment (MLflow) name to group runs under")
    s.add_argument("--checkpoint", nargs="?", const=True, metavar="DIR",
                   help="give the job a stable AUTORESEARCH_CHECKPOINT_DIR (optionally DIR)")
    s.add_argument("--shell", action="store_true", help="run the command through /bin/sh -c")
    s.add_argument("--wait", action="store_true",
                   help="wait until the job ends and exit with its status (like sbatch --wait)")
    s.add_argument("--array", metavar="INDICES",
                   help="a job array, as sbatch --array: one job per index (0-99, 1,3,5-7, 0-98:2; %%N: at most N "
                        "at once, e.g. 0-99%%8), each with $AUTORESEARCH_ARRAY_INDEX; prints FIRST-LAST, its ids")
    s.add_argument("--image", help="container image to run the command in (a backend with containers: docker, ...)")
    s.add_argument("--backend", metavar="NAME", help="a backend profile (config.yaml) or kind; default "
                   "$AUTORESEARCH_BACKEND, then config.yaml's default, then local")
    s.add_argument("--json", action="store_true", help=JSON_HELP)
    s.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")

    st = sub.add_parser("status", help="one job in detail, or the recent jobs")
    st.add_argument("job", nargs="?", help="the job's id, or a loop's trial's as T48 (default: the recent jobs)")
    st.add_argument("--trial", type=int, metavar="N", help="the job that ran the loop's trial N (the same as T<N>)")
    st.add_argument("--json", action="store_true", help=JSON_HELP)

    ls = sub.add_parser("list", help="list jobs, newest first")
    ls.add_argument("--state", help="only jobs in this state (queued, running, succeeded, failed, cancelled, ...)")
    ls.add_argument("--experiment", help="only jobs whose experiment contains this text, or matches this glob "
                                         "(e.g. 'digits*'); case-insensitive")
    ls.add_argument("--limit", type=int, default=50, help="jobs per page (default 50)")
    ls.add_argument("--cursor", type=int, help="continue after this job id (from the previous page)")
    ls.add_argument("--json", action="store_true", help=JSON_HELP)

    lg = sub.add_parser("logs", help="print a job's log")
    lg.add_argument("job", nargs="?", help="the job's id, or a loop's trial's as T48")
    lg.add_argument("--trial", type=int, metavar="N", help="the job that ran the loop's trial N (the same as T<N>)")
    lg.add_argument("--tail", type=int, metavar="N", help="last N lines")
    lg.add_argument("-f", "--follow", action="store_true",
                    help="keep printing until the job ends, then exit with its status")
    lg.add_argument("--attempt", type=int, help="which attempt (default: the latest)")
    lg.add_argument("--grep", help="only lines matching this regular expression, with their line numbers")
    lg.add_argument("--json", action="store_true", help=JSON_HELP)

    mt = sub.add_parser("metrics", help="a job's metrics: last, best, step, count")
    mt.add_argument("job", nargs="?", help="the job's id, or a loop's trial's as T48")
    mt.add_argument("--trial", type=int, metavar="N", help="the job that ran the loop's trial N (the same as T<N>)")
    mt.add_argument("--series", action="store_true", help="include the (downsampled) series")
    mt.add_argument("--json", action="store_true", help=JSON_HELP)

    cn = sub.add_parser("cancel", help="cancel jobs (running ones get SIGTERM, grace, SIGKILL)")
    cn.add_argument("jobs", nargs="+", help="the ids of the jobs to cancel")
    cn.add_argument("--json", action="store_true", help=JSON_HELP)

    nd = sub.add_parser("nodes", help="nodes, GPUs free/used, cordoned nodes")
    nd.add_argument("--json", action="store_true", help=JSON_HELP)

    co = sub.add_parser("cordon", help="stop scheduling onto a node")
    co.add_argument("node", help="the node's name (see autoresearch nodes)")
    co.add_argument("--reason", default="", help="why, shown by nodes and status")
    uc = sub.add_parser("uncordon", help="schedule onto a node again")
    uc.add_argument("node", help="the node's name (see autoresearch nodes)")

    for command in (s, st, ls, lg, mt, cn, nd, co, uc):
        command.set_defaults(handler=run)


def _kv(items: list[str] | None, flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SpecError(f"{flag} {item!r} is not KEY=VALUE", hint=f"write {flag} NAME=value")
        out[key] = value
    return out


def run(args: argparse.Namespace) -> int:
    cmd = args.cmd
    if cmd == "submit":
        return _submit(args)  # (its one-line answer needs neither the tables nor the rest of the views)
    from autoresearch.cli._facade import open_api
    from autoresearch.cli._render import print_json, render_job, render_jobs, render_metrics, render_nodes
    from autoresearch.views import JobView

    if cmd in ("status", "logs", "metrics"):
        _job_or_trial(args, required=cmd != "status")
    api = open_api(args)
    if cmd == "status":
        result = api.status(args.job)
        if args.json:
            return print_json(result)
        if isinstance(result, JobView):
            render_job(result)
        else:
            render_jobs(result)
        lag = api.mirror_lag()
        if lag:
            print(f"warning: {lag}", file=sys.stderr)
    elif cmd == "list":
        page = api.list_jobs(state=args.state, experiment=args.experiment, limit=args.limit, cursor=args.cursor)
        if args.json:
            return print_json(page)
        filters = " ".join(f"{flag} {value}" for flag, value in (("--state", args.state),
                                                                  ("--experiment", args.experiment)) if value is not None)
        empty = f"no jobs match {filters}" if filters else "no older jobs" if args.cursor else None
        render_jobs(page.jobs, *([empty] if empty else []))
        if page.next_cursor:
            print(f"more: {_next_page(args, page.next_cursor)}")
    elif cmd == "logs":
        return _logs(api, args)
    elif cmd == "metrics":
        rows = api.metrics(args.job, series=args.series)
        if args.json:
            return print_json(rows)
        render_metrics(rows)
    elif cmd == "cancel":
        views = api.cancel(args.jobs)
        if args.json:
            return print_json(views)
        for v in views:
            print(f"{v.id}\t{'cancelling' if v.cancelling else v.state}")
    elif cmd == "nodes":
        cluster = api.cluster()
        if args.json:
            return print_json(cluster)
        render_nodes(cluster)
    elif cmd in ("cordon", "uncordon"):
        node = api.cordon(args.node, getattr(args, "reason", ""), undo=cmd == "uncordon")
        print(f"{node.name}\t{node.state}\t{node.reason}")
        if node.warning:
            print(f"warning: {node.warning}", file=sys.stderr)
    return 0



def _submit(args: argparse.Namespace) -> int:
    from autoresearch.cli._facade import open_api

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    spec: dict[str, Any] = {}
    if args.file:
        import yaml

        try:
            with open(args.file, encoding="utf-8") as f:
                spec = yaml.safe_load(f) or {}
        except OSError as err:
            raise SpecError(f"cannot read {args.file}: {err.strerror}", hint="pass an existing YAML file") from None
        except UnicodeDecodeError:
            raise SpecError(f"{args.file} is not UTF-8 text", hint="save the job spec as UTF-8") from None
        except (yaml.YAMLError, ValueError, RecursionError) as err:
            raise SpecError(f"{args.file} is not valid YAML: {str(err)[:300]}", hint="fix the line it names") from None
        if not isinstance(spec, dict):
            raise SpecError(f"{args.file} must be a mapping of keys (command, gpus, ...), got {type(spec).__name__}",
                            hint="write one job spec per file, e.g. command: [python, train.py]")
    if command:
        spec["command"] = " ".join(command) if args.shell and len(command) > 1 else (
            command[0] if args.shell else command)
    if "command" not in spec:
        raise SpecError("no command to run", hint="put the program after --, e.g. autoresearch submit -- python train.py")
    options = {
        "name": args.name, "gpus": args.gpus, "cpus": args.cpus, "memory": args.memory, "nodes": args.nodes,
        "priority": args.priority, "workdir": args.workdir, "timeout": args.timeout, "grace": args.grace,
        "max_retries": args.retries, "retry_on_exit_codes": args.retry_codes, "experiment": args.experiment,
        "checkpoint": args.checkpoint, "image": args.image,
    }
    spec.update({k: v for k, v in options.items() if v is not None})
    if args.shell:
        spec["shell"] = True
    for key, flag, attr in (("env", "--env", "env"), ("tags", "--tag", "tag"), ("mounts", "--mount", "mount"),
                            ("secret_env", "--secret-env", "secret_env")):
        values = _kv(getattr(args, attr), flag)
        if values:
            spec[key] = {**(spec.get(key) or {}), **values}
    spec.setdefault("workdir", os.getcwd())
    api = open_api(args)
    if args.array is not None:
        return _submit_array(api, spec, args)
    view = api.submit(spec)
    if args.json and not args.wait:
        print(json.dumps({"id": view.id, "state": view.state}))
    elif not args.json:
        print(view.id, flush=True)
    for warning in view.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if not args.wait:
        return 0
    delay = 0.2
    try:
        while view.state not in FINAL:
            time.sleep(delay)
            delay = min(delay * 1.5, 2.0)
            view = api.status(view.id)
    except KeyboardInterrupt:
        print(f"\njob {view.id} keeps running; follow it with: autoresearch logs {view.id} -f", file=sys.stderr)
        return 130
    if args.json:
        from autoresearch.cli._render import print_json

        print_json(view)
    print(final_line(view), file=sys.stderr)
    return exit_status(view)


def _submit_array(api: Any, spec: dict[str, Any], args: argparse.Namespace) -> int:
    """``submit --array``: FIRST-LAST on stdout (``cancel`` takes it), a line for people on stderr;
    ``--wait``: until every job ended, then the highest status any exited with (as sbatch --wait)."""
    view = api.submit_array(spec, args.array)
    ids = f"{view.first_id}-{view.last_id}"
    if args.json and not args.wait:
        from autoresearch.cli._render import print_json

        print_json(view)
    elif not args.json:
        print(ids, flush=True)
        cap = f", at most {view.max_running} at once" if view.max_running is not None else ""
        print(f"array {view.array}: {view.count} job(s) {ids}, indices {view.indices}{cap}", file=sys.stderr)
    for warning in view.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if not args.wait:
        return 0
    worst, failed = 0, []
    states: dict[str, int] = {}
    job_id, delay = view.first_id, 0.2
    try:
        while job_id <= view.last_id:
            job = api.status(job_id, refresh=False)  # (the ended ones: a read each, no pass)
            if job.state not in FINAL:
                time.sleep(delay)
                delay = min(delay * 1.5, 2.0)
                api.status(job_id)  # a pass: an ending nobody heard is recorded
                continue
            states[job.state] = states.get(job.state, 0) + 1
            worst = max(worst, exit_status(job))
            if job.state != "succeeded":
                failed.append(job_id)
            job_id += 1
    except KeyboardInterrupt:
        print(f"\njobs {ids} keep running; follow them with: autoresearch list", file=sys.stderr)
        return 130
    view.states = states
    if args.json:
        from autoresearch.cli._render import print_json

        print_json(view)
    shown = ", ".join(map(str, failed[:10])) + (f" and {len(failed) - 10} more" if len(failed) > 10 else "")
    print(f"array {view.array}: {view.count} job(s) ended: "
          + ", ".join(f"{n} {state}" for state, n in sorted(states.items()))
          + (f" (not succeeded: {shown})" if failed else ""), file=sys.stderr)
    return worst


FINAL = ("succeeded", "failed", "cancelled")


def exit_status(job: Any) -> int:
    """What ``submit --wait`` and ``logs -f`` exit with: 0 if the job succeeded, its exit code if
    it failed with one, 124 if it timed out (as timeout(1) does), 1 otherwise (cancelled, killed)."""
    if job.state == "succeeded":
        return 0
    if job.end_reason == "timeout":
        return 124
    if job.state == "failed" and job.exit_code is not None and 0 < job.exit_code < 256:
        return int(job.exit_code)
    return 1


def final_line(job: Any) -> str:
    """One line saying how a job ended, for stderr after ``--wait`` / ``logs -f``."""
    how = job.end_reason or ""
    if job.exit_code is not None and job.state != "succeeded":
        how = f"exit {job.exit_code}" + (f", {job.end_reason}" if job.end_reason not in (None, "exit") else "")
    ran = f" after {job.ended_at - job.started_at:.1f}s" if job.ended_at and job.started_at else ""
    state = "stopped" if job.state == "cancelled" and job.end_reason == "stopped" else job.state
    return f"job {job.id} {state}" + (f" ({how})" if how and job.state != "succeeded" else "") + ran


def _next_page(args: argparse.Namespace, cursor: int) -> str:
    """The command for the next page: the same filters, the new cursor."""
    import shlex

    words = ["autoresearch", "list"]
    if args.home:
        words += ["--home", args.home]
    for flag, value in (("--state", args.state), ("--experiment", args.experiment)):
        if value is not None:
            words += [flag, value]
    if args.limit != 50:
        words += ["--limit", str(args.limit)]
    return shlex.join([*words, "--cursor", str(cursor)])


def _job_or_trial(args: argparse.Namespace, required: bool) -> None:
    """``--trial N`` is ``T<N>``: the job that ran the loop's trial N (the api resolves it)."""
    if args.trial is not None and args.job is not None:
        raise SpecError(f"autoresearch {args.cmd}: a job id and --trial both given", hint="give one of them")
    if args.trial is not None:
        args.job = f"T{args.trial}"
    elif args.job is None and required:
        raise SpecError(f"autoresearch {args.cmd}: which job?",
                        hint="give its id (autoresearch list), or a loop's trial's as T48 or --trial 48")


def _logs(api: Any, args: argparse.Namespace) -> int:
    from autoresearch.cli._render import print_json

    if args.json:
        return print_json(api.logs(args.job, attempt=args.attempt, tail_lines=args.tail, grep=args.grep))
    out = sys.stdout
    if args.grep is not None:
        out.write(api.logs(args.job, attempt=args.attempt, tail_lines=args.tail, grep=args.grep, max_bytes=1 << 24).text
                  + "\n")
        return 0
    if args.tail:
        page = api.logs(args.job, attempt=args.attempt, tail_lines=args.tail, max_bytes=1 << 24)
        out.write(page.text + ("\n" if page.text and not page.text.endswith("\n") else ""))
        offset, attempt = page.size, page.attempt
    else:
        offset, attempt = 0, args.attempt
    while True:
        page = api.logs(args.job, attempt=attempt, offset=offset, max_bytes=1 << 20)
        out.write(page.text)
        out.flush()
        offset, attempt = page.next_offset, page.attempt or attempt
        if page.truncated:
            continue
        if not args.follow:
            return 0
        job = api.status(args.job)
        if job.state in FINAL:
            last = api.logs(args.job, attempt=attempt, offset=offset, max_bytes=1 << 20)
            out.write(last.text)
            out.flush()
            print(final_line(job), file=sys.stderr)
            return exit_status(job)
        if args.attempt is None and job.attempts and job.attempts != attempt:
            if offset >= page.size:  # this attempt is drained: follow the newer one
                attempt, offset = job.attempts, 0
                out.write(f"--- attempt {attempt} ---\n")
        time.sleep(0.2)
