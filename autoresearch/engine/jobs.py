"""The engine's job operations that more than one caller needs: submit, cancel, the
capacity check and a page of a log.

Both the facade (:class:`autoresearch.api.Api`, for the CLI, MCP and Python) and the
research loop (which sits below the facade) call these, so a trial is submitted, refused
and cancelled exactly like a job submitted by hand. They take the :class:`Runtime`;
nothing here imports the facade, the loop or the MLflow mirror.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from autoresearch.engine.blocked import no_node_text
from autoresearch.engine.runtime import FINAL, Runtime, checkpoint_dir, checkpoint_problem
from autoresearch.engine.watcher import wake
from autoresearch.errors import CapacityError, SpecError
from autoresearch.util.redact import context, job_secrets, mask
from autoresearch.views import LogPage

MAX_LOG_BYTES = 16_000


def submit(runtime: Runtime, spec: Any, project: str = "") -> int:
    """Validate, record and (if there is room) start a job; returns its id.

    Refused here, before anything is recorded: a bad spec, what the backend cannot do,
    more GPUs or nodes than exist, a project the backend cannot isolate, an unusable
    checkpoint directory."""
    return submit_many(runtime, [spec], project)[0]


def submit_many(runtime: Runtime, specs: list[Any], project: str = "", group: str | None = None,
                max_running: int | None = None, place_as: int | None = None,
                place: bool | Callable[[], bool] = True) -> list[int]:
    """:func:`submit` for a batch (a loop's proposal): every spec is checked as by ``submit``
    before anything is recorded (one bad spec refuses the batch), all are recorded in one ledger
    transaction, then one pass places what fits (not one pass per job). Their ids, in order.

    ``group``: the jobs' group, of which at most ``max_running`` (when given: the group's cap from
    now on, set in the same transaction) start or run at once; the others wait queued and the pass
    that records one's ending starts the next (a research loop submits trials ahead of its free
    slots this way: no round trip through the loop between an ending and the next launch).
    ``place_as``: the job whose place in the queue they take (a paused trial resumed by its loop
    keeps its paused job's place: it goes before the trials queued after that). ``place=False`` (or a
    function that says so once they are recorded): no pass; the caller runs one soon (a server's
    batches: tools/_batch.py)."""
    from autoresearch.engine.spec import JobSpec, make_spec  # pydantic stays off the read paths

    if group is not None and (not isinstance(group, str) or not 0 < len(group) <= 200):
        raise SpecError("a job group is a name of 1 to 200 characters", hint="name the group, e.g. loop:12")
    if max_running is not None and (group is None or isinstance(max_running, bool) or not isinstance(max_running, int)
                                    or not 1 <= max_running <= 1_000_000):
        raise SpecError(f"max_running must be a whole number from 1 to 1000000 with a group, not {max_running!r}",
                        hint="cap a group at the number of its jobs that may run at once")
    if place_as is not None and (isinstance(place_as, bool) or not isinstance(place_as, int)
                                 or not 1 <= place_as < 2**63):
        raise SpecError(f"place_as must be a job id, not {place_as!r}", hint="name the job whose place to take")
    ledger = runtime.ledger
    containers = runtime.backend.capabilities.containers
    workdirs: dict[str, str] = {}  # (a batch's jobs share their workdir: checked once)
    jobs = [spec if isinstance(spec, JobSpec) else make_spec(dict(spec), containers=containers, workdirs=workdirs)
            for spec in specs]
    if not jobs:
        return []
    for job in jobs:
        if job.secret_env and not runtime.backend.capabilities.secrets:
            raise SpecError(f"the {runtime.backend.name} backend has no secret store for secret_env "
                            f"({', '.join(sorted(job.secret_env))})",
                            hint="use a kubernetes or databricks backend, or pass the value in env")
        runtime.backend.check(job)  # what the backend cannot do is refused here, never retried
    node_rows: list[Any] | None = None  # as check_capacity read them: our pass places onto these
    for gpus, nodes, priority in sorted({(job.gpus, job.nodes, job.priority) for job in jobs}):
        node_rows = check_capacity(runtime, gpus, nodes, project, priority)
    from autoresearch.engine import isolation  # submits only: reads stay light

    policy = isolation.job_policy(ledger, project, runtime.backend)  # fails closed
    for job in jobs:
        if policy:  # a tenant's job: the server writes nothing for it outside the tenant's own places
            isolation.check_paths(ledger, project, job, containers)
        if not job.checkpoint:
            continue
        checkpoint = checkpoint_dir(ledger.home, 0, {"checkpoint": job.checkpoint, "workdir": job.workdir})
        problem = checkpoint_problem(checkpoint) if checkpoint else None
        if problem:
            raise SpecError(f"checkpoint directory {checkpoint} cannot be created: {problem}",
                            hint="pass --checkpoint a writable directory, or --checkpoint alone for a per-job one")
    job_ids = runtime.jobs.add_jobs(jobs, project, runtime.backend.name, policy, group, max_running, place_as)
    from autoresearch.engine.watcher import ensure_daemon

    # The endings of what our pass starts run their pass in the daemon, not each in a fresh interpreter.
    # A batch starts it before its pass: its first wave may be dozens of short jobs ending at once, and
    # one that ends before the daemon listens waits for it (backends/_supervisor.py). A single job's
    # start does not wait behind the daemon's fork and imports: it is started after.
    if len(jobs) > 1:
        ensure_daemon(runtime)
    # Our own pass, unless another process runs one now (the pass daemon, busy with endings): then we
    # do not queue behind it for the lock; a poke makes the listener run another pass after its
    # current one, which places these. Nobody listens: we wait for the lock and run it ourselves.
    # A capped group with no room (a loop's trials queued ahead of its free slots): no pass could start
    # one of them now, and only an ending of one of its jobs makes room, whose pass (it records the
    # ending, then places) starts them. So no pass of ours and no poke: ~4 ms of a loop's controller
    # per batch. (An ending recorded before this read left room here: then we place as ever.)
    placed_elsewhere = group is not None and max_running is not None and \
        runtime.jobs.group_room([group]).get(group, 1) <= 0
    # (Its reconcile polls the starting attempts, not every running one: their endings are heard by
    # whoever listens, or recorded by their supervisors' own passes; Runtime.FULL_RECONCILE_S.)
    if ((place() if callable(place) else place) and not placed_elsewhere
            and not runtime.tick(wait=False, nodes=True if node_rows is None else node_rows, due=True, only=())
            and not wake(runtime.ledger.home, runtime.backend.name)):
        runtime.tick(due=True, only=())
    sizes = (node_rows if node_rows is not None else runtime.jobs.node_sizes(runtime.backend.name)) \
        if runtime.backend.capabilities.places else []
    for job_id, job in zip(job_ids, jobs, strict=True):  # (the nodes read once for the batch, not once a job)
        warn_if_unschedulable(runtime, job_id, job.gpus, job.nodes, sizes)
    if len(jobs) == 1:
        ensure_daemon(runtime)
    return job_ids


ARRAY_INDEX, ARRAY_COUNT = "AUTORESEARCH_ARRAY_INDEX", "AUTORESEARCH_ARRAY_COUNT"


def submit_array(runtime: Runtime, spec: Any, array: str, project: str = "") -> tuple[list[int], list[int], int | None]:
    """A job array (Slurm's ``sbatch --array``): one job of ``spec`` per index of ``array``
    (:func:`autoresearch.engine.spec.parse_array`), each with ``$AUTORESEARCH_ARRAY_INDEX`` (its index) and
    ``$AUTORESEARCH_ARRAY_COUNT``, named ``NAME[INDEX]`` and tagged ``array`` (the array's id) and
    ``array_index``. All are checked once and recorded by one :func:`submit_many` (one transaction,
    one pass; their ids run consecutively in index order); with ``%N``, they share a job group capped
    at N, so at most N start or run at once and each ending starts the next. Returns (their ids, the
    indices, the cap)."""
    import secrets

    from autoresearch.engine.spec import JobSpec, make_spec, parse_array

    indices, cap = parse_array(array)
    base = spec if isinstance(spec, JobSpec) else make_spec(dict(spec), containers=runtime.backend.capabilities.containers)
    fields = base.model_dump()
    array_id = secrets.token_hex(6)
    specs = [JobSpec(**{**fields, "name": f"{base.name}[{i}]",
                        "env": {**base.env, ARRAY_INDEX: str(i), ARRAY_COUNT: str(len(indices))},
                        "tags": {**base.tags, "array": array_id, "array_index": str(i)}}) for i in indices]
    ids = submit_many(runtime, specs, project, group=f"array:{array_id}" if cap is not None else None, max_running=cap)
    return ids, indices, cap


def warn_if_unschedulable(runtime: Runtime, job_id: int, gpus: int, nodes: int,
                          rows: list[Any] | None = None) -> None:
    """A job that fits the cluster but has no usable node (all cordoned or down) queues, with a
    warning on it saying so, instead of waiting in silence. ``rows``: the backend's node sizes,
    if the caller read them already."""
    if not runtime.backend.capabilities.places:
        return
    if runtime.backend.single_host and nodes > 1:
        gpus, nodes = gpus * nodes, 1  # a gang's members share the host
    if rows is None:
        rows = runtime.jobs.node_sizes(runtime.backend.name)
    text = no_node_text(rows, gpus, nodes)
    if not text:
        return
    job = runtime.jobs.job(job_id)
    if job is None or job["state"] != "queued":
        return
    runtime.jobs.warn("unschedulable", job_id, None, f"queued: {text}")


def check_capacity(runtime: Runtime, gpus: int, nodes: int, project: str = "", priority: str = "normal") -> \
        list[Any] | None:
    """Refuse a request no node (or not enough nodes) could ever hold, or its project's quota
    never lets run (autoresearch/engine/shares.py). The nodes' rows it refreshed (None: the backend places
    its jobs itself, and no node was read)."""
    if not runtime.backend.capabilities.places:
        return None
    rows = runtime.refresh_nodes()
    for node, other in runtime.node_clash.items():
        raise SpecError(f"backend {runtime.backend.name!r} reports node {node!r}, which backend {other!r} of this "
                        "home reports already (node names are unique in a home)",
                        hint=f"give profile {runtime.backend.name!r} its own node_name: in config.yaml "
                             "(two backends on one machine also share its GPUs: give each its own, or use one)")
    # Capacity is what exists, cordoned or not (a cordoned node comes back); the wait for
    # a usable one is the queue's business, as with Slurm's drained nodes.
    largest = max((r["gpus"] for r in rows), default=0)
    if gpus > largest:
        if not largest:
            raise CapacityError(
                f"asked for {gpus} GPU(s) but this machine has none (NVML found no GPU and AUTORESEARCH_GPUS "
                "is unset)",
                hint="use --gpus 0, or declare fake slots with AUTORESEARCH_GPUS=N for development",
            )
        where = ", ".join(f"{r['name']}: {r['gpus']}" for r in rows)
        raise CapacityError(f"asked for {gpus} GPU(s) per node but the largest node has {largest} ({where})",
                            hint=f"ask for at most {largest} GPUs")
    if runtime.backend.single_host and nodes > 1:  # a gang's members share the host, each with its own slots
        if gpus * nodes > largest:
            raise CapacityError(f"a gang of {nodes} members with {gpus} GPU(s) each needs {gpus * nodes} GPU slots "
                                f"but this host has {largest}",
                                hint=f"ask for at most {largest // gpus} node(s) of {gpus} GPU(s), or fewer GPUs each")
    else:
        fitting = sum(1 for r in rows if r["gpus"] >= gpus)
        if nodes > fitting:
            raise CapacityError(f"asked for {nodes} node(s) with {gpus} GPU(s) each but only {fitting} exist",
                                hint=f"ask for at most {fitting} node(s)")
    from autoresearch.backends import profiles
    from autoresearch.engine import shares

    shares.check(profiles.fair_share(runtime.ledger.home), sum(r["gpus"] for r in rows), project, priority, gpus, nodes)
    return rows


def cancel(runtime: Runtime, job_ids: list[int], reason: str = "cancelled") -> None:
    """Cancel queued jobs now; stop running ones (SIGTERM, grace, SIGKILL). Ids must exist.

    ``reason`` is the running attempts' end reason: ``cancelled`` (by a person or an agent)
    or ``stopped`` (by a research loop: early stopping, the loop's own end)."""
    asked = runtime.jobs.request_cancel(job_ids, FINAL)
    for att in runtime.jobs.active_attempt_numbers(asked):
        runtime.request_stop(att["job_id"], att["n"], reason)
    runtime.tick(wait=False)


def log_page(runtime: Runtime, job: Any, att: Any, tail_lines: int | None = None, offset: int | None = None,
             max_bytes: int = MAX_LOG_BYTES, grep: str | None = None) -> LogPage:
    """A page of one attempt's log (``job``, ``att``: their ledger rows), secrets masked:
    from ``offset``, the last ``tail_lines``, or lines matching ``grep``."""
    if max_bytes < 1:
        raise SpecError("max_bytes must be >= 1", hint=f"use up to {MAX_LOG_BYTES}")
    if offset is not None and offset < 0:
        raise SpecError("offset must be >= 0", hint="offset 0 is the start of the log")
    if tail_lines is not None and tail_lines < 1:
        raise SpecError("tail_lines must be >= 1", hint="leave it out to read from an offset")
    backend = runtime.for_backend(job["backend"]).backend  # the job's own, in a home of several
    ext = att["external_id"]
    size = backend.log_size(ext)
    secrets = job_secrets(json.loads(job["spec"]))  # masked with '*' of the same length: offsets stay exact
    if grep is not None:
        from autoresearch.util._grep import compile_pattern, matching_lines

        compile_pattern(grep)
        data = mask(backend.read_log(ext, 0, 64 << 20), secrets)  # grep cannot probe for a secret
        lines = data.decode("utf-8", "replace").splitlines()
        hits = [f"{i + 1}: {lines[i]}" for i in matching_lines(grep, data) if i < len(lines)]
        if tail_lines:
            hits = hits[-tail_lines:]
        text, cut = _fit_tail("\n".join(hits), max_bytes)
        hint = f"{len(hits)} matching lines; showing the last ones that fit in {max_bytes} bytes" if cut else ""
        return LogPage(job["id"], att["n"], text, 0, size, size, cut, hint)
    if offset is None and tail_lines is not None:
        start = max(0, size - max(max_bytes, 1) * 4)
        raw_bytes = mask(backend.read_log(ext, start, size - start), secrets)
        raw = raw_bytes.decode("utf-8", "replace")
        lines = raw.splitlines()
        if start > 0 and lines:
            lines = lines[1:]  # drop the partial first line
        kept = lines[-tail_lines:]
        text, cut = _fit_tail("\n".join(kept), max_bytes)
        first = max(0, size - len(text.encode()) - raw.endswith("\n"))  # the join dropped the last newline
        cut = cut or first > 0
        back = f" (or offset={_line_start(raw_bytes, start, first - max_bytes)} for the page before this one)" \
            if first > max_bytes else ""
        hint = f"earlier output exists: call again with offset=0{back}" if cut else ""
        return LogPage(job["id"], att["n"], text, first, size, size, cut, hint)
    start = min(offset or 0, size)  # past the end: an empty page, not a seek error
    margin = context(secrets) + 1 if secrets else 0  # a secret cut by the page's edge is still seen whole
    before = min(start, margin)
    window = mask(backend.read_log(ext, start - before, before + max_bytes + margin), secrets)
    chunk = window[before:before + max_bytes]
    if start + len(chunk) < size and b"\n" in chunk:
        chunk = chunk[:chunk.rindex(b"\n") + 1]  # a cut page ends at a line end: the next one starts a line
    text = chunk.decode("utf-8", "replace")
    end = start + len(chunk)
    cut = end < size
    hint = f"more output: call again with offset={end}" if cut else ""
    if offset is not None and offset > size:
        hint = f"offset {offset} is past the end of the log ({size} bytes); read from offset={size} or less"
    return LogPage(job["id"], att["n"], text, start, end, size, cut, hint)


def log_tail(runtime: Runtime, job_id: int, lines: int, max_bytes: int) -> str:
    """The last ``lines`` of a job's latest attempt ('' when it never started)."""
    job = runtime.jobs.job(job_id)
    att = runtime.jobs.latest_attempt(job_id) if job else None
    if att is None:
        return ""
    return log_page(runtime, job, att, tail_lines=lines, max_bytes=max_bytes).text


def _fit_tail(text: str, max_bytes: int) -> tuple[str, bool]:
    """The end of ``text`` in ``max_bytes``, starting at a line start (unless one line is longer)."""
    data = text.encode()
    if len(data) <= max_bytes:
        return text, False
    tail = data[-max_bytes:]
    if data[-max_bytes - 1:-max_bytes] != b"\n" and b"\n" in tail[:-1]:
        tail = tail[tail.index(b"\n") + 1:]
    return tail.decode("utf-8", "ignore"), True


def _line_start(data: bytes, raw_offset: int, offset: int) -> int:
    """The first line start at or after byte ``offset`` of the log, ``data`` being its bytes from
    byte ``raw_offset`` (``offset`` itself when it cannot tell)."""
    at = offset - raw_offset
    if at <= 0 or at > len(data) or data[at - 1:at] == b"\n":
        return offset
    newline = data.find(b"\n", at)
    return offset if newline < 0 else raw_offset + newline + 1
