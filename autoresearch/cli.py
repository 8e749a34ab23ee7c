"""The ``autoresearch`` command: the facade for people at a terminal and for CI.

Reads print rich tables for people and JSON with ``--json``. Errors print message
and hint, exit 2 for usage/spec errors and 1 for runtime failures; tracebacks only
with ``--debug``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from autoresearch.errors import AutoresearchError, SpecError
from autoresearch.views import JobView, to_dict

# Subcommands that live with their subsystem. Each module defines
# ``add_parser(sub)`` (argparse only: it is imported on every call) and
# ``run(args) -> int`` (which imports what it needs). Missing modules are skipped.
PLUGINS = (
    "autoresearch.tools.cli",  # serve
    "autoresearch.tracking_cli",  # ui, sync
    "autoresearch.loop.cli",  # run (autoresearch plan.yaml), schema, report
)

STATE_STYLE = {"queued": "yellow", "starting": "cyan", "running": "cyan", "succeeded": "green", "failed": "red",
               "cancelled": "magenta"}


def _kv(items: list[str] | None, flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SpecError(f"{flag} {item!r} is not KEY=VALUE", hint=f"write {flag} NAME=value")
        out[key] = value
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="autoresearch", description="Run ML research jobs and loops on GPUs.")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.add_argument("--home", help="state directory (default $AUTORESEARCH_HOME or ~/.autoresearch)")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")

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

    for module in _plugins():
        module.add_parser(sub)
    return p


def _plugins() -> list[Any]:
    from importlib import import_module
    from importlib.util import find_spec

    found = []
    for name in PLUGINS:
        try:
            present = find_spec(name) is not None
        except ModuleNotFoundError:
            present = False
        if present:
            found.append(import_module(name))
    return found


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    first = next((a for a in argv if not a.startswith("-")), "")
    if first.endswith((".yaml", ".yml")):
        argv = ["run", *argv]  # `autoresearch plan.yaml` runs the loop
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.cmd:
        parser.print_help()
        return 2
    try:
        return _run(args)
    except AutoresearchError as err:
        if args.debug:
            raise
        print(f"error: {err.message}", file=sys.stderr)
        if err.hint:
            print(f"hint: {err.hint}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        return 130


def _api(args: argparse.Namespace) -> Any:
    from autoresearch.api import Api

    return Api(args.home)


def _run(args: argparse.Namespace) -> int:
    cmd = args.cmd
    if getattr(args, "plugin_run", None) is not None:
        return int(args.plugin_run(args))
    if cmd == "submit":
        return _submit(args)
    api = _api(args)
    if cmd == "status":
        result = api.status(args.job)
        if args.json:
            return _print_json(result)
        if isinstance(result, JobView):
            _render_job(result)
        else:
            _render_jobs(result)
    elif cmd == "list":
        page = api.list_jobs(state=args.state, experiment=args.experiment, limit=args.limit, cursor=args.cursor)
        if args.json:
            return _print_json(page)
        _render_jobs(page.jobs)
        if page.next_cursor:
            print(f"more: autoresearch list --cursor {page.next_cursor}")
    elif cmd == "logs":
        return _logs(api, args)
    elif cmd == "metrics":
        rows = api.metrics(args.job, series=args.series)
        if args.json:
            return _print_json(rows)
        _render_metrics(rows)
    elif cmd == "cancel":
        views = api.cancel(args.jobs)
        if args.json:
            return _print_json(views)
        for v in views:
            print(f"{v.id}\t{'cancelling' if v.cancelling else v.state}")
    elif cmd == "nodes":
        cluster = api.cluster()
        if args.json:
            return _print_json(cluster)
        _render_nodes(cluster)
    elif cmd in ("cordon", "uncordon"):
        node = api.cordon(args.node, getattr(args, "reason", ""), undo=cmd == "uncordon")
        print(f"{node.name}\t{node.state}\t{node.reason}")
    return 0


def _submit(args: argparse.Namespace) -> int:
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
    view = _api(args).submit(spec)
    if args.json:
        print(json.dumps({"id": view.id, "state": view.state}))
    else:
        print(view.id)
    return 0


def _logs(api: Any, args: argparse.Namespace) -> int:
    if args.json:
        return _print_json(api.logs(args.job, attempt=args.attempt, tail_lines=args.tail, grep=args.grep))
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


def _print_json(value: Any) -> int:
    print(json.dumps(to_dict(value), indent=2, default=str))
    return 0


# -- rendering for people ------------------------------------------------------------------

def _ago(ts: float | None) -> str:
    if not ts:
        return "-"
    return _dur(time.time() - ts) + " ago"


def _dur(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


def _console() -> Any:
    from rich.console import Console

    return Console()


def _esc(text: object) -> str:
    """User text (names, commands, tags, reasons) inside rich markup: shown, never parsed."""
    from rich.markup import escape

    return escape(str(text))


def _state(v: JobView) -> str:
    label = "cancelling" if v.cancelling else v.state
    return f"[{STATE_STYLE.get(v.state, 'white')}]{label}[/]"


def _render_jobs(jobs: list[JobView]) -> None:
    from rich.table import Table

    table = Table(title=None if jobs else "no jobs yet — submit one: autoresearch submit -- CMD")
    for col in ("ID", "NAME", "STATE", "PRIORITY", "GPUS", "ATTEMPTS", "SUBMITTED", "RUNTIME", "EXIT"):
        table.add_column(col)
    for v in jobs:
        runtime = (v.ended_at or time.time()) - v.started_at if v.started_at else None
        exit_text = f"{v.exit_code} ({v.end_reason})" if v.end_reason else "-"
        table.add_row(str(v.id), _esc(v.name), _state(v), v.priority, str(v.gpus), str(v.attempts),
                      _ago(v.submitted_at), _dur(runtime), _esc(exit_text))
    _console().print(table)


def _render_job(v: JobView) -> None:
    from rich.table import Table

    console = _console()
    console.print(f"[bold]job {v.id}[/] {_esc(v.name)}  {_state(v)}  priority={v.priority} gpus={v.gpus}"
                  + (f" experiment={_esc(v.experiment)}" if v.experiment else ""))
    console.print(f"command: {v.command}", markup=False, highlight=False)
    console.print(f"workdir: {v.workdir}", markup=False, highlight=False)
    table = Table()
    for col in ("#", "STATE", "NODE", "GPUS", "STARTED", "ENDED", "RAN", "EXIT", "REASON", "PEAK MB"):
        table.add_column(col)
    notes = []
    for a in v.attempt_list:
        exit_text = str(a.exit_code) if a.exit_code is not None else (f"sig {a.signal}" if a.signal else "-")
        ran = (a.ended_at or time.time()) - a.started_at if a.started_at else None
        table.add_row(str(a.n), a.state, _esc(a.node or "-"), _esc(",".join(a.gpus) or "-"), _ago(a.started_at),
                      _ago(a.ended_at), _dur(ran),
                      exit_text, _esc(a.end_reason or "-"), f"{a.peak_rss_mb:.0f}" if a.peak_rss_mb else "-")
        if a.detail and not a.detail.startswith("exited "):
            notes.append(f"attempt {a.n}: {a.detail}")
    if v.attempt_list:
        console.print(table)
    for note in notes + [f"warning: {w}" for w in v.warnings]:
        console.print(note, markup=False, highlight=False)
    if v.log_excerpt:
        console.print(f"[red]failed ({v.failure_class} error); last lines of the log:[/]")
        console.print(v.log_excerpt, markup=False, highlight=False)


def _render_metrics(rows: list[Any]) -> None:
    from rich.table import Table

    table = Table(title=None if rows else "no metrics reported yet")
    for col in ("METRIC", "LAST", "BEST", "STEP", "COUNT"):
        table.add_column(col)
    for m in rows:
        table.add_row(_esc(m.name), _num(m.last), f"{_num(m.best)} ({m.mode})", str(m.step), str(m.count))
    _console().print(table)


def _num(value: float | None) -> str:
    return "nan" if value is None else f"{value:.6g}"


def _render_nodes(cluster: Any) -> None:
    from rich.table import Table

    table = Table()
    for col in ("NODE", "BACKEND", "STATE", "GPUS FREE/TOTAL", "RUNNING", "REASON"):
        table.add_column(col)
    for n in cluster.nodes:
        table.add_row(_esc(n.name), _esc(n.backend), n.state, f"{n.gpus_free}/{n.gpus}", str(n.running),
                      _esc(n.reason or "-"))
    console = _console()
    console.print(table)
    queued = ", ".join(f"{k}={v}" for k, v in cluster.queued.items())
    console.print(f"GPUs free {cluster.gpus_free}/{cluster.gpus_total}; running {cluster.running}; queued {queued}")


if __name__ == "__main__":
    sys.exit(main())
