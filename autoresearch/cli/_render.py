"""Output of the ``autoresearch`` command: JSON for machines, rich tables for people.

rich is imported inside the functions, so a ``--json`` call never loads it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from autoresearch.views import JobView, to_dict, with_iso

STATE_STYLE = {"queued": "yellow", "starting": "cyan", "running": "cyan", "succeeded": "green", "failed": "red",
               "cancelled": "magenta"}


def print_json(value: Any) -> int:
    print(json.dumps(with_iso(to_dict(value)), indent=2, default=str))
    return 0


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


PIPED_WIDTH = 400  # a table piped to a file or grep is not cut at 80 columns


def _console() -> Any:
    from rich.console import Console

    return Console(width=console_width())


def console_width() -> int | None:
    """None (the terminal's, or $COLUMNS) on a terminal; wide when piped, unless $COLUMNS says otherwise."""
    if sys.stdout.isatty() or os.environ.get("COLUMNS", "").isdigit():
        return None
    return PIPED_WIDTH


def _esc(text: object) -> str:
    """User text (names, commands, tags, reasons) inside rich markup: shown, never parsed."""
    from rich.markup import escape

    return escape(str(text))


def _state(v: JobView) -> str:
    label = "cancelling" if v.cancelling else v.state
    if v.state == "cancelled" and v.end_reason == "stopped":
        label = "stopped"  # stopped early by its research loop (an early stopper, the loop's end)
    return f"[{STATE_STYLE.get(v.state, 'white')}]{label}[/]"


def render_jobs(jobs: list[JobView], empty: str = "no jobs yet — submit one: autoresearch submit -- CMD") -> None:
    from rich.table import Table

    table = Table(title=None if jobs else empty)
    for col in ("ID", "NAME", "STATE", "PRIORITY", "GPUS", "ATTEMPTS", "SUBMITTED", "RUNTIME", "EXIT"):
        table.add_column(col)
    for v in jobs:
        runtime = (v.ended_at or time.time()) - v.started_at if v.started_at else None
        exit_text = f"{v.exit_code} ({v.end_reason})" if v.end_reason else "-"
        table.add_row(str(v.id), _esc(v.name), _state(v), v.priority, str(v.gpus), str(v.attempts),
                      _ago(v.submitted_at), _dur(runtime), _esc(exit_text))
    _console().print(table)


def render_job(v: JobView) -> None:
    from rich.table import Table

    console = _console()
    console.print(f"[bold]job {v.id}[/] {_esc(v.name)}  {_state(v)}  priority={v.priority} gpus={v.gpus}"
                  + (f" experiment={_esc(v.experiment)}" if v.experiment else "")
                  + (f" backend={_esc(v.backend)}" if v.backend else ""))
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
    if v.failure_why:
        whose = "the machine's fault" if v.failure_class == "infra" else "the program's error"
        console.print(f"[red]failed: {whose} ({v.failure_class})[/]: {_esc(v.failure_why)}")
        if v.failure_hint:
            console.print(f"hint: {v.failure_hint}", markup=False, highlight=False)
    if v.log_excerpt:
        console.print(f"[red]failed ({v.failure_class} error); last lines of the log:[/]")
        console.print(v.log_excerpt, markup=False, highlight=False)


def render_metrics(rows: list[Any]) -> None:
    from rich.table import Table

    if not rows:
        from autoresearch.api import METRIC_FORMATS

        print("no metrics reported yet. A job reports a metric with any of:")
        for shape in METRIC_FORMATS:
            print(f"  {shape}")
        return
    table = Table()
    for col in ("METRIC", "LAST", "BEST", "STEP", "COUNT"):
        table.add_column(col)
    for m in rows:
        table.add_row(_esc(m.name), _num(m.last), f"{_num(m.best)} ({m.mode})", str(m.step), str(m.count))
    _console().print(table)


def _num(value: float | None) -> str:
    return "nan" if value is None else f"{value:.6g}"


def render_nodes(cluster: Any) -> None:
    from rich.table import Table

    table = Table()
    for col in ("NODE", "BACKEND", "STATE", "SINCE", "GPUS FREE/TOTAL", "RUNNING", "REASON", "LAST FINDINGS"):
        table.add_column(col)
    for n in cluster.nodes:
        table.add_row(_esc(n.name), _esc(n.backend), n.state, _ago(n.since), f"{n.gpus_free}/{n.gpus}",
                      str(n.running), _esc(n.reason or "-"), _esc("\n".join(n.findings[:2]) or "-"))
    console = _console()
    console.print(table)
    queued = ", ".join(f"{k}={v}" for k, v in cluster.queued.items())
    console.print(f"GPUs free {cluster.gpus_free}/{cluster.gpus_total}; running {cluster.running}; queued {queued}")
    if cluster.projects:
        usage = Table(title="projects (fair share)")
        for col in ("PROJECT", "GPUS USED", "OF WHICH BEST-EFFORT", "QUOTA", "WEIGHT", "RUNNING", "QUEUED"):
            usage.add_column(col)
        for p in cluster.projects:
            usage.add_row(_esc(p.project or "(default)"), str(p.gpus_used), str(p.best_effort_gpus),
                          "-" if p.quota is None else str(p.quota), f"{p.weight:g}", str(p.running), str(p.queued))
        console.print(usage)


def render_health(view: Any) -> None:
    from rich.table import Table

    table = Table(title=f"{view.node}: driver {view.driver_version or '?'}, {len(view.gpus)} GPU(s)")
    for col in ("GPU", "NAME", "TEMP C", "ECC UNCORR", "CLOCK EVENTS", "XIDS"):
        table.add_column(col)
    for g in view.gpus:
        table.add_row(str(g.index), _esc(g.name or "-"), "-" if g.temperature_c is None else f"{g.temperature_c:.0f}",
                      str(g.ecc_uncorrected), ", ".join(g.clock_event_reasons) or "-",
                      ", ".join(map(str, g.xids)) or "-")
    console = _console()
    console.print(table)
    for line in view.findings:
        console.print(f"finding: {line}", markup=False, highlight=False)
    console.print("[green]healthy[/]" if view.healthy else f"[red]unhealthy[/]: {_esc(view.reason)}")
    if view.action:
        console.print(view.action, markup=False, highlight=False)
