"""The fleet driver hands the scheduler what the runtime does: fair share between projects, and each
attempt's last checkpoint so a preemption stops what loses least."""

from __future__ import annotations

from autoresearch.engine.scheduler import FairShare, Share
from autoresearch.sim.driver import Driver, Job
from autoresearch.sim.fleet import parse

NO_FAULTS = {"node_loss": 0, "xid": 0, "nccl_hang": 0, "thermal": 0}


def backlog(projects: list[str], per: int) -> list[Job]:
    jobs = []
    for i in range(per):
        for project in projects:  # interleaved: submit order alone shares the fleet evenly
            jobs.append(Job(len(jobs) + 1, "normal", 8, 1, (600.0,) * 6, float(i), 3, "backlog", project=project))
    return jobs


def held(fair: FairShare | None) -> dict[str, float]:
    fleet = parse([{"name": "h100", "count": 4, "gpus": 8}], NO_FAULTS, 1)
    driver = Driver(fleet, backlog(["a", "b"], 40), 12 * 3600.0, cordon=False, fair=fair)
    return driver.run().project_gpu_s


def test_fair_share_gives_each_project_its_weight() -> None:
    on = held(FairShare({"a": Share(1.0), "b": Share(3.0)}))
    assert 2.5 <= on["b"] / on["a"] <= 3.5
    off = held(None)
    assert 0.8 <= off["b"] / off["a"] <= 1.25


def test_preemption_in_the_driver_spares_the_recently_saved() -> None:
    """Two best-effort whole-node jobs: the older saved a checkpoint just before a critical job arrives,
    the younger has not saved yet (its first checkpoint is later): the younger loses more, the older stops."""
    fleet = parse([{"name": "h100", "count": 2, "gpus": 8}], NO_FAULTS, 1)
    old = Job(1, "best-effort", 8, 1, (1000.0,) * 20, 0.0, 1, "soak")  # saves every 1000 s
    young = Job(2, "best-effort", 8, 1, (3000.0,) * 5, 500.0, 1, "soak")  # first save at 3500 s
    critical = Job(3, "critical", 8, 1, (600.0,), 2050.0, 1, "gang")
    driver = Driver(fleet, [old, young, critical], 2100.0, cordon=False)
    stats = driver.run()
    assert old.attempts == 1 and old.done_steps == 2  # stopped: kept its checkpoint at 2000 s
    assert young.state == "running" and young.attempts == 1
    assert stats.lost_preempt_gpu_s <= 8 * 60.0  # 50 s since old's checkpoint (+ grace), not 1550 s of young's


def test_a_queued_jobs_view_is_kept_until_what_the_pass_reads_of_it_changes() -> None:
    """The driver hands the scheduler the same Pending for a queued job pass after pass (made again when
    it is queued again, has a node more to avoid, or crosses reserve_after_s: the only use of waited_s)."""
    from autoresearch.sim.driver import RESERVE_AFTER_S

    job = Job(1, "normal", 8, 1, (60.0,), 0.0)
    job.queued_since = 100.0
    first = Driver._pending(job, 110.0)
    assert Driver._pending(job, 110.0 + RESERVE_AFTER_S / 2) is first and first.waited_s == 10.0
    late = Driver._pending(job, 100.0 + RESERVE_AFTER_S)
    assert late is not first and late.waited_s >= RESERVE_AFTER_S
    job.avoid.add("n3")
    assert Driver._pending(job, 100.0 + RESERVE_AFTER_S + 1).avoid == frozenset({"n3"})
    job.queued_since = 900.0  # preempted and queued again: it waits from scratch
    assert Driver._pending(job, 901.0).waited_s == 1.0


def test_the_driver_hands_the_scheduler_group_caps_and_cpus() -> None:
    """As the runtime does: a capped group (a research loop's trials) never runs more than its cap at once,
    and a job's cores count against its node's (two 50-core jobs do not share a 96-core node)."""
    fleet = parse([{"name": "h100", "count": 2, "gpus": 8}], NO_FAULTS, 1)  # 96 cores a node (12 per GPU)
    trials = [Job(i, "normal", 1, 1, (600.0,), 0.0, 1, "sweep", group="loop:1") for i in range(1, 11)]
    driver = Driver(fleet, trials, 4 * 3600.0, cordon=False, group_caps={"loop:1": 3})
    seen: list[int] = []
    launch = driver._launch

    def counting(*args: object) -> None:
        launch(*args)  # type: ignore[arg-type]
        seen.append(driver.group_running["loop:1"])

    driver._launch = counting  # type: ignore[method-assign]
    stats = driver.run()
    assert stats.jobs_done == 10 and max(seen) == 3
    cores = [Job(i, "normal", 1, 1, (600.0,), 0.0, 1, "cpu", cpus=50.0) for i in range(1, 5)]
    driver = Driver(fleet, cores, 3600.0, cordon=False)
    driver.run()
    first = [j for j in cores if j.first_start == 0.0]
    assert len(first) == 2  # one per node: a node's 96 cores hold one 50-core job


def test_past_usage_in_the_driver_favours_the_project_that_waited() -> None:
    """a held the whole fleet (32 GPUs) for the first day; then a and b queue equal backlogs. With a
    half-life of a day, b gets most of the next twelve hours; with the past forgotten (a half-life of a
    second), the two share them evenly."""
    def window(half_life: float) -> dict[str, float]:
        fleet = parse([{"name": "h100", "count": 4, "gpus": 8}], NO_FAULTS, 1)
        first = [Job(i + 1, "normal", 8, 1, (3600.0,) * 24, 0.0, 0, "backlog", project="a") for i in range(4)]
        later = [Job(len(first) + 1 + i, "normal", 8, 1, (600.0,) * 6, 86_400.0 + i, 3, "backlog",
                     project="ab"[i % 2]) for i in range(160)]
        driver = Driver(fleet, first + later, 86_400.0 + 12 * 3600.0, cordon=False, fair=FairShare(half_life=half_life))
        got = driver.run().project_gpu_s
        return {"a": got["a"] - 32 * 86_400.0, "b": got["b"]}  # a's first day: four whole nodes for a day

    decayed = window(86_400.0)
    assert decayed["b"] > 1.5 * decayed["a"]
    forgotten = window(1.0)
    assert 0.8 <= forgotten["b"] / forgotten["a"] <= 1.25


def test_a_guarantee_in_the_driver_takes_back_borrowed_gpus_within_a_pass_and_grace() -> None:
    """nlp (no guarantee) borrowed the whole idle fleet with ten-hour jobs; vision is guaranteed 16 GPUs
    and submits two whole-node jobs at one hour: they start a pass and a grace period later, not in ten hours.
    nlp's cap (borrow: 24) keeps a node free for others from the start."""
    def run(fair: FairShare) -> tuple[list[Job], float]:
        fleet = parse([{"name": "h100", "count": 4, "gpus": 8}], NO_FAULTS, 1)
        nlp = [Job(i + 1, "normal", 8, 1, (3600.0,) * 10, 0.0, 0, "backlog", project="nlp") for i in range(4)]
        vision = [Job(10 + i, "normal", 8, 1, (3600.0,), 3600.0, 0, "backlog", project="vision") for i in range(2)]
        stats = Driver(fleet, nlp + vision, 3 * 3600.0, cordon=False, fair=fair).run()
        return vision, stats.lost_preempt_gpu_s

    vision, lost = run(FairShare({"vision": Share(guaranteed=16), "nlp": Share(quota=32)}))
    assert all(v.first_start is not None and v.first_start <= 3600.0 + 120.0 for v in vision)
    assert 0 < lost <= 2 * 8 * 3600.0  # two of nlp's jobs stopped (no checkpoints: their hour is lost)
    vision, lost = run(FairShare({"nlp": Share(quota=32)}))  # no guarantee: vision waits for nlp's ten hours
    assert all(v.first_start is None for v in vision) and lost == 0
    capped = FairShare({"vision": Share(guaranteed=16), "nlp": Share(quota=24, borrow=24)})
    jobs = [Job(i + 1, "normal", 8, 1, (3600.0,) * 10, 0.0, 0, "backlog", project="nlp") for i in range(6)]
    stats = Driver(parse([{"name": "h100", "count": 4, "gpus": 8}], NO_FAULTS, 1), jobs, 3600.0, cordon=False,
                   fair=capped).run()
    assert stats.project_gpu_s["nlp"] <= 24 * 3600.0  # never more than 24 of the 32 GPUs at once
    assert sum(1 for j in jobs if j.first_start is not None) == 3


def test_a_pass_capped_at_max_starts_is_followed_by_another_at_once() -> None:
    """The driver passes again at the same moment while the scheduler stops at ``max_starts`` (as the runtime
    does): eight one-GPU jobs on an idle 8-GPU node all start at once with a cap of 3 a pass, in 3 passes."""
    fleet = parse([{"name": "h100", "count": 1, "gpus": 8}], NO_FAULTS, 1)
    jobs = [Job(i, "normal", 1, 1, (600.0,), 0.0, 1, "sweep") for i in range(1, 9)]
    driver = Driver(fleet, jobs, 60.0, cordon=False, max_starts=3)
    stats = driver.run()
    assert [j.first_start for j in jobs] == [0.0] * 8
    assert stats.passes == 3 and stats.attempts == 8


def test_the_monitors_bookkeeping_matches_the_fleet_after_a_day_of_faults() -> None:
    """The monitor reads only the nodes with a fault in reach (each kind's own) or a state of their own,
    kept as sets as statuses and attempts change: after a day of frequent faults they are exactly the
    unhealthy nodes and the nodes attempts run on, and the monitor has cordoned and lifted cordons."""
    faults = {"node_loss": 0.01, "xid": 0.02, "nccl_hang": 0.01, "thermal": 0.05, "repair": "2h",
              "unattended_repair": "24h", "hang_timeout": "10m", "thermal_for": "1h", "thermal_slowdown": 1.5}
    fleet = parse([{"name": "h100", "count": 12, "gpus": 8}], faults, 3)
    jobs = [Job(i, "normal" if i % 3 else "best-effort", 8 if i % 2 else 1, 1, (900.0,) * 8, 600.0 * i, 2, "soak")
            for i in range(1, 200)]
    driver = Driver(fleet, jobs, 86400.0)
    stats = driver.run()
    assert stats.cordons > 0 and stats.faults_caught > 0
    assert driver._unhealthy == {n for n, st in driver.status.items() if st.state != "healthy"}
    busy: dict[str, int] = {}
    for att in driver.running.values():
        for node in att.rec.nodes:
            busy[node] = busy.get(node, 0) + 1
    assert driver._busy == busy and busy
