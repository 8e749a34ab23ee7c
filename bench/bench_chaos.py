"""Chaos benchmark (not a test): ``kill -9`` of the loop controller at random points, many
times, over several loops; one row per loop, then the totals.

Each loop: ``--kills`` lives of ``autoresearch plan.yaml`` (a real process, MLflow tracking and
the background syncer on, ``sleep``-like trials, repeats on), each ended by ``kill -9`` early
(starting, waiting for its trials' MLflow runs) or a few decisions into its work, a resume
after each, then a run to the end and ``autoresearch sync``. Counted: trials lost (not ended,
or decided without a job), duplicates (a trial with two jobs or two launch decisions),
orphans (processes of the home alive at the end), MLflow runs not ended.

    python bench/bench_chaos.py                      # 5 loops x 16 kills (several minutes)
    python bench/bench_chaos.py --loops 2 --kills 8 --trials 12 --seed 3
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.loop.chaos import ChaosResult, run_chaos  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--loops", type=int, default=5)
    parser.add_argument("--kills", type=int, default=16)
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--parallel", type=int, default=3)
    parser.add_argument("--sleep", type=float, default=0.5, help="seconds each trial sleeps")
    parser.add_argument("--seed", type=int, default=0, help="loop i uses seed + i")
    args = parser.parse_args()

    header = f"{'loop':>4} {'seed':>5} {'kills':>5} {'trials':>6} {'launched':>8} {'lost':>4} {'dup':>4} " \
             f"{'orphans':>7} {'runs not ended':>14} {'wall s':>7}"
    print(header)
    print("-" * len(header))
    results: list[ChaosResult] = []
    for i in range(args.loops):
        with tempfile.TemporaryDirectory(prefix="bench-chaos-") as root:
            r = run_chaos(Path(root), kills=args.kills, trials=args.trials, parallel=args.parallel,
                          sleep=args.sleep, seed=args.seed + i)
        results.append(r)
        print(f"{i + 1:>4} {args.seed + i:>5} {r.kills:>5} {r.trials:>6} {r.launched:>8} {len(r.lost):>4} "
              f"{len(r.duplicates):>4} {len(r.orphans):>7} {len(r.runs_not_ended):>14} {r.wall_s:>7.1f}", flush=True)
        for line in r.lost + r.duplicates + r.orphans + r.runs_not_ended:
            print(f"     ! {line}")
        if r.final_rc != 0:
            print(f"     ! the final run exited {r.final_rc}")
    print("-" * len(header))
    total = sum
    print(f"{'all':>4} {'':>5} {total(r.kills for r in results):>5} {total(r.trials for r in results):>6} "
          f"{total(r.launched for r in results):>8} {total(len(r.lost) for r in results):>4} "
          f"{total(len(r.duplicates) for r in results):>4} {total(len(r.orphans) for r in results):>7} "
          f"{total(len(r.runs_not_ended) for r in results):>14} {total(r.wall_s for r in results):>7.1f}")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
