"""Preflight: before an attempt's command starts, its GPUs are present and healthy.

:func:`preflight` samples the node through NVML (:mod:`autoresearch.health.nvml`), turns
the sample into findings (:func:`autoresearch.health.findings.check_sample`) and, when
``health.probe`` names one, runs a short probe job on the attempt's GPUs
(:mod:`autoresearch.health.probe`: a matmul and, for several GPUs, an all-reduce whose
bus bandwidth is compared with ``min_busbw_gbps``). A node that passed is not checked
again for ``preflight_cache`` (the result lives on its ``nodes`` row, so every process
shares it): a warm start pays a row look-up, no NVML call.

The caller (the pass) does not start an attempt that preflight blocks: the node is marked
(policy) and the job stays queued for another node, its retries untouched.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from typing import Any

from autoresearch.health.config import HealthConfig, Probe
from autoresearch.health.findings import Finding, blocking, check_sample
from autoresearch.health.nvml import NvmlReader

_BUSBW = re.compile(r"^\s*busbw_gbps\s*[:=]\s*([0-9]+(?:\.[0-9]+)?)\s*$", re.M)


def cached_block(row: Any, gpu_ids: tuple[str, ...], config: HealthConfig, now: float) -> list[str] | None:
    """What the cached result says of these GPUs: the signatures that block them ([] passes),
    or None when there is no fresh result for the node."""
    checked = row["checked_at"] if row is not None else None
    if checked is None or now - checked >= config.preflight_cache_s or now < checked:
        return None
    try:
        event_at = row["machine_event_at"]
    except (IndexError, KeyError):
        event_at = None
    if event_at is not None and event_at >= checked:  # the machine said something since: look again
        return None
    try:
        result = json.loads(row["check_result"] or "{}")
        bad = result.get("bad") or {}
        node_level = list(result.get("node") or [])
    except (ValueError, AttributeError):
        return None
    return node_level + [str(bad[g]) for g in gpu_ids if g in bad]


def check(node: str, reader: NvmlReader | None, gpu_ids: tuple[str, ...], config: HealthConfig,
          now: float, node_gpus: tuple[str, ...] | None = None,
          extra: list[Finding] | None = None) -> tuple[list[Finding], dict[str, Any]]:
    """Every finding of the node now (all its GPUs, ``node_gpus`` as the backend counts them: one
    bad GPU is the node's fault; ``extra``: the kernel log's) and the cache entry: ``{"bad": {gpu:
    signature}, "node": [signature]}`` of the blocking ones."""
    findings = check_sample(node, reader.sample(), node_gpus, config, now, source="preflight") if reader else []
    findings += extra or []
    wanted = set(gpu_ids)
    blocked = blocking(findings)
    if reader is not None and config.probe.command and gpu_ids and not any(
            f.gpu is None or f.gpu in wanted for f in blocked):
        findings += run_probe(config.probe, node, gpu_ids, now)
    result: dict[str, Any] = {"bad": {}, "node": []}
    for f in blocking(findings):
        if f.gpu is None:
            result["node"].append(f.signature)
        else:
            result["bad"].setdefault(f.gpu, f.signature)
    return findings, result


def run_probe(probe: Probe, node: str, gpu_ids: tuple[str, ...], now: float) -> list[Finding]:
    """Run the probe command on ``gpu_ids``; a failure is a hard finding of the node."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(gpu_ids), "AUTORESEARCH_PROBE_GPUS": str(len(gpu_ids)),
           "AUTORESEARCH_PROBE_MIN_BUSBW": str(probe.min_busbw_gbps)}

    def found(signature: str, severity: str, excerpt: str) -> Finding:
        return Finding(node, signature, "infra", severity, "probe", ",".join(gpu_ids) or None, excerpt[-400:], now)

    try:
        done = subprocess.run(list(probe.command), env=env, capture_output=True, text=True, errors="replace",
                              timeout=probe.timeout_s, stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        return [found("probe_timeout", "hard", f"the probe ran past {probe.timeout_s:g} s")]
    except OSError as err:  # the command is not there: the operator's mistake, not the node's
        return [found("probe_unrunnable", "info", f"cannot run the probe {probe.command[0]!r}: {err.strerror}")]
    output = (done.stdout + done.stderr).strip()
    if done.returncode != 0:
        last = output.splitlines()[-3:] if output else []
        return [found("probe_failed", "hard", f"exited {done.returncode}: " + " | ".join(last))]
    match = _BUSBW.search(done.stdout)
    if match and probe.min_busbw_gbps and float(match.group(1)) < probe.min_busbw_gbps:
        return [found("busbw_low", "hard",
                      f"all-reduce bus bandwidth {float(match.group(1)):g} GB/s < {probe.min_busbw_gbps:g} GB/s")]
    return []
