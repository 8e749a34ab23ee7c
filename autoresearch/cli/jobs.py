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


def add_parser(sub: Any) -> None:
    s = sub.add_parser("submit", help="submit a job: autoresearch submit [options] -- CMD ARGS...")
    s.add_argument("-f", "--file", help="job spec YAML; options below override it")
    s.add_argument("--name")
    s.add_argument("--gpus", type=int)
    s.add_argument("--cpus", type=float)
    s.add_argument("--memory", help="e.g. 16G")
    s.add_argument("--nodes", type=int)
    s.add_argument("--priority", help="critical | normal | best-effort")
    s.add_argument("--env", action="append", metavar="K=V")
    s.add_argument("--tag", action="append", metavar="K=V")
    s.add_argument("--mount", action="append", metavar="TARGET=SOURCE")
    s.add_argument("--workdir")
    s.add_argument("--timeout", help="e.g. 300, 5m, 1h30m")
    s.add_argument("--grace", help="SIGTERM to SIGKILL, e.g. 30s")
    s.add_argument("--retries", type=int, help="retries after infrastructure failures (default 2)")
    s.add_argument("--retry-on-exit-code", type=int, action="append", dest="retry_codes", metavar="CODE")
    s.add_argument("--experiment")
    s.add_argument("--checkpoint", nargs="?", const=True, metavar="DIR",
                   help="give the job a stable AUTORESEARCH_CHECKPOINT_DIR (optionally DIR)")
    s.add_argument("--shell", action="store_true", help="run the command through /bin/sh -c")
    s.add_argument("--json", action="store_true")
    s.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")

    st = sub.add_parser("status", help="one job in detail, or the recent jobs")
    st.add_argument("job", nargs="?")
    st.add_argument("--json", action="store_true")

    ls = sub.add_parser("list", help="list jobs, newest first")
    ls.add_argument("--state")
    ls.add_argument("--experiment")
    ls.add_argument("--limit", type=int, default=50)
    ls.add_argument("--cursor", type=int, help="continue after this job id (from the previous page)")
    ls.add_argument("--json", action="store_true")

    lg = sub.add_parser("logs", help="print a job's log")
    lg.add_argument("job")
    lg.add_argument("--tail", type=int, metavar="N", help="last N lines")
    lg.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends")
    lg.add_argument("--attempt", type=int)
    lg.add_argument("--grep")
    lg.add_argument("--json", action="store_true")

    mt = sub.add_parser("metrics", help="a job's metrics: last, best, step, count")
    mt.add_argument("job")
    mt.add_argument("--series", action="store_true", help="include the (downsampled) series")
    mt.add_argument("--json", action="store_true")

    cn = sub.add_parser("cancel", help="cancel jobs (running ones get SIGTERM, grace, SIGKILL)")
    cn.add_argument("jobs", nargs="+")
    cn.add_argument("--json", action="store_true")

    nd = sub.add_parser("nodes", help="nodes, GPUs free/used, cordoned nodes")
    nd.add_argument("--json", action="store_true")

    co = sub.add_parser("cordon", help="stop scheduling onto a node")
    co.add_argument("node")
    co.add_argument("--reason", default="")
    uc = sub.add_parser("uncordon", help="schedule onto a node again")
    uc.add_argument("node")

    for name in ("submit", "status", "list", "logs", "metrics", "cancel", "nodes", "cordon", "uncordon"):
        sub.choices[name].set_defaults(handler=run)


def _kv(items: list[str] | None, flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SpecError(f"{flag} {item!r} is not KEY=VALUE", hint=f"write {flag} NAME=value")
        out[key] = value
    return out


def run(args: argparse.Namespace) -> int:
    from autoresearch.cli import open_api
    from autoresearch.cli._render import print_json, render_job, render_jobs, render_metrics, render_nodes
    from autoresearch.views import JobView

    cmd = args.cmd
    if cmd == "submit":
        return _submit(args)
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
        render_jobs(page.jobs)
        if page.next_cursor:
            print(f"more: autoresearch list --cursor {page.next_cursor}")
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
    return 0



def _submit(args: argparse.Namespace) -> int:
    from autoresearch.cli import open_api

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
        "checkpoint": args.checkpoint,
    }
    spec.update({k: v for k, v in options.items() if v is not None})
    if args.shell:
        spec["shell"] = True
    for key, flag in (("env", "--env"), ("tags", "--tag"), ("mounts", "--mount")):
        values = _kv(getattr(args, key.rstrip("s") if key != "mounts" else "mount"), flag)
        if values:
            spec[key] = {**(spec.get(key) or {}), **values}
    spec.setdefault("workdir", os.getcwd())
    view = open_api(args).submit(spec)
    if args.json:
        print(json.dumps({"id": view.id, "state": view.state}))
    else:
        print(view.id)
    return 0


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
        if job.state in ("succeeded", "failed", "cancelled"):
            last = api.logs(args.job, attempt=attempt, offset=offset, max_bytes=1 << 20)
            out.write(last.text)
            out.flush()
            return 0
        if args.attempt is None and job.attempts and job.attempts != attempt:
            if offset >= page.size:  # this attempt is drained: follow the newer one
                attempt, offset = job.attempts, 0
                out.write(f"--- attempt {attempt} ---\n")
        time.sleep(0.2)
