"""Output of the ``autoresearch`` command: JSON for machines, rich tables for people.

rich is imported inside the functions, so a ``--json`` call never loads it.
"""

from __future__ import annotations

import json
import time
from typing import Any

from autoresearch.views import JobView, to_dict

STATE_STYLE = {"queued": "yellow", "starting": "cyan", "running": "cyan", "succeeded": "green", "failed": "red",
               "cancelled": "magenta"}


def print_json(value: Any) -> int:
    print(json.dumps(to_dict(value), indent=2, default=str))
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


def render_jobs(jobs: list[JobView]) -> None:
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
    if v.log_excerpt:
        console.print(f"[red]failed ({v.failure_class} error); last lines of the log:[/]")
        console.print(v.log_excerpt, markup=False, highlight=False)


def render_metrics(rows: list[Any]) -> None:
    from rich.table import Table

    table = Table(title=None if rows else "no metrics reported yet")
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
    for col in ("NODE", "BACKEND", "STATE", "GPUS FREE/TOTAL", "RUNNING", "REASON"):
        table.add_column(col)
    for n in cluster.nodes:
        table.add_row(_esc(n.name), _esc(n.backend), n.state, f"{n.gpus_free}/{n.gpus}", str(n.running),
                      _esc(n.reason or "-"))
    console = _console()
    console.print(table)
    queued = ", ".join(f"{k}={v}" for k, v in cluster.queued.items())
    console.print(f"GPUs free {cluster.gpus_free}/{cluster.gpus_total}; running {cluster.running}; queued {queued}")
