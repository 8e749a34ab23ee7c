"""The pure scheduler's fair share, quotas, best-effort backfill and gang placement (issue 11)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from autoresearch.engine.scheduler import FairShare, NodeState, Pending, Running, Share, schedule


def node(name: str = "n1", gpus: int = 2, **kw: object) -> NodeState:
    return NodeState(name, tuple(str(i) for i in range(gpus)), **kw)  # type: ignore[arg-type]


def run(job_id: int, project: str, node_name: str, ids: tuple[str, ...], priority: str = "normal",
        started: float = 0.0) -> Running:
    return Running(job_id, 1, priority, ((node_name, ids),), started, project=project)


def placed(out: object) -> list[int]:
    return [p.job_id for p in out.placements]  # type: ignore[attr-defined]


def test_without_fair_share_submit_order_wins() -> None:
    pending = [Pending(1, "normal", 1, project="a"), Pending(2, "normal", 1, project="a"),
               Pending(3, "normal", 1, project="b")]
    assert placed(schedule(pending, [node(gpus=2)], [])) == [1, 2]


def test_fair_share_serves_the_project_furthest_below_its_share() -> None:
    # a submitted a burst first; with fair share b's job goes before a's second one
    pending = [Pending(1, "normal", 1, project="a"), Pending(2, "normal", 1, project="a"),
               Pending(3, "normal", 1, project="b")]
    assert placed(schedule(pending, [node(gpus=2)], [], fair=FairShare())) == [1, 3]


def test_running_usage_counts_and_weights_scale_it() -> None:
    nodes = [node("n1", 4), node("n2", 4)]
    busy = [run(100, "a", "n1", ("0", "1"))]  # a holds 2 of 8 GPUs
    pending = [Pending(1, "normal", 1, project="a"), Pending(2, "normal", 1, project="b")]
    assert placed(schedule(pending, nodes, busy, fair=FairShare()))[0] == 2
    busy.append(run(101, "b", "n2", ("0",)))  # b: 1/8 = 0.125 at weight 1; a: 0.25/4 = 0.0625
    heavy = FairShare({"a": Share(weight=4.0)})
    assert placed(schedule(pending, nodes, busy, fair=heavy))[0] == 1
    assert placed(schedule(pending, nodes, busy, fair=FairShare()))[0] == 2


def test_priority_class_still_comes_first() -> None:
    busy = [run(100, "b", "n1", ("0",))]
    pending = [Pending(1, "normal", 1, project="a"), Pending(2, "critical", 1, project="b")]
    assert placed(schedule(pending, [node(gpus=2)], busy, fair=FairShare())) == [2]


def test_quota_caps_normal_work_but_not_best_effort_backfill() -> None:
    fair = FairShare({"a": Share(quota=2)})
    busy = [run(100, "a", "n1", ("0", "1"))]
    pending = [Pending(1, "normal", 1, project="a"), Pending(2, "critical", 1, project="a"),
               Pending(3, "best-effort", 2, project="a")]
    out = schedule(pending, [node("n1", 8)], busy, fair=fair)
    assert placed(out) == [3]  # the idle GPUs go to a's best-effort job, never past its quota otherwise
    # a quota counts the placements of the same pass too
    assert placed(schedule([Pending(i, "normal", 1, project="a") for i in range(5)], [node("n1", 8)], [],
                           fair=fair)) == [0, 1]
    # and a gang's every member
    assert placed(schedule([Pending(1, "normal", 1, 3, project="a")], [node(f"n{i}", 2) for i in range(3)], [],
                           fair=fair)) == []


def test_project_at_quota_neither_preempts_nor_reserves() -> None:
    fair = FairShare({"a": Share(quota=1)})
    busy = [run(100, "a", "n1", ("0",)), run(101, "b", "n1", ("1",), "best-effort")]
    out = schedule([Pending(1, "normal", 1, project="a", waited_s=10_000)], [node("n1", 2)], busy, fair=fair)
    assert out.preemptions == [] and out.reserved == {}
    other = schedule([Pending(1, "normal", 1, project="c")], [node("n1", 2)], busy, fair=fair)
    assert [p.job_id for p in other.preemptions] == [101]  # best-effort backfill is the first to go


def test_gang_is_all_or_nothing_on_distinct_nodes() -> None:
    nodes = [node("a", 2), node("b", 2), node("c", 1)]
    out = schedule([Pending(1, "normal", 2, 3)], nodes, [])
    assert out.placements == []
    out = schedule([Pending(1, "normal", 2, 2)], nodes, [])
    assert sorted(n for n, _ in out.placements[0].alloc) == ["a", "b"]


def test_packed_gang_splits_one_host_into_members() -> None:
    out = schedule([Pending(1, "normal", 2, 2)], [node("host", 4)], [], pack_gangs=True)
    assert out.placements[0].alloc == (("host", ("0", "1")), ("host", ("2", "3")))
    # all or nothing: 3 members of 2 GPUs do not fit in 4
    assert schedule([Pending(1, "normal", 2, 3)], [node("host", 4)], [], pack_gangs=True).placements == []
    # without packing, one host never holds a 2-member gang
    assert schedule([Pending(1, "normal", 2, 2)], [node("host", 4)], []).placements == []
    # CPU-only members
    out = schedule([Pending(1, "normal", 0, 2)], [node("host", 0, cpus=4.0)], [], pack_gangs=True)
    assert out.placements[0].alloc == (("host", ()), ("host", ()))


def test_a_packed_best_effort_gang_is_one_victim_and_frees_all_its_slots() -> None:
    gang = Running(100, 1, "best-effort", (("host", ("0", "1")), ("host", ("2", "3"))), cpus=1.0)
    out = schedule([Pending(1, "normal", 4, cpus=2.0)], [node("host", 4, cpus=4.0)], [gang], pack_gangs=True)
    assert [(p.job_id, p.attempt) for p in out.preemptions] == [(100, 1)]  # once, not once per member
    # its two members hold 2 of the 4 cores: a job needing 3 does not fit beside it, and 4 GPUs never do
    assert schedule([Pending(2, "best-effort", 0, cpus=3.0)], [node("host", 4, cpus=4.0)], [gang],
                    pack_gangs=True).placements == []


jobs_st = st.lists(st.tuples(st.sampled_from(["critical", "normal", "best-effort"]), st.integers(0, 4),
                             st.integers(1, 3), st.sampled_from(["a", "b", "c"])), max_size=25)


@settings(max_examples=150, deadline=None)
@given(jobs=jobs_st, sizes=st.lists(st.integers(0, 8), min_size=1, max_size=5),
       quotas=st.dictionaries(st.sampled_from(["a", "b", "c"]), st.integers(0, 10)),
       busy_be=st.booleans(), pack=st.booleans())
def test_fair_share_properties(jobs: list[tuple[str, int, int, str]], sizes: list[int], quotas: dict[str, int],
                               busy_be: bool, pack: bool) -> None:
    nodes = [node(f"n{i}", g) for i, g in enumerate(sizes)]
    busy = [run(1000 + i, "abc"[i % 3], n.name, n.gpu_ids[:1], "best-effort" if busy_be else "normal")
            for i, n in enumerate(nodes) if n.gpu_ids]
    fair = FairShare({p: Share(weight=1.0 + len(p), quota=q) for p, q in quotas.items()})
    pending = [Pending(i, pr, g, k, project=p) for i, (pr, g, k, p) in enumerate(jobs)]
    out = schedule(pending, nodes, busy, fair=fair, pack_gangs=pack)
    taken = {(n, g) for r in busy for n, ids in r.alloc for g in ids}
    held = {p: sum(len(ids) for n, ids in r.alloc) for p in "abc" for r in busy
            if r.project == p and r.priority != "best-effort"}
    by_id = {p.job_id: p for p in pending}
    for placement in out.placements:
        job = by_id[placement.job_id]
        assert len(placement.alloc) == job.nodes  # every member, or the job is not placed
        assert all(len(ids) == job.gpus for _, ids in placement.alloc)
        if not pack:
            assert len({n for n, _ in placement.alloc}) == job.nodes
        for name, ids in placement.alloc:
            for gpu in ids:
                assert (name, gpu) not in taken, "a slot was given twice"
                taken.add((name, gpu))
        if job.priority != "best-effort":
            held[job.project] = held.get(job.project, 0) + job.gpus * job.nodes
    for project, quota in quotas.items():
        before = sum(len(ids) for r in busy if r.project == project and r.priority != "best-effort"
                     for _, ids in r.alloc)
        assert held.get(project, 0) <= max(quota, before), "a project went past its quota"
