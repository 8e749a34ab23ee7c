"""Health inside the runtime's passes, on the fake backend with recorded GPU states: preflight
turns bad nodes away (not a retry), the monitor reads logs and NVML, endings get a class,
nodes get cordoned (through Backend.cordon) or degraded, and every face says so."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from autoresearch.errors import NotFoundError
from tests.health.conftest import Fleet, configure, node_states, setup, submit, view


def test_preflight_turns_a_faulty_node_away_and_the_job_starts_elsewhere_not_as_a_retry(
        home: Path, fleet: Fleet) -> None:
    api, fake = setup(home)
    api._runtime.tick()  # the idle nodes' poll, healthy: the next is due in poll_interval
    fleet.set("fake-0", "xid79")  # (between two polls: the preflight finds it)
    job = submit(api, gpus=8, max_retries=0)
    v = view(api, job)
    assert v.state in ("starting", "running") and v.attempts == 1
    assert fake.attempt(f"{job}.1").request.node == "fake-1"
    state, reason = node_states(api)["fake-0"]
    assert state == "cordoned" and "xid_79 on fake-0 GPU 5" in reason
    assert fake.cordons and fake.cordons[0][0] == "fake-0"  # the engine was told too (Slurm drains)
    assert any("preflight turned it away" in w and "xid_79" in w for w in v.warnings)


def test_with_every_node_faulty_the_job_waits_in_the_queue_and_never_starts(home: Path, fleet: Fleet) -> None:
    fleet.set("fake-0", "ecc")
    fleet.set("fake-1", "missing_gpu")
    api, fake = setup(home)
    job = submit(api, gpus=8)
    assert (view(api, job).state, view(api, job).attempts, fake.attempts()) == ("queued", 0, [])
    assert {s for s, _ in node_states(api).values()} == {"cordoned"}


def test_a_fault_on_a_gpu_the_attempt_was_not_given_still_cordons_the_node_before_it_starts(
        home: Path, fleet: Fleet) -> None:
    fleet.set("fake-0", "ecc")  # GPU 3
    fleet.set("fake-1", "ecc")
    api, fake = setup(home)
    job = submit(api, gpus=1)
    assert view(api, job).state == "queued" and fake.attempts() == []


def test_a_passed_preflight_is_cached_per_node(home: Path, fleet: Fleet) -> None:
    api, fake = setup(home, nodes=1)
    first = submit(api, gpus=1)
    assert view(api, first).state in ("starting", "running")
    api._runtime.tick()  # the monitor's poll of the node, healthy: the next is due in poll_interval
    fleet.set("fake-0", "xid79")  # the cache does not look again within preflight_cache
    second = submit(api, gpus=1)
    assert view(api, second).state in ("starting", "running")
    configure(home, "preflight_cache: 0")
    third = submit(api, gpus=1)
    assert view(api, third).state == "queued"
    assert node_states(api)["fake-0"][0] == "cordoned"


def test_a_cpu_only_job_skips_preflight(home: Path, fleet: Fleet) -> None:
    api, _ = setup(home, nodes=1)
    api._runtime.tick()  # the idle node's poll, healthy: the next is due in poll_interval
    fleet.set("fake-0", "xid79")
    job = submit(api)
    v = view(api, job)
    assert v.state in ("starting", "running") and not v.warnings  # (the monitor cordons the node next)


def test_an_nccl_timeout_in_the_log_is_infra_suspect_retried_on_another_node(home: Path, fleet: Fleet) -> None:
    api, fake = setup(home)
    job = submit(api, gpus=8, max_retries=1, env={"HF_TOKEN": "hf_s3cr3tvalue123456"})
    node = fake.attempt(f"{job}.1").request.node
    fake.emit(f"{job}.1", "step 1 loss: 1.0\n[Rank 0] Watchdog caught collective operation timeout: "
                          "WorkNCCL(SeqNum=9, OpType=ALLREDUCE) token hf_s3cr3tvalue123456\n"
                          "Traceback (most recent call last):\n")
    fake.finish(f"{job}.1", 1)
    api._runtime.tick()
    v = view(api, job)
    assert v.attempts == 2 and v.attempt_list[0].failure_class == "infra-suspect"
    assert node_states(api)[node][0] == "healthy"  # the job's word alone; the re-check of the machine passed
    assert fake.attempt(f"{job}.2").request.node != node  # the node it failed on comes last
    fake.finish(f"{job}.2", 1)
    api._runtime.tick()
    v = view(api, job)
    assert v.state == "failed" and v.failure_class == "user"  # attempt 2: no fault of the machine seen
    first = api._runtime.health.store.attempt_findings(job, 1)
    assert {f.signature for f in first} >= {"collective_timeout", "python_exception", "infra_failure"}
    assert all("hf_s3cr3tvalue123456" not in f.excerpt for f in first)  # redacted like all trial output


def test_cuda_out_of_memory_is_the_users_error_not_retried_with_the_excerpt_and_a_hint(
        home: Path, fleet: Fleet) -> None:
    api, fake = setup(home)
    job = submit(api, gpus=1, max_retries=3)
    fake.emit(f"{job}.1", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB\n")
    fake.kill(f"{job}.1", 9)  # even a SIGKILL is the program's when its log says it ran out of memory
    api._runtime.tick()
    v = view(api, job)
    assert (v.state, v.attempts, v.failure_class) == ("failed", 1, "user")
    assert v.failure_why and "cuda_oom" in v.failure_why and "CUDA out of memory" in v.failure_why
    assert v.failure_hint and "batch size" in v.failure_hint and "not retried" in v.failure_hint


def test_an_xid_line_in_the_log_never_cordons_it_asks_the_machine_whose_answer_decides(
        home: Path, fleet: Fleet) -> None:
    api, fake = setup(home)
    job = submit(api, gpus=1)
    node = fake.attempt(f"{job}.1").request.node
    api._runtime.tick()  # the node polled and checked: its next poll is not due for poll_interval
    fake.emit(f"{job}.1", "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.\n"
                          "checking dmesg for Xid 79 ... none found\nstep 1 no ECC error detected\n")
    api._runtime.ingest(job)  # what the live ingestion (a loop, the mirror's syncer) does
    assert node_states(api)[node][0] == "healthy"  # a job's output is never the machine's evidence
    found = {f.signature: f for f in api._runtime.health.store.attempt_findings(job, 1)}
    assert set(found) == {"xid_in_log"} and found["xid_in_log"].owner == "job"
    assert found["xid_in_log"].cls == "infra-suspect"
    api._runtime.tick()  # the re-check it asked for: the machine says it is fine
    assert node_states(api)[node][0] == "healthy"
    fleet.set(node, "xid79")  # now the driver itself reports it
    fake.emit(f"{job}.1", "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.\n")
    api._runtime.ingest(job)  # the same line again asks nothing more (one request per signature per attempt)
    api._runtime.tick()
    assert node_states(api)[node][0] == "healthy"
    fake.emit(f"{job}.1", "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, "
                          "NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600013 milliseconds before timing out.\n")
    api._runtime.ingest(job)
    api._runtime.tick()  # the next pass looks at the machine (the poll was made due), which decides
    state, reason = node_states(api)[node]
    assert state == "cordoned" and "xid_79" in reason


def test_infra_suspect_failures_on_the_only_node_never_cordon_it(home: Path, fleet: Fleet) -> None:
    configure(home, "cordon_after: 2")
    api, fake = setup(home, nodes=1)
    for i in range(4):
        job = int(api.submit({"command": ["train"], "workdir": str(home), "gpus": 1, "max_retries": 0},
                             project=f"p{i % 2}").id)
        fake.fail(f"{job}.1", "supervisor died")  # a lost attempt: the engine's word, infra-suspect
        api._runtime.tick()
        assert view(api, job).failure_class == "infra-suspect"
    assert node_states(api)["fake-0"][0] == "healthy" and fake.cordons == []


def test_infra_suspect_failures_cordon_only_with_differential_evidence_from_two_projects(
        home: Path, fleet: Fleet) -> None:
    configure(home, "cordon_after: 2")
    api, fake = setup(home, nodes=2, gpus=1)
    nccl = ("RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, "
            "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.19.3\n")
    bad = ""

    def fail_once_there(project: str) -> None:
        nonlocal bad
        for _ in range(6):
            job = int(api.submit({"command": ["train"], "workdir": str(home), "gpus": 1, "max_retries": 1},
                                 project=project).id)
            node = fake.attempt(f"{job}.1").request.node
            bad = bad or node
            if node != bad:
                fake.finish(f"{job}.1", 0)
                api._runtime.tick()
                continue
            fake.emit(f"{job}.1", nccl)
            fake.finish(f"{job}.1", 1)
            api._runtime.tick()
            assert view(api, job).attempt_list[0].failure_class == "infra-suspect"
            retry = fake.attempt(f"{job}.2")
            assert retry.request.node != bad, (view(api, job), node_states(api))  # placed away from where it failed
            fake.finish(f"{job}.2", 0)  # the same job succeeds elsewhere
            api._runtime.tick()
            return
        raise AssertionError("never placed on the suspect node")

    fail_once_there("a")
    fail_once_there("a")
    assert node_states(api)[bad][0] == "healthy"  # two jobs, one project: maybe that project's bug
    fail_once_there("b")
    state, reason = node_states(api)[bad]
    assert state == "cordoned" and "infra failures of 3 jobs" in reason and "ran elsewhere" in reason


def test_throttling_degrades_a_node_which_is_placed_last(home: Path, fleet: Fleet) -> None:
    api, fake = setup(home)
    first = submit(api, gpus=1)
    hot = fake.attempt(f"{first}.1").request.node
    fleet.set(hot, "thermal")
    api._runtime.health.monitor(api._runtime.jobs.active_attempts(api._runtime.backend.name), now=time.time() + 60)
    assert node_states(api)[hot][0] == "degraded"
    assert any(hot in line and "throttling" in line for line in api.cluster().degraded)
    second = submit(api, gpus=1)  # best fit would pick the busier node: degraded, it comes last
    assert fake.attempt(f"{second}.1").request.node != hot


def test_a_silent_attempt_is_a_hang_finding_per_job_setting(home: Path, fleet: Fleet) -> None:
    api, fake = setup(home, nodes=1)
    job = submit(api, gpus=1, env={"AUTORESEARCH_HANG_AFTER": "10m"})
    fake.emit(f"{job}.1", "step 1\n")
    api._runtime.tick()
    health, active = api._runtime.health, api._runtime.jobs.active_attempts(api._runtime.backend.name)
    health.monitor(active, now=active[0]["created_at"] + 60)  # output seen: progress noted
    active = api._runtime.jobs.active_attempts(api._runtime.backend.name)
    health.monitor(active, now=active[0]["created_at"] + 400)  # under 10 min of silence
    assert [f for f in health.store.attempt_findings(job, 1) if f.signature == "hang"] == []
    health.monitor(active, now=active[0]["created_at"] + 60 + 601)
    hangs = [f for f in health.store.attempt_findings(job, 1) if f.signature == "hang"]
    assert len(hangs) == 1 and "no new log line or metric" in hangs[0].excerpt


def test_the_monitor_polls_each_node_at_most_once_per_interval(home: Path, fleet: Fleet) -> None:
    api, fake = setup(home, nodes=1)
    submit(api, gpus=1)
    store = api._runtime.health.store
    t = time.time() + 1000  # (the submit's pass polled it now)
    assert store.claim_poll("fake-0", t, 30.0)
    assert not store.claim_poll("fake-0", t + 10, 30.0)  # another process, within the interval
    assert store.claim_poll("fake-0", t + 31, 30.0)


def test_a_health_cordon_lifts_after_a_passing_check_when_configured_a_hand_cordon_does_not(
        home: Path, fleet: Fleet) -> None:
    configure(home, "uncordon: preflight\npoll_interval: 0\ncooldown: 0")
    fleet.set("fake-0", "missing_gpu")  # a soft cause: a GPU that may come back
    api, fake = setup(home)
    job = submit(api, gpus=8)
    assert node_states(api)["fake-0"][0] == "cordoned"
    api.cordon("fake-1", "maintenance")
    fleet.set("fake-0", "healthy")
    api._runtime.tick()
    assert node_states(api)["fake-0"] == ("healthy", "") and fake.uncordons == ["fake-0"]
    assert node_states(api)["fake-1"] == ("cordoned", "maintenance")
    assert job


def test_a_hard_cause_waits_for_a_person_and_a_soft_one_for_the_cool_down(home: Path, fleet: Fleet) -> None:
    configure(home, "uncordon: preflight\npoll_interval: 0\ncooldown: 1h")
    fleet.set("fake-0", "xid79")
    fleet.set("fake-1", "missing_gpu")
    api, fake = setup(home)
    submit(api, gpus=8)
    assert {s for s, _ in node_states(api).values()} == {"cordoned"}
    assert "[hard]" in node_states(api)["fake-0"][1]
    fleet.set("fake-0", "healthy")
    fleet.set("fake-1", "healthy")
    api._runtime.tick()
    assert node_states(api)["fake-0"][0] == "cordoned"  # Xid 79: a person must look
    assert node_states(api)["fake-1"][0] == "cordoned"  # passing, but within the cool-down
    configure(home, "uncordon: preflight\npoll_interval: 0\ncooldown: 0")
    api._runtime.tick()
    assert node_states(api)["fake-1"][0] == "healthy" and node_states(api)["fake-0"][0] == "cordoned"


def test_nodes_show_state_reason_since_and_last_findings(home: Path, fleet: Fleet) -> None:
    fleet.set("fake-0", "xid79")
    api, _ = setup(home)
    submit(api, gpus=8)
    node = next(n for n in api.nodes() if n.name == "fake-0")
    assert node.state == "cordoned" and node.since and node.findings
    assert node.findings[0].startswith("xid_79 on fake-0 GPU 5")


def test_cordoning_the_last_healthy_node_while_critical_jobs_queue_warns_and_unknown_nodes_are_listed(
        home: Path, fleet: Fleet) -> None:
    api, _ = setup(home, nodes=2, gpus=1)
    submit(api, gpus=1)
    submit(api, gpus=1)
    submit(api, gpus=1, priority="critical")  # no room: it queues
    assert api.cordon("fake-0").warning == ""
    last = api.cordon("fake-1")
    assert last.state == "cordoned" and "critical job(s) are queued" in last.warning
    with pytest.raises(NotFoundError) as err:
        api.cordon("fake-9")
    assert "fake-0" in err.value.hint and "fake-1" in err.value.hint


def test_a_finding_with_a_hostile_record_does_not_break_reads(home: Path, fleet: Fleet) -> None:
    api, _ = setup(home)
    submit(api, gpus=1)
    with api._ledger.tx() as c:
        for data in ("{", "[]", json.dumps({"signature": None}), json.dumps({"node": 5, "ts": "x"})):
            c.execute("INSERT INTO events(ts, kind, data) VALUES (1, 'finding', ?)", (data,))
    assert len(api.nodes()) == 2


def test_a_node_that_keeps_throttling_stays_degraded_and_recovers_when_it_stops(home: Path, fleet: Fleet) -> None:
    api, fake = setup(home, nodes=1)
    submit(api, gpus=1)
    fleet.set("fake-0", "thermal")
    health, active = api._runtime.health, api._runtime.jobs.active_attempts(api._runtime.backend.name)
    t0 = active[0]["created_at"] + 1000
    for minute in range(0, 40, 1):  # polled every minute for 40 minutes (degraded_for: 10 min)
        health.monitor(active, now=t0 + 60 * minute)
        assert node_states(api)["fake-0"][0] == "degraded", minute
    fleet.set("fake-0", "healthy")
    health.monitor(active, now=t0 + 60 * 41)
    assert node_states(api)["fake-0"][0] == "degraded"  # within degraded_for of the last throttling
    health.monitor(active, now=t0 + 60 * 55)
    assert node_states(api)["fake-0"] == ("healthy", "")


def probe_config(home: Path, script: str, extra: str = "") -> None:
    configure(home, f"probe:\n  command: [{sys.executable!r}, -c, {script!r}]\n  timeout: 5s\n{extra}")


def test_a_failing_probe_job_turns_the_node_away(home: Path, fleet: Fleet) -> None:
    probe_config(home, "import os,sys; sys.exit(3 if os.environ['CUDA_VISIBLE_DEVICES'].startswith('0') else 0)")
    api, fake = setup(home, nodes=1)
    job = submit(api, gpus=2)
    assert view(api, job).state == "queued"
    state, reason = node_states(api)["fake-0"]
    assert state == "cordoned" and "probe_failed" in reason and "exited 3" in reason


def test_a_probe_below_the_bus_bandwidth_threshold_fails_and_one_above_passes(home: Path, fleet: Fleet) -> None:
    probe_config(home, "import os; print('busbw_gbps: 40.5' if os.environ['AUTORESEARCH_PROBE_GPUS'] == '8' "
                       "else 'busbw_gbps: 400')", "  min_busbw_gbps: 100")
    api, fake = setup(home)
    small = submit(api, gpus=2)
    assert view(api, small).state in ("starting", "running")
    configure(home, "preflight_cache: 0\nprobe:\n"
                    f"  command: [{sys.executable!r}, -c, \"print('busbw_gbps: 40.5')\"]\n  min_busbw_gbps: 100")
    big = submit(api, gpus=4)
    assert view(api, big).state == "queued"
    assert any("busbw_low" in r and "40.5 GB/s < 100 GB/s" in r for _, r in node_states(api).values())


def test_a_probe_that_hangs_is_a_timeout_and_one_that_cannot_run_blocks_nothing(home: Path, fleet: Fleet) -> None:
    configure(home, f"probe:\n  command: [{sys.executable!r}, -c, 'import time; time.sleep(30)']\n  timeout: 0.5")
    api, _ = setup(home, nodes=1)
    assert view(api, submit(api, gpus=1)).state == "queued"
    assert "probe_timeout" in node_states(api)["fake-0"][1]
    home2 = home.parent / "home2"
    configure(home2, "probe:\n  command: [/nonexistent/probe]")
    api2, _ = setup(home2, nodes=1)
    assert view(api2, submit(api2, gpus=1)).state in ("starting", "running")  # the operator's typo, not the node's


def test_a_hand_uncordon_forgives_old_findings_but_a_fault_that_is_still_there_cordons_again(
        home: Path, fleet: Fleet) -> None:
    fleet.set("fake-0", "xid79")
    api, fake = setup(home)
    first = submit(api, gpus=8)
    assert fake.attempt(f"{first}.1").request.node == "fake-1"
    api.cordon("fake-0", undo=True)  # someone says it is fixed; it is not
    second = submit(api, gpus=8)  # only fake-0 has room: checked afresh, turned away, cordoned again
    assert view(api, second).state == "queued"
    assert node_states(api)["fake-0"][0] == "cordoned"
    fleet.set("fake-0", "healthy")
    api.cordon("fake-0", undo=True)  # fixed now
    api._runtime.tick()
    assert view(api, second).state in ("starting", "running")
    assert fake.attempt(f"{second}.1").request.node == "fake-0"


def test_a_node_the_monitor_cordons_in_a_pass_gets_nothing_that_pass_places(home: Path, fleet: Fleet) -> None:
    """A pass places onto the node rows it read before its monitor round only when the round ran no
    check: a fault found in that round (here by the submit's own pass) keeps the job off the node,
    though its preflight result of a moment ago, cached in the row read before, said it passed."""
    configure(home, "poll_interval: 0")  # (the first submit's pass polled both nodes, idle)
    api, fake = setup(home)
    first = submit(api, gpus=4)
    node = fake.attempt(f"{first}.1").request.node
    other = next(n for n in ("fake-0", "fake-1") if n != node)
    fleet.set(node, "xid79")  # best fit would put 4 more GPUs there; the monitor is due on it
    second = submit(api, gpus=4)
    assert node_states(api)[node][0] == "cordoned"
    assert fake.attempt(f"{second}.1").request.node == other


def test_a_node_an_ending_cordons_in_a_submits_pass_gets_nothing_that_pass_places(home: Path, fleet: Fleet) -> None:
    """A submit's pass that records an ending whose infra failure cordons the node places nothing there
    (not onto the node rows the submit read for its capacity check, before that ending)."""
    configure(home, "cordon_after: 1")
    api, fake = setup(home)
    first = submit(api, gpus=8, max_retries=0)
    node = fake.attempt(f"{first}.1").request.node
    submit(api, gpus=8)  # the other node is full
    api._runtime.tick()  # both nodes polled: no monitor round is due in the next pass
    fleet.set(node, "ecc")  # the machine's own word, read at the ending
    fake.fail(f"{first}.1", "supervisor died")  # heard by the next pass: the submit's
    third = submit(api, gpus=8)
    assert node_states(api)[node][0] == "cordoned"
    assert (view(api, third).state, view(api, third).attempts) == ("queued", 0)
