"""How a Job and its pods read as an :class:`AttemptStatus` (``backends/kubernetes.py``): pure
functions over the API's JSON, so every engine state is tested without a cluster.

Endings: Job ``Complete`` -> exit 0; ``Failed`` -> the container's exit code (the rank that
failed on its own, for a gang), ``DeadlineExceeded`` -> timed out; ``OOMKilled`` -> SIGKILL with
the reason. Lost (infra, and the Job deleted so the engine never runs it beside the retry):
an evicted pod, a Job Kueue suspended after it ran (preempted), an image that cannot be pulled.
"""

from __future__ import annotations

import time
from typing import Any

from autoresearch.backends import _k8s_job as manifest
from autoresearch.backends._base import AttemptStatus

STARTED = "autoresearch.io/started"  # set on the Job once a pod of it ran: a later suspension is a preemption
_FATAL_WAITING = {"ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "CreateContainerConfigError",
                  "CreateContainerError", "RunContainerError"}


def _d(value: Any) -> dict[str, Any]:
    """``value`` if the API gave an object there, else ``{}``: its JSON is parsed defensively (invariant 8)."""
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return default


def job_annotations(obj: dict[str, Any]) -> dict[str, str]:
    return dict(_d(_d(_d(obj).get("metadata")).get("annotations")))


def index(pod: dict[str, Any]) -> tuple[int, str]:
    meta = _d(_d(pod).get("metadata"))
    return _int(_d(meta.get("annotations")).get("batch.kubernetes.io/job-completion-index")), \
        str(meta.get("creationTimestamp") or "")


def _condition(job: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for cond in _list(_d(job.get("status")).get("conditions")):
        if isinstance(cond, dict) and cond.get("type") == kind and cond.get("status") == "True":
            return cond
    return None


def _terminated(pod: dict[str, Any]) -> dict[str, Any] | None:
    for cs in _list(_d(pod.get("status")).get("containerStatuses")):
        if isinstance(cs, dict) and cs.get("name") == manifest.CONTAINER:
            term = _d(cs.get("state")).get("terminated")
            return term if isinstance(term, dict) else None
    return None


def _waiting(pod: dict[str, Any]) -> dict[str, Any]:
    for cs in _list(_d(pod.get("status")).get("containerStatuses")):
        if isinstance(cs, dict):
            waiting = _d(cs.get("state")).get("waiting")
            if isinstance(waiting, dict):
                return waiting
    return {}


def _ended_status(pods: list[dict[str, Any]], stopped: bool, timed_out: bool, detail: str) -> AttemptStatus:
    """The attempt's ending from its pods: the first failed rank's exit, else rank 0's."""
    terms = [(p, t) for p in pods if (t := _terminated(p)) is not None]
    failed = [(p, t) for p, t in terms if _int(t.get("exitCode")) != 0 or t.get("reason") == "OOMKilled"]
    # The rank that failed on its own (not one the Job controller deleted after it), the earliest first.
    failed.sort(key=lambda pt: (bool(_d(pt[0].get("metadata")).get("deletionTimestamp")),
                                str(pt[1].get("finishedAt") or "")))
    pod_term = failed[0] if failed else (terms[0] if terms else None)
    code: int | None = None
    signal: int | None = None
    if pod_term is not None:
        term = pod_term[1]
        code = _int(term.get("exitCode"))
        signal = _int(term.get("signal")) or None
        if term.get("reason") == "OOMKilled":
            signal, detail = 9, detail or f"OOMKilled: {term.get('message') or 'the container passed its memory limit'}"
        elif signal is None and 128 < code <= 128 + 64 and (stopped or timed_out):
            signal = code - 128  # the runtime's exit code for a death by signal N
        if signal is not None:
            code = None
    elif stopped:
        signal, detail = 9, detail or "stopped; the pod was removed before its exit status was read"
    return AttemptStatus("exited", exit_code=code, signal=signal, timed_out=timed_out, stopped=stopped,
                         ended_at=time.time(), detail=detail)


def interpret(job: dict[str, Any] | None, pods: list[dict[str, Any]], stopped: bool, ns: str,
               name: str) -> tuple[AttemptStatus, bool]:
    """(status, whether the Job must be deleted so that the engine never runs it again)."""
    pods = [p for p in _list(pods) if isinstance(p, dict)]
    job = job if isinstance(job, dict) else None
    active = [p for p in pods if _d(p.get("status")).get("phase") not in ("Succeeded", "Failed")]
    for pod in pods:
        st = _d(pod.get("status"))
        if st.get("phase") == "Failed" and st.get("reason") in ("Evicted", "Preempting", "Shutdown", "NodeLost",
                                                                "Terminated", "UnexpectedAdmissionError"):
            return AttemptStatus("lost", ended_at=time.time(), stopped=stopped,
                                 detail=f"pod {st.get('reason')}: {str(st.get('message') or '')[:200]}"), True
        waiting = _waiting(pod)
        if str(waiting.get("reason")) in _FATAL_WAITING:
            return AttemptStatus("lost", ended_at=time.time(),
                                 detail=f"{waiting['reason']}: {str(waiting.get('message') or '')[:200]} "
                                        f"(kubectl -n {ns} describe pod)"), True
    if job is None or _d(job.get("metadata")).get("deletionTimestamp"):
        if active:
            return AttemptStatus("running"), False
        if pods or stopped:
            return _ended_status(pods, stopped, False, ""), False
        return AttemptStatus("lost", ended_at=time.time(),
                             detail=f"Job {ns}/{name} is gone (deleted outside autoresearch, or by its TTL before "
                                    "its ending was read)"), False
    if _d(job.get("spec")).get("suspend") is True and STARTED in job_annotations(job) and not active:
        return AttemptStatus("lost", ended_at=time.time(),
                             detail="preempted: Kueue suspended the running Job (evicted for a higher-priority "
                                    "workload); retried as a new attempt"), True
    failed, complete = _condition(job, "Failed"), _condition(job, "Complete")
    if (failed or complete) and not active:
        reason = str((failed or {}).get("reason") or "")
        detail = "" if not failed or reason in ("BackoffLimitExceeded", "DeadlineExceeded") else \
            f"Job failed: {reason}: {str(failed.get('message') or '')[:200]}"
        return _ended_status(pods, stopped, reason == "DeadlineExceeded", detail), False
    if any(_d(p.get("status")).get("phase") == "Running" for p in active):
        return AttemptStatus("running"), False
    if not active and pods and all(_terminated(p) is not None for p in pods) and not (failed or complete):
        return AttemptStatus("running"), False  # the Job controller has not caught up with its pods yet
    return AttemptStatus("starting"), False
