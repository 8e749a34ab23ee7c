"""Evidence with an owner: the log signatures on a corpus of real log lines (and spoofs), the kernel log
reader (the machine's word), and hostile input that must decide nothing."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from autoresearch.health import config as C
from autoresearch.health import kernel_log as K
from autoresearch.health.signatures import classify_line, scan

CORPUS = Path(__file__).parent / "corpus"


def corpus() -> list[tuple[str, str, str]]:
    out = []
    for path in sorted(CORPUS.glob("*.tsv")):
        for line in path.read_text().splitlines():
            if line.strip():
                cls, _, text = line.partition("\t")
                out.append((path.name, cls, text))
    return out


@pytest.mark.parametrize(("where", "expected", "line"), corpus(), ids=lambda v: str(v)[:40])
def test_each_real_or_spoofed_line_gets_its_class(where: str, expected: str, line: str) -> None:
    assert classify_line(line) == expected, (where, line)


def test_the_corpus_covers_every_class() -> None:
    assert {cls for _, cls, _ in corpus()} == {"user", "infra-suspect", "info", "none"}


@pytest.mark.parametrize("line", [
    "x" * 1_000_000, "NCCL error in: " + "a" * 1_000_000, "\x00\x01\xff" * 1000, "a.b." * 250_000,
    "node:1:2 [0] " * 100_000, "\ufffd" * 50_000, "Xid " * 250_000,
])
def test_hostile_lines_are_scanned_fast_and_decide_nothing(line: str) -> None:
    start = time.process_time()  # CPU time: a backtracking pattern burns it, a loaded machine does not
    hits = scan([line, line], C.DEFAULT)
    assert time.process_time() - start < 2.0
    assert all(h.cls != "infra" and h.severity != "hard" for h in hits)


KMSG = """\
6,1,100,-;Linux version 6.1
4,2,200,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.
4,3,300,-;NVRM: Xid (PCI:0000:3b:00): 13, pid=1234, name=python, Graphics SM Warp Exception
3,4,400,-;Out of memory: Killed process 4242 (python) total-vm:900000kB, anon-rss:800000kB, oom_score_adj:0
6,5,500,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),task=python3,pid=777,uid=1000
4,6,600,-;NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.
garbage without a header
6,x,700,-;not a record
"""


def test_the_kernel_log_reader_turns_records_into_machine_findings_after_its_cursor(tmp_path: Path) -> None:
    path = tmp_path / "kmsg"
    path.write_text(KMSG)
    log = K.KernelLog(str(path))
    read = log.read(None)
    assert read.cursor == "k:6" and not read.problem
    found = K.findings_from("n1", read, C.DEFAULT, 1.0)
    assert [(f.signature, f.cls, f.severity, f.owner) for f in found] == [
        ("xid_79", "infra", "hard", "machine"), ("xid_13", "user", "info", "machine"),
        ("oom_kill", "user", "info", "machine"), ("oom_kill", "user", "info", "machine"),
        ("xid_79", "infra", "hard", "machine")]
    assert "pid 4242 (python)" in found[2].excerpt and "pid 777 (python3)" in found[3].excerpt
    assert log.read("k:6").records == []  # nothing new after the cursor
    with path.open("a") as fh:
        fh.write("4,7,800,-;NVRM: Xid (PCI:0000:3b:00): 48, pid=9, name=x, DBE\n")
    again = log.read("k:6")
    assert [r.seq for r in again.records] == [7] and again.cursor == "k:7"


def test_a_rotated_reset_or_unreadable_kernel_log_is_a_finding_never_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "kmsg"
    path.write_text("6,50,100,-;a\n6,51,100,-;b\n")
    gap = K.KernelLog(str(path)).read("k:10")  # records 11..49 were overwritten
    assert gap.signature == "kernel_log_gap" and [r.seq for r in gap.records] == [50, 51]
    reset = K.KernelLog(str(path)).read("k:900")  # the sequence started again: a reboot
    assert reset.signature == "kernel_log_gap" and len(reset.records) == 2
    missing = K.KernelLog(str(tmp_path / "nope")).read("k:3")
    found = K.findings_from("n1", missing, C.DEFAULT, 1.0)
    assert [(f.signature, f.severity, f.owner) for f in found] == [("kernel_log_unreadable", "info", "machine")]
    (tmp_path / "bin").write_bytes(b"\x00\xff\xfe" * 10_000 + b"\n6,1,1,-;\xff\xfeNVRM\n")
    assert K.findings_from("n1", K.KernelLog(str(tmp_path / "bin")).read(None), C.DEFAULT, 1.0) == []


def test_the_real_dev_kmsg_is_read_or_said_unreadable() -> None:
    read = K.KernelLog().read(None)  # whatever this machine allows: records, or a finding via journalctl's answer
    assert read.records or read.problem or read.cursor is None
