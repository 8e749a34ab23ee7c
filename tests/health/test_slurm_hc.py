"""`autoresearch health --slurm-hc --drain` as Slurm's HealthCheckProgram, against a fake scontrol: the
kernel log since its last run (its cursor), pending remaps, drains with a reason, and resumes only the
nodes it drained itself (its reason prefix), for soft causes, after the cool-down."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

from tests.health.conftest import FIXTURES, configure

CLI = [sys.executable, "-m", "autoresearch.cli"]

# scontrol as a Slurm node's state: `show node -o N` prints the record from $FAKE_SLURM (state \t reason);
# `update ... state=drain reason=R` / `state=resume` change it; every call is logged.
SCONTROL = r"""#!/bin/sh
echo "$@" >> "$FAKE_SLURM.calls"
if [ -n "$FAKE_GARBAGE" ] && [ "$1" = show ]; then printf '\001\377State=<b>\nNodeName=x State\n'; exit 0; fi
if [ "$1" = show ]; then
  state=$(cut -f1 "$FAKE_SLURM"); reason=$(cut -f2 "$FAKE_SLURM")
  echo "NodeName=$4 Arch=x86_64 CoresPerSocket=8 State=$state ThreadsPerCore=1 Reason=$reason [root@2026-12-03T04:00:00] Comment=(null)"
  exit 0
fi
for a in "$@"; do
  case "$a" in
    state=drain) new=IDLE+DRAIN ;;
    state=resume) printf 'IDLE\t\n' > "$FAKE_SLURM"; exit 0 ;;
    reason=*) why=${a#reason=} ;;
  esac
done
[ -n "$new" ] && printf '%s\t%s\n' "$new" "$why" > "$FAKE_SLURM"
exit 0
"""


class Node:
    def __init__(self, tmp: Path, home: Path) -> None:
        self.bin = tmp / "bin"
        self.bin.mkdir()
        (self.bin / "scontrol").write_text(SCONTROL)
        (self.bin / "scontrol").chmod(0o755 | stat.S_IEXEC)
        self.slurm = tmp / "slurm"
        self.slurm.write_text("IDLE\t\n")
        self.kmsg = tmp / "kmsg"
        self.kmsg.write_text("6,1,100,-;Linux version 6.8.0\n")
        self.home = home
        self.env = {"PATH": f"{self.bin}:{os.environ['PATH']}", "SLURMD_NODENAME": "gpu-17",
                    "FAKE_SLURM": str(self.slurm), "AUTORESEARCH_KMSG": str(self.kmsg),
                    "AUTORESEARCH_NVML_FAKE": str(FIXTURES / "healthy.json")}

    def log(self, seq: int, text: str) -> None:
        with self.kmsg.open("a") as fh:
            fh.write(f"4,{seq},{seq * 100},-;{text}\n")

    def hc(self, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*CLI, "health", "--slurm-hc", "--drain"], capture_output=True, text=True, timeout=60,
                              env={**os.environ, **self.env, **env})

    def state(self) -> tuple[str, str]:
        state, _, reason = self.slurm.read_text().rstrip("\n").partition("\t")
        return state, reason

    def calls(self) -> list[str]:
        path = Path(f"{self.slurm}.calls")
        return path.read_text().splitlines() if path.exists() else []


def test_an_xid_in_the_kernel_log_since_the_last_run_drains_and_a_pass_after_the_cool_down_resumes(
        home: Path, tmp_path: Path) -> None:
    configure(home, "cooldown: 0")
    node = Node(tmp_path, home)
    assert node.hc().returncode == 0 and node.state() == ("IDLE", "")
    node.log(2, "NVRM: Xid (PCI:0000:3b:00): 94, pid=1234, name=python, Contained: SM (0x1).")
    out = node.hc()
    assert out.returncode == 1 and "drained gpu-17" in out.stdout
    assert node.state()[0] == "IDLE+DRAIN" and node.state()[1].startswith("autoresearch health: xid_94")
    out = node.hc()  # the cursor moved past the record: the node passes, and it is this program's drain
    assert out.returncode == 0 and "resumed gpu-17" in out.stdout, out.stdout + out.stderr
    assert node.state() == ("IDLE", "") and "update nodename=gpu-17 state=resume" in node.calls()


def test_a_pass_within_the_cool_down_keeps_the_drain(home: Path, tmp_path: Path) -> None:
    configure(home, "cooldown: 1h")
    node = Node(tmp_path, home)
    node.log(2, "NVRM: Xid (PCI:0000:3b:00): 94, pid=1234, name=python, Contained: SM (0x1).")
    assert node.hc().returncode == 1
    out = node.hc()
    assert out.returncode == 0 and "cool-down" in out.stdout and node.state()[0] == "IDLE+DRAIN"


def test_a_hard_cause_and_a_persons_drain_are_never_resumed(home: Path, tmp_path: Path) -> None:
    configure(home, "cooldown: 0")
    node = Node(tmp_path, home)
    node.log(2, "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.")
    assert node.hc().returncode == 1
    assert node.state()[1].startswith("autoresearch health: [hard] xid_79")
    out = node.hc()
    assert out.returncode == 0 and "waits for a person" in out.stdout and node.state()[0] == "IDLE+DRAIN"
    node.slurm.write_text("IDLE+DRAIN\tmaintenance: new PSU\n")
    node.hc()
    assert node.state() == ("IDLE+DRAIN", "maintenance: new PSU")
    assert not any("resume" in c for c in node.calls())


def test_a_pending_row_remap_drains_as_a_hard_cause(home: Path, tmp_path: Path) -> None:
    state = json.loads((FIXTURES / "healthy.json").read_text())
    state["gpus"][1]["row_remap_pending"] = True
    (tmp_path / "remap.json").write_text(json.dumps(state))
    node = Node(tmp_path, home)
    out = node.hc(AUTORESEARCH_NVML_FAKE=str(tmp_path / "remap.json"))
    assert out.returncode == 1 and node.state()[1].startswith("autoresearch health: [hard] row_remap_pending")


def test_garbage_from_scontrol_and_an_unreadable_kernel_log_decide_nothing(home: Path, tmp_path: Path) -> None:
    configure(home, "cooldown: 0")
    node = Node(tmp_path, home)
    node.slurm.write_text("IDLE+DRAIN\tautoresearch health: xid_94 on gpu-17\n")
    out = node.hc(FAKE_GARBAGE="1", AUTORESEARCH_KMSG=str(tmp_path / "missing"))
    assert out.returncode == 0 and out.stderr == "" and node.state()[0] == "IDLE+DRAIN"  # garbage: not resumed
    node.kmsg.write_bytes(b"\x00\xff garbage\n4,x,y;NVRM: Xid\n" + b"A" * 1_000_000 + b"\n")
    out = node.hc()
    assert out.returncode == 0, out.stdout + out.stderr
