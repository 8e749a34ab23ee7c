"""Engine turnover benchmark (issue 16): launch throughput, submit->running at ledger sizes, reads.

    python bench/bench_throughput.py [--jobs 2000] [--parallel 64] [--sizes 100,10000,100000] [--n 20]

Prints tables measured in this run on this machine (not a test):

1. Launch throughput (and the CPU per trial of each process: the submitter, the pass daemon, the
   supervisors with their commands): ``--jobs`` ``true`` jobs at ``--parallel`` in flight. A plain Python
   Popen loop (64 children at a time, reaped with os.wait) against the Python API: one
   ``Api.submit`` per job, and one ``jobs.submit_many`` for all; the CLI's job array (one
   ``autoresearch submit --array 0-1999%64 -- true``); and a research loop of as many
   ``echo loss: x`` trials at the same parallel. Each API job asks for
   cpus = ncpu / parallel, so the engine itself keeps ``--parallel`` running and starts the
   next one on every ending. With the pass daemon (default) and without it
   (``AUTORESEARCH_PASSD=off``: every ending execs ``python -m autoresearch.engine.runtime``).
   Wall is from the first submit to the last ending recorded in the ledger.
2. submit->running over a bare spawn of the same command (``date +%s.%N > marker``),
   through the Python API, with 100 / 10k / 100k finished jobs in the ledger. The big
   ledgers are written straight in (``JobStore.seed_finished``: succeeded jobs with one
   attempt and three events each, 10k rows per transaction), not submitted.
3. Reads: ``Api.status(id)`` with nothing queued and with 4,000 jobs queued behind a full node.

Goals (issue 16): >= 200 trials/s sustained launch throughput; submit->running <= +3 ms p50
over a bare spawn at any ledger size up to 100k jobs; reads O(1) in queue depth.
The tracking mirror is off (AUTORESEARCH_SYNC=off) except in the last launch row, the loop as users run
it (the CLI, tracking on, until it returns); the mirror's own cost is measured in bench_tracking.py.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_runtime import fs_line, pct, started_at  # noqa: E402

os.environ["AUTORESEARCH_SYNC"] = "off"
os.environ.setdefault("AUTORESEARCH_GPUS", "1")


POPEN_CPU_MS = [0.0]  # CPU ms per job of the Popen loop (parent and children)


def popen_loop(jobs: int, parallel: int) -> float:
    from collections import deque

    t0, before = time.perf_counter(), os.times()
    running: deque[subprocess.Popen[bytes]] = deque()
    for _ in range(jobs):
        if len(running) >= parallel:
            running.popleft().wait()  # all run the same `true`: the oldest ends first
        running.append(subprocess.Popen(["true"]))
    while running:
        running.popleft().wait()
    after = os.times()
    POPEN_CPU_MS[0] = sum(after[i] - before[i] for i in range(4)) * 1000 / jobs
    return time.perf_counter() - t0


def _wait_all(api: object, ids: list[int], timeout: float = 600.0) -> None:
    store = api._jobs  # type: ignore[attr-defined]
    deadline = time.time() + timeout
    while time.time() < deadline:
        rows = store.job_ends(ids)
        if all(r["state"] in ("succeeded", "failed", "cancelled") for r in rows):
            if any(r["state"] != "succeeded" for r in rows):
                raise RuntimeError("a benchmark job did not succeed")
            return
        time.sleep(0.05)
    raise RuntimeError("benchmark jobs did not end in time")


def ours(tmp: Path, jobs: int, parallel: int, batch: bool, daemon: bool) -> float:
    from autoresearch.api import Api
    from autoresearch.engine import jobs as J

    if daemon:
        os.environ.pop("AUTORESEARCH_PASSD", None)
    else:
        os.environ["AUTORESEARCH_PASSD"] = "off"
    home = Path(tempfile.mkdtemp(dir=tmp))
    api = Api(home)
    spec = {"command": ["true"], "workdir": str(tmp), "cpus": (os.cpu_count() or 1) / parallel}
    # The daemon as our own child (submits find it running and start none): its CPU, and that of the
    # supervisors it forked (with their commands), come back with its exit status.
    daemon_proc = subprocess.Popen([sys.executable, "-m", "autoresearch.engine.passd", "--home", str(home), "--idle", "2"]) \
        if daemon else None
    if daemon_proc is not None:
        from autoresearch.engine import passd

        while passd.running_pid(home) != daemon_proc.pid:  # it listens
            time.sleep(0.01)
    zygote_proc = _zygote_child(home) if daemon else None  # the same for the home's launcher, when there is one
    t0, cpu0 = time.perf_counter(), time.process_time()
    if batch and hasattr(J, "submit_many"):
        ids = J.submit_many(api._runtime, [spec] * jobs)  # type: ignore[attr-defined]
    else:
        ids = [int(api.submit(spec).id) for _ in range(jobs)]
    _wait_all(api, ids)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    CPU[label_of(batch, daemon)] = {"submitter": cpu * 1000 / jobs}
    if daemon_proc is not None:
        fields = Path(f"/proc/{daemon_proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        own = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        _, _, tree = os.wait4(daemon_proc.pid, 0)  # itself and the supervisors it reaped
        CPU[label_of(batch, daemon)].update(daemon=own * 1000 / jobs,
                                            tree=(tree.ru_utime + tree.ru_stime) * 1000 / jobs)
    if zygote_proc is not None:
        own = _own_cpu(zygote_proc.pid)
        _, _, tree = os.wait4(zygote_proc.pid, 0)  # it exits when idle (2 s); with the supervisors it forked
        CPU[label_of(batch, daemon)].update(zygote=own * 1000 / jobs,
                                            ztree=(tree.ru_utime + tree.ru_stime) * 1000 / jobs)
    _stop_daemon(home)
    return wall


def cli_array(tmp: Path, jobs: int, parallel: int) -> float:
    """One ``autoresearch submit --array 0-(jobs-1)%parallel -- true`` (a fresh interpreter, as a user's
    shell runs it; it starts the home's pass daemon), to the last ending recorded."""
    from autoresearch.api import Api

    os.environ.pop("AUTORESEARCH_PASSD", None)
    home = Path(tempfile.mkdtemp(dir=tmp))
    env = {**os.environ, "AUTORESEARCH_HOME": str(home)}
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "autoresearch.cli", "submit", "--array", f"0-{jobs - 1}%{parallel}",
                          "--workdir", str(tmp), "--", "true"], env=env, capture_output=True, text=True, check=True)
    first, _, last = out.stdout.strip().partition("-")
    _wait_all(Api(home), list(range(int(first), int(last) + 1)))
    wall = time.perf_counter() - t0
    _stop_daemon(home)
    return wall


def loop_sweep(tmp: Path, jobs: int, parallel: int) -> float:
    """A research loop of ``jobs`` trials (``echo loss: x``, random proposer, tracking off) at ``parallel``,
    in a fresh interpreter: from the controller's start to its run() returning."""
    home = tempfile.mkdtemp(dir=tmp)
    code = (
        "import json, sys, time\n"
        "from autoresearch.loop.plan import parse_plan\n"
        "from autoresearch.loop.controller import Controller\n"
        f"plan = parse_plan({{'name': 'lt', 'objective': {{'metric': 'loss'}}, 'trial': {{'command': 'echo loss: {{x}}'}},"
        f" 'space': {{'x': {{'low': 0.0, 'high': 1.0}}}}, 'proposer': {{'kind': 'random'}},"
        f" 'budget': {{'trials': {jobs}, 'parallel': {parallel}}}}}, base_dir='.')\n"
        "t0 = time.perf_counter()\n"
        f"view = Controller(plan, home={home!r}).run()\n"
        "print(json.dumps({'wall': time.perf_counter() - t0, 'counts': view.counts}))\n"
    )
    env = {**os.environ, "AUTORESEARCH_HOME": home, "AUTORESEARCH_TRACKING": "off", "AUTORESEARCH_GPUS": "0"}
    env.pop("AUTORESEARCH_PASSD", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    import json

    result = json.loads(out.stdout.strip().splitlines()[-1])
    if result["counts"].get("succeeded") != jobs:
        raise RuntimeError(f"the loop's trials did not all succeed: {result['counts']}")
    _stop_daemon(Path(home))
    return float(result["wall"])


def loop_cli_tracked(tmp: Path, jobs: int, parallel: int) -> float:
    """The same loop as a user runs it: ``autoresearch --json plan.yaml`` in a fresh interpreter with
    tracking on (the embedded SQLite MLflow store, the background syncer, the report helper), from the
    command's start to its return."""
    home = tempfile.mkdtemp(dir=tmp)
    work = Path(home) / "work"
    work.mkdir()
    (work / "plan.yaml").write_text(
        "name: lt\nobjective: {metric: loss}\ntrial: {command: 'echo loss: {x}', gpus: 0}\n"
        "space: {x: {low: 0.0, high: 1.0}}\nproposer: {kind: random}\n"
        f"budget: {{trials: {jobs}, parallel: {parallel}}}\n")
    env = {**os.environ, "AUTORESEARCH_HOME": f"{home}/h", "AUTORESEARCH_TRACKING": "on", "AUTORESEARCH_GPUS": "0"}
    for name in ("AUTORESEARCH_PASSD", "AUTORESEARCH_SYNC"):
        env.pop(name, None)
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "autoresearch.cli", "--json", str(work / "plan.yaml")], cwd=work,
                         env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    result = json.loads(out.stdout)
    if out.returncode != 0 or result.get("counts", {}).get("succeeded") != jobs:
        raise RuntimeError(f"the loop's trials did not all succeed: {out.returncode} {out.stderr[-500:]}")
    _stop_daemon(Path(home) / "h")
    return wall


def _own_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _zygote_child(home: Path) -> subprocess.Popen[bytes] | None:
    """The home's launcher (backends/_zygote.py) as our child, idle after 2 s; None on a tree without one."""
    try:
        from autoresearch.backends import _zygote
    except ImportError:
        return None
    if not _zygote.enabled():
        return None
    proc = subprocess.Popen([sys.executable, "-S", "-E", _zygote.__file__, str(home), "2"])
    while _zygote.running_pid(home) != proc.pid:
        time.sleep(0.01)
    return proc


CPU: dict[str, dict[str, float]] = {}  # how -> CPU ms per trial: submitter, daemon, supervisors (+ their commands)


def label_of(batch: bool, daemon: bool) -> str:
    return ("jobs.submit_many" if batch else "Api.submit per job") + (", pass daemon" if daemon else ", no daemon")


def _stop_daemon(home: Path) -> None:
    """Stop the home's pass daemon and zygote (a tree without them: nothing to stop)."""
    import importlib

    for name in ("autoresearch.engine.passd", "autoresearch.backends._zygote"):
        try:
            pid = importlib.import_module(name).running_pid(home)
        except (ImportError, AttributeError):
            continue
        if pid:
            os.kill(pid, 15)


def seed(api: object, count: int) -> None:
    store = api._jobs  # type: ignore[attr-defined]
    if hasattr(store, "seed_finished"):
        store.seed_finished(count, "local", '{"command": ["true"], "workdir": "/"}')
        return
    now = time.time()  # a tree from before seed_finished (for a before/after run): the same rows
    with store.ledger.tx() as c:
        for _ in range(count):
            job = c.execute("INSERT INTO jobs(name, state, priority, spec, gpus, nodes, backend, submitted_at, "
                            "updated_at, started_at, ended_at, attempts, exit_code, end_reason) VALUES ('seed',"
                            "'succeeded','normal','{\"command\": [\"true\"], \"workdir\": \"/\"}',0,1,'local',"
                            "?,?,?,?,1,0,'exit')", (now, now, now, now)).lastrowid
            c.execute("INSERT INTO attempts(job_id, n, state, external_id, log_path, metrics_path, created_at, "
                      "started_at, ended_at, exit_code, end_reason) VALUES (?,1,'ended','','','',?,?,?,0,'exit')",
                      (job, now, now, now))
            c.executemany("INSERT INTO events(ts, job_id, attempt, kind, data) VALUES (?,?,1,?,'{}')",
                          [(now, job, kind) for kind in ("submit", "launch", "end")])


# submit->running in stages: the time of each mark below (the first entry into a function, or its
# return), in this process, per submit; the last stage ends at the command's own first instant.
STAGES = (("checks", "spec, backend, capacity and isolation checks"), ("submit txn", "jobs row + submit event"),
          ("pass", "pass lock, reconcile, nodes, change mark"), ("placement", "queue read + scheduler"),
          ("launch txn", "attempt row + launch event"), ("attempt setup", "env, dirs, request.json"),
          ("supervisor fork", "zygote send (or fork), launcher side"),
          ("to supervisor", "zygote hand-off; supervisor: request, claim, fds, signals"),
          ("to exec", "posix_spawn, sh, date (what the bare spawn also pays)"))


class StageClock:
    """Marks per submit, by wrapping the engine's functions in this process (a few µs each)."""

    def __init__(self) -> None:
        self.marks: dict[str, float] = {}
        self.rows: list[dict[str, float]] = []
        self._undo: list[tuple[object, str, object]] = []

    def _wrap(self, owner: object, name: str, enter: str | None, leave: str | None) -> None:
        real = getattr(owner, name)
        marks = self.marks

        def wrapped(*args: object, **kwargs: object) -> object:
            if enter and enter not in marks:
                marks[enter] = time.time()
            try:
                return real(*args, **kwargs)
            finally:
                if leave and leave not in marks:
                    marks[leave] = time.time()

        self._undo.append((owner, name, real))
        setattr(owner, name, wrapped)

    def __enter__(self) -> StageClock:
        from autoresearch.backends import _supervisor
        from autoresearch.engine import jobs as J
        from autoresearch.engine.runtime import Runtime
        from autoresearch.store.jobstore import JobStore

        self._wrap(JobStore, "add_jobs", "submit txn", "pass")
        self._wrap(Runtime, "schedule", "placement", None)
        begin = "begin_attempts" if hasattr(JobStore, "begin_attempts") else "begin_attempt"
        self._wrap(JobStore, begin, "launch txn", "attempt setup")
        self._wrap(_supervisor, "launch", "supervisor fork", "to supervisor")
        del J
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, name, real in reversed(self._undo):
            setattr(owner, name, real)

    def submitted(self, t0: float, started: float, supervised: float | None) -> None:
        """One submit's row: from ``t0`` (its call) to ``started`` (its command's first instant), through
        ``supervised`` (its supervisor's ``started_at``: about to spawn the command)."""
        row = {**self.marks, "checks": t0, "end": started}
        if supervised is not None:
            row["to exec"] = supervised
        order = [name for name, _ in STAGES] + ["end"]
        if all(k in row for k in order):
            self.rows.append({name: (row[nxt] - row[name]) * 1000 for name, nxt in zip(order, order[1:], strict=False)})
        self.marks.clear()


def supervisor_started(home: Path, job: int) -> float | None:
    """When the supervisor of ``job``'s first attempt was about to spawn its command (its state.json)."""
    state = home / "jobs" / str(job) / "attempt-1" / "state.json"
    for _ in range(2000):
        try:
            return float(json.loads(state.read_text())["started_at"])
        except (OSError, ValueError, KeyError, TypeError):
            time.sleep(0.001)
    return None


def start_latency(tmp: Path, size: int, n: int, clock: StageClock | None = None,
                  running: int = 0) -> tuple[list[float], list[float]]:
    """``running``: that many other jobs (``sleep``) run meanwhile (each submit's placement reads them)."""
    from autoresearch.api import Api

    os.environ.pop("AUTORESEARCH_PASSD", None)
    home = tmp / f"home-{size}-{running}"
    api = Api(home)
    seed(api, size)
    sleepers = [view.id for view in api.submit_many([{"command": ["sleep", "600"], "workdir": str(tmp)}] * running)]
    if sleepers:
        for _ in range(200):  # (until a pass saw them all run)
            if all(api.status(j).state == "running" for j in sleepers):
                break
            time.sleep(0.05)
    bare, ours_ms = [], []
    for i in range(n + 1):
        for kind in ("bare", "ours"):
            marker = tmp / f"{kind}-{size}-{running}-{i}"
            argv = ["/bin/sh", "-c", f"date +%s.%N > {marker}"]
            if clock is not None:
                clock.marks.clear()
            t0 = time.time()
            if kind == "bare":
                subprocess.Popen(argv).wait()
            else:
                job = api.submit({"command": argv, "workdir": str(tmp)}).id
            began = started_at(marker)
            latency = (began - t0) * 1000
            if i:  # the first is a warm-up (the daemon starts)
                (bare if kind == "bare" else ours_ms).append(latency)
                if clock is not None and kind == "ours":
                    clock.submitted(t0, began, supervisor_started(home, int(job)))
            time.sleep(0.2)  # let the ending's pass settle
    if sleepers:
        api.cancel(sleepers)
    _stop_daemon(home)
    return bare, ours_ms


def read_latency(tmp: Path, queued: int, runs: int = 30) -> float:
    from autoresearch.api import Api

    home = Path(tempfile.mkdtemp(dir=tmp))
    api = Api(home)
    blocker = int(api.submit({"command": ["sleep", "600"], "workdir": str(tmp), "gpus": 1}).id)
    waiting: list[int] = []
    if queued:
        from autoresearch.engine import jobs as J

        spec = {"command": ["true"], "workdir": str(tmp), "gpus": 1}
        if hasattr(J, "submit_many"):
            waiting = J.submit_many(api._runtime, [spec] * queued)  # type: ignore[attr-defined]
        else:
            waiting = [int(api.submit(spec).id) for _ in range(queued)]
    api.status(blocker)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        api.status(blocker)
        times.append((time.perf_counter() - t0) * 1000)
    api.cancel([*waiting, blocker])  # the queue goes first: nothing drains in the background afterwards
    _stop_daemon(home)
    return pct(times, 0.5)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--parallel", type=int, default=64)
    parser.add_argument("--sizes", default="100,10000,100000")
    parser.add_argument("--running", type=int, default=64, help="submit->running: one more row, at the first "
                                                                 "size with this many other jobs running (0: none)")
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--skip", default="", help="comma list of: throughput, nodaemon, start, reads")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    load = os.getloadavg()[0]
    import autoresearch

    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as name:
        tmp = Path(name)
        print(f"# bench_throughput on {os.cpu_count()} cores, load {load:.1f}, python {sys.version.split()[0]}, "
              f"{fs_line(name)}, autoresearch from {Path(autoresearch.__file__).parent.parent}")
        if "throughput" not in skip:
            print(f"\n## launch throughput: {args.jobs} `true` jobs, {args.parallel} in flight\n")
            print("| how | wall s | jobs/s | of the Popen loop's |\n|---|---:|---:|---:|")
            base = popen_loop(args.jobs, args.parallel)
            print(f"| Python Popen loop | {base:.2f} | {args.jobs / base:.0f} | 1 |")
            for label, batch, daemon in (("Api.submit per job, pass daemon", False, True),
                                         ("jobs.submit_many, pass daemon", True, True),
                                         ("Api.submit per job, no daemon (a pass process per ending)", False, False)):
                if not daemon and "nodaemon" in skip:
                    continue
                wall = ours(tmp, args.jobs, args.parallel, batch, daemon)
                print(f"| {label} | {wall:.2f} | {args.jobs / wall:.0f} | {base / wall:.3f} |", flush=True)
            for label, run in ((f"CLI `submit --array 0-{args.jobs - 1}%{args.parallel} -- true` (one command)",
                                cli_array),
                               (f"research loop, {args.jobs} trials `echo loss: x` at parallel {args.parallel}",
                                loop_sweep),
                               ("the same loop as users run it: `autoresearch --json plan.yaml`, tracking on, "
                                "until it returns", loop_cli_tracked)):
                wall = run(tmp, args.jobs, args.parallel)
                print(f"| {label} | {wall:.2f} | {args.jobs / wall:.0f} | {base / wall:.3f} |", flush=True)
            print("\n### where the CPU goes: ms per trial (the Popen loop: the parent's fork/exec/wait, and `true`)\n")
            print("| how | submitter | pass daemon | zygote | supervisors + commands | total |\n"
                  "|---|---:|---:|---:|---:|---:|")
            print(f"| Python Popen loop | - | - | - | - | {POPEN_CPU_MS[0]:.2f} |")
            for how, parts in CPU.items():
                if "daemon" in parts:
                    zyg, ztree = parts.get("zygote", 0.0), parts.get("ztree", 0.0)
                    print(f"| {how} | {parts['submitter']:.2f} | {parts['daemon']:.2f} | {zyg:.2f} | "
                          f"{parts['tree'] - parts['daemon'] + ztree - zyg:.2f} | "
                          f"{parts['submitter'] + parts['tree'] + ztree:.2f} |")
        if "start" not in skip:
            print(f"\n## submit->running over a bare spawn, Python API ({args.n} each)\n")
            print("| jobs in ledger | bare p50 ms | ours p50 ms | +p50 ms | +p95 ms |\n|---:|---:|---:|---:|---:|")
            clocks: dict[str, StageClock] = {}
            sizes = [int(s) for s in args.sizes.split(",")]
            runs = [(size, 0) for size in sizes] + ([(sizes[0], args.running)] if args.running > 0 else [])
            for size, running in runs:
                label = f"{size:,} jobs" + (f", {running} running" if running else "")
                with StageClock() as clock:
                    bare, ours_ms = start_latency(tmp, size, args.n, clock, running)
                clocks[label] = clock
                diff = [o - b for o, b in zip(ours_ms, bare, strict=True)]
                print(f"| {label} | {pct(bare, 0.5):.1f} | {pct(ours_ms, 0.5):.1f} | {pct(diff, 0.5):+.1f} | "
                      f"{pct(diff, 0.95):+.1f} |", flush=True)
            print("\n### where submit->running goes: p50 ms per stage (the stages' p50s need not add up)\n")
            print("| stage | what | " + " | ".join(clocks) + " |")
            print("|---|---|" + "---:|" * len(clocks))
            for name, what in STAGES:
                cells = [f"{pct([r[name] for r in c.rows], 0.5):.2f}" if c.rows else "-" for c in clocks.values()]
                print(f"| {name} | {what} | " + " | ".join(cells) + " |")
        if "reads" not in skip:
            print("\n## Api.status(id) wall, p50 of 30\n")
            print("| jobs queued | ms |\n|---:|---:|")
            for queued in (0, 4000):
                print(f"| {queued:,} | {read_latency(tmp, queued):.2f} |", flush=True)
    print(f"\nload at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
