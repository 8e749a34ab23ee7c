"""Tree-structured Parzen estimators on a plan's space, for the model-based proposers (bohb, and
tpe's priors): the space encoded in the unit cube, a good and a bad density over observed
configurations, a prior (``space.<name>.prior``: a best guess and a confidence) mixed into the
good one, and the candidate that maximizes their ratio.

Encoding: a range becomes u in [0, 1] (on the log scale when ``log``); ``choices`` an index.
Each density is a mixture with one component per observation (a Gaussian per range, an
Aitchison-Aitken kernel per choice, their product over the parameters: multivariate, as
optuna's ``multivariate=True``) plus one prior component: the user's prior for the good
density (weight ``1 + 4c/(1-c)`` observations for confidence c, so it fades as data grows),
the uniform one otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from autoresearch.loop.proposers._space import canonical


@dataclass
class Dim:
    name: str
    low: float = 0.0
    high: float = 1.0
    log: bool = False
    step: float | None = None
    is_int: bool = False
    choices: list[Any] | None = None
    prior: tuple[float, float] | None = None  # (guess encoded, confidence)


def dims_of(space: dict[str, Any]) -> list[Dim]:
    out = []
    for name, p in space.items():
        if p.choices is not None:
            dim = Dim(name, choices=list(p.choices))
        else:
            dim = Dim(name, float(p.low), float(p.high), bool(p.log), p.step, bool(p.is_int))
        if getattr(p, "prior", None) is not None:
            dim.prior = (encode_one(dim, p.prior.guess), float(p.prior.confidence))
        out.append(dim)
    return out


def encode_one(dim: Dim, value: Any) -> float:
    """A value as the unit cube sees it (a choice: its index); NaN when it is not in the space."""
    if dim.choices is not None:
        for i, c in enumerate(dim.choices):  # the common case, without serializing
            if type(c) is type(value) and isinstance(c, (str, int, float)) and c == value:
                return float(i)
        key = canonical({"v": value})
        return next((float(i) for i, c in enumerate(dim.choices) if canonical({"v": c}) == key), math.nan)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return math.nan
    if not dim.low <= value <= dim.high:
        return math.nan
    if dim.high == dim.low:
        return 0.5
    if dim.log:
        return (math.log(value) - math.log(dim.low)) / (math.log(dim.high) - math.log(dim.low))
    return (value - dim.low) / (dim.high - dim.low)


def encode(dims: list[Dim], params: dict[str, Any]) -> np.ndarray | None:
    """A configuration as a row of the unit cube, or None when it lies outside today's space."""
    row = [encode_one(d, params.get(d.name)) for d in dims]
    return None if any(math.isnan(x) for x in row) else np.array(row, dtype=float)


def decode(dims: list[Dim], row: np.ndarray) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for d, u in zip(dims, row, strict=True):
        if d.choices is not None:
            out[d.name] = d.choices[int(u)]
            continue
        u = min(max(float(u), 0.0), 1.0)
        if d.log:
            value = math.exp(math.log(d.low) + u * (math.log(d.high) - math.log(d.low)))
        else:
            value = d.low + u * (d.high - d.low)
        if d.step is not None:
            value = min(max(d.low + round((value - d.low) / d.step) * d.step, d.low), d.high)
        out[d.name] = int(round(value)) if d.is_int else float(f"{value:.6g}")
    return out


def prior_weight(confidence: float) -> float:
    return 1.0 + 4.0 * confidence / (1.0 - confidence)


def prior_sd(confidence: float) -> float:
    return 0.05 + 0.45 * (1.0 - confidence)


class Parzen:
    """A mixture density on the encoded space: one kernel per observation and one prior component."""

    def __init__(self, dims: list[Dim], points: np.ndarray, user_prior: bool, n_model: int | None = None,
                 anchors: np.ndarray | None = None, anchor_confidence: float = 0.5) -> None:
        self.dims = dims
        self.points = points.reshape(-1, len(dims))
        n = max(n_model if n_model is not None else len(self.points), 1)
        shrink = n ** (-1.0 / (len(dims) + 4))
        self.sigma = max(0.2 * shrink, 0.03)
        self.eps = [min((len(d.choices) - 1) / len(d.choices), 0.4 * shrink) if d.choices else 0.0 for d in dims]
        self.user_prior = user_prior and any(d.prior is not None for d in dims)
        confidences = [d.prior[1] for d in dims if d.prior is not None]
        w_prior = prior_weight(max(confidences)) if self.user_prior else 1.0
        # Anchors (an LLM's suggestions): kernels as wide as a prior of anchor_confidence, sharing its weight.
        self.anchors = np.zeros((0, len(dims))) if anchors is None else anchors.reshape(-1, len(dims))
        self.anchor_conf = anchor_confidence
        w_anchor = [prior_weight(anchor_confidence) / max(len(self.anchors), 1)] * len(self.anchors)
        self.weights = np.concatenate([np.ones(len(self.points)), w_anchor, [w_prior]])
        self.weights /= self.weights.sum()

    def _kernels(self, x: np.ndarray, centers: np.ndarray, sigma: float, own: list[float]) -> np.ndarray:
        """log kernel of each x around each center: (len(x), len(centers))."""
        comps = np.zeros((len(x), len(centers)))
        for j, d in enumerate(self.dims):
            xj, pj = x[:, j][:, None], centers[:, j][None, :]
            if d.choices:
                k = len(d.choices)
                if k > 1:
                    comps += np.log(np.where(xj == pj, own[j], (1 - own[j]) / (k - 1)))
            else:
                comps += -0.5 * ((xj - pj) / sigma) ** 2 - math.log(sigma * math.sqrt(2 * math.pi))
        return comps

    def _prior_logpdf(self, x: np.ndarray) -> np.ndarray:
        out = np.zeros(len(x))
        for j, d in enumerate(self.dims):
            if not self.user_prior or d.prior is None:
                if d.choices:
                    out -= math.log(len(d.choices))
                continue
            guess, conf = d.prior
            if d.choices:
                k = len(d.choices)
                p = np.where(x[:, j] == guess, conf + (1 - conf) / k, (1 - conf) / k)
                out += np.log(p)
            else:
                sd = prior_sd(conf)
                out += -0.5 * ((x[:, j] - guess) / sd) ** 2 - math.log(sd * math.sqrt(2 * math.pi))
        return out

    def logpdf(self, x: np.ndarray) -> np.ndarray:
        comps = self._kernels(x, self.points, self.sigma, [1 - e for e in self.eps])
        anchor_own = [self.anchor_conf + (1 - self.anchor_conf) / len(d.choices) if d.choices else 0.0
                      for d in self.dims]
        anchored = self._kernels(x, self.anchors, prior_sd(self.anchor_conf), anchor_own)
        allc = np.concatenate([comps, anchored, self._prior_logpdf(x)[:, None]], axis=1) + np.log(self.weights)[None, :]
        top = allc.max(axis=1, keepdims=True)
        return (top + np.log(np.exp(allc - top).sum(axis=1, keepdims=True)))[:, 0]

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        which = rng.choice(len(self.weights), size=n, p=self.weights)
        out = np.zeros((n, len(self.dims)))
        n_points = len(self.points)
        for i, c in enumerate(which):
            if c < n_points:
                out[i] = self._around(self.points[c], rng, self.sigma, self.eps)
            elif c < n_points + len(self.anchors):
                eps = [(1 - self.anchor_conf) * (len(d.choices) - 1) / len(d.choices) if d.choices else 0.0
                       for d in self.dims]
                out[i] = self._around(self.anchors[c - n_points], rng, prior_sd(self.anchor_conf), eps)
            else:
                out[i] = sample_prior(self.dims, rng, self.user_prior)
        return out

    def _around(self, center: np.ndarray, rng: np.random.Generator, sigma: float, eps: list[float]) -> np.ndarray:
        row = np.array(center, dtype=float)
        for j, d in enumerate(self.dims):
            if d.choices:
                k = len(d.choices)
                if k > 1 and rng.random() < eps[j]:
                    row[j] = float(rng.choice([i for i in range(k) if i != int(center[j])]))
            else:
                row[j] = _truncated(rng, center[j], sigma)
        return row


def _truncated(rng: np.random.Generator, mean: float, sd: float) -> float:
    for _ in range(20):
        x = rng.normal(mean, sd)
        if 0.0 <= x <= 1.0:
            return float(x)
    return float(min(max(mean, 0.0), 1.0))


def sample_prior(dims: list[Dim], rng: np.random.Generator, user_prior: bool = True) -> np.ndarray:
    """One encoded configuration from the prior: around each guess, uniform where there is none."""
    row = np.zeros(len(dims))
    for j, d in enumerate(dims):
        prior = d.prior if user_prior else None
        if d.choices:
            k = len(d.choices)
            if prior is not None and rng.random() < prior[1]:
                row[j] = prior[0]
            else:
                row[j] = float(rng.integers(k))
        elif prior is not None:
            row[j] = _truncated(rng, prior[0], prior_sd(prior[1]))
        else:
            row[j] = rng.random()
    return row


def best_candidate(good: Parzen, bad: Parzen, rng: np.random.Generator, n_candidates: int) -> np.ndarray:
    """The candidate drawn from the good density with the highest good/bad ratio."""
    cands = good.sample(rng, n_candidates)
    score = good.logpdf(cands) - bad.logpdf(cands)
    return cands[int(np.argmax(score))]
