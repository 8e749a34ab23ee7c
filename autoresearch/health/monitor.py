"""The health checks inside the pass: preflight, the runtime monitor, endings, node reviews.

No daemon (docs/architecture.md): :class:`Health` runs in the processes that already run
passes (a CLI call, an attempt's on-exit hook, a loop, the MCP server) and in the live
ingestion of logs (the mirror's syncer, a loop's monitor), rate-limited per node across
processes by the ledger (``nodes.poll_due_at``):

* :meth:`Health.preflight` before an attempt starts (cached per node);
* :meth:`Health.monitor` once per pass: for each node due for a poll that runs attempts (every
  member's node of a gang) or is idle and readable here, NVML findings (a GPU's belongs to the
  attempt that holds it), the attempts' logs scanned for signatures (through the ingestion of
  their metrics, which reads the same bytes), and hangs (no new output for ``hang_after``;
  ``on_hang: kill`` stops them, their stack dumped first);
* :meth:`Health.on_ending`: whose fault a failed attempt was (:func:`policy.failure_class`),
  with a last look at the machine (NVML, the kernel log); an ``infra-suspect`` ending (the
  job's output points at the machine) re-checks the node at once, uncached (and runs the
  probe when one is configured): the machine's answer decides about the node;
* :func:`review`: the policy applied to a node's findings (machine-owned evidence, and the
  fleet's differential evidence for infra-suspect failures); a cordon goes through
  ``Backend.cordon`` too, so an engine that schedules itself (Slurm) drains the node.

What a job prints (its log's signatures) is recorded as job-owned findings and never
reviews a node by itself; an infra-suspect line asks for a re-check (the node's cache is
dropped and its poll made due).

Every finding is a ledger event (:mod:`autoresearch.health.store`) with node, GPU,
signature and a redacted excerpt.
"""

from __future__ import annotations

import contextlib
import json
import sys
from typing import Any

from autoresearch.backends import Backend
from autoresearch.backends._supervisor import NEVER_STARTED
from autoresearch.errors import LedgerError
from autoresearch.health import config as C
from autoresearch.health import policy
from autoresearch.health.findings import Finding, blocking, check_sample
from autoresearch.health.log_hits import redacted as _redacted
from autoresearch.health.nvml import reader_for
from autoresearch.health.policy import SUSPECT
from autoresearch.health.store import HealthStore
from autoresearch.store.ledger import Ledger

HANG_ENV = "AUTORESEARCH_HANG_AFTER"


class Health:
    def __init__(self, ledger: Ledger, backend: Backend) -> None:
        self.ledger = ledger
        self.backend = backend
        self.store = HealthStore(ledger)

    @property
    def config(self) -> C.HealthConfig:
        return C.load(self.ledger.home)

    # -- preflight --------------------------------------------------------------------------

    def preflight(self, node: str | None, gpu_ids: tuple[str, ...], row: Any, now: float | None = None) -> list[str]:
        """Why an attempt must not start on ``node``'s ``gpu_ids`` ([]: it may). ``row``: the node's
        ``nodes`` row as the pass read it (its cache)."""
        config = self.config
        if not (config.enabled and config.preflight and gpu_ids and node):
            return []
        from autoresearch.health import preflight as P

        now = self.ledger.clock() if now is None else now
        cached = P.cached_block(row, gpu_ids, config, now)
        if cached is not None:
            return cached
        reader = _reader(self.backend, node)
        klog = _kernel(self.backend, node)
        if reader is None and klog is None:
            return []  # this process cannot see the node's GPUs: the node's own health program can
        findings, result = P.check(node, reader, gpu_ids, config, now, _gpus_of(row) or None,
                                   extra=self._kernel_findings(node, klog, config, now))
        self.store.record(_redacted(findings))
        self.store.mark_checked(node, now, result)
        passed = not result["bad"] and not result["node"]
        state = review(self.ledger, self.backend, node, now, preflight_passed_at=now if passed else None)
        wanted = set(gpu_ids)
        why = [f.line() for f in blocking(findings) if f.gpu is None or f.gpu in wanted
               or any(g in wanted for g in f.gpu.split(","))]
        if not why and state == "cordoned":
            why = [f"node {node} is cordoned"]
        return why

    # -- the runtime monitor ----------------------------------------------------------------

    def monitor(self, active: list[Any], now: float | None = None) -> None:
        """One rate-limited round over the nodes that run ``active`` attempts (every member's node of a
        gang), the idle nodes whose GPUs this process can read (a node that goes bad while idle must not
        take the next job), and health-cordoned nodes waiting for a passing check (``uncordon: preflight``)."""
        config = self.config
        if not config.enabled:
            return
        now = self.ledger.clock() if now is None else now
        by_node: dict[str, list[tuple[Any, tuple[str, ...]]]] = {}
        for att in active:
            for node, gpus in members(att):
                by_node.setdefault(node, []).append((att, gpus))
        rows = self.store.nodes()
        waiting = []
        if config.uncordon == "preflight":
            waiting = [r["name"] for r in rows
                       if r["state"] == "cordoned" and str(r["reason"]).startswith(policy.PREFIX)]
        idle = [r["name"] for r in rows if r["state"] in ("healthy", "degraded") and r["name"] not in by_node
                and r["backend"] == self.backend.name and (r["poll_due_at"] or 0) <= now
                and _gpus_of(r)] if watches_idle(self.backend) else []
        for node in sorted(set(by_node) | set(waiting) | set(idle)):
            if not self.store.claim_poll(node, now, config.poll_interval_s):
                continue
            try:
                self._poll(node, by_node.get(node, []), config, now)
            except LedgerError:
                raise
            except Exception as err:  # noqa: BLE001 - a monitor bug must not stop the pass
                print(f"warning: health monitor on {node} failed: {type(err).__name__}: {err}", file=sys.stderr)

    def _poll(self, node: str, attempts: list[tuple[Any, tuple[str, ...]]], config: C.HealthConfig,
              now: float) -> None:
        """``attempts``: those with a member on ``node``, each with that member's GPUs there."""
        gpus = _gpus_of(self.store.node(node))
        # A node with no GPU slots (a CPU machine: no driver, no AUTORESEARCH_GPUS) has nothing for
        # NVML to check; "NVML unavailable" there is the normal case, not a fault to cordon for.
        reader = _reader(self.backend, node) if gpus else None
        findings: list[Finding] = self._kernel_findings(node, _kernel(self.backend, node) if gpus else None,
                                                        config, now)
        if reader is not None:
            findings += check_sample(node, reader.sample(), gpus, config, now)
            for i, f in enumerate(findings):  # a GPU's fault belongs to the attempt (gang member) that runs on it
                owner = next((a for a, held in attempts if f.gpu is not None and f.gpu in held), None)
                if owner is not None:
                    findings[i] = _owned(f, owner["job_id"], owner["n"])
        from autoresearch.engine.ingest import ingest_attempt  # the log's signatures are found as it is ingested

        for att, _ in attempts:
            if att["node"] == node:  # an attempt's log is read once a round: with its first member's node
                ingest_attempt(self.ledger, self.backend, att)
                findings += self._hang(node, att, config, now)
        # throttling is recorded again often enough to keep the node degraded while it lasts
        self.store.record(_redacted(findings), throttle_dedupe_s=min(3600.0, config.degraded_for_s / 3))
        passed = reader is not None and not blocking(findings) and not any(f.signature == "nvml_error" for f in findings)
        review(self.ledger, self.backend, node, now, preflight_passed_at=now if passed and not attempts else None)

    def _hang(self, node: str, att: Any, config: C.HealthConfig, now: float) -> list[Finding]:
        hang_after = config.hang_after_s
        with contextlib.suppress(ValueError, TypeError, C.SpecError):
            env = json.loads(att["spec"]).get("env") or {}
            if env.get(HANG_ENV):
                hang_after = C.duration(env[HANG_ENV], "hang_after (job env)", "the job's env")
        if not hang_after or att["state"] != "running" or not att["external_id"]:
            return []
        try:
            size = self.backend.log_size(att["external_id"])
        except Exception:  # noqa: BLE001 - no size now: no verdict now
            return []
        with contextlib.suppress(OSError):
            import os

            size += os.stat(att["metrics_path"]).st_size
        seen_at = att["seen_at"] or att["started_at"] or att["created_at"]
        if size != att["seen_bytes"]:
            self.store.note_progress(att["job_id"], att["n"], size, now)
            return []
        if now - seen_at < hang_after:
            return []
        gpus = ",".join(json.loads(att["gpu_ids"])) or None
        silent = f"no new log line or metric for {int(now - seen_at)} s (hang_after {hang_after:g} s)"
        found = [Finding(node, "hang", SUSPECT, "info", "hang", gpus, silent, now, att["job_id"], att["n"])]
        if config.on_hang == "kill" and att["stop_reason"] is None:
            found.append(self._kill_hang(node, att, gpus, silent, now))
        return found

    def _kill_hang(self, node: str, att: Any, gpus: str | None, silent: str, now: float) -> Finding:
        """``on_hang: kill``: the hung attempt's Python stack dumped first (``py-spy dump`` when installed,
        beside its log), then the stop recorded (reason ``hang``) and sent with the job's grace (a program
        that ignores SIGTERM gets SIGKILL after it). Its ending is infra-suspect: the re-check of the
        machine decides (a hang is the job's silence, not the machine's word)."""
        from autoresearch.store.jobstore import JobStore

        stack = _dump_stack(self.backend, att)
        row = JobStore(self.ledger).mark_stop(att["job_id"], att["n"], "hang", why=silent)
        if row is not None:
            try:
                grace = float(json.loads(att["spec"]).get("grace") or 0.0) or None
            except (TypeError, ValueError, AttributeError):
                grace = None
            try:
                self.backend.stop(att["external_id"], grace)
            except Exception as err:  # noqa: BLE001 - recorded: the pass sends the stop again (STOP_AGAIN_AFTER_S)
                print(f"warning: could not stop hung attempt {att['job_id']}.{att['n']}: {err}", file=sys.stderr)
        return Finding(node, "hang_killed", SUSPECT, "soft", "hang", gpus,
                       f"killed (health.on_hang: kill): {silent}" + (f"; {stack}" if stack else ""), now,
                       att["job_id"], att["n"])

    # -- endings ----------------------------------------------------------------------------

    def on_ending(self, att: Any, end_reason: str, exit_code: int | None, detail: str,
                  now: float | None = None, signal: int | None = None) -> policy.Classified | None:
        """Whose fault an ended attempt was, from its findings and a last look at the machine (NVML on its
        GPUs, the kernel log). An infra-suspect ending re-checks the node now (uncached, with the probe);
        an infra or infra-suspect ending is recorded against the node, where the policy weighs it."""
        config = self.config
        now = self.ledger.clock() if now is None else now
        if end_reason in ("cancelled", "preempted") or (end_reason == "exit" and exit_code == 0):
            return None
        node = att["node"]
        placed = members(att)
        started = att["started_at"] or att["created_at"] or 0.0
        if config.enabled and placed:
            seen: list[Finding] = []
            for member, gpus in placed:  # every member's node: the Xid that killed a gang may be on member k's
                seen += self._kernel_findings(member, _kernel(self.backend, member), config, now)
                reader = _reader(self.backend, member)
                if reader is not None and gpus:  # the Xid that killed it may be in the driver, not in its log
                    seen += check_sample(member, reader.sample(), gpus, config, now)
            self.store.record(_redacted([_owned(f, att["job_id"], att["n"]) for f in seen]))
        found = self.store.attempt_findings(att["job_id"], att["n"])
        for member in _nodes(placed):  # what the machine said about its nodes while it ran (polls, the kernel log)
            found += [f for f in self.store.node_findings(member, since=started - 1)
                      if f.owner == "machine" and f.job_id is None and f.ts <= now + 1
                      and ((f.severity == "hard" and f.cls == "infra") or f.signature == "oom_kill")]
        classified = policy.failure_class(end_reason, exit_code, detail, found, signal)
        if classified is None or not node or not config.enabled or detail == NEVER_STARTED:
            return classified  # (a launcher killed mid-launch: nothing ran on the node)
        gpus_of = dict(placed)
        # A suspicion re-checks every member's node (the machine's answer decides); the node the machine's
        # evidence names is blamed (member k's, for a gang); a suspicion nobody confirmed is weighed on every
        # member's node (the differential rule decides). The simulated driver settles endings the same way.
        settled = policy.attribute(classified, _nodes(placed), found,
                                   lambda member: self.recheck(member, gpus_of[member], config, now))
        classified = settled.classified
        self.store.record([policy.verdict(n, classified, f"job {att['job_id']} attempt {att['n']}: {classified.why}",
                                          now, att["job_id"], att["n"]) for n in settled.blamed])
        for n in settled.blamed:
            review(self.ledger, self.backend, n, now)
        return classified

    def on_success(self, att: Any, now: float | None = None) -> None:
        """A retry that succeeded: the nodes where this job failed as infra-suspect are weighed again (it
        ran elsewhere: the differential rule may now count those failures)."""
        config = self.config
        if not config.enabled:
            return
        now = self.ledger.clock() if now is None else now
        for node in self.store.suspect_nodes(att["job_id"], att["n"]):
            if node != att["node"]:
                review(self.ledger, self.backend, node, now)

    def recheck(self, node: str, gpu_ids: tuple[str, ...], config: C.HealthConfig, now: float) -> list[Finding]:
        """Look at ``node`` again now, uncached: NVML on every GPU, the kernel log, the probe when one is
        configured (on ``gpu_ids``, the attempt's there). The blocking faults it found (the machine's word)."""
        from autoresearch.health import preflight as P

        reader = _reader(self.backend, node)
        klog = _kernel(self.backend, node)
        if reader is None and klog is None:
            self.store.request_recheck(node)  # this process cannot look: the next one that can will
            return []
        row = self.store.node(node)
        findings, result = P.check(node, reader, gpu_ids, config, now, _gpus_of(row) or None,
                                   extra=self._kernel_findings(node, klog, config, now))
        self.store.record(_redacted(findings))
        self.store.mark_checked(node, now, result)
        return blocking(findings)

    def _kernel_findings(self, node: str, klog: Any, config: C.HealthConfig, now: float) -> list[Finding]:
        """The kernel log's new records on ``node`` (after the ledger's cursor), as findings; the cursor moves."""
        if klog is None:
            return []
        from autoresearch.health.kernel_log import findings_from

        read = klog.read(self.store.kernel_cursor(node))
        self.store.set_kernel_cursor(node, read.cursor)
        return findings_from(node, read, config, now)


PYSPY_TIMEOUT_S = 20.0


def _dump_stack(backend: Backend, att: Any) -> str:
    """``py-spy dump --pid`` of the attempt's program, written beside its log (``attempt-N.stack.txt``);
    a line saying where (and its last frame), or "" when py-spy is not installed or the backend cannot
    name the process on this machine. Never raises."""
    import shutil
    import subprocess

    pyspy = shutil.which("py-spy")
    pids = getattr(backend, "attempt_pids", None)
    if pyspy is None or pids is None:
        return ""
    try:
        found = [int(p) for p in pids(att["external_id"])][:4]
    except Exception:  # noqa: BLE001 - no pid: no stack
        return ""
    if not found:
        return ""
    parts = []
    for pid in found:
        try:
            done = subprocess.run([pyspy, "dump", "--pid", str(pid)], capture_output=True, timeout=PYSPY_TIMEOUT_S,
                                  check=False)
            text = (done.stdout or done.stderr or b"").decode("utf-8", "replace")
        except (OSError, subprocess.SubprocessError) as err:
            text = f"py-spy dump --pid {pid} failed: {err}"
        parts.append(f"$ py-spy dump --pid {pid}\n{text[:200_000]}")
    path = str(att["log_path"])
    path = (path[:-4] if path.endswith(".log") else path) + ".stack.txt"
    try:
        import os

        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
            out.write("\n".join(parts))
    except OSError:
        path = ""
    frames = [line.strip() for line in "\n".join(parts).splitlines() if line.strip() and not line.startswith(("$", "Process",
              "Python v", "Thread"))]
    top = frames[0][:160] if frames else ""
    return "stack dumped" + (f" to {path}" if path else "") + (f" (top: {top})" if top else "")


def review(ledger: Ledger, backend: Backend, node: str, now: float, preflight_passed_at: float | None = None) -> str:
    """Apply the policy to ``node``'s findings and record a change; its state after."""
    store = HealthStore(ledger)
    row = store.node(node)
    if row is None:
        return ""
    before = policy.NodeStatus(row["state"], row["reason"] or "", row["since"] or row["updated_at"] or 0.0,
                               row["cleared_at"] or 0.0)
    config = C.load(ledger.home)
    findings = store.node_findings(node, since=before.cleared_at)
    suspects = [f.job_id for f in findings if f.source == "ending" and f.cls == policy.SUSPECT
                and f.job_id is not None and f.ts >= now - config.cordon_window_s]
    diff = store.differential(node, suspects, now - config.cordon_window_s) if suspects else None
    after = policy.node_state(before, findings, config, now, preflight_passed_at, diff)
    if after == before or not store.set_status(node, before, after):
        return before.state
    if after.state == "cordoned":
        try:
            backend.cordon(node, after.reason)
        except Exception as err:  # noqa: BLE001 - the ledger's cordon stands; the engine is told next time
            print(f"warning: could not cordon {node} on the {backend.name} engine: {err}", file=sys.stderr)
    elif before.state == "cordoned" and after.state == "healthy":
        with contextlib.suppress(Exception):
            backend.uncordon(node)
    return after.state


def warm(ledger: Ledger) -> None:
    """Load the home's health config and compile its log signatures now (:func:`autoresearch.health.log_hits.record_log_hits`'s first
    call would): a long-lived process does it before its first ending, not on that ending's path."""
    config = C.load(ledger.home)
    if config.enabled:
        from autoresearch.health.signatures import scan

        scan([""], config)


def _reader(backend: Backend, node: str) -> Any:
    """The backend's own reader of ``node``'s GPUs (a simulated fleet's), else NVML's."""
    own = getattr(backend, "gpu_reader", None)
    return own(node) if own is not None else reader_for(node, backend.name)


def _kernel(backend: Backend, node: str) -> Any:
    """The kernel log of ``node`` this process can read (this machine's, or ``AUTORESEARCH_KMSG``'s), or None."""
    from autoresearch.health import kernel_log
    from autoresearch.health.nvml import local_node_names

    own = getattr(backend, "kernel_log", None)
    if own is not None:
        return own(node)
    return kernel_log.for_node(node, backend.name == "local" and node in local_node_names())


def watches_idle(backend: Backend) -> bool:
    """Whether the passes poll ``backend``'s idle nodes: the nodes whose GPUs a pass can read (this machine's,
    a simulated fleet's, recorded states). An engine's remote nodes are watched by their own health
    program (``autoresearch health --slurm-hc``)."""
    import os

    from autoresearch.health.nvml import FAKE_ENV

    return backend.name == "local" or getattr(backend, "gpu_reader", None) is not None or bool(os.environ.get(FAKE_ENV))


def members(att: Any) -> list[tuple[str, tuple[str, ...]]]:
    """(node, GPU ids) of every member of an attempt: a gang's whole placement (its ``alloc``), else its
    one node; members that share a node (a gang packed on one host) are one entry."""
    placed: list[tuple[str, list[str]]] = []
    try:
        alloc = json.loads(att["alloc"]) if att["alloc"] else None
        for node, ids in alloc or ():
            placed.append((str(node), [str(g) for g in ids]))
    except (TypeError, ValueError, KeyError, IndexError):
        placed = []
    if not placed and att["node"]:
        try:
            placed = [(str(att["node"]), [str(g) for g in json.loads(att["gpu_ids"] or "[]")])]
        except (TypeError, ValueError):
            placed = [(str(att["node"]), [])]
    merged: dict[str, list[str]] = {}
    for node, ids in placed:
        merged.setdefault(node, []).extend(g for g in ids if g not in merged.get(node, []))
    return [(node, tuple(ids)) for node, ids in merged.items()]


def _nodes(placed: list[tuple[str, tuple[str, ...]]]) -> list[str]:
    return [node for node, _ in placed]


def _gpus_of(row: Any) -> tuple[str, ...]:
    """The GPU slots the backend reports for a node (its ``nodes`` row)."""
    try:
        return tuple(str(g) for g in json.loads(row["gpu_ids"]))
    except (TypeError, ValueError, KeyError, IndexError):
        return ()


def _owned(f: Finding, job_id: int, n: int) -> Finding:
    return Finding(f.node, f.signature, f.cls, f.severity, f.source, f.gpu, f.excerpt, f.ts, job_id, n)
