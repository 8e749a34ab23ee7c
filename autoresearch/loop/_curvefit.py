"""Learning-curve extrapolation for the ``curve`` stopper (numpy only, imported when it judges).

A partial curve (steps, values; lower is better) is fitted by two saturating families,
``c + a * x**-alpha`` (power law) and ``c + a * exp(-b * x)`` (exponential), each over a
grid of its shape parameter with (c, a) solved by least squares. The best few fits of each
family that explain the points about as well as the best one form the ensemble; their most
optimistic prediction at the horizon less the residual noise (scaled by the confidence and by
how far the horizon lies beyond the last point) is the bound on the final value (Domhan et al. 2015 use a Bayesian ensemble of 11 such
forms; this is its cheap, deterministic cousin).
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import NormalDist

ALPHAS = (0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0)
KEEP = 3  # fits per family in the ensemble


@dataclass(frozen=True)
class Forecast:
    mean: float  # the ensemble's prediction at the horizon
    low: float  # optimistic bound: the final value is above it with the asked confidence
    members: int


def forecast(steps: list[int], values: list[float], horizon: int, confidence: float) -> Forecast | None:
    """Where a curve ends at ``horizon``, with an optimistic bound; None for too few points."""
    import numpy as np

    x = np.asarray(steps, dtype=float)
    y = np.asarray(values, dtype=float)
    ok = np.isfinite(x) & np.isfinite(y) & (x > 0)
    x, y = x[ok], y[ok]
    if len(x) < 3 or horizon <= 0:
        return None
    scale = float(np.std(y)) or 1.0
    last = float(x.max())
    fits: list[tuple[float, float]] = []  # (sse, prediction)
    shapes = [("pow", a) for a in ALPHAS] + [("exp", k / last) for k in (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)]
    for family in ("pow", "exp"):
        family_fits = []
        for name, p in shapes:
            if name != family:
                continue
            basis = x ** -p if family == "pow" else np.exp(-p * x)
            at_h = horizon ** -p if family == "pow" else float(np.exp(-p * horizon))
            design = np.column_stack([np.ones_like(x), basis])
            coef, *_ = np.linalg.lstsq(design, y, rcond=None)
            sse = float(np.sum((design @ coef - y) ** 2))
            family_fits.append((sse, float(coef[0] + coef[1] * at_h)))
        fits.extend(sorted(family_fits)[:KEEP])
    best_sse = min(sse for sse, _ in fits)
    noise = max((best_sse / max(len(x) - 2, 1)) ** 0.5, 1e-3 * scale)
    # the ensemble: fits about as likely as the best one (a chi-square margin of 4 on the SSE)
    kept = [p for sse, p in fits if (sse - best_sse) / noise**2 <= 4.0]
    z = NormalDist().inv_cdf(confidence)
    reach = (horizon / last) ** 0.5  # farther extrapolation, less certainty
    low = min(kept) - z * noise * reach
    return Forecast(sum(kept) / len(kept), low, len(kept))
