"""``report.html``: the loop's report as one self-contained page (no network, no JavaScript library).

The figures are the report's own (:mod:`autoresearch.loop._plots`), inlined as SVG: every
point or curve that stands for a trial shows the trial, its value and its params on hover
(an SVG ``<title>``) and links to the trial's row in the table below, which lists every
trial with the loop's verdict. plotly is not used: it is not a dependency, and a page with
its library inline weighs ~4.6 MB.

Everything from the ledger (names, params, rationales: untrusted, invariant 8) is escaped.
"""

from __future__ import annotations

import html
import io
import json
import re
from typing import Any

from autoresearch.loop._plots import ReportData, _value
from autoresearch.loop.views import mark

_LINK = re.compile(r'<a xlink:href="#trial-(\d+)"[^>]*>')
CSS = """body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;padding:0 1em;color:#222}
table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ddd;padding:3px 6px;text-align:left}
tr:target{background:#fff3b0}tr.incumbent{background:#fde2e2}code{font-size:12px}
figure{margin:1.5em 0}svg{max-width:100%;height:auto}svg a:hover path{stroke:#000;stroke-width:2}
.muted{color:#777}"""


def svg_of(fig: Any) -> str:
    """The figure as an inline ``<svg>`` element (no XML prolog)."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    text = buf.getvalue()
    return text[text.index("<svg"):]


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


def _tooltips(svg: str, titles: dict[int, str]) -> str:
    def add(m: re.Match[str]) -> str:
        trial = int(m.group(1))
        return f'<a xlink:href="#trial-{trial}"><title>{_e(titles.get(trial, f"trial {trial}"))}</title>'

    return _LINK.sub(add, svg)


def render(data: ReportData, summary_md: str, svgs: dict[str, str]) -> str:
    view = data.view
    titles = {}
    for t in view.trials:
        verdict = mark(t, view)
        titles[t.trial_id] = (f"trial {t.trial_id} ({t.role}, {t.state}{', ' + verdict if verdict else ''}): "
                              f"{view.metric}={_num(_value(data, t))} "
                              + json.dumps(t.params, sort_keys=True, default=str)[:300])
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{_e(view.name)}: loop report</title>",
             f"<style>{CSS}</style></head><body>",
             f"<h1>Loop <code>{_e(view.name)}</code></h1>",
             f"<p>{_e(view.goal)} <code>{_e(view.metric)}</code> · {_e(view.state)}"
             + (f" ({_e(view.stop_reason)})" if view.stop_reason else "") + "</p>"]
    if view.best_trial is not None:
        seeds = f" (mean of {view.best_seeds} seeds)" if view.best_seeds > 1 else ""
        parts.append(f"<p><b>Best</b> (the incumbent the loop kept): <a href='#trial-{view.best_trial}'>trial "
                     f"{view.best_trial}</a>, {_e(view.metric)} = {_num(view.best_value)}{seeds} · params "
                     f"<code>{_e(json.dumps(view.best_params, sort_keys=True, default=str))}</code></p>")
    if view.noise_floor is not None:
        parts.append(f"<p><b>Noise floor</b> ±{view.noise_floor:.4g} ({_e(view.noise_basis)}); "
                     f"{view.rejected_as_noise} gain(s) within the floor of their time not kept.</p>")
    parts.append("<p class='muted'>Hover a point or curve for its trial; click it to jump to its row.</p>")
    for name, svg in svgs.items():
        parts.append(f"<figure id='{_e(name)}'>{_tooltips(svg, titles)}</figure>")
    parts.append(f"<h2>Every trial</h2><table><tr><th>trial</th><th>role</th><th>seed</th><th>state</th>"
                 f"<th>{_e(view.metric)}</th><th>best so far</th><th>loop's verdict</th><th>params</th>"
                 "<th>rationale</th></tr>")
    for t in view.trials:
        cls = " class='incumbent'" if t.trial_id == view.best_trial else ""
        parts.append(f"<tr id='trial-{t.trial_id}'{cls}><td>{t.trial_id}</td><td>{_e(t.role)}</td>"
                     f"<td>{_e('' if t.seed is None else t.seed)}</td><td>{_e(t.state)}</td>"
                     f"<td>{_num(_value(data, t))}</td><td>{_num(t.best_so_far)}</td><td>{_e(mark(t, view))}</td>"
                     f"<td><code>{_e(json.dumps(t.params, sort_keys=True, default=str))}</code></td>"
                     f"<td>{_e(t.rationale[:300])}</td></tr>")
    parts.append("</table>")
    parts.append(f"<h2>summary.md</h2><pre>{_e(summary_md)}</pre></body></html>")
    return "\n".join(parts)
