"""What a CI run of a loop leaves behind: a JSON summary, a JUnit XML file and a Markdown summary.

* ``--json PATH``: the verdict, the gate's comparison, the best (the loop's incumbent), the
  noise floor, counts and every trial; it is also what ``--baseline`` reads back next night
  (``format: autoresearch-ci/1``).
* ``--junit PATH``: one testcase per trial (failed and crashed trials are failures with
  their log excerpt, early-stopped and never-launched ones are skipped with the reason)
  and one for the gate, so a CI's test view shows the sweep.
* ``--summary PATH``: the verdict and the gate's comparison, then the loop's own report
  (:mod:`autoresearch.loop.report`: leaderboard, failures, the best-so-far plot), whose
  files go to ``<PATH stem>.files/`` beside it; appended to ``$GITHUB_STEP_SUMMARY`` when set
  (images there are named, not shown: a job summary cannot show a local file).

Everything a trial wrote (its log excerpt) is cleaned of characters XML cannot hold.
"""

from __future__ import annotations

import json
import os
import re
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from autoresearch.errors import SpecError
from autoresearch.loop.gate import SUMMARY_FORMAT, GateResult, confirmed_words
from autoresearch.loop.store import LoopStore

VERDICT = {0: "PASS", 1: "REGRESSION", 2: "ERROR"}
_NOT_XML = re.compile("[^\u0009\u000a\u000d\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_IMAGE = re.compile(r"!\[([^\]\n]*)\]\(([^)\s/]+\.png)\)")


def check_paths(paths: dict[str, str | None]) -> None:
    """Refuse (exit 2, before any trial runs) a report path that cannot be written: its folder
    is missing and cannot be made, it is a folder, or it is not writable."""
    for flag, raw in paths.items():
        if not raw:
            continue
        path = Path(raw)
        hint = f"give {flag} a file path in a writable folder"
        if path.is_dir():
            raise SpecError(f"{flag} {raw}: is a folder, not a file", hint=hint)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise SpecError(f"{flag} {raw}: cannot create its folder ({err.strerror})", hint=hint) from None
        target = path if path.exists() else path.parent
        if not os.access(target, os.W_OK):
            raise SpecError(f"{flag} {raw}: not writable", hint=hint)


def _xml_text(text: str, limit: int = 8000) -> str:
    text = _NOT_XML.sub("\ufffd", text)
    return text if len(text) <= limit else "…" + text[-limit:]


def _cell(text: Any) -> str:
    """A value safe inside a Markdown table cell."""
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("`", "'").replace("<", "&lt;") \
        .replace("\n", " ")[:200]


def _params(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())[:160]


def stop_reasons(ledger: Any, loop_id: int) -> dict[int, str]:
    """Why each early-stopped trial was stopped (its stop decision's rationale)."""
    out: dict[int, str] = {}
    for d in LoopStore(ledger, loop_id).decisions():
        if d["kind"] == "stop" and d["trial_id"] is not None:
            out[int(d["trial_id"])] = str(d["rationale"] or "stopped by the loop")
    return out


def summary(view: Any, result: GateResult | None, code: int, reason: str, stops: dict[int, str]) -> dict[str, Any]:
    trials = []
    for t in view.trials:
        trials.append({
            "trial": t.trial_id, "job_id": t.job_id, "state": t.state, "role": t.role, "seed": t.seed,
            "params": t.params, "objective": t.objective, "parent_trial": t.parent_trial,
            "duration_s": round(t.ended_at - t.started_at, 3) if t.ended_at and t.started_at else None,
            "failure": (t.failure or "").strip().splitlines()[0][:300] if t.failure else None,
            "stop_reason": stops.get(t.trial_id) if t.state == "stopped" else None})
    best = None
    if view.best_trial is not None:
        best = {"trial": view.best_trial, "value": view.best_value, "seeds": view.best_seeds,
                "confirmed": view.best_confirmed, "params": view.best_params}
    return {"format": SUMMARY_FORMAT, "loop": view.name, "state": view.state, "stop_reason": view.stop_reason,
            "metric": view.metric, "goal": view.goal, "exit_code": code, "verdict": VERDICT.get(code, "ERROR"),
            "reason": reason, "best": best, "noise_floor": view.noise_floor,
            "noise_basis": getattr(view, "noise_basis", ""), "counts": view.counts,
            "elapsed_s": round(view.elapsed_s, 3), "llm_usd": view.llm_usd, "decisions": view.decisions,
            "gate": result.to_dict() if result is not None else None, "trials": trials,
            "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def junit(view: Any, result: GateResult | None, stops: dict[int, str]) -> bytes:
    suites = ET.Element("testsuites", name="autoresearch")
    suite = ET.SubElement(suites, "testsuite", name=f"loop {view.name}",
                          timestamp=time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()))
    props = ET.SubElement(suite, "properties")
    confirmed = getattr(view, "best_confirmed", None)
    for name, value in (("metric", view.metric), ("goal", view.goal), ("best_trial", view.best_trial),
                        ("best_value", view.best_value), ("best_seeds", view.best_seeds),
                        ("best_confirmed", "no repeats" if confirmed is None else str(confirmed).lower()),
                        ("noise_floor", view.noise_floor),
                        ("stop_reason", view.stop_reason)):
        ET.SubElement(props, "property", name=name, value=_xml_text("" if value is None else str(value), 500))
    tests = failures = skipped = errors = 0
    total = 0.0
    classname = f"autoresearch.{view.name}"
    for t in view.trials:
        seconds = max(0.0, t.ended_at - t.started_at) if t.ended_at and t.started_at else 0.0
        total += seconds
        label = f"trial {t.trial_id}" + (" (seed repeat)" if t.role == "repeat" else "")
        case = ET.SubElement(suite, "testcase", classname=classname,
                             name=_xml_text(f"{label} {_params(t.params)}".strip(), 300), time=f"{seconds:.3f}")
        tests += 1
        if t.state in ("failed", "crashed"):
            failures += 1
            text = (t.failure or "").strip()
            first = text.splitlines()[0] if text else t.state
            node = ET.SubElement(case, "failure", message=_xml_text(f"{t.state}: {first}", 300), type=t.state)
            node.text = _xml_text(text)
        elif t.state in ("stopped", "cancelled", "skipped"):
            skipped += 1
            why = stops.get(t.trial_id) if t.state == "stopped" else (t.failure or t.state)
            ET.SubElement(case, "skipped", message=_xml_text(f"{t.state}: {why or 'stopped early'}", 500))
        elif t.state != "succeeded":
            errors += 1
            ET.SubElement(case, "error", message=f"still {t.state} when the loop ended", type=t.state)
        else:
            out = ET.SubElement(case, "system-out")
            out.text = f"{view.metric}={t.objective}"
    if result is not None:
        tests += 1
        case = ET.SubElement(suite, "testcase", classname=classname, name=f"gate {result.metric}", time="0")
        if result.verdict == "regression":
            failures += 1
            ET.SubElement(case, "failure", message=_xml_text(result.rationale, 500), type="regression")
        elif result.verdict != "pass":
            skipped += 1
            ET.SubElement(case, "skipped", message=_xml_text(result.rationale, 500))
        else:
            ET.SubElement(case, "system-out").text = _xml_text(result.rationale, 500)
    for element in (suite, suites):
        element.set("tests", str(tests))
        element.set("failures", str(failures))
        element.set("errors", str(errors))
        element.set("skipped", str(skipped))
        element.set("time", f"{total:.3f}")
    ET.indent(suites)
    return ET.tostring(suites, encoding="utf-8", xml_declaration=True)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


def markdown(view: Any, result: GateResult | None, code: int, reason: str, loop_md: str = "") -> str:
    lines = [f"# autoresearch CI: `{view.name}`: {VERDICT.get(code, 'ERROR')} (exit {code})", "", _cell(reason), ""]
    if result is not None:
        b = result.baseline
        seeds = f", mean of {result.candidate_seeds} seeds" if result.candidate_seeds > 1 else ""
        sure = f", {confirmed_words(result.candidate_confirmed)}" \
            if result.candidate is not None and result.candidate_confirmed is not None else ""
        rows = [("metric", f"{result.metric} ({result.goal})"),
                ("this run", f"{_fmt(result.candidate)} (trial {result.candidate_trial}{seeds}{sure})"
                 if result.candidate is not None else "-"),
                ("baseline", f"{_fmt(b.value)} ({b.source or b.ref}"
                             f"{'' if b.confirmed is None else ', ' + confirmed_words(b.confirmed)})"
                 if b is not None else "none given")]
        if result.worse_by is not None:
            rel = f" ({result.worse_by / abs(b.value):+.2%})" if b is not None and b.value else ""
            rows.append(("worse by", f"{result.worse_by:.4g}{rel}"))
            rows.append(("allowed", f"{_fmt(result.allowed)}: the larger of max_regression {result.max_regression} "
                                    f"(= {_fmt(result.tolerance)}) and the noise floor (±{_fmt(result.noise)}, the std "
                                    "of one run of the incumbent over its seeds)"))
        rows.append(("verdict", result.verdict))
        lines += ["## Gate", "", "| | |", "|---|---|"] + [f"| {k} | {_cell(v)} |" for k, v in rows] + [""]
    if loop_md:
        lines.append(re.sub(r"^(#+) ", r"#\1 ", loop_md, flags=re.M))  # its headings under ours
    return "\n".join(lines).rstrip() + "\n"


def write(ledger: Any, view: Any, result: GateResult | None, code: int, reason: str, *, json_path: str | None = None,
          junit_path: str | None = None, summary_path: str | None = None, loop_md: str = "",
          report_dir: str | None = None) -> list[str]:
    """Write the requested reports; returns the paths written. ``loop_md``: the loop report's
    summary.md (its images relative to ``report_dir``)."""
    stops = stop_reasons(ledger, view.loop_id)
    written: list[str] = []
    if json_path:
        Path(json_path).write_text(json.dumps(summary(view, result, code, reason, stops), indent=2, default=str))
        written.append(json_path)
    if junit_path:
        Path(junit_path).write_bytes(junit(view, result, stops))
        written.append(junit_path)
    if summary_path:
        md = loop_md
        if report_dir:
            prefix = os.path.relpath(report_dir, Path(summary_path).resolve().parent)
            md = _IMAGE.sub(lambda m: f"![{m.group(1)}]({prefix}/{m.group(2)})", md)
        text = markdown(view, result, code, reason, md)
        Path(summary_path).write_text(text)
        written.append(summary_path)
        step = os.environ.get("GITHUB_STEP_SUMMARY")
        if step:
            shown = _IMAGE.sub(lambda m: f"*(plot `{m.group(2)}` is in the reports artifact)*",
                               markdown(view, result, code, reason, loop_md))
            try:
                with open(step, "a", encoding="utf-8") as fh:
                    fh.write(shown + "\n")
            except OSError as err:
                print(f"autoresearch: could not append to $GITHUB_STEP_SUMMARY ({err.strerror})")
    return written
