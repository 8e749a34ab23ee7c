"""This machine's GPUs, checked now: ``autoresearch health`` and Slurm's ``HealthCheckProgram``.

Slurm runs the program on every compute node at ``HealthCheckInterval``; a non-zero exit
with a reason on stdout marks the problem, and with ``--drain`` the node drains itself
(``scontrol update nodename=<this node> state=drain reason=...``), as NHC does. The checks
are the preflight's (:func:`autoresearch.health.findings.check_sample`), on every GPU.
``AUTORESEARCH_NVML_FAKE`` points the program at a recorded state instead of the driver.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time

from autoresearch.health.config import HealthConfig
from autoresearch.health.findings import Finding, check_sample
from autoresearch.health.nvml import FAKE_ENV, NodeSample, RealNvml, RecordedNvml


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
