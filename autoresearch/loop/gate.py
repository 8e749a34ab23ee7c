"""The CI regression gate: the sweep's best against a baseline, beyond noise, as an exit code.

``autoresearch plan.yaml --ci --baseline REF`` with ``gate: {metric, max_regression}`` in
the plan. The candidate is the loop's incumbent (the trial the loop kept, noise-aware:
:mod:`autoresearch.loop.noise`; the mean over its seeds when the plan has ``repeats``).
It regresses when it is worse than the baseline by more than the allowance, which is the
larger of ``max_regression`` and the noise floor (measured by this sweep's repeats, else
the baseline's own): a difference within seed-to-seed noise is never a regression.

Exit codes (what CI reads): 0 pass, 1 regression (or every trial failed: the code under
test is broken), 2 configuration or infrastructure error (bad input, unreachable backend,
every trial crashed, nothing finished within the budget).

A baseline comes from a previous run's ``--json`` summary here (stdlib only); an MLflow run
or experiment is looked up by the mirror (:mod:`autoresearch.tracking._baseline`), the only
code that imports mlflow. Pure functions otherwise: no ledger, no I/O but the file read.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from autoresearch.errors import NotFoundError, SpecError

SUMMARY_FORMAT = "autoresearch-ci/1"
MAX_BASELINE_BYTES = 50 * 2**20  # a summary is small; a larger file is not one


@dataclass
class Baseline:
    ref: str  # as the user gave it
    kind: str  # json | mlflow-run | mlflow-experiment
    metric: str
    value: float
    noise_floor: float | None = None
    source: str = ""  # what it is, for people: "trial 4 of loop nightly (summary.json)", "MLflow run abc..."
    confirmed: bool | None = None  # its seeds all ended (True), not (False), unknown or no repeats (None)


@dataclass
class GateResult:
    metric: str
    goal: str
    verdict: str  # pass | regression | no-baseline | no-result
    candidate: float | None = None  # the incumbent's value (mean over its seeds)
    candidate_trial: int | None = None
    candidate_seeds: int = 0
    candidate_confirmed: bool | None = None  # the incumbent's repeats all ended; None: the plan has no repeats
    baseline: Baseline | None = None
    worse_by: float | None = None  # > 0: worse than the baseline, in the metric's units
    tolerance: float | None = None  # max_regression, in the metric's units
    noise: float | None = None  # the noise floor used
    allowed: float | None = None  # max(tolerance, noise)
    max_regression: str = ""  # as the plan wrote it
    rationale: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def baseline_from_summary(path: str | Path, metric: str, goal: str, ref: str | None = None) -> Baseline:
    """The best of a previous run's ``--json`` summary file. NotFoundError/SpecError (exit 2) when
    it does not exist, is not a summary, or has no value of ``metric``."""
    p = Path(path)
    hint = "pass the --json summary of an earlier run (autoresearch plan.yaml --ci --json summary.json)"
    try:
        size = p.stat().st_size
        if size > MAX_BASELINE_BYTES:
            raise SpecError(f"baseline {p} is {size} bytes: not a summary", hint=hint)
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise NotFoundError(f"baseline file {p} does not exist", hint=hint) from None
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise SpecError(f"baseline {p} is not a readable JSON summary ({str(err)[:120]})", hint=hint) from None
    if not isinstance(data, dict) or data.get("format") != SUMMARY_FORMAT:
        raise SpecError(f"baseline {p} is not an autoresearch summary (no \"format\": \"{SUMMARY_FORMAT}\")",
                        hint=hint)
    if data.get("metric") != metric:
        raise SpecError(f"baseline {p} has no metric {metric!r} (its sweep measured {str(data.get('metric'))[:60]!r})",
                        hint="gate on the same metric as the baseline's sweep, or pick another baseline")
    if data.get("goal") not in (None, goal):
        raise SpecError(f"baseline {p} {data.get('goal')}s {metric!r}, this plan {goal}s it",
                        hint="the baseline must come from a sweep with the same objective")
    best: dict[str, Any] = data["best"] if isinstance(data.get("best"), dict) else {}
    value = _number(best.get("value"))
    if value is None:
        raise SpecError(f"baseline {p} has no value of {metric!r} (no trial of that sweep finished with it)",
                        hint="pick a baseline whose sweep produced a best trial")
    noise = _number(data.get("noise_floor"))
    trial = best.get("trial")
    confirmed = best.get("confirmed") if isinstance(best.get("confirmed"), bool) else None
    source = f"trial {str(trial)[:20]} of loop {str(data.get('loop', '?'))[:64]} ({p.name})"
    return Baseline(ref or str(path), "json", metric, value, noise if noise is not None and noise >= 0 else None,
                    source, confirmed)


def confirmed_words(confirmed: bool | None, seeds: int = 0) -> str:
    """``confirmed (3 seeds)``, ``not confirmed (1 seed ended)``, or ``no repeats`` (None)."""
    count = f" ({seeds} seed{'s' if seeds != 1 else ''}{'' if confirmed else ' ended'})" if seeds > 0 else ""
    return "no repeats" if confirmed is None else ("confirmed" if confirmed else "not confirmed") + count


def evaluate(view: Any, gate: Any, baseline: Baseline | None) -> GateResult:
    """The verdict on a finished loop's view (a LoopView) against ``baseline``; ``gate``: the plan's."""
    out = GateResult(metric=gate.metric, goal=view.goal, verdict="no-baseline", candidate=view.best_value,
                     candidate_trial=view.best_trial, candidate_seeds=view.best_seeds,
                     candidate_confirmed=getattr(view, "best_confirmed", None), baseline=baseline,
                     max_regression=str(gate.max_regression))
    if view.best_value is None:
        out.verdict = "no-result"
        out.rationale = f"no trial finished with {gate.metric!r}: nothing to compare"
        return out
    if baseline is None:
        out.rationale = "no --baseline given: nothing to compare (this run's --json summary can be the next baseline)"
        return out
    sign = 1.0 if view.goal == "minimize" else -1.0
    out.worse_by = sign * (view.best_value - baseline.value)
    out.tolerance = gate.tolerance(baseline.value)
    out.noise = view.noise_floor if view.noise_floor is not None else baseline.noise_floor
    out.allowed = max(out.tolerance, out.noise or 0.0)
    rel = f" ({out.worse_by / abs(baseline.value):+.2%})" if baseline.value else ""
    allowed = f"allowed {out.allowed:.4g} (max_regression {gate.max_regression}"
    allowed += f", noise floor ±{out.noise:.4g})" if out.noise is not None else ")"
    sure = out.candidate_confirmed  # said only where the plan has repeats (as summary.md does)
    what = (f"{gate.metric} {view.best_value:.6g}"
            + (f" [{confirmed_words(sure, out.candidate_seeds)}]" if sure is not None else "")
            + f" vs baseline {baseline.value:.6g}")
    if baseline.confirmed is not None:
        what += f" [{confirmed_words(baseline.confirmed)}]"
    if out.worse_by > out.allowed:
        out.verdict = "regression"
        out.rationale = f"{what}: worse by {out.worse_by:.4g}{rel}, more than {allowed}"
    else:
        out.verdict = "pass"
        change = f"worse by {out.worse_by:.4g}{rel}, within {allowed}" if out.worse_by > 0 else \
            f"better by {-out.worse_by:.4g}{rel}" if out.worse_by < 0 else "equal"
        out.rationale = f"{what}: {change}"
    return out


def exit_code(view: Any, result: GateResult | None) -> tuple[int, str]:
    """CI's one number for a finished loop, and why."""
    counts = view.counts
    if result is not None and result.verdict == "regression":
        return 1, f"regression: {result.rationale}"
    left = counts.get("running", 0) + counts.get("queued", 0)
    if left:
        return 2, f"{left} trial(s) did not end when the loop stopped ({view.stop_reason}): check the backend"
    if view.best_value is None:
        if counts.get("failed"):
            return 1, (f"no trial finished with {view.metric!r}; {counts['failed']} failed: the code under test "
                       "is broken (see the failures in the report)")
        why = view.stop_reason or "nothing finished"
        return 2, f"no trial finished with {view.metric!r} ({why}): an infrastructure or budget problem"
    if result is not None and result.verdict == "pass":
        return 0, f"pass: {result.rationale}"
    return 0, f"done: best {view.metric} {view.best_value:.6g} (trial {view.best_trial}); no gate evaluated"
