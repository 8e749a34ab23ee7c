"""Gangs: every member is watched on its own node, and a fault on member k's node blames that node."""

from __future__ import annotations

from pathlib import Path

from tests.health.conftest import Fleet, configure, node_states, setup, submit, view


def _gang(api, fake, fleet: Fleet) -> tuple[int, list[str]]:  # type: ignore[no-untyped-def]
    job = submit(api, gpus=8, nodes=2, max_retries=1)
    members = [n for n, _ in fake.attempt(f"{job}.1").request.alloc]
    assert len(members) == 2 and members[0] != members[1]
    return job, members


def test_an_xid_on_member_1s_node_found_by_the_monitor_cordons_that_node_not_member_0s(
        home: Path, fleet: Fleet) -> None:
    configure(home, "poll_interval: 0")
    fleet.states["fake-2"] = "healthy"
    fleet.write()
    api, fake = setup(home, nodes=3)
    job, (first, second) = _gang(api, fake, fleet)
    fleet.set(second, "xid79")
    api._runtime.tick()
    states = node_states(api)
    assert states[second][0] == "cordoned" and "xid_79" in states[second][1]
    assert states[first][0] == "healthy"
    assert [n for n, _ in fake.cordons] == [second]
    found = [f for f in api._runtime.health.store.attempt_findings(job, 1) if f.signature == "xid_79"]
    assert found and found[0].node == second  # the member's GPU fault belongs to the gang's attempt


def test_a_gang_that_dies_of_an_xid_on_member_1s_node_blames_it_and_restarts_elsewhere(
        home: Path, fleet: Fleet) -> None:
    fleet.states["fake-2"] = "healthy"
    fleet.write()
    api, fake = setup(home, nodes=3)
    job, (first, second) = _gang(api, fake, fleet)
    fleet.set(second, "xid79")  # between two polls: the ending's last look finds it
    fake.emit(f"{job}.1", "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE)\n")
    fake.finish(f"{job}.1", 1)
    api._runtime.tick()
    v = view(api, job)
    assert v.attempt_list[0].failure_class == "infra"
    states = node_states(api)
    assert states[second][0] == "cordoned" and states[first][0] == "healthy"
    assert second not in [n for n, _ in fake.attempt(f"{job}.2").request.alloc]


def test_a_node_that_goes_bad_while_idle_takes_no_new_job(home: Path, fleet: Fleet) -> None:
    configure(home, "poll_interval: 0")  # (the preflight's cache would let the next job start there)
    api, fake = setup(home, nodes=1)
    first = submit(api, gpus=8)
    fake.finish(f"{first}.1", 0)
    api._runtime.tick()
    fleet.set("fake-0", "xid79")  # idle, and its preflight passed a moment ago
    second = submit(api, gpus=8)
    assert view(api, second).state == "queued" and len(fake.attempts()) == 1
    state, reason = node_states(api)["fake-0"]
    assert state == "cordoned" and "xid_79" in reason


def test_nvml_failing_after_open_degrades_the_node_with_a_shown_finding_and_places_it_last(
        home: Path, fleet: Fleet) -> None:
    api, fake = setup(home)
    fleet.set("fake-0", "nvml_error")
    api._runtime.tick()  # the idle nodes' poll
    state, reason = node_states(api)["fake-0"]
    assert state == "degraded" and "nvml_error" in reason and "GPU is lost" in reason
    assert node_states(api)["fake-1"][0] == "healthy"
    job = submit(api, gpus=1)
    assert fake.attempt(f"{job}.1").request.node == "fake-1"
    shown = [f for f in api._runtime.health.store.node_findings("fake-0") if f.signature == "nvml_error"]
    assert shown and shown[0].owner == "machine" and shown[0].gpu == "2"


def test_members_of_an_attempt_survive_a_malformed_placement() -> None:
    from autoresearch.health.monitor import members

    def row(alloc: object, node: object = "n0", gpu_ids: object = '["0"]') -> dict[str, object]:
        return {"alloc": alloc, "node": node, "gpu_ids": gpu_ids}

    assert members(row('[["n0", ["0", "1"]], ["n1", ["0"]]]')) == [("n0", ("0", "1")), ("n1", ("0",))]
    assert members(row('[["n0", ["0"]], ["n0", ["1"]]]')) == [("n0", ("0", "1"))]  # packed on one host
    for garbage in ("{", "[1, 2]", '[["n0"]]', "null", '"x"'):
        assert members(row(garbage)) == [("n0", ("0",))]  # the first member's node, as recorded
    assert members(row(None, None)) == []
    assert members(row(None, "n0", "not json")) == [("n0", ())]
