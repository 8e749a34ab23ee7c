"""Output of the ``autoresearch`` command: JSON for machines, tables for people.

The tables of the fast reads (status, list, metrics, nodes) are :mod:`._table`'s, without
rich (issue 16: those commands start in under 150 ms); the GPU health view still uses rich,
imported inside its function.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from autoresearch.cli._table import Table, clean, styled, terminal_columns
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


def console_width() -> int | None:
    """None (the terminal's, or $COLUMNS) on a terminal; wide when piped, unless $COLUMNS says otherwise."""
    if sys.stdout.isatty() or os.environ.get("COLUMNS", "").isdigit():
        return None
    return PIPED_WIDTH


def _width() -> int:
    return console_width() or terminal_columns()


def _print(text: str = "", style: str = "") -> None:
    """One line (or several) to stdout; ``style`` colors it on a terminal (user text: pass it through clean)."""
    print(styled(text, style) if style else text)


def _state(v: JobView) -> tuple[str, str]:
    label = "cancelling" if v.cancelling else v.state
    if v.state == "cancelled" and v.end_reason == "stopped":
        label = "stopped"  # stopped early by its research loop (an early stopper, the loop's end)
    if v.engine_state and not v.cancelling:  # launched, but the engine holds it in its queue
        return f"queued (engine: {v.engine_state})", STATE_STYLE["queued"]
    return label, STATE_STYLE.get(v.state, "white")


def exit_column(code: int | None, reason: str | None) -> str:
    """The EXIT cell: the code and why it ended (``1 (exit)``), the reason alone when the job never
    exited by itself (``cancelled``, ``stopped``: no code), ``-`` while it runs."""
    if not reason:
        return "-" if code is None else str(code)
    return reason if code is None else f"{code} ({reason})"


def render_jobs(jobs: list[JobView], empty: str = "no jobs yet — submit one: autoresearch submit -- CMD") -> None:
    table = Table("ID", "NAME", "STATE", "PRIORITY", "GPUS", "ATTEMPTS", "SUBMITTED", "RUNTIME", "EXIT",
                  title=None if jobs else empty)
    for v in jobs:
        runtime = (v.ended_at or time.time()) - v.started_at if v.started_at else None
        exit_text = exit_column(v.exit_code, v.end_reason)
        label, style = _state(v)
        table.add_row(v.id, clean(v.name), label, v.priority, v.gpus, v.attempts, _ago(v.submitted_at), _dur(runtime),
                      clean(exit_text), styles={2: style})
    _print(table.render(_width()))


def render_job(v: JobView) -> None:
    label, style = _state(v)
    print(styled(f"job {v.id}", "bold") + f" {clean(v.name)}  {styled(label, style)}  priority={v.priority} "
          f"gpus={v.gpus}" + (f" experiment={clean(v.experiment)}" if v.experiment else "")
          + (f" backend={clean(v.backend)}" if v.backend else ""))
    print(f"command: {clean(v.command)}")
    print(f"workdir: {clean(v.workdir)}")
    table = Table("#", "STATE", "NODE", "GPUS", "STARTED", "ENDED", "RAN", "EXIT", "REASON", "PEAK MB")
    notes = []
    for a in v.attempt_list:
        exit_text = str(a.exit_code) if a.exit_code is not None else (f"sig {a.signal}" if a.signal else "-")
        ran = (a.ended_at or time.time()) - a.started_at if a.started_at else None
        table.add_row(a.n, a.state, clean(",".join(a.nodes) or a.node or "-"), clean(",".join(a.gpus) or "-"), _ago(a.started_at),
                      _ago(a.ended_at), _dur(ran), exit_text, clean(a.end_reason or "-"),
                      f"{a.peak_rss_mb:.0f}" if a.peak_rss_mb else "-")
        if a.detail and not a.detail.startswith("exited "):
            notes.append(f"attempt {a.n}: {a.detail}")
    if v.attempt_list:
        _print(table.render(_width()))
    if v.limits:
        notes.append(f"limits: {v.limits}")
    for note in notes + [f"warning: {w}" for w in v.warnings]:
        print(clean(note))
    if v.failure_why:
        whose = {"infra": "the machine's fault", "infra-suspect": "the machine's fault, suspected",
                 "unknown": "an unknown cause"}.get(v.failure_class or "", "the program's error")
        print(styled(f"failed: {whose} ({v.failure_class})", "red") + f": {clean(v.failure_why)}")
        if v.failure_hint:
            print(f"hint: {clean(v.failure_hint)}")
    if v.log_excerpt:
        _print(f"failed ({v.failure_class} error); last lines of the log:", "red")
        print(clean(v.log_excerpt, newlines=True))


def render_metrics(rows: list[Any]) -> None:
    if not rows:
        from autoresearch.api import METRIC_FORMATS

        print("no metrics reported yet. A job reports a metric with any of:")
        for shape in METRIC_FORMATS:
            print(f"  {shape}")
        return
    table = Table("METRIC", "LAST", "BEST", "STEP", "COUNT")
    for m in rows:
        table.add_row(clean(m.name), _num(m.last), f"{_num(m.best)} ({m.mode})", m.step, m.count)
    _print(table.render(_width()))
    if rows[0].unread_points:
        print(styled(f"partial: about {rows[0].unread_points:,} more point(s) of its output are still being read; "
                     "call metrics again for the rest", "yellow"))


def _num(value: float | None) -> str:
    return "nan" if value is None else f"{value:.6g}"


def render_nodes(cluster: Any) -> None:
    table = Table("NODE", "BACKEND", "STATE", "SINCE", "GPUS FREE/TOTAL", "RUNNING", "REASON", "LAST FINDINGS")
    for n in cluster.nodes:
        table.add_row(clean(n.name), clean(n.backend), n.state, _ago(n.since), f"{n.gpus_free}/{n.gpus}",
                      n.running, clean(n.reason or "-"), "\n".join(clean(f) for f in n.findings[:2]) or "-")
    _print(table.render(_width()))
    queued = ", ".join(f"{k}={v}" for k, v in cluster.queued.items())
    print(f"GPUs free {cluster.gpus_free}/{cluster.gpus_total}; running {cluster.running}; queued {queued}")
    if cluster.projects:
        # GPUS: held now (of which best-effort); CAP: gpu_quota or guaranteed + borrow; GUAR: guaranteed; GPU-H: past usage,
        # decayed; SHARE: what the queue orders by (least first); RUN/Q: jobs running / queued
        usage = Table("PROJECT", "GPUS", "CAP", "GUAR", "BORROW", "WEIGHT", "GPU-H", "SHARE", "RUN/Q",
                      title="projects (fair share)")
        for p in cluster.projects:
            usage.add_row(clean(p.project) or "(default)",
                          f"{p.gpus_used} ({p.best_effort_gpus} be)" if p.best_effort_gpus else p.gpus_used,
                          "-" if p.quota is None else p.quota, p.guaranteed or "-",
                          "-" if p.borrow is None else p.borrow, f"{p.weight:g}", f"{p.decayed_gpu_h:.1f}",
                          f"{p.share:.3f}", f"{p.running}/{p.queued}")
        _print(usage.render(_width()))


def render_health(view: Any) -> None:
    table = Table("GPU", "NAME", "TEMP C", "ECC UNCORR", "CLOCK EVENTS", "XIDS",
                  title=clean(f"{view.node}: driver {view.driver_version or '?'}, {len(view.gpus)} GPU(s)"))
    for g in view.gpus:
        table.add_row(g.index, clean(g.name or "-"), "-" if g.temperature_c is None else f"{g.temperature_c:.0f}",
                      g.ecc_uncorrected, clean(", ".join(g.clock_event_reasons) or "-"), ", ".join(map(str, g.xids)) or "-")
    _print(table.render(_width()))
    for line in view.findings:
        print(f"finding: {clean(line)}")
    print(styled("healthy", "green") if view.healthy else styled("unhealthy", "red") + f": {clean(view.reason)}")
    if view.action:
        print(clean(view.action))
