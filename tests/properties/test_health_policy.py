"""The health policy (autoresearch/health/policy.py) on arbitrary findings: it never raises, a
person's word (a hand cordon, a down node) stands, one hard fault cordons, throttling only
degrades, forgiven findings stay forgiven, and whose fault an ending was follows the rules."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from autoresearch.health.config import HealthConfig
from autoresearch.health.findings import JOB_SOURCES, Finding
from autoresearch.health.policy import PREFIX, Differential, NodeStatus, failure_class, node_state
from tests.properties.strategies import FAST

TIMES = st.floats(min_value=0, max_value=10_000, allow_nan=False)
SIGNATURES = st.sampled_from(["xid_79", "xid_13", "ecc_uncorrectable", "nccl_error", "nccl_warn", "cuda_oom",
                              "python_exception", "throttling", "hot", "hang", "infra_failure", "gpu_missing"])
SOURCES = st.sampled_from(["nvml", "kernel", "probe", "preflight", "log", "ending", "hang", "exit", "signal"])
FINDINGS = st.builds(
    Finding, node=st.just("n1"), signature=SIGNATURES,
    cls=st.sampled_from(["infra", "infra-suspect", "user", "throttle"]),
    severity=st.sampled_from(["hard", "soft", "info"]), source=SOURCES,
    gpu=st.one_of(st.none(), st.sampled_from(["0", "3"])), excerpt=st.text(max_size=30), ts=TIMES,
    job_id=st.one_of(st.none(), st.integers(1, 5)), attempt=st.one_of(st.none(), st.integers(1, 3)))
STATES = st.builds(NodeStatus, state=st.sampled_from(["healthy", "degraded", "cordoned", "down"]),
                   reason=st.one_of(st.just(""), st.just("by hand"), st.text(max_size=10).map(lambda t: PREFIX + t)),
                   since=TIMES, cleared_at=TIMES)
CONFIGS = st.builds(HealthConfig, cordon_after=st.integers(1, 5), cordon_window_s=st.floats(1, 20_000),
                    degraded_for_s=st.floats(0, 20_000), uncordon=st.sampled_from(["manual", "preflight"]))


def hard(f: Finding) -> bool:
    return f.severity == "hard" and f.cls == "infra" and f.source not in JOB_SOURCES


@FAST
@given(STATES, st.lists(FINDINGS, max_size=12), CONFIGS, TIMES, st.one_of(st.none(), TIMES))
def test_node_state_is_total_and_a_persons_word_stands(current: NodeStatus, findings: list[Finding],
                                                       config: HealthConfig, now: float, passed: float | None) -> None:
    after = node_state(current, findings, config, now, passed)
    assert after.state in ("healthy", "degraded", "cordoned", "down")
    if current.state == "down" or (current.state == "cordoned" and not current.by_health):
        assert after == current  # the backend's down, a hand cordon: only they undo it
    if current.state == "cordoned" and after.state != "cordoned":
        assert config.uncordon == "preflight" and passed is not None and passed >= current.since + config.cooldown_s
    if after.state != current.state and after.state != "down":
        assert after.reason == "" or after.reason.startswith(PREFIX)
    past = [f for f in findings if f.ts <= now]
    settled = node_state(current, past, config, now, passed)
    assert node_state(settled, past, config, now, None).state == settled.state  # a fixed point


@FAST
@given(STATES, st.lists(FINDINGS, max_size=12), CONFIGS, TIMES)
def test_one_live_hard_fault_cordons_and_throttling_alone_never_does(current: NodeStatus, findings: list[Finding],
                                                                    config: HealthConfig, now: float) -> None:
    after = node_state(current, findings, config, now)
    if current.state in ("healthy", "degraded") and any(hard(f) and f.ts > current.cleared_at for f in findings):
        assert after.state == "cordoned" and after.reason.startswith(PREFIX)
    throttles = [f for f in findings if f.cls == "throttle"]
    if current.state in ("healthy", "degraded"):
        assert node_state(current, throttles, config, now).state in ("healthy", "degraded")


@FAST
@given(STATES, st.lists(FINDINGS, max_size=8), st.lists(FINDINGS, max_size=8), CONFIGS, TIMES)
def test_findings_before_the_last_clearing_are_forgiven(current: NodeStatus, old: list[Finding],
                                                        live: list[Finding], config: HealthConfig, now: float) -> None:
    forgiven = [f for f in old if f.ts <= current.cleared_at]
    assert node_state(current, forgiven + live, config, now) == node_state(current, live, config, now)


@FAST
@given(st.sampled_from(["exit", "timeout", "infra", "cancelled", "preempted"]), st.one_of(st.none(), st.integers(-1, 255)),
       st.lists(FINDINGS, max_size=8))
def test_failure_class_rules(end_reason: str, exit_code: int | None, findings: list[Finding]) -> None:
    result = failure_class(end_reason, exit_code, "detail", findings)
    ok = end_reason in ("cancelled", "preempted") or (end_reason == "exit" and exit_code == 0)
    assert (result is None) == ok
    if result is None:
        return
    assert result.cls in ("infra", "infra-suspect", "unknown", "user") and result.hint
    if any(hard(f) for f in findings):
        assert result.cls == "infra"  # a hard fault of the machine wins over everything the program printed
    if result.cls == "infra":  # only the machine's own evidence makes an ending the machine's fault
        assert any(f.cls == "infra" and f.source not in JOB_SOURCES and f.severity != "info" for f in findings)
    extra = Finding("n1", "xid_79", "infra", "hard", "nvml", "0", "", 1.0)
    assert (failure_class(end_reason, exit_code, "", [*findings, extra]) or result).cls == "infra"


JOB_FINDINGS = st.builds(
    Finding, node=st.just("n1"), signature=SIGNATURES | st.text(max_size=12),
    cls=st.sampled_from(["infra", "infra-suspect", "user", "throttle"]), severity=st.sampled_from(["hard", "soft"]),
    source=st.sampled_from(sorted(JOB_SOURCES)), gpu=st.one_of(st.none(), st.just("0")), excerpt=st.text(max_size=30),
    ts=TIMES, job_id=st.one_of(st.none(), st.integers(1, 50)), attempt=st.integers(1, 3))


@FAST
@given(st.lists(JOB_FINDINGS, max_size=40), CONFIGS, TIMES, st.integers(0, 3))
def test_job_owned_evidence_alone_never_cordons(findings: list[Finding], config: HealthConfig, now: float,
                                               others: int) -> None:
    """Whatever a job prints, however it ends, however often: without the machine's word (and without the
    fleet's differential evidence) the node is never cordoned."""
    for current in (NodeStatus("healthy"), NodeStatus("degraded", PREFIX + "hot", 0.0)):
        assert node_state(current, findings, config, now).state != "cordoned"
        # the fleet vouching for jobs of a single project is not enough either
        one = Differential(others, frozenset(range(1, 51)), frozenset({"p"}), tuple((j, "p") for j in range(1, 51)))
        assert node_state(current, findings, config, now, diff=one).state != "cordoned"
