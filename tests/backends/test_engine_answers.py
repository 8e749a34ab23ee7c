"""Whatever JSON an engine answers (a broken proxy, a newer API, garbage) is read without an
exception: an unknown shape is never taken for an ending (invariant 8)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from autoresearch.backends._base import AttemptStatus
from autoresearch.backends._k8s_status import interpret
from autoresearch.backends.databricks import _interpret as databricks_state
from tests.properties.strategies import FAST, json_values

# Shapes near the real ones, with garbage in every slot.
_POD = st.fixed_dictionaries({}, optional={
    "metadata": st.one_of(json_values(), st.fixed_dictionaries({}, optional={
        "name": json_values(), "annotations": json_values(), "deletionTimestamp": json_values()})),
    "status": st.one_of(json_values(), st.fixed_dictionaries({}, optional={
        "phase": st.one_of(st.sampled_from(["Pending", "Running", "Succeeded", "Failed"]), json_values()),
        "reason": st.one_of(st.sampled_from(["Evicted"]), json_values()),
        "containerStatuses": st.one_of(json_values(), st.lists(st.fixed_dictionaries({}, optional={
            "name": st.one_of(st.just("main"), json_values()),
            "state": st.one_of(json_values(), st.fixed_dictionaries({}, optional={
                "terminated": st.one_of(json_values(), st.fixed_dictionaries({}, optional={
                    "exitCode": json_values(), "signal": json_values(), "reason": json_values()})),
                "waiting": json_values()}))}), max_size=2))}))})
_JOB = st.one_of(st.none(), json_values(), st.fixed_dictionaries({}, optional={
    "metadata": json_values(), "spec": st.one_of(json_values(), st.fixed_dictionaries({}, optional={
        "suspend": json_values()})),
    "status": st.one_of(json_values(), st.fixed_dictionaries({}, optional={
        "conditions": st.one_of(json_values(), st.lists(st.fixed_dictionaries({}, optional={
            "type": st.one_of(st.sampled_from(["Complete", "Failed"]), json_values()),
            "status": st.one_of(st.just("True"), json_values()), "reason": json_values()}), max_size=2))}))}))


@FAST
@given(job=_JOB, pods=st.one_of(json_values(), st.lists(_POD, max_size=3)), stopped=st.booleans())
def test_any_job_and_pods_read_as_a_status(job: Any, pods: Any, stopped: bool) -> None:
    status, delete = interpret(job, pods, stopped, "ns", "name")
    assert isinstance(status, AttemptStatus) and isinstance(delete, bool)
    assert status.exit_code is None or isinstance(status.exit_code, int)


@FAST
@given(answer=st.one_of(json_values(), st.fixed_dictionaries({}, optional={
    "state": st.one_of(st.sampled_from(["RUNNING", "FAILED", "CANCELED", "SUCCEEDED", "WHAT"]), json_values()),
    "exit_code": json_values(), "state_message": json_values()})), timeout=json_values())
def test_any_databricks_answer_reads_as_a_status(answer: Any, timeout: Any) -> None:
    status = databricks_state(answer if isinstance(answer, dict) else {"state": answer}, timeout)
    assert isinstance(status, AttemptStatus)
