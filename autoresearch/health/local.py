"""This machine's GPUs, checked now: ``autoresearch health`` and Slurm's ``HealthCheckProgram``.

Slurm runs the program on every compute node at ``HealthCheckInterval``; a non-zero exit
with a reason on stdout marks the problem, and with ``--drain`` the node drains itself
(``scontrol update nodename=<this node> state=drain reason=...``), as NHC does. The checks
are the preflight's (:func:`autoresearch.health.findings.check_sample`), on every GPU.
``AUTORESEARCH_NVML_FAKE`` points the program at a recorded state instead of the driver.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from autoresearch.health.config import HealthConfig
from autoresearch.health.findings import Finding, check_sample
from autoresearch.health.nvml import FAKE_ENV, NodeSample, RealNvml, RecordedNvml

DRAIN_PREFIX = "autoresearch health: "  # the reason of a drain this program made (it resumes only these)
HARD_TAG = "[hard] "  # after DRAIN_PREFIX: a cause that waits for a person (health.policy.HARD_SIGNATURES)


def node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or os.environ.get("AUTORESEARCH_NODE") or socket.gethostname().split(".")[0]


def check_here(config: HealthConfig, expect_gpus: int | None = None) -> tuple[str, NodeSample, list[Finding]]:
    """This node's name, its GPUs' sample and the findings on it (``expect_gpus``: how many the
    node must have, e.g. its Slurm Gres count; None: whatever the driver reports)."""
    node = node_name()
    fake = os.environ.get(FAKE_ENV)
    sample = RecordedNvml.from_file(fake, node).sample() if fake else RealNvml().sample()
    wanted = None if expect_gpus is None else tuple(str(i) for i in range(expect_gpus))
    return node, sample, check_sample(node, sample, wanted, config, time.time(), source="health")


def drain(node: str, reason: str) -> str:
    """Drain ``node`` in Slurm with ``reason``; what happened, in one line."""
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return "not drained: scontrol is not on PATH (is this a Slurm node?)"
    try:
        done = subprocess.run([scontrol, "update", f"nodename={node}", "state=drain", f"reason={reason[:200]}"],
                              capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"not drained: {err}"
    if done.returncode != 0:
        return f"not drained: scontrol said {(done.stderr or done.stdout).strip()[:200]}"
    return f"drained {node} in Slurm"


# -- Slurm's health program: its state between runs, its own drains ---------------------------


def state_path(home: Path, node: str) -> Path:
    """Where ``--slurm-hc`` keeps, per node, its kernel-log cursor and when it drained the node."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", node)[:100].lstrip(".") or "node"
    return home / "slurm-hc" / f"{safe}.json"


def load_state(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def save_state(path: Path, state: dict[str, Any]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, path)
    except OSError:
        pass  # the next run reads the kernel log from its start again: more to read, nothing lost


def kernel_here(node: str, config: HealthConfig, state: dict[str, Any]) -> list[Finding]:
    """The kernel log's records since the last run (the cursor in ``state``, moved), as findings."""
    from autoresearch.health import kernel_log

    klog = kernel_log.for_node(node, True)
    if klog is None:
        return []
    cursor = state.get("kernel_cursor")
    read = klog.read(cursor if isinstance(cursor, str) else None)
    if read.cursor:
        state["kernel_cursor"] = read.cursor[:500]
    return kernel_log.findings_from(node, read, config, time.time())


def drain_reason(bad: list[Finding]) -> str:
    from autoresearch.health.policy import HARD_SIGNATURES

    hard = HARD_TAG if any(f.signature in HARD_SIGNATURES for f in bad) else ""
    return (DRAIN_PREFIX + hard + "; ".join(f.line() for f in bad))[:200]


_STATE = re.compile(r"(?:^|\s)State=(\S+)")
_REASON = re.compile(r"(?:^|\s)Reason=(.*?)(?=\s+\[[^\]]*@[^\]]*\]|\s+[A-Z][A-Za-z]*=|$)")


def slurm_node(node: str) -> tuple[str, str] | None:
    """(state, reason) of ``node`` as ``scontrol show node -o`` says; None when it cannot say (no scontrol,
    an error, output that is not a node record)."""
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return None
    try:
        done = subprocess.run([scontrol, "show", "node", "-o", node], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (done.stdout or b"")[:65536].decode("utf-8", "replace")
    if done.returncode != 0 or f"NodeName={node} " not in text + " ":
        return None
    state = _STATE.search(text)
    if state is None:
        return None
    reason = _REASON.search(text)
    return state.group(1)[:100], (reason.group(1).strip() if reason else "")[:500]


def resume_if_own(node: str, state: dict[str, Any], cooldown_s: float, now: float) -> str:
    """On a node that passed: resume it in Slurm when it is drained by this program (its reason starts with
    DRAIN_PREFIX), for a soft cause, ``cooldown_s`` after the drain. What happened, in one line ("": nothing)."""
    seen = slurm_node(node)
    if seen is None:
        return ""
    slurm_state, reason = seen
    if "DRAIN" not in slurm_state.upper() or not reason.startswith(DRAIN_PREFIX):
        state.pop("drained_at", None)  # not ours (a person's drain, or none): never touched
        return ""
    if reason.startswith(DRAIN_PREFIX + HARD_TAG.strip()):
        return f"{node} stays drained: a hard cause waits for a person ({reason[:160]})"
    at = state.get("drained_at")
    if not isinstance(at, (int, float)) or at != at or at > now:
        state["drained_at"] = now  # drained before this program remembered it: the cool-down starts now
        at = now
    if now < at + cooldown_s:
        return f"{node} passed; it stays drained until the cool-down ends in {int(at + cooldown_s - now)} s"
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return ""
    try:
        done = subprocess.run([scontrol, "update", f"nodename={node}", "state=resume"], capture_output=True,
                              text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"not resumed: {err}"
    if done.returncode != 0:
        return f"not resumed: scontrol said {(done.stderr or done.stdout).strip()[:200]}"
    state.pop("drained_at", None)
    return f"resumed {node} in Slurm (it passed; drained by this program: {reason[:120]})"
