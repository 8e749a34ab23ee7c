"""An attempt's last checkpoint (``Running.saved_at``) weighs in a pass only as the price of stopping a
best-effort attempt, or of a normal one when a project has a guarantee (a reclaim), that is not stopping
already: the simulated fleet's driver leaves it out of every other attempt's view (autoresearch/sim/driver.py, ``Driver._view``) so that a checkpoint does not change what the
scheduler's kept records see. Seeded random passes on small clusters (preemption, fair share with quotas and
guarantees, reclaim, gangs, group caps): the decisions are the same whatever the other attempts' ``saved_at``."""

from __future__ import annotations

import random
from typing import Any

import pytest

from autoresearch.engine import scheduler as S

PRIORITIES = ("critical", "normal", "best-effort")


def _weighs(att: S.Running, fair: S.FairShare | None) -> bool:
    """Whether a pass may price the attempt's checkpoint: a best-effort one (preemption) and, with a
    guarantee set, a normal one (a reclaim stops borrowers' normal attempts); never one stopping already."""
    reclaims = fair is not None and any(s.guaranteed > 0 for s in fair.projects.values())
    return not att.stopping and (att.priority == "best-effort" or (att.priority == "normal" and reclaims))


@pytest.mark.parametrize("seed", [*range(30), 205, 387])  # (205, 387: a reclaim priced by a checkpoint)
def test_decisions_do_not_depend_on_the_checkpoints_of_attempts_no_one_prices(seed: int) -> None:
    rng = random.Random(seed)
    nodes = [S.NodeState(f"n{i}", tuple(str(g) for g in range(rng.choice((2, 4, 8)))), cpus=16.0, memory=64)
             for i in range(rng.randint(2, 6))]
    fair = S.FairShare({"a": S.Share(2.0, quota=rng.choice((None, 6))), "b": S.Share(1.0, guaranteed=4, borrow=8)},
                       half_life=3600.0) if seed % 2 else None
    running: list[S.Running] = []
    queue: list[S.Pending] = []
    t, next_id, differed = 0.0, 1, 0
    for _ in range(30):
        t += rng.choice((30.0, 300.0))
        for _ in range(rng.randint(0, 4)):
            queue.append(S.Pending(next_id, rng.choice(PRIORITIES), rng.choice((1, 2, 4, 8)), rng.choice((1, 1, 2)),
                                   rng.choice((0.0, 1.0)), waited_s=rng.choice((0.0, 1000.0)),
                                   project=rng.choice(("a", "b")), group=rng.choice(("", "g"))))
            next_id += 1
        running = [a for a in running if rng.random() > 0.1 and not (a.stopping and rng.random() < 0.5)]
        kwargs: dict[str, Any] = {"now": t, "fair": fair, "past": {"a": 100.0} if fair else None,
                                  "room": {"g": rng.randint(0, 3)}, "reserve_after_s": 300.0}
        left_out = [a if _weighs(a, fair) else a._replace(saved_at=None) for a in running]
        other = [a if _weighs(a, fair) else a._replace(saved_at=t - rng.uniform(0, 3000)) for a in running]
        want = S.schedule(list(queue), nodes, running, **kwargs)
        assert S.schedule(list(queue), nodes, left_out, **kwargs) == want
        assert S.schedule(list(queue), nodes, other, **kwargs) == want
        differed += left_out != running
        by_id = {p.job_id: p for p in queue}
        for p in want.placements:
            q = by_id[p.job_id]
            running.append(S.Running(q.job_id, 1, q.priority, p.alloc, started_at=t, cpus=q.cpus, memory=q.memory,
                                     project=q.project, saved_at=t + rng.choice((0.0, 60.0)) if rng.random() < 0.5
                                     else None))
        stopped = {(pre.job_id, pre.attempt) for pre in want.preemptions}
        running = [a._replace(stopping=True) if (a.job_id, a.attempt) in stopped else a for a in running]
        placed = {p.job_id for p in want.placements}
        queue = [p for p in queue if p.job_id not in placed]
    assert differed > 0 or seed % 7 == 6  # (the attempts' checkpoints did differ in most runs)
