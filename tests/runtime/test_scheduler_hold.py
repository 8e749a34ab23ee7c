"""The slots freed for a job are held for it: after a pass stops victims for job J (a preemption or a
reclaim), until J starts no job of its class or a lower one (one sorted ahead of it in the next pass:
a resumed trial keeping an old place, a project whose share now sorts first) takes the GPUs there,
whether the victims are still stopping or have ended. A more urgent class may; a job no longer queued
holds nothing. Two passes each, through the :class:`Scheduler` the runtime and the sim driver keep
(it hands a pass the holds the last one left) and through :func:`schedule` given them."""

from __future__ import annotations

from autoresearch.engine.scheduler import (
    Decisions,
    FairShare,
    NodeState,
    Pending,
    Running,
    Scheduler,
    Share,
    schedule,
)


def node(name: str, gpus: int = 4) -> NodeState:
    return NodeState(name, tuple(str(g) for g in range(gpus)))


NODES = [node("n1")]
BUSY = [Running(50, 1, "best-effort", (("n1", ("0", "1", "2", "3")),), started_at=10.0, project="x")]
J = Pending(2, "normal", 4, project="a")
# submitted after J, but keeps an older place (a paused trial resumed): it sorts ahead of J in pass 2
K = Pending(3, "normal", 4, project="a", order=1)


def two_passes(first: list[Pending], second: list[Pending], running2: list[Running], nodes: list[NodeState] = NODES,
               running1: list[Running] = BUSY, **kw: object) -> tuple[Decisions, Decisions]:
    """Pass 1 then pass 2 through a Scheduler; pass 2 through schedule() with pass 1's holds decides the same."""
    sched = Scheduler()
    one = sched.schedule(first, nodes, running1, now=100.0, **kw)  # type: ignore[arg-type]
    two = sched.schedule(second, nodes, running2, now=200.0, **kw)  # type: ignore[arg-type]
    assert schedule(second, nodes, running2, now=200.0, held=one.held, **kw) == two  # type: ignore[arg-type]
    return one, two


def test_victims_ended_the_job_they_were_stopped_for_starts_not_the_one_sorted_ahead() -> None:
    one, two = two_passes([J], [K, J], [])
    assert [(p.job_id, p.for_job) for p in one.preemptions] == [(50, 2)] and one.held == {"n1": 2}
    assert [p.job_id for p in two.placements] == [2]  # without the hold: K (3) took n1
    assert two.held == {}  # J started: the hold is released


def test_victims_still_stopping_no_job_sorted_ahead_claims_them() -> None:
    stopping = [BUSY[0]._replace(stopping=True)]
    one, two = two_passes([J], [K, J], stopping)
    assert two.preemptions == [] and two.placements == []
    assert two.held == {"n1": 2}  # J claims its stopping victims again: held one more pass
    sched = Scheduler()
    sched.held = dict(two.held)
    three = sched.schedule([K, J], NODES, [], now=300.0)
    assert [p.job_id for p in three.placements] == [2]


def test_a_more_urgent_class_may_take_the_held_slots() -> None:
    urgent = Pending(4, "critical", 4, project="b")
    _, two = two_passes([J], [urgent, J], [])
    assert [p.job_id for p in two.placements] == [4]
    assert two.held == {}  # (n1 went to the critical job: J holds nothing, it preempts anew when it can)


def test_a_job_no_longer_queued_holds_nothing() -> None:
    _, two = two_passes([J], [K], [])  # J was cancelled between the passes
    assert [p.job_id for p in two.placements] == [3]
    assert two.held == {}


def test_a_project_whose_share_now_sorts_first_waits_for_the_held_node() -> None:
    """b held n2 in pass 1 (its share sorted it after a); its attempt ends, and in pass 2 its share sorts
    first: its job does not take n1, freed for a's job."""
    nodes = [node("n1"), node("n2"), node("n3")]
    fair = FairShare({"a": Share(), "b": Share()})
    running1 = [*BUSY, Running(60, 1, "normal", (("n2", ("0", "1", "2", "3")),), started_at=0.0, project="b"),
                Running(61, 1, "normal", (("n3", ("0", "1")),), started_at=0.0, project="a")]
    kb = Pending(5, "normal", 4, project="b")
    one, two = two_passes([J, kb], [J, kb], [running1[2]], nodes=nodes, running1=running1, fair=fair)
    assert [p.for_job for p in one.preemptions] == [2]
    # pass 2: b holds nothing (share 0), a holds n3's 2 GPUs: b's job goes first, onto n2, not n1
    assert sorted((p.job_id, p.alloc[0][0]) for p in two.placements) == [(2, "n1"), (5, "n2")]


def test_a_gang_holds_the_free_node_it_claimed_too() -> None:
    """J, a 2-node gang, claims n2's free GPUs and stops n1's victim; in pass 2 a 4-GPU job sorted ahead
    finds n2 held (and n1's victim still stopping): it takes neither."""
    nodes = [node("n1"), node("n2")]
    gang = Pending(2, "normal", 4, nodes=2, project="a")
    one, two = two_passes([gang], [K, gang], [BUSY[0]._replace(stopping=True)], nodes=nodes)
    assert one.held == {"n1": 2, "n2": 2}
    assert two.placements == [] and two.preemptions == []
    assert two.held == {"n1": 2, "n2": 2}


def test_a_reclaim_holds_the_node_for_the_guaranteed_job() -> None:
    """vision's job reclaims n1 from nlp; nlp's next job (sorted ahead by its share) does not take it."""
    fair = FairShare({"vision": Share(guaranteed=4)})
    running1 = [Running(70, 1, "normal", (("n1", ("0", "1", "2", "3")),), started_at=10.0, project="nlp")]
    jv = Pending(2, "normal", 4, project="vision")
    kn = Pending(1, "normal", 4, project="nlp", order=0)
    past = {"vision": 1e9}  # (vision used much lately: nlp's job sorts first once nlp holds nothing)
    one, two = two_passes([jv], [kn, jv], [], running1=running1, fair=fair, past=past)
    assert [(p.job_id, p.for_job) for p in one.preemptions] == [(70, 2)]
    assert [p.job_id for p in two.placements] == [2]


def test_only_what_the_job_needs_is_held_the_rest_of_the_node_stays_open() -> None:
    """J needs 2 of n1's 4 GPUs and stopped the best-effort attempt on 2 of them; once everything there
    ended, a 2-GPU job sorted ahead of J takes the other 2 and J the 2 held for it."""
    running1 = [Running(50, 1, "best-effort", (("n1", ("0", "1")),), started_at=10.0, project="x"),
                Running(51, 1, "normal", (("n1", ("2", "3")),), started_at=10.0, project="x")]
    j2 = Pending(2, "normal", 2, project="a")
    k2 = Pending(3, "normal", 2, project="a", order=1)
    one, two = two_passes([j2], [k2, j2], [], running1=running1)
    assert [p.job_id for p in one.preemptions] == [50]
    assert sorted(p.job_id for p in two.placements) == [2, 3]
    # and while the normal attempt still runs, only J's 2 GPUs are free: K waits, J starts
    _, three = two_passes([j2], [k2, j2], [running1[1]], running1=running1)
    assert [p.job_id for p in three.placements] == [2]


def test_a_job_its_group_cap_keeps_waiting_holds_nothing() -> None:
    """J's group has no room left in pass 2 (another of its trials started): J cannot start, so at its
    turn its hold ends, and the next pass gives the node to the job sorted ahead of it."""
    jg = J._replace(group="loop")
    _, two = two_passes([jg], [K, jg], [])
    assert [p.job_id for p in two.placements] == [2]  # (with room, J starts: the hold was its)
    sched = Scheduler()
    sched.schedule([jg], NODES, BUSY, now=100.0)
    out = sched.schedule([K, jg], NODES, [], now=200.0, room={"loop": 0})
    assert out.placements == [] and out.held == {}  # (K came before J's turn: held in this pass still)
    again = sched.schedule([K, jg], NODES, [], now=300.0, room={"loop": 0})
    assert [p.job_id for p in again.placements] == [3]
