"""BOHB-style model-based proposals (Falkner et al. 2018) that learn from every rung reached,
not only from finished trials: ``proposer: {kind: bohb}`` beside the ``asha`` (or
``hyperband``) stopper.

Each trial's curve so far (``TrialRecord.intermediate``) gives its value at every rung it
reached (``early_stop.min_steps * reduction_factor**k``; finished trials also at the final
level). The model is fitted at the highest level with enough observations
(``min_points``, default d + 2 for d parameters): the best ``gamma`` of them make the good
density, the rest the bad one (:mod:`autoresearch.loop.proposers._parzen`). A trial that
failed is a bad observation at every level; one the stopper ended counts only at the rungs it
reached (``stopped: ignore``, the default, as BOHB proper: where curves cross, a config stopped
early may be one that ends best), or is bad above them too (``stopped: bad``); trials in flight (and the batch's
earlier proposals) are bad as well ("constant liar"), so a batch spreads out. Before any
level has enough observations, and for a ``random_fraction`` of proposals afterwards,
proposals come from the prior: around each ``space.<name>.prior`` guess, uniform elsewhere.
Trials of ``warm_start`` loops are observations like the loop's own.

Options (``proposer.options``): ``gamma`` (0.15), ``random_fraction`` (0.33, as BOHB), ``candidates``
(64), ``min_points``, ``fit``, ``stopped`` (``predict``: a stopped trial also counts at the final level,
with the final value of the finished trials nearest it at its last rung), ``init`` (``lhs``: the start-up
trials are the rows of a Latin hypercube); ``proposer.n_startup`` is a floor on ``min_points``.
"""

from __future__ import annotations

import math
from typing import Any

from autoresearch.errors import PlanError
from autoresearch.loop.proposers._base import (
    Proposal,
    Proposer,
    ProposerContext,
    ProposeResult,
    ProposerInfo,
    TrialRecord,
    option,
    proposer_options,
)
from autoresearch.loop.proposers._space import canonical

FINAL = math.inf  # the level of finished trials' final values
PENDING = ("proposed", "queued", "running")


def rungs(plan: Any) -> list[int]:
    """The levels the model may be fitted at: the stopper's rungs (none without early stopping)."""
    es = plan.early_stop
    if es is None:
        return []
    low, rf = max(1, int(getattr(es, "min_steps", 1))), max(2, int(getattr(es, "reduction_factor", 3)))
    top = getattr(es, "max_steps", None) or 10**9
    out: list[int] = []
    rung = low
    while rung < top and len(out) < 40:
        out.append(rung)
        rung *= rf
    return out


def value_at(curve: list[tuple[int, float]], step: int) -> float | None:
    return next((v for s, v in curve if s >= step), None)


class BOHBProposer(Proposer):
    kind = "bohb"
    blocking = False

    def __init__(self, ctx: ProposerContext) -> None:
        super().__init__(ctx)
        import numpy  # noqa: F401 - refused here if missing, not at the first proposal

        from autoresearch.loop.proposers._parzen import dims_of

        known = {"gamma", "random_fraction", "candidates", "min_points", "fit", "stopped", "init", "llm_prior",
                 "llm_confidence"}
        if "llm_prior" in proposer_options(self.plan):  # the llm proposer's own options too
            known |= {"retries", "backoff_s", "timeout_s", "price_in", "price_out", "history_limit"}
        opts = proposer_options(self.plan, known)
        self.dims = dims_of(self.plan.space)
        self.gamma = option(opts, "gamma", 0.15, 0.01, 0.99, kind="bohb")
        self.random_fraction = option(opts, "random_fraction", 0.33, 0.0, 1.0, kind="bohb")
        self.candidates = option(opts, "candidates", 64, 1, 10_000, integer=True, kind="bohb")
        floor = self.plan.proposer.n_startup or 0
        self.min_points = max(floor, option(opts, "min_points", len(self.dims) + 2, 2, 10_000, integer=True,
                                                  kind="bohb"))
        self.sign = 1.0 if self.plan.objective.goal == "minimize" else -1.0
        self.levels = rungs(self.plan)
        # An LLM's suggestions as the prior (options.llm_prior: how many to ask for, once): the plan's
        # provider/model/base_url settings, as for proposer kind llm.
        self.llm: Any = None
        self.anchors: Any = None  # encoded suggestions, once asked
        if "llm_prior" in opts:
            from autoresearch.loop.proposers.llm import LLMProposer

            self.llm_k = option(opts, "llm_prior", 4, 1, 50, integer=True, kind="bohb")
            self.llm_conf = option(opts, "llm_confidence", 0.5, 0.01, 0.99, kind="bohb")
            self.llm = LLMProposer(ctx)  # no key, no provider: refused here, before anything launches
            self.blocking = True  # the first proposal waits for the model
        self.stopped = str(opts.get("stopped", "ignore"))
        if self.stopped not in ("bad", "ignore", "predict"):
            raise PlanError(f"proposer.options.stopped is {self.stopped[:40]!r}; give bad, ignore or predict",
                            hint="ignore (the default): a stopped trial counts only where it got (BOHB proper); "
                                 "bad: a trial stopped below a level counts as bad there; predict: also at the "
                                 "final level, with the final value of the finished trials nearest it at its last rung")
        self.init = str(opts.get("init", "random"))
        if self.init not in ("random", "lhs"):
            raise PlanError(f"proposer.options.init is {self.init[:40]!r}; give random or lhs",
                            hint="random (the default): the first trials sample the prior; lhs: a Latin hypercube "
                                 "over the space's ranges and choices, one stratum per trial")
        self.design: Any = None  # the Latin hypercube of init: lhs, drawn at the first proposal
        self.fit = str(opts.get("fit", "level"))
        if self.fit not in ("all", "level", "rank"):
            raise PlanError(f"proposer.options.fit is {self.fit[:40]!r}; give all, level or rank",
                            hint="level: the model of the highest rung with data (BOHB); all: a model per rung, "
                                 "weighted by how well each ranks like the highest; rank: every trial ranked "
                                 "by how far it got, then its value there")

    def info(self) -> ProposerInfo:
        if self.llm is not None:
            llm = self.llm.info()
            return ProposerInfo(kind=self.kind, model=f"bohb seed={self.plan.proposer.seed}, prior: {llm.model}",
                                provider=llm.provider, prompt_name=llm.prompt_name, prompt_sha256=llm.prompt_sha256,
                                temperature=llm.temperature)
        return ProposerInfo(kind=self.kind, model=f"bohb seed={self.plan.proposer.seed}")

    def _ask_llm(self, history: list[TrialRecord]) -> ProposeResult | None:
        """The LLM's suggestions, once per run (a resumed loop asks again); None if it failed."""
        import numpy as np

        from autoresearch.errors import AutoresearchError
        from autoresearch.loop.proposers._parzen import encode

        try:
            result = self.llm.propose(history, self.llm_k)
        except AutoresearchError as err:
            self.anchors = np.zeros((0, len(self.dims)))
            self.llm_note = f"; the LLM prior failed ({err.message[:200]}): sampling without it"
            return None
        rows = [x for p in result.proposals for x in [encode(self.dims, p.params)] if x is not None]
        self.anchors = np.array(rows).reshape(-1, len(self.dims))
        self.llm_note = f"; prior: {len(rows)} suggestion(s) of {self.llm.model}: {result.rationale[:300]}"
        return result

    # -- what is known at each level -----------------------------------------------------------

    def _observations(self, history: list[TrialRecord]) -> tuple[dict[float, list[tuple[Any, float]]],
                                                                 dict[float, list[Any]], list[Any]]:
        """Per level: (x, signed value) of trials that reached it, x of trials known to be bad there
        (stopped below it, failed), and x of trials still in flight."""
        from autoresearch.loop.proposers._parzen import encode

        seen: dict[float, list[tuple[Any, float]]] = {lv: [] for lv in [*self.levels, FINAL]}
        bad: dict[float, list[Any]] = {lv: [] for lv in seen}
        pending: list[Any] = []
        finished: list[tuple[list[tuple[int, float]], float]] = []  # (curve, final) of succeeded trials
        stopped: list[tuple[Any, list[tuple[int, float]]]] = []  # (x, curve) of stopped trials
        for r in [*self.ctx.warm, *history]:
            if r.role != "explore":
                continue
            x = encode(self.dims, r.params)
            if x is None:
                continue  # outside today's space
            curve = [(s, self.sign * v) for s, v in r.intermediate if v is not None and math.isfinite(v)]
            last = curve[-1][0] if curve else -1
            if r.state in PENDING:
                pending.append((x, last))
            for lv in self.levels:
                v = value_at(curve, lv)
                if v is not None:
                    seen[lv].append((x, v))
                elif (r.state == "failed" or r.state == "stopped" and self.stopped == "bad") and last < lv:
                    bad[lv].append(x)  # never got there: the stopper (or the trial itself) ended it below
            if r.state == "succeeded" and r.objective is not None and math.isfinite(r.objective):
                seen[FINAL].append((x, self.sign * r.objective))
                finished.append((curve, self.sign * r.objective))
            elif r.state == "failed" or r.state == "stopped" and self.stopped == "bad":
                bad[FINAL].append(x)
            elif r.state == "stopped" and self.stopped == "predict" and curve:
                stopped.append((x, curve))
        for x, curve in stopped:
            guess = self._predicted_final(curve, finished)
            if guess is not None:
                seen[FINAL].append((x, guess))
        return seen, bad, pending

    def _predicted_final(self, curve: list[tuple[int, float]], finished: list[tuple[list[tuple[int, float]], float]],
                         k: int = 3) -> float | None:
        """stopped: predict: a stopped trial's final value, the median final value of the ``k`` finished
        trials whose values at its highest rung were nearest its own (None before ``k`` such trials)."""
        reached = [lv for lv in self.levels if value_at(curve, lv) is not None]
        if not reached:
            return None
        mine = value_at(curve, reached[-1])
        assert mine is not None
        near = sorted((abs(v - mine), final) for c, final in finished for v in [value_at(c, reached[-1])]
                      if v is not None)
        if len(near) < k:
            return None
        finals = sorted(final for _, final in near[:k])
        return finals[k // 2] if k % 2 else (finals[k // 2 - 1] + finals[k // 2]) / 2

    @staticmethod
    def _where(level: Any) -> str:
        return "the final values" if level == FINAL else "the furthest rung of each trial" if level == "rank" \
            else f"step {level}"

    def _ranked(self, history: list[TrialRecord]) -> list[tuple[Any, tuple[int, float]]]:
        """Every ended or running trial with a value, ranked as optuna's TPE ranks pruned trials:
        the further it got (rung reached), the better; then its value there."""
        from autoresearch.loop.proposers._parzen import encode

        out = []
        for r in [*self.ctx.warm, *history]:
            x = encode(self.dims, r.params) if r.role == "explore" else None
            if x is None:
                continue
            curve = [(s, self.sign * v) for s, v in r.intermediate if v is not None and math.isfinite(v)]
            if r.state == "succeeded" and r.objective is not None and math.isfinite(r.objective):
                out.append((x, (-len(self.levels) - 1, self.sign * r.objective)))
                continue
            reached = [(k, v) for k, lv in enumerate(self.levels) for v in [value_at(curve, lv)] if v is not None]
            if reached:
                out.append((x, (-reached[-1][0], reached[-1][1])))
            elif r.state == "failed":
                out.append((x, (1, math.inf)))
        return out

    def _fits(self, seen: dict[float, list[tuple[Any, float]]], bad: dict[float, list[Any]]) -> list[Any]:
        """fit: all: (weight, level, good rows, bad rows) for every level with ``min_points``
        observations, ascending. The highest weighs 1; a lower one as its ranking agrees with the
        highest's on the trials that reached both (Kendall's tau, floored at 0; MFES-HB weighs its
        per-fidelity models the same way), or as its share of the highest's steps when fewer than
        3 trials reached both."""
        import numpy as np

        levels = [lv for lv in [*self.levels, FINAL] if len(seen[lv]) >= self.min_points]
        if not levels:
            return []
        top = levels[-1]
        top_of = {x.tobytes(): v for x, v in seen[top]}
        end = self.top_step()
        out = []
        for lv in levels:
            obs = sorted(seen[lv], key=lambda xv: xv[1])
            n_good = max(1, math.ceil(self.gamma * len(obs)))
            weight = 1.0
            if lv != top:
                pairs = [(v, top_of[x.tobytes()]) for x, v in obs if x.tobytes() in top_of]
                if len(pairs) >= 3:
                    signs = [np.sign(a[0] - b[0]) * np.sign(a[1] - b[1]) for i, a in enumerate(pairs)
                             for b in pairs[i + 1:]]
                    weight = max(0.0, float(np.mean(signs)))
                else:
                    weight = (lv if lv != FINAL else end) / (top if top != FINAL else end)
            if weight > 0:
                out.append((weight, lv, np.array([x for x, _ in obs[:n_good]]),
                            [x for x, _ in obs[n_good:]] + bad[lv]))
        return out

    def _design_size(self) -> int:
        """init: lhs: trials spread by the design: the start-up (``min_points``) plus a generation."""
        return self.min_points + max(1, int(self.plan.budget.parallel or 1))

    def _design_row(self, k: int, rng: Any) -> Any:
        """Row ``k`` of a Latin hypercube of :meth:`_design_size` rows, drawn once from the seed: each
        range cut into that many strata (a choice: its options spread evenly over them), every
        stratum of every parameter used once. A parameter with a prior samples it instead."""
        import numpy as np

        from autoresearch.loop.proposers._parzen import sample_prior

        m = self._design_size()
        if self.design is None:
            seed = self.plan.proposer.seed if self.plan.proposer.seed is not None else 0
            g = np.random.default_rng([abs(int(seed)) % 2**32, 0x1A5])
            self.design = (np.argsort(g.random((m, len(self.dims))), axis=0) + g.random((m, len(self.dims)))) / m
        row = sample_prior(self.dims, rng)
        for j, d in enumerate(self.dims):
            if d.prior is not None:
                continue
            u = float(self.design[k % m, j])
            row[j] = float(min(len(d.choices) - 1, int(u * len(d.choices)))) if d.choices else u
        return row

    def top_step(self) -> float:
        es = self.plan.early_stop
        top = getattr(es, "max_steps", None) if es is not None else None
        return float(top or (self.levels[-1] * 3 if self.levels else 1))

    def _best_of_fits(self, fits: list[Any], pending: list[Any], batch: list[Any], anchors: Any, rng: Any) -> Any:
        """The candidate (drawn from the good densities, as many from each as its weight's share)
        with the highest weighted sum of log good/bad ratios over the levels. A trial in flight below
        a level, and the batch's earlier proposals, count as bad there (constant liar)."""
        import numpy as np

        from autoresearch.loop.proposers._parzen import Parzen

        total = sum(w for w, *_ in fits)
        models, cands = [], []
        for w, lv, good_x, bad_x in fits:
            good = Parzen(self.dims, good_x, user_prior=True, anchors=anchors,
                          anchor_confidence=getattr(self, "llm_conf", 0.5))
            rest = bad_x + [x for x, last in pending if last < lv] + batch
            models.append((w / total, good, Parzen(self.dims, np.array(rest).reshape(-1, len(self.dims)), False)))
            cands.append(good.sample(rng, max(1, round(self.candidates * w / total))))
        pool = np.concatenate(cands)
        score = sum(w * (g.logpdf(pool) - b.logpdf(pool)) for w, g, b in models)
        return pool[int(np.argmax(score))]

    def propose(self, history: list[TrialRecord], n: int) -> ProposeResult:
        import numpy as np

        from autoresearch.loop.proposers._parzen import Parzen, best_candidate, decode, sample_prior

        if not self.dims:  # nothing to search (the plan's default proposer on a plan without space:)
            return ProposeResult([Proposal({}, rationale="no space: to search") for _ in range(n)], self.info(),
                                 rationale="the plan has no space: each trial runs the command as it is")
        asked = self._ask_llm(history) if self.llm is not None and self.anchors is None else None
        anchors = self.anchors if self.anchors is not None and len(self.anchors) else None
        explore = sum(1 for r in history if r.role == "explore")
        seed = self.plan.proposer.seed if self.plan.proposer.seed is not None else 0
        rng = np.random.default_rng([abs(int(seed)) % 2**32, explore])
        seen, bad, pending = self._observations(history)
        level = next((lv for lv in [FINAL, *reversed(self.levels)] if len(seen[lv]) >= self.min_points), None)
        taken = {canonical(r.params) for r in [*history]}
        proposals = []
        model_used = 0
        good_x: Any = None
        bad_x: list[Any] = []
        fits: list[Any] = []
        if self.fit == "rank":
            ranked = self._ranked(history)
            level = "rank" if len(ranked) >= self.min_points else None  # type: ignore[assignment]
            if level is not None:
                ranked.sort(key=lambda xk: xk[1])
                n_good = max(1, math.ceil(self.gamma * len(ranked)))
                good_x = np.array([x for x, _ in ranked[:n_good]])
                bad_x = [x for x, _ in ranked[n_good:]]
                seen[level] = [(x, 0.0) for x, _ in ranked]  # type: ignore[index]
                bad[level] = []  # type: ignore[index]
        elif self.fit == "all":
            fits = self._fits(seen, bad)
            level = fits[-1][1] if fits else None
        elif level is not None:
            obs = sorted(seen[level], key=lambda xv: xv[1])
            n_good = max(1, math.ceil(self.gamma * len(obs)))
            good_x = np.array([x for x, _ in obs[:n_good]])
            bad_x = [x for x, _ in obs[n_good:]] + bad[level]
        # In flight and not yet at the level the model is fitted at: a lie ("bad") until it gets there.
        cut = math.inf if level is None or level == FINAL else level if level != "rank" else \
            (self.levels[0] if self.levels else math.inf)
        lies: list[Any] = [x for x, last in pending if last < cut]
        batch: list[Any] = []  # this call's proposals so far
        for _ in range(n):
            unused = [a for a in (anchors if anchors is not None else []) if canonical(decode(self.dims, a)) not in taken]
            for _attempt in range(10):
                if level is None and unused:
                    row, how = unused[0], "llm"  # the model's own suggestion first
                elif level is None and self.init == "lhs" and explore + len(batch) < self._design_size():
                    row, how = self._design_row(explore + len(batch), rng), "design"
                elif level is None or rng.random() < self.random_fraction:
                    row, how = sample_prior(self.dims, rng), "prior sample"
                    if anchors is not None:
                        row = Parzen(self.dims, np.zeros((0, len(self.dims))), True, anchors=anchors,
                                     anchor_confidence=self.llm_conf).sample(rng, 1)[0]
                elif self.fit == "all":
                    row, how = self._best_of_fits(fits, pending, batch, anchors, rng), "model"
                else:
                    good = Parzen(self.dims, good_x, user_prior=True, anchors=anchors,
                                  anchor_confidence=getattr(self, "llm_conf", 0.5))
                    rest = np.array(bad_x + lies) if bad_x or lies else np.zeros((0, len(self.dims)))
                    row, how = best_candidate(good, Parzen(self.dims, rest, user_prior=False), rng,
                                              self.candidates), "model"
                params = decode(self.dims, row)
                if canonical(params) not in taken:
                    break
            taken.add(canonical(params))
            lies.append(row)
            batch.append(row)
            model_used += how == "model"
            where = self._where(level)
            why = f"BOHB model at {where} ({len(seen[level])} trials there)" if how == "model" and level is not None \
                else "the LLM's suggestion (prior)" if how == "llm" \
                else "a cell of the start-up Latin hypercube" if how == "design" \
                else "sample of the prior (random where no prior is given)"
            proposals.append(Proposal(params, rationale=why))
        if level is None:
            most = max(((len(v), lv) for lv, v in seen.items()), default=(0, FINAL))
            phase = (f"start-up: no level has {self.min_points} observations yet (most: {most[0]}); "
                     "sampling the prior")
        else:
            phase = (f"model fitted at {self._where(level)}: "
                     f"{len(seen[level])} trials there, {len(bad[level])} known worse, {len(pending)} in flight; "
                     f"{model_used}/{n} from the model")
        phase += getattr(self, "llm_note", "") if asked is not None or self.llm is not None and explore == 0 else ""
        out = ProposeResult(proposals, self.info(), rationale=phase)
        if asked is not None:  # its tokens and dollars count against budget.llm_usd
            out.tokens_in, out.tokens_out, out.cost_usd, out.calls = (asked.tokens_in, asked.tokens_out,
                                                                      asked.cost_usd, asked.calls)
        return out
