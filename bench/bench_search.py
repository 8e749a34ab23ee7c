"""The search benchmark (not a test): strategies x seeds x workloads on recorded learning curves.

Each workload is a table of real training curves (bench/record_curves.py, shipped in
autoresearch/sim/data/); each run replays one strategy with one seed on ``--parallel`` simulated
workers until ``--budget`` full trainings' worth of epochs are spent
(:mod:`autoresearch.sim.replay`). Compute is epochs consumed by all trials, stopped ones
included. The workloads and seeds are split into a development set and a test set
(autoresearch/sim/data/split.json, :mod:`autoresearch.sim.benchset`): defaults are chosen on the
development set only (``--tune``, which refuses test workloads and seeds); the test set is reported
(``--set test``, the default). Per workload:

* **target**: the final value that the best ``--top`` (5%) of the recorded configs reach when
  fully trained. **compute-to-target**: epochs consumed when a fully trained trial first reaches
  it (a run that never does within the budget counts as infinite: "hit" says how many did).
* **best at fixed compute**: the best fully trained value found within the budget.
* **anytime curves**: the median (over seeds) best value so far against compute, as regret
  above the table's best config, in a PNG.

Printed: median and IQR of compute-to-target, its ratio to the reference (Optuna TPE + Hyperband
on our rungs), best at the budget; then our default against each baseline: the ratio per workload
with a bootstrap interval, the final values side by side with a Mann-Whitney test, the worst
workload and the geometric mean; then the A/A check (our random search against Optuna's
RandomSampler, ``--aa-seeds`` seeds): the two must agree within noise.

    python bench/bench_search.py [--set test|dev] [--seeds 20] [--parallel 4] [--budget 40] [--jobs 1]
        [--strategies bohb+hyperband optuna:tpe+hb ...] [--png docs/search-benchmark.png] [--json out.json]
    python bench/bench_search.py --tune bohb+hyperband "bohb[fit=all]+hyperband" ...   # dev set only
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_runtime import pct  # noqa: E402

DATA = ROOT / "autoresearch" / "sim" / "data"
OURS = "bohb+hyperband"  # the loop's default proposer + stopper (a plan that names no kind)
# Optuna on our rungs (hb, sh-matched: min 1 epoch, factor 3, max 27) and on its own defaults (sh: factor 4;
# hb-default: max resource auto); then external tools where they are installed (bench/baselines.py)
DEFAULT = [OURS, "tpe+asha", "random", "optuna:tpe+hb", "optuna:tpe+sh-matched", "optuna:tpe+sh", "optuna:tpe+hb-default",
           "optuna:tpe", "optuna:random"]
REFERENCE = "optuna:tpe+hb"  # the goal's baseline: Optuna TPE + Hyperband on matched rungs
BASELINE_PREFIXES = ("optuna:", "smac:", "dehb", "synetune:")
FLOOR = 1e-4  # regret 0 (the table's best config found) drawn here on the log scale


def one(args: tuple[str, str, int, int, int, float, int]) -> dict[str, Any]:
    """One replayed run, summarized (runs in a worker process)."""
    from autoresearch.sim.curves import CurveTable
    from autoresearch.sim.replay import replay, run_strategy, target_of
    from bench.baselines import is_external, make_external

    path, strategy, seed, parallel, budget_trainings, top, grid = args
    table = CurveTable.load(path)
    budget = budget_trainings * table.max_step
    t0 = time.perf_counter()
    if is_external(strategy):
        searcher = make_external(strategy, table, seed=seed, parallel=parallel)
        try:
            run = replay(table, searcher, parallel=parallel, budget=budget, strategy=strategy, seed=seed)
        finally:
            searcher.close()
    else:
        run = run_strategy(strategy, table, seed=seed, parallel=parallel, budget=budget)
    target = target_of(table, top)
    steps = [budget * (i + 1) / grid for i in range(grid)]
    return {"workload": table.workload, "mode": table.mode, "strategy": strategy, "seed": seed,
            "compute_to_target": run.compute_to(target),
            "best": run.best_at(budget), "anytime": [run.best_at(c) for c in steps], "grid": steps,
            "trials": run.trials, "stopped": run.stopped, "completed": run.completed, "compute": run.compute,
            "wall_s": time.perf_counter() - t0}


def run_all(paths: list[Path], strategies: list[str], seeds: list[int], parallel: int, budget: int, top: float,
            jobs: int, grid: int = 60) -> list[dict[str, Any]]:
    work = [(str(p), s, seed, parallel, budget, top, grid) for p in paths for s in strategies for seed in seeds]
    if jobs <= 1:
        out = []
        for i, w in enumerate(work):
            out.append(one(w))
            print(f"  [{i + 1}/{len(work)}] {w[1]} seed {w[2]} {Path(w[0]).name}: "
                  f"{out[-1]['compute_to_target']} ({out[-1]['wall_s']:.1f}s)", file=sys.stderr, flush=True)
        return out
    with ProcessPoolExecutor(jobs) as pool:
        return list(pool.map(one, work))


def fmt(x: float) -> str:
    return "never" if math.isinf(x) else f"{x:.0f}"


def summarize(results: list[dict[str, Any]], strategies: list[str], budget: int) -> str:
    lines = []
    by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in results:
        by.setdefault((r["workload"], r["strategy"]), []).append(r)
    workloads = sorted({r["workload"] for r in results})
    head = (f"{'workload':16s} {'strategy':26s} {'c2t median':>10s} {'IQR':>13s} {'hit':>6s} {'x ' + REFERENCE:>17s} "
            f"{'95% CI':>13s} {'best@budget':>12s} {'trials':>7s} {'stopped':>8s}")
    lines += [head, "-" * len(head)]
    ratios: dict[str, list[float]] = {}
    for w in workloads:
        # "never" counts as the budget in the ratio: a lower bound on that run's compute-to-target, so the
        # ratio of a strategy that hits more often than the reference is an upper bound (in the reference's favour)
        cap = max(r["grid"][-1] for r in results if r["workload"] == w)
        ref = [min(r["compute_to_target"], cap) for r in by.get((w, REFERENCE), [])]
        ref_median = statistics.median(ref) if ref else math.nan
        for s in strategies:
            rows = by.get((w, s), [])
            if not rows:
                continue
            c2t = [r["compute_to_target"] for r in rows]
            med = statistics.median(c2t)
            capped = [min(x, cap) for x in c2t]
            ratio = statistics.median(capped) / ref_median if ref and ref_median > 0 else math.nan
            ci = boot_ratio(capped, ref) if ref and s != REFERENCE else "-"
            ratios.setdefault(s, []).append(ratio)
            bests = [r["best"] for r in rows if r["best"] is not None]
            best = f"{statistics.median(bests):.4g}" if bests else "-"
            hits = sum(1 for x in c2t if math.isfinite(x))
            iqr = f"{fmt(pct(c2t, 0.25))}-{fmt(pct(c2t, 0.75))}"
            lines.append(f"{w:16s} {s:26s} {fmt(med):>10s} {iqr:>13s} {hits:>3d}/{len(c2t):<2d} "
                         f"{ratio:>17.2f} {ci:>13s} {best:>12s} {statistics.median(r['trials'] for r in rows):>7.0f} "
                         f"{statistics.median(r['stopped'] for r in rows):>8.0f}")
        lines.append("")
    lines.append(f"ratios: median compute-to-target / {REFERENCE}'s, a run that never reached the target counted "
                 f"as the budget; 95% CI: bootstrap over seeds")
    lines.append(f"geometric mean over workloads of the ratio to {REFERENCE}:")
    for s, rs in ratios.items():
        finite = [r for r in rs if math.isfinite(r) and r > 0]
        gm = math.exp(sum(math.log(r) for r in finite) / len(finite)) if finite else math.nan
        lines.append(f"  {s:26s} {gm:.2f}" + ("" if len(finite) == len(rs) else f" ({len(rs) - len(finite)} "
                                                                               "workload(s) without a ratio)"))
    return "\n".join(lines)


def boot_ratio(xs: list[float], refs: list[float], resamples: int = 2000) -> str:
    """A bootstrap 95% interval of median(xs) / median(refs) (a median of "never" is infinite)."""
    rng = random.Random(1)
    out = []
    for _ in range(resamples):
        a = statistics.median(rng.choices(xs, k=len(xs)))
        b = statistics.median(rng.choices(refs, k=len(refs)))
        if math.isinf(a) and math.isinf(b):
            out.append(math.nan)
        else:
            out.append(0.0 if math.isinf(b) else math.inf if math.isinf(a) else a / b)
    finite = sorted(x for x in out if not math.isnan(x))
    if len(finite) < resamples / 2:
        return "-"
    lo, hi = finite[int(0.025 * len(finite))], finite[min(len(finite) - 1, int(0.975 * len(finite)))]
    return f"[{lo:.2f},{hi:.2f}]"


def median_str(xs: list[float]) -> str:
    return f"{statistics.median(xs):.4g}" if xs else "-"


def is_baseline(strategy: str) -> bool:
    return strategy.startswith(BASELINE_PREFIXES)


def compare(results: list[dict[str, Any]], ours: str, baselines: list[str]) -> str:
    """``ours`` against each baseline, per workload: the ratio of median compute-to-target ("never"
    counted as the budget) with a bootstrap 95% interval and the hit counts; the median final value at
    the budget of each, with a two-sided Mann-Whitney test; then the worst workload and the geometric mean."""
    from scipy.stats import mannwhitneyu

    by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in results:
        by.setdefault((r["workload"], r["strategy"]), []).append(r)
    workloads = sorted({r["workload"] for r in results})
    lines = [f"{ours} against each baseline: compute-to-target ratio [95% CI] and hits; final value at the budget "
             "(median, ours vs theirs; Mann-Whitney p, two-sided; 'worse'/'better' where p < 0.05)"]
    for b in baselines:
        if b == ours or not any((w, b) in by for w in workloads):
            continue
        lines.append(f"  vs {b}")
        ratios: list[tuple[float, str]] = []
        worse: list[str] = []
        for w in workloads:
            mine, theirs = by.get((w, ours), []), by.get((w, b), [])
            if not mine or not theirs:
                continue
            cap = max(r["grid"][-1] for r in mine + theirs)
            xa = [min(r["compute_to_target"], cap) for r in mine]
            xb = [min(r["compute_to_target"], cap) for r in theirs]
            ratio = statistics.median(xa) / statistics.median(xb)
            ratios.append((ratio, w))
            hits_a = sum(1 for r in mine if math.isfinite(r["compute_to_target"]))
            hits_b = sum(1 for r in theirs if math.isfinite(r["compute_to_target"]))
            fa = [r["best"] for r in mine if r["best"] is not None]
            fb = [r["best"] for r in theirs if r["best"] is not None]
            verdict, p = "", math.nan
            if fa and fb:
                try:
                    p = float(mannwhitneyu(fa, fb).pvalue)
                except ValueError:
                    p = 1.0
                if p < 0.05:
                    maximize = mine[0].get("mode") == "max"
                    ahead = statistics.median(fa) > statistics.median(fb) if maximize else \
                        statistics.median(fa) < statistics.median(fb)
                    verdict = "better" if ahead else "worse"
                    if not ahead:
                        worse.append(w)
            lines.append(f"    {w:16s} {ratio:6.2f} {boot_ratio(xa, xb):>13s}  hit {hits_a:>2d}/{len(xa)} vs "
                         f"{hits_b:>2d}/{len(xb)}   final {median_str(fa):>8s} vs {median_str(fb):>8s}  p={p:.2f} {verdict}")
        if ratios:
            worst = max(ratios)
            finite = [r for r, _ in ratios if math.isfinite(r) and r > 0]
            gm = math.exp(sum(map(math.log, finite)) / len(finite)) if finite else math.nan
            lines.append(f"    worst {worst[1]} {worst[0]:.2f}x, geometric mean {gm:.2f}x over {len(ratios)} workloads; "
                         f"<= 0.5x on every workload: {'yes' if worst[0] <= 0.5 else 'no'}; final value worse on: "
                         f"{', '.join(worse) or 'none'}")
    return "\n".join(lines)


def rank(results: list[dict[str, Any]], candidates: list[str], reference: str) -> str:
    """The tuning helper's answer: candidates by their worst and geometric-mean ratio to ``reference``."""
    rows = []
    for c in candidates:
        ratios = []
        for w in sorted({r["workload"] for r in results}):
            mine = [r for r in results if r["workload"] == w and r["strategy"] == c]
            ref = [r for r in results if r["workload"] == w and r["strategy"] == reference]
            if not mine or not ref:
                continue
            cap = max(r["grid"][-1] for r in mine + ref)
            ratios.append(statistics.median(min(r["compute_to_target"], cap) for r in mine)
                          / statistics.median(min(r["compute_to_target"], cap) for r in ref))
        if ratios:
            gm = math.exp(sum(math.log(max(r, 1e-9)) for r in ratios) / len(ratios))
            rows.append((max(ratios), gm, c))
    lines = [f"tuning (development workloads and seeds only): candidates by worst, then geometric-mean ratio to "
             f"{reference}"]
    lines += [f"  {c:40s} worst {w:.2f}x  mean {gm:.2f}x" for w, gm, c in sorted(rows)]
    return "\n".join(lines)


def aa_check(results: list[dict[str, Any]], a: str, b: str, resamples: int = 2000) -> str:
    """Random search in both tools must agree within noise: the ratio of median compute-to-target
    with a bootstrap 90% interval, and a Mann-Whitney U test, per workload."""
    from scipy.stats import mannwhitneyu

    lines = [f"A/A check: {a} vs {b} (same random search in both tools; medians of compute-to-target)"]
    rng = random.Random(0)
    for w in sorted({r["workload"] for r in results}):
        xa = [r["compute_to_target"] for r in results if r["workload"] == w and r["strategy"] == a]
        xb = [r["compute_to_target"] for r in results if r["workload"] == w and r["strategy"] == b]
        if not xa or not xb:
            continue
        boot = []
        for _ in range(resamples):
            ma = statistics.median(rng.choices(xa, k=len(xa)))
            mb = statistics.median(rng.choices(xb, k=len(xb)))
            if math.isfinite(ma) and math.isfinite(mb) and mb > 0:
                boot.append(ma / mb)
        big = 10.0 * max(x for x in xa + xb if math.isfinite(x)) if any(map(math.isfinite, xa + xb)) else 1.0
        p = mannwhitneyu([min(x, big) for x in xa], [min(x, big) for x in xb]).pvalue
        ma, mb = statistics.median(xa), statistics.median(xb)
        ci = f"[{pct(boot, 0.05):.2f}, {pct(boot, 0.95):.2f}]" if boot else "[-]"
        lines.append(f"  {w:16s} {fmt(ma):>6s} vs {fmt(mb):>6s}  ratio {ma / mb if mb else math.nan:.2f} "
                     f"90% CI {ci}  Mann-Whitney p={p:.2f}  ({len(xa)} seeds each)")
    return "\n".join(lines)


def plot(results: list[dict[str, Any]], strategies: list[str], png: Path, top: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from autoresearch.sim.curves import CurveTable

    workloads = sorted({r["workload"] for r in results})
    best_of = {w: min(CurveTable.load(DATA / f"{w}.json.gz").finals()) for w in workloads}
    cols = 2
    rows = math.ceil(len(workloads) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(11, 4 * rows), squeeze=False)
    for ax, w in zip(axes.flat, workloads, strict=False):
        from autoresearch.sim.replay import target_of

        target = target_of(CurveTable.load(DATA / f"{w}.json.gz"), top)
        for s in strategies:
            rows_ = [r for r in results if r["workload"] == w and r["strategy"] == s]
            if not rows_:
                continue
            grid = rows_[0]["grid"]
            median = []
            for i in range(len(grid)):
                vals = [r["anytime"][i] for r in rows_]
                vals = [max(v - best_of[w], FLOOR) if v is not None else math.inf for v in vals]
                median.append(statistics.median(vals))
            style = "--" if is_baseline(s) else "-"  # one colour per strategy in every panel
            ax.plot(grid, [m if math.isfinite(m) else math.nan for m in median], style, label=s,
                    color=f"C{strategies.index(s) % 10}")
        ax.axhline(max(target - best_of[w], FLOOR), color="grey", lw=0.8, ls=":", label=f"target (top {top:.0%})")
        ax.set_yscale("log")
        ax.set_title(w)
        ax.set_xlabel("compute (epochs, all trials)")
        ax.set_ylabel("median regret (best so far - table's best)")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(workloads):]:
        ax.axis("off")
    for ax in list(axes.flat)[: len(workloads)]:
        ax.legend(fontsize=7)  # each panel names what it draws (a strategy run on other workloads only is not here)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=90)


def main() -> None:
    from autoresearch.errors import SpecError
    from autoresearch.sim.benchset import check_tuning, load_split

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", choices=("test", "dev"), default="test",
                    help="the split's workloads and seeds to run (autoresearch/sim/data/split.json)")
    ap.add_argument("--tune", nargs="+", metavar="STRATEGY",
                    help="rank candidate defaults against the reference on the development set (refuses test)")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--seed-start", type=int, help="first seed (default: the set's first seed in the split)")
    ap.add_argument("--aa-seeds", type=int, default=40, help="seeds of the A/A check (random in both tools)")
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--budget", type=int, default=40, help="compute budget per run, in full trainings (x max_step)")
    ap.add_argument("--top", type=float, default=0.05, help="target: the value the best TOP of configs reach")
    ap.add_argument("--strategies", nargs="+", default=DEFAULT)
    ap.add_argument("--ours", default=OURS, help="the strategy compared against each baseline")
    ap.add_argument("--workloads", nargs="+", help="table names under autoresearch/sim/data (default: the set's)")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes")
    ap.add_argument("--png", type=Path, help="anytime curves (e.g. docs/search-benchmark.png)")
    ap.add_argument("--json", type=Path, help="every run's summary")
    ap.add_argument("--load", type=Path, nargs="+", help="summarize and plot earlier --json files (no runs)")
    args = ap.parse_args()
    split = load_split()
    part = split.part("dev" if args.tune else args.set)
    names = args.workloads or list(part.workloads)
    seed_start = part.seeds.start if args.seed_start is None else args.seed_start
    seeds = list(range(seed_start, seed_start + args.seeds))
    if args.tune:
        try:
            check_tuning(names, seeds, split)  # a default is never chosen on a test workload or seed
        except SpecError as err:
            sys.exit(f"bench_search --tune: {err} ({err.hint})" if getattr(err, "hint", None) else
                     f"bench_search --tune: {err}")
        args.strategies = list(dict.fromkeys([*args.tune, REFERENCE]))
        args.aa_seeds = 0
    paths = [DATA / f"{w}.json.gz" for w in names]
    missing = [p.name for p in paths if not p.exists()]
    if missing and not args.load:
        sys.exit(f"no recorded table for {', '.join(missing)} (bench/record_curves.py --only NAME)")
    t0 = time.perf_counter()
    aa = [s for s in ("random", "optuna:random") if s in args.strategies]
    if args.load:
        results = [r for f in args.load for r in json.loads(f.read_text())
                   if r["strategy"] in args.strategies and r["workload"] in names]
        paths = sorted({DATA / f"{r['workload']}.json.gz" for r in results})
    else:
        results = run_all(paths, args.strategies, seeds, args.parallel, args.budget, args.top, args.jobs)
    if len(aa) == 2 and args.aa_seeds > args.seeds and not args.load:
        results += run_all(paths, aa, list(range(seed_start + args.seeds, seed_start + args.aa_seeds)),
                           args.parallel, args.budget, args.top, args.jobs)
    budget = statistics.median(r["grid"][-1] for r in results) if results else 0
    print(f"search benchmark ({'tuning on the dev' if args.tune else args.set} set): {len(paths)} workloads "
          f"({', '.join(p.name.removesuffix('.json.gz') for p in paths)}), {args.seeds} seeds from {seed_start}, "
          f"parallel {args.parallel}, budget {budget:.0f} epochs per run, target = top {args.top:.0%} of recorded "
          f"configs ({time.perf_counter() - t0:.0f}s)\n")
    main_results = [r for r in results if r["seed"] in seeds]
    print(summarize(main_results, args.strategies, args.budget))
    if args.tune:
        print()
        print(rank(main_results, args.tune, REFERENCE))
    elif args.ours in args.strategies:
        print()
        print(compare(main_results, args.ours, [s for s in args.strategies if s != args.ours]))
    if len(aa) == 2:
        print()
        print(aa_check(results, "random", "optuna:random"))
    if args.png:
        plot(main_results, args.strategies, args.png, args.top)
        print(f"\nanytime curves: {args.png}")
    if args.json:
        args.json.write_text(json.dumps(results, default=str))


if __name__ == "__main__":
    main()
