"""policy.attribute: how a classified failure is settled (the machine's re-check, the nodes blamed), the
one rule the runtime's Health.on_ending and the simulated driver both call."""

from __future__ import annotations

from autoresearch.health import policy as P
from autoresearch.health.findings import Finding

XID = Finding("b", "xid_79", "infra", "hard", "nvml", "3", "GPU has fallen off the bus", 10.0)


def test_a_suspicion_the_recheck_confirms_is_the_machines_fault_on_the_node_it_names() -> None:
    asked: list[str] = []

    def recheck(node: str) -> list[Finding]:
        asked.append(node)
        return [XID] if node == "b" else []

    suspect = P.Classified(P.SUSPECT, "collective operation timeout")
    settled = P.attribute(suspect, ["a", "b", "a", "c"], [], recheck)
    assert asked == ["a", "b", "c"]  # every member's node once, in order
    assert settled.classified.cls == "infra" and settled.classified.signature == "xid_79"
    assert settled.classified.hint == P.INFRA_HINT and "fallen off the bus" in settled.classified.excerpt
    assert settled.confirmed == (XID,)
    assert settled.blamed == ("b",)  # member k's node, not the whole gang


def test_an_unconfirmed_suspicion_is_weighed_on_every_member_and_user_faults_on_none() -> None:
    suspect = P.Classified(P.SUSPECT, "collective operation timeout")
    settled = P.attribute(suspect, ["a", "b", "a"], [], lambda _node: [])
    assert settled.classified is suspect and settled.confirmed == () and settled.blamed == ("a", "b")

    def never(node: str) -> list[Finding]:
        raise AssertionError(f"a user fault re-checked {node}")

    user = P.Classified("user", "Traceback")
    assert P.attribute(user, ["a"], [], never).blamed == ()
    infra = P.Classified("infra", "xid", signature="xid_79")
    assert P.attribute(infra, ["a", "b"], [XID], never).blamed == ("b",)


def test_a_verdict_is_a_verdict_only_when_the_machine_said_so() -> None:
    infra = P.verdict("a", P.Classified("infra", "xid"), "job 1: " + "x" * 400, 5.0, 1, 2)
    assert (infra.source, infra.cls, infra.signature, infra.severity) == ("verdict", "infra", "infra_failure", "soft")
    assert len(infra.excerpt) == 300 and (infra.job_id, infra.attempt, infra.ts) == (1, 2, 5.0)
    assert P.verdict("a", P.Classified(P.SUSPECT, "nccl"), "job 1", 5.0, 1, 2).source == "ending"
