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
