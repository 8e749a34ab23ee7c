"""Fair share as fleets know it: past usage decayed with a half-life (Slurm's PriorityDecayHalfLife)
and quotas guaranteed and borrowable (Kueue's nominalQuota and borrowingLimit), in the pure scheduler."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoresearch.engine import shares
from autoresearch.engine.scheduler import DAY, FairShare, Pending, Share, schedule
from tests.properties.test_scheduler_shortcuts import PENDING, _both, clusters
from tests.runtime.test_fair_share import node, placed, run

# -- decay -------------------------------------------------------------------------------------

def test_accrued_is_the_decayed_integral() -> None:
    h = 7 * DAY
    # a whole GPU for one half-life, ending now: tau * (1 - 1/2) = h / ln 2 / 2
    assert shares.accrued(1, -h, 0, 0, h) == pytest.approx(h / math.log(2) / 2)
    # the same hour a week ago counts half of the same hour just now
    recent = shares.accrued(8, -3600, 0, 0, h)
    week_ago = shares.accrued(8, -h - 3600, -h, 0, h)
    assert week_ago == pytest.approx(recent / 2, rel=1e-9)
    assert recent == pytest.approx(8 * 3600, rel=1e-2)  # an hour is a tiny part of a week: barely decayed
    assert shares.accrued(4, 10, 5, 20, h) == 0.0 and shares.accrued(0, 0, 10, 10, h) == 0.0
    assert shares.accrued(1, 0, 50, 10, h) == pytest.approx(shares.accrued(1, 0, 10, 10, h))  # to now at most


def test_decayed_accumulator_moves_on_without_rescanning() -> None:
    h = DAY
    acc = shares.Decayed(h)
    acc.advance(1000.0)
    acc.add("a", 2, 0.0, 1000.0)
    first = acc.usage["a"]
    assert first == pytest.approx(shares.accrued(2, 0, 1000, 1000, h))
    acc.advance(1000.0 + h)
    assert acc.usage["a"] == pytest.approx(first / 2)
    with_running = acc.now(1000.0 + h, [("b", 4, 1000.0 + h - 60)])
    assert with_running["b"] == pytest.approx(shares.accrued(4, 1000 + h - 60, 1000 + h, 1000 + h, h))
    assert "b" not in acc.usage  # running attempts are added to the answer, not kept


def test_a_project_that_used_a_lot_a_week_ago_counts_half_of_one_that_did_yesterday() -> None:
    """Two projects used the whole 8-GPU fleet for a day: a a week ago (one half-life), b yesterday.
    With equal weights and nothing running, a goes first, and its past share is half of b's."""
    h, now = 7 * DAY, 100 * DAY
    acc = shares.Decayed(h)
    acc.advance(now)
    acc.add("a", 8, now - 8 * DAY, now - 7 * DAY)
    acc.add("b", 8, now - 2 * DAY, now - 1 * DAY)
    past = acc.now(now)
    # each as the fleet's share on average over the decay: GPU-s / (GPUs x half_life / ln 2)
    span = 8 * h / math.log(2)
    share_a, share_b = past["a"] / span, past["b"] / span
    assert share_a == pytest.approx(share_b / 2 ** (6 / 7), rel=1e-9)  # six days further back: 2^(6/7) less
    assert share_b == pytest.approx((1 - 2 ** (-1 / 7)) * 2 ** (-1 / 7), rel=1e-9)  # ~0.085
    fair = FairShare(half_life=h)
    pending = [Pending(1, "normal", 8, project="b"), Pending(2, "normal", 8, project="a")]
    assert placed(schedule(pending, [node("n1", 8)], [], fair=fair, past=past)) == [2]
    # without the decay (both yesterday) submit order would decide: b first
    assert placed(schedule(pending, [node("n1", 8)], [], fair=fair, past={"a": past["b"], "b": past["b"]})) == [1]
    # and a weight of 2 for b outweighs its more recent use (0.085 / 2 < 0.049)
    heavy = FairShare({"b": Share(weight=2.0)}, half_life=h)
    assert placed(schedule(pending, [node("n1", 8)], [], fair=heavy, past=past)) == [1]


def test_past_usage_adds_to_the_share_in_use_now() -> None:
    """a holds 2 of 8 GPUs now (0.25); b holds none but used the fleet lately (past share 0.3)."""
    h = DAY
    fair = FairShare(half_life=h)
    span = 8 * h / math.log(2)
    busy = [run(100, "a", "n1", ("0", "1"))]
    pending = [Pending(1, "normal", 1, project="b"), Pending(2, "normal", 1, project="a")]
    assert placed(schedule(pending, [node("n1", 4), node("n2", 4)], busy, fair=fair,
                           past={"b": 0.3 * span}))[0] == 2
    assert placed(schedule(pending, [node("n1", 4), node("n2", 4)], busy, fair=fair,
                           past={"b": 0.2 * span}))[0] == 1


# -- guaranteed and borrowable ----------------------------------------------------------------

def test_a_project_below_its_guarantee_preempts_the_youngest_borrower() -> None:
    """vision is guaranteed 4 of 8 GPUs; nlp borrowed the whole fleet (4 one-GPU jobs per node,
    started at 10k + node: n2's are the younger). vision's 2-GPU job stops the two youngest, on n2, no more."""
    fair = FairShare({"vision": Share(guaranteed=4), "nlp": Share(guaranteed=0)})
    busy = [run(10 * i + k, "nlp", f"n{i}", (str(k),), started=float(10 * k + i)) for i in (1, 2) for k in range(4)]
    out = schedule([Pending(1, "normal", 2, project="vision")], [node("n1", 4), node("n2", 4)], busy, fair=fair)
    assert sorted(p.job_id for p in out.preemptions) == [22, 23]  # started at 22 and 32: the least work lost
    assert {p.for_job for p in out.preemptions} == {1} and out.placements == []
    # a project past its guarantee does not reclaim: vision already holds 4
    held = [*busy[:6], run(50, "vision", "n2", ("2", "3")), run(51, "vision", "n2", ("0", "1"))]
    again = schedule([Pending(2, "normal", 2, project="vision")], [node("n1", 4), node("n2", 4)], held, fair=fair)
    assert again.preemptions == []


def test_reclaim_never_cuts_a_borrower_below_its_own_guarantee_nor_stops_critical_work() -> None:
    fair = FairShare({"vision": Share(guaranteed=2), "nlp": Share(guaranteed=3)})
    # nlp holds 4 (one over its guarantee of 3), its critical job is one of them
    busy = [run(1, "nlp", "n1", ("0",), started=1), run(2, "nlp", "n1", ("1",), started=2),
            run(3, "nlp", "n1", ("2",), "critical", started=3), run(4, "nlp", "n1", ("3",), started=4)]
    out = schedule([Pending(9, "normal", 2, project="vision")], [node("n1", 4)], busy, fair=fair)
    assert out.preemptions == []  # freeing 2 would leave nlp at 2 < 3
    one = schedule([Pending(9, "normal", 1, project="vision")], [node("n1", 4)], busy, fair=fair)
    assert [p.job_id for p in one.preemptions] == [4]  # the youngest normal one; the critical job is spared


def test_without_guarantees_normal_work_is_never_preempted() -> None:
    busy = [run(i, "nlp", "n1", (str(i),)) for i in range(4)]
    out = schedule([Pending(9, "critical", 2, project="vision")], [node("n1", 4)], busy,
                   fair=FairShare({"vision": Share(quota=4)}))
    assert out.preemptions == []


def test_borrow_limit_caps_what_a_project_takes_of_an_idle_fleet() -> None:
    fair = FairShare({"nlp": Share(quota=6, guaranteed=2, borrow=4)})
    out = schedule([Pending(i, "normal", 1, project="nlp") for i in range(10)], [node("n1", 8), node("n2", 8)], [],
                   fair=fair)
    assert len(out.placements) == 6  # 2 guaranteed + 4 borrowed, though 16 GPUs are idle


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(1, 4), st.sampled_from(["normal", "critical"])),
                min_size=1, max_size=30),
       st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 3), st.integers(0, 3)), max_size=12),
       st.dictionaries(st.sampled_from("abc"), st.tuples(st.integers(0, 6), st.integers(0, 6)), max_size=3))
def test_placements_never_take_a_project_past_guaranteed_plus_borrow(
        jobs: list[tuple[str, int, str]], busy: list[tuple[str, int, int]],
        limits: dict[str, tuple[int, int]]) -> None:
    """Whatever runs and is queued, the pass never places a project's normal and critical work past
    guaranteed + borrow (what it already held over the cap stays, but nothing more is added)."""
    nodes = [node(f"n{i}", 4) for i in range(4)]
    running, used = [], {f"n{i}": 0 for i in range(4)}
    for k, (project, n, gpus) in enumerate(busy):
        name = f"n{n}"
        if gpus and used[name] + gpus <= 4:
            running.append(run(1000 + k, project, name, tuple(str(g) for g in range(used[name], used[name] + gpus)),
                               started=float(k)))
            used[name] += gpus
    fair = FairShare({p: Share(quota=g + b, guaranteed=g, borrow=b) for p, (g, b) in limits.items()})
    out = schedule([Pending(i, prio, gpus, project=p) for i, (p, gpus, prio) in enumerate(jobs)], nodes, running,
                   fair=fair)
    size = {i: gpus for i, (_, gpus, _) in enumerate(jobs)}
    held = {p: sum(len(r.alloc[0][1]) for r in running if r.project == p) for p in "abc"}
    stopped = {p.job_id for p in out.preemptions}
    for p, (g, b) in limits.items():
        added = sum(size[d.job_id] for d in out.placements if jobs[d.job_id][0] == p)
        claimed = {d.for_job for d in out.preemptions if jobs[d.for_job][0] == p}
        added += sum(size[j] for j in claimed)
        after = held[p] - sum(len(r.alloc[0][1]) for r in running if r.project == p and r.job_id in stopped)
        assert added == 0 or after + added <= g + b


# -- the section: bad input refused at load with a hint -----------------------------------------

@pytest.mark.parametrize("half_life, seconds", [("7d", 7 * DAY), ("12h", 43_200.0), ("90m", 5_400.0), ("2w", 14 * DAY),
                                                (3600, 3600.0), ("0.5d", DAY / 2), (" 30s ", 30.0)])
def test_half_life_units(half_life: object, seconds: float) -> None:
    fair = shares.parse({"half_life": half_life})
    assert fair is not None and fair.half_life == seconds
    assert shares.parse({}).half_life == 7 * DAY  # type: ignore[union-attr]  # Slurm's default


@pytest.mark.parametrize("section, message, hint", [
    ({"half_life": 0}, "scheduler.half_life must be a time > 0", "half_life: 7d"),
    ({"half_life": -5}, "must be a time > 0", "PriorityDecayHalfLife"),
    ({"half_life": "-3h"}, "got '-3h'", "units s, m, h, d, w"),
    ({"half_life": float("nan")}, "got 'nan'", "half_life: 7d"),
    ({"half_life": float("inf")}, "got 'inf'", "half_life: 7d"),
    ({"half_life": "1e400d"}, "got '1e400d'", "half_life: 7d"),
    ({"half_life": "a week"}, "got 'a week'", "units"),
    ({"half_life": "x" * 10_000}, "got 'xxxx", "units"),
    ({"half_life": True}, "got 'True'", "units"),
    ({"half_life": [7]}, "got '[7]'", "units"),
    ({"half_life": 10 ** 12}, "at most 10 years", "half_life: 7d"),
    ({"projects": {"a": {"guaranteed": -1}}}, "scheduler.projects.a.guaranteed must be a whole number of GPUs >= 0",
     "guaranteed: 8"),
    ({"projects": {"a": {"guaranteed": 2.5}}}, "guaranteed must be a whole number", "guaranteed: 8"),
    ({"projects": {"a": {"guaranteed": float("nan")}}}, "got 'nan'", "guaranteed: 8"),
    ({"projects": {"a": {"guaranteed": "4"}}}, "got '4'", "guaranteed: 8"),
    ({"projects": {"a": {"guaranteed": 1 << 40}}}, "guaranteed must be a whole number", "guaranteed: 8"),
    ({"projects": {"a": {"borrow": -4}}}, "scheduler.projects.a.borrow must be a whole number", "borrow: 8"),
    ({"projects": {"a": {"borrow": float("inf")}}}, "got 'inf'", "no limit"),
    ({"projects": {"a": {"borow": 4}}}, "scheduler.projects.a: unknown key 'borow'", "did you mean 'borrow'?"),
    ({"projects": {"a": {"guarantee": 4}}}, "unknown key 'guarantee'", "did you mean 'guaranteed'?"),
    ({"half_lfe": "7d"}, "scheduler: unknown key 'half_lfe'", "did you mean 'half_life'?"),
    ({"projects": {"a": {"gpu_quota": 8, "borrow": 4}}}, "gpu_quota and borrow both cap", "gpu_quota alone"),
    ({"projects": {"a": {"gpu_quota": 2, "guaranteed": 4}}}, "gpu_quota 2 is below guaranteed 4", "never be used"),
])
def test_a_bad_value_is_refused_with_a_hint(section: dict[str, object], message: str, hint: str) -> None:
    from autoresearch.errors import SpecError

    with pytest.raises(SpecError) as err:
        shares.parse(section)
    assert message in err.value.message and hint in err.value.hint


def test_guaranteed_and_borrow_make_the_cap() -> None:
    fair = shares.parse({"projects": {"a": {"guaranteed": 4, "borrow": 2}, "b": {"guaranteed": 2},
                                      "c": {"borrow": 3}, "d": {"guaranteed": 1, "gpu_quota": 5}}})
    assert fair is not None
    got = {p: (fair.share(p).guaranteed, fair.share(p).borrow, fair.share(p).quota) for p in "abcd"}
    assert got == {"a": (4, 2, 6), "b": (2, None, None), "c": (0, 3, 3), "d": (1, None, 5)}


def test_guarantees_above_the_fleet_are_refused_at_submit_and_overlapping_caps_are_not() -> None:
    from autoresearch.errors import CapacityError

    fair = shares.parse({"projects": {"a": {"guaranteed": 6, "borrow": 10}, "b": {"guaranteed": 4, "borrow": 12}}})
    with pytest.raises(CapacityError) as err:
        shares.check(fair, 8, "a", "normal", 1, 1)
    assert "guaranteed GPUs in config.yaml add up to 10 but the fleet has 8" in err.value.message
    assert "lower the guaranteed values" in err.value.hint
    ok = shares.parse({"projects": {"a": {"guaranteed": 4, "borrow": 12}, "b": {"guaranteed": 4, "borrow": 12}}})
    shares.check(ok, 8, "a", "normal", 1, 1)  # caps of 16 each on 8 GPUs: borrowing idle GPUs is their point


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_the_shortcuts_change_no_decision_with_guarantees_and_past_usage(data: st.DataObject) -> None:
    """The pass's shortcuts (a class given up, a project at its cap dropped) with guarantees that preempt
    normal work and past usage in the order: the same decisions with them and without them."""
    nodes, running = data.draw(clusters())
    pending = data.draw(PENDING)
    guaranteed = data.draw(st.integers(0, 4))
    fair = FairShare({"a": Share(2.0, quota=data.draw(st.sampled_from([None, 4, 6]))),
                      "b": Share(1.0, quota=guaranteed + data.draw(st.integers(0, 2)), guaranteed=guaranteed,
                                 borrow=0)}, half_life=DAY)
    past = {"a": data.draw(st.floats(0, 1e6)), "b": data.draw(st.floats(0, 1e6))}
    fast, slow = _both(pending, nodes, running, fair=fair, past=past, now=200.0,
                       max_reservations=data.draw(st.integers(0, 3)), room={"g": data.draw(st.integers(0, 3))})
    assert fast == slow


def test_a_full_class_is_not_given_up_while_a_guarantee_may_take_gpus_back() -> None:
    """A full fleet of a's normal work, nothing best-effort: a's queued job finds no room and nothing to
    preempt, which would end the class; b's job behind it (a weighs 100, b used the fleet lately) is
    within b's guarantee and takes a GPU back."""
    fair = FairShare({"a": Share(weight=100.0), "b": Share(guaranteed=1)}, half_life=DAY)
    busy = [run(100 + i, "a", "n1", (str(i),), started=float(i)) for i in range(4)]
    pending = [Pending(1, "normal", 1, project="a"), Pending(2, "normal", 1, project="b")]
    past = {"b": 0.5 * 4 * DAY / math.log(2)}  # half the fleet on average over the decay: b's share 0.5 > a's 0.01
    fast, slow = _both(pending, [node("n1", 4)], busy, fair=fair, past=past, max_reservations=0)
    assert fast == slow and [(p.job_id, p.for_job) for p in fast.preemptions] == [(103, 2)]


def test_the_file_is_refused_at_load_naming_itself(home: Path) -> None:
    from autoresearch.backends.profiles import load
    from autoresearch.errors import SpecError

    home.mkdir(parents=True, exist_ok=True)
    (home / "config.yaml").write_text("scheduler: {half_life: 0, projects: {a: {guaranteed: 2, borrow: 2}}}\n")
    with pytest.raises(SpecError) as err:
        load(home)
    assert "scheduler.half_life must be a time > 0" in err.value.message
    assert str(home / "config.yaml") in err.value.message and "half_life: 7d" in err.value.hint


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("ab"), st.integers(1, 8), st.floats(0, 5000), st.floats(0, 5000)),
                max_size=20),
       st.sampled_from([1.0, 60.0, 3600.0, 7 * DAY]))
def test_running_sums_match_the_integral_per_attempt(runs: list[tuple[str, int, float, float]],
                                                     half_life: float) -> None:
    """Decayed's running attempts as two sums per project (started/ended) give what adding each attempt's
    decayed integral gives, whatever the half-life (1 s: the weights rebased many times over)."""
    acc = shares.Decayed(half_life)
    events = sorted([(s, 0, i) for i, (_, _, s, _) in enumerate(runs)] + [(s + d, 1, i) for i, (_, _, s, d) in
                                                                           enumerate(runs)])
    for _t, kind, i in events:
        project, gpus, start, span = runs[i]
        if kind == 0:
            acc.started(project, gpus, start)
        else:
            acc.ended(project, gpus, start, start + span)
    end = max((s + d for _, _, s, d in runs), default=0.0) + 10.0
    got = acc.now(end)
    for p in "ab":
        want = sum(shares.accrued(g, s, s + d, end, half_life) for q, g, s, d in runs if q == p)
        assert got.get(p, 0.0) == pytest.approx(want, rel=1e-6, abs=1e-6)
    # and attempts still running at ``end``
    acc2 = shares.Decayed(half_life)
    for project, gpus, start, _ in sorted(runs, key=lambda r: r[2]):
        acc2.started(project, gpus, start)
    got2 = acc2.now(end)
    for p in "ab":
        want = sum(shares.accrued(g, s, end, end, half_life) for q, g, s, _ in runs if q == p)
        assert got2.get(p, 0.0) == pytest.approx(want, rel=1e-6, abs=1e-3)


def test_reclaim_stops_no_attempt_the_job_can_do_without() -> None:
    """Youngest first takes nlp's 1-GPU job, then its older 4-GPU one to fit 4 GPUs: the 1-GPU job is
    then not needed and keeps running."""
    fair = FairShare({"vision": Share(guaranteed=4)})
    busy = [run(1, "nlp", "n1", ("0", "1", "2", "3"), started=1.0), run(2, "nlp", "n1", ("4",), started=50.0)]
    out = schedule([Pending(9, "normal", 4, project="vision")], [node("n1", 5)], busy, fair=fair)
    assert [p.job_id for p in out.preemptions] == [1]
