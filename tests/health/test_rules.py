"""The health rules without a GPU: recorded NVML states -> findings, log lines -> signatures,
the health: settings (and their refusals), and whose fault an ending was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoresearch.errors import SpecError
from autoresearch.health import config as C
from autoresearch.health.findings import Finding, blocking, check_sample
from autoresearch.health.nvml import RecordedNvml, reader_for, sample_from_json
from autoresearch.health.policy import failure_class
from autoresearch.health.signatures import scan

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nvml"


def findings_of(name: str, gpus: tuple[str, ...] | None = None) -> list[Finding]:
    sample = RecordedNvml.from_file(FIXTURES / f"{name}.json").sample()
    return check_sample("n1", sample, gpus, C.DEFAULT, 100.0)


def sigs(findings: list[Finding]) -> set[tuple[str, str | None, str]]:
    return {(f.signature, f.gpu, f.severity) for f in findings}


def test_a_healthy_node_has_no_findings_and_power_capping_is_normal() -> None:
    assert findings_of("healthy") == []
    assert findings_of("power_cap") == []  # SwPowerCap (0x4) alone: a busy GPU, not a sick one


@pytest.mark.parametrize(("fixture", "expected"), [
    ("ecc", {("ecc_uncorrectable", "3", "hard")}),
    ("xid79", {("xid_79", "5", "hard")}),
    ("missing_gpu", set()),  # every GPU the driver reports is fine...
    ("retired_pages", {("retired_pages_pending", "0", "hard"), ("row_remap_failure", "0", "hard")}),
    ("thermal", {("throttling", "1", "soft"), ("hot", "1", "soft")}),
    ("no_driver", {("nvml_unavailable", None, "hard")}),
])
def test_recorded_faults_become_findings(fixture: str, expected: set[tuple[str, str | None, str]]) -> None:
    assert sigs(findings_of(fixture)) == expected


def test_the_gpus_an_attempt_was_given_must_be_present() -> None:
    assert sigs(findings_of("missing_gpu", ("6", "7"))) == {("gpu_missing", "7", "hard")}
    assert findings_of("ecc", ("0", "1")) == []  # GPU 3's fault is not these GPUs'
    thermal = findings_of("thermal")
    assert {f.cls for f in thermal} == {"throttle"} and not blocking(thermal)
    assert "SwThermal" in thermal[0].excerpt and "HwThermal" in thermal[0].excerpt


def test_a_recorded_state_that_is_garbage_reads_as_absent_not_a_crash() -> None:
    for data in (None, [], "x", {"gpus": "x"}, {"gpus": [None, {"index": "nan", "temperature_c": "hot",
                                                                 "xids": ["a", 2**80, 13],
                                                                 "ecc_volatile_uncorrected": float("nan")}]}):
        sample = sample_from_json(data)
        check_sample("n", sample, None, C.DEFAULT)
    sample = sample_from_json({"gpus": [{"xids": ["a", 2**80, 13]}]})
    assert sample.gpus[0].xids == (0, 0, 13)
    assert sigs(check_sample("n", sample, None, C.DEFAULT)) == {("xid_13", "0", "info"), ("xid_0", "0", "info")}


def test_a_fleet_file_gives_each_node_its_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fleet = {"nodes": {"a": json.loads((FIXTURES / "healthy.json").read_text()),
                       "b": json.loads((FIXTURES / "xid79.json").read_text())}}
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps(fleet))
    monkeypatch.setenv("AUTORESEARCH_NVML_FAKE", str(path))
    a, b = reader_for("a", "fake"), reader_for("b", "fake")
    assert a is not None and b is not None and reader_for("c", "fake") is None
    assert b.sample().gpus[5].xids == (79,) and a.sample().gpus[5].xids == ()
    monkeypatch.setenv("AUTORESEARCH_NVML_FAKE", str(tmp_path / "missing.json"))
    assert reader_for("a", "fake") is None  # a missing test double cordons nothing


def test_without_the_fake_a_remote_node_or_declared_slots_have_no_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AUTORESEARCH_NVML_FAKE", raising=False)
    assert reader_for("fake-0", "fake") is None
    monkeypatch.setenv("AUTORESEARCH_GPUS", "2")
    assert reader_for(None, "local") is None  # declared slots: no driver to ask


LOG = """\
step 1 loss: 0.5
gpu-a1:2211:2290 [1] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to 10.0.0.2<41233> failed : Software caused connection abort
[E ProcessGroupNCCL.cpp:475] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600000 milliseconds before timing out.
RuntimeError: CUDA error: an illegal memory access was encountered
NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB
Traceback (most recent call last):
"""


def test_log_signatures_name_whose_fault_it_is() -> None:
    hits = {h.signature: (h.cls, h.severity) for h in scan(LOG.splitlines(), C.DEFAULT)}
    suspect = ("infra-suspect", "soft")  # a job's output is never more than a suspicion about the machine
    assert hits == {"nccl_net_error": suspect, "nccl_warn": ("info", "info"), "collective_timeout": suspect,
                    "illegal_memory_access": ("user", "soft"), "xid_in_log": suspect,
                    "cuda_oom": ("user", "soft"), "python_exception": ("user", "soft")}
    assert scan(["loss: 0.1", "all good", "x" * 100_000], C.DEFAULT) == []


def test_extra_patterns_are_used_and_ones_that_do_not_compile_are_refused() -> None:
    config = C.parse({"patterns": [{"pattern": r"fabric (down|flap)", "signature": "fabric", "class": "infra",
                                    "severity": "hard"}]})
    assert [(h.signature, h.cls, h.severity) for h in scan(["link: fabric flap on port 3"], config)] == [
        ("fabric", "infra-suspect", "soft")]  # an operator's pattern reads job output too: never hard
    with pytest.raises(SpecError) as err:
        C.parse({"patterns": ["(unclosed"]})
    assert "does not compile" in err.value.message and "escape" in err.value.hint


@pytest.mark.parametrize("bad", [
    {"cordon_after": 0}, {"cordon_after": "many"}, {"cordon_after": True}, {"poll_interval": "-5s"},
    {"poll_interval": float("nan")}, {"preflight_cache": "soon"}, {"uncordon": "auto"}, {"hard_xids": 79},
    {"temperature_margin": 1e9}, {"min_driver": "../etc"}, {"probe": {"command": []}},
    {"probe": {"command": ["x"], "min_busbw_gbps": "fast"}}, {"nonsense": 1}, ["not", "a", "map"],
])
def test_invalid_thresholds_are_refused_with_a_hint(bad: object) -> None:
    with pytest.raises(SpecError) as err:
        C.parse(bad)
    assert err.value.hint


def test_settings_come_from_the_homes_config_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert C.load(tmp_path) == C.DEFAULT  # no file: defaults, no YAML import needed
    (tmp_path / "config.yaml").write_text("backends: {}\nhealth:\n  cordon_after: 5\n  poll_interval: 2m\n")
    config = C.load(tmp_path)
    assert (config.cordon_after, config.poll_interval_s) == (5, 120.0)
    (tmp_path / "config.yaml").write_text("health:\n  cordon_after: -1\n")
    with pytest.raises(SpecError):
        C.load(tmp_path, strict=True)
    assert C.load(tmp_path) == C.DEFAULT  # a pass goes on with the defaults, and says so
    assert "health.cordon_after" in capsys.readouterr().err


def F(sig: str, cls: str, severity: str = "soft", ts: float = 1.0, source: str = "log") -> Finding:  # noqa: N802
    return Finding("n1", sig, cls, severity, source, None, f"line of {sig}", ts)


def test_failure_class_the_machines_fault_wins_then_the_programs_bugs_then_suspicions_then_exceptions() -> None:
    assert failure_class("exit", 0, "", [F("xid_79", "infra", "hard", source="kernel")]) is None
    assert failure_class("cancelled", None, "", [F("xid_79", "infra", "hard", source="nvml")]) is None
    both = [F("python_exception", "user"), F("nccl_error", "infra-suspect"),
            F("xid_79", "infra", "hard", 5.0, source="kernel")]
    top = failure_class("exit", 1, "exited 1", both)
    assert top is not None and (top.cls, top.signature) == ("infra", "xid_79")
    forged = failure_class("exit", 1, "exited 1", [F("xid_79", "infra", "hard", source="log")])
    assert forged is not None and forged.cls == "user"  # a hard "fault" the job printed decides nothing
    oom = failure_class("exit", 1, "", [F("nccl_error", "infra-suspect"), F("cuda_oom", "user")])
    assert oom is not None and (oom.cls, oom.signature) == ("user", "cuda_oom") and "batch size" in oom.hint
    for bug in ("illegal_memory_access", "device_assert", "nccl_invalid_usage"):
        got = failure_class("exit", 1, "", [F("collective_timeout", "infra-suspect"), F(bug, "user")])
        assert got is not None and (got.cls, got.signature) == ("user", bug) and "not retried" in got.hint
    nccl = failure_class("exit", 1, "", [F("python_exception", "user"), F("collective_timeout", "infra-suspect")])
    assert nccl is not None and nccl.cls == "infra-suspect" and "another node" in nccl.hint and nccl.retried
    plain = failure_class("exit", 3, "exited 3", [])
    assert plain is not None and (plain.cls, plain.why) == ("user", "exited 3")
    lost = failure_class("infra", None, "supervisor died", [])
    assert lost is not None and lost.cls == "infra-suspect"
    killed_oom = failure_class("infra", None, "killed by SIGKILL", [F("cuda_oom", "user")], signal=9)
    assert killed_oom is not None and killed_oom.cls == "user"


def test_a_sigkill_is_unknown_without_the_machines_word_and_out_of_memory_with_the_oom_killers() -> None:
    killed = failure_class("infra", None, "killed by SIGKILL that autoresearch did not send", [], signal=9)
    assert killed is not None and (killed.cls, killed.retried) == ("unknown", True)
    oom = failure_class("infra", None, "killed by SIGKILL", [F("oom_kill", "user", "info", source="kernel")], signal=9)
    assert oom is not None and (oom.cls, oom.signature) == ("user", "oom_kill") and "memory" in oom.hint
    printed = failure_class("infra", None, "killed", [F("oom_kill", "user", "info", source="log")], signal=9)
    assert printed is not None and printed.cls == "unknown"  # the job printing an OOM-killer line proves nothing
    hang = failure_class("timeout", None, "ran past its timeout", [F("hang", "infra-suspect", "info", source="hang")])
    assert hang is not None and hang.cls == "user"  # a reported hang does not make a timeout the machine's


def test_a_pending_row_remap_is_a_hard_cause_that_waits_for_a_person() -> None:
    from autoresearch.health.findings import check_sample
    from autoresearch.health.nvml import sample_from_json
    from autoresearch.health.policy import NodeStatus, node_state

    sample = sample_from_json({"gpus": [{"index": 0}, {"index": 1, "row_remap_pending": True}]})
    found = check_sample("n1", sample, None, C.DEFAULT, 5.0)
    assert [(f.signature, f.gpu, f.severity, f.owner) for f in found] == [("row_remap_pending", "1", "hard", "machine")]
    config = C.parse({"uncordon": "preflight", "cooldown": 0})
    cordoned = node_state(NodeStatus("healthy"), found, config, 6.0)
    assert cordoned.state == "cordoned" and "[hard]" in cordoned.reason
    assert node_state(cordoned, [], config, 99.0, preflight_passed_at=98.0).state == "cordoned"
