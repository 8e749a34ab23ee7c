"""Benchmark: 100,000 metric points from 16 concurrent trials into MLflow.

Measures the time from the trials' end (all 16 jobs final, points in the ledger) to
everything mirrored (runs created, all points, logs, runs terminated), for the embedded
SQLite store and a real `mlflow server` on 127.0.0.1, beside naive per-point
``log_metric`` (timed on a sample and scaled to 100,000 points: the full run would take
minutes to hours). "cold" starts the sync when the trials have ended (everything to
send); "live" has the background syncer running beside the trials, as in production,
and measures only what is left at their end. Prints a table. Not a test.

    python bench/bench_tracking.py [--points 100000] [--trials 16] [--naive-sample 1000] [--repeat 3]
    python bench/bench_tracking.py --cold-sqlite [--points 100000]   # issue 16: bulk vs log_batch
    python bench/bench_tracking.py --catch-up 600 [--repeat 3]        # the mirror's CPU a trial

``--cold-sqlite``: the same ledger (copied) mirrored cold into a fresh SQLite store twice,
through the bulk path (:func:`autoresearch.tracking._metrics.bulk_log`) and through
log_batch (``AUTORESEARCH_MIRROR_BULK=off``, the path before issue 16), side by side.

``--catch-up N``: the process CPU of the mirror's pass after a loop of N short trials, a trial's
run, tags, params, log, metric and end: batched SQL transactions (the default into SQLite) beside
MLflow's client calls (``AUTORESEARCH_MIRROR_BULK=off``), or any code given with ``--code``.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

TRIAL = ("from autoresearch import report\nn = {n}\nfor i in range(n):\n"
         "    report(step=i, loss=1.0 / (i + 1), acc=i / n)\n")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(root: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _port()
    log = open(root / "server.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
                             f"sqlite:///{root / 'server.db'}", "--artifacts-destination", str(root / "artifacts"),
                             "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                            stdout=log, stderr=log, start_new_session=True, cwd=root,
                            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    uri = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=1):
                return proc, uri
        except OSError:
            time.sleep(0.3)
    raise RuntimeError("mlflow server did not start")


def run_trials(home: Path, points: int, trials: int) -> float:
    """Run the trials to the end; returns the wall time they took."""
    from autoresearch.api import Api

    api = Api(home)
    per = points // trials // 2  # two metrics per report() call
    t0 = time.monotonic()
    ids = [api.submit({"command": [sys.executable, "-c", TRIAL.format(n=per)], "workdir": str(home)}).id
           for _ in range(trials)]
    while True:
        views = [api.status(i) for i in ids]
        if all(v.state in ("succeeded", "failed", "cancelled") for v in views):
            break
        time.sleep(0.2)
    assert all(v.state == "succeeded" for v in views), [v.state for v in views]
    n = api._ledger.one("SELECT COUNT(*) AS n FROM metrics")
    assert n is not None and n["n"] == per * 2 * trials, n["n"] if n else None
    return time.monotonic() - t0


def live(home: Path, uri: str, points: int, trials: int) -> tuple[float, float]:
    """The background syncer runs while the trials do (production). Returns (trials s, end → all mirrored s)."""
    from autoresearch.api import Api

    os.environ["AUTORESEARCH_SYNC"] = "on"
    os.environ["MLFLOW_TRACKING_URI"] = uri
    try:
        trials_s = run_trials(home, points, trials)
        end = time.monotonic()
        api = Api(home)
        while True:
            cursor = api._ledger.one("SELECT value FROM tracking_state WHERE name='metrics'")
            last = api._ledger.one("SELECT MAX(rowid) AS m FROM metrics")
            done = api._ledger.one("SELECT COUNT(*) AS n FROM tracking_runs WHERE finished=1")
            if cursor and last and int(cursor["value"]) >= last["m"] and done and done["n"] >= trials:
                return trials_s, time.monotonic() - end
            time.sleep(0.05)
    finally:
        os.environ["AUTORESEARCH_SYNC"] = "off"
        os.environ.pop("MLFLOW_TRACKING_URI", None)


def batched(home: Path, uri: str) -> tuple[float, float, int]:
    """(seconds to import mlflow and open the store, seconds to mirror everything, points sent)."""
    from autoresearch.tracking._sync import Syncer

    t0 = time.monotonic()
    syncer = Syncer(home, uri=uri)
    syncer.check()
    t1 = time.monotonic()
    sent = 0
    while True:
        report = syncer.run_once()
        sent += report.metrics
        if not report.pending:
            break
    return t1 - t0, time.monotonic() - t1, sent


def naive(uri: str, sample: int) -> float:
    """Seconds per point with one log_metric call per point."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.create_experiment(f"naive-{time.time_ns()}")
    run = client.create_run(exp).info.run_id
    t0 = time.monotonic()
    for i in range(sample):
        client.log_metric(run, "loss", 1.0 / (i + 1), step=i)
    return (time.monotonic() - t0) / sample


def cold_sqlite(points: int, trials: int, repeat: int) -> int:
    """The same ledger mirrored cold into fresh SQLite stores: bulk path vs log_batch."""
    import shutil

    os.environ["AUTORESEARCH_SYNC"] = "off"
    os.environ["AUTORESEARCH_GPUS"] = "2"
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    results: dict[str, list[tuple[float, float]]] = {"bulk": [], "log_batch": []}
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "source"
        source.mkdir()
        trials_s = run_trials(source, points, trials)
        for r in range(repeat):
            for mode in ("bulk", "log_batch"):
                home = Path(tmp) / f"{mode}-{r}"
                shutil.copytree(source, home, ignore=shutil.ignore_patterns("*.fifo", "*.sock"))  # FIFOs and sockets are not files
                os.environ["AUTORESEARCH_MIRROR_BULK"] = "on" if mode == "bulk" else "off"
                opened, synced, sent = batched(home, f"sqlite:///{home / 'mlflow.db'}")
                assert sent == points, sent
                results[mode].append((opened, synced))
    os.environ.pop("AUTORESEARCH_MIRROR_BULK", None)
    print(f"\n{points:,} points from {trials} trials ({trials_s:.1f} s to run), mirrored cold into a fresh SQLite "
          f"store; medians of {repeat}; load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores\n")
    print("| path | open s (import mlflow, make the store) | cold sync s (end→all in) | points/s |")
    print("|---|---|---|---|")
    for mode, rows in results.items():
        opened = statistics.median(o for o, _ in rows)
        synced = statistics.median(s for _, s in rows)
        print(f"| {mode} | {opened:.1f} | {synced:.2f} | {points / synced:,.0f} |")
    return 0


_CATCH_UP = """\
import json, resource, sys, time
c0 = time.process_time()
from autoresearch.tracking._sync import Syncer, freeze_imports
syncer = Syncer(sys.argv[1])
freeze_imports()  # as the background syncer does once its Syncer is made
c1 = time.process_time()
r1 = resource.getrusage(resource.RUSAGE_SELF)
total = {"runs_created": 0, "finished": 0, "decisions": 0}
while True:  # passes until one finds nothing to do
    report = syncer.run_once()
    if not (report.runs_created or report.finished or report.decisions or report.metrics or report.artifacts):
        break
    for key in total:
        total[key] += getattr(report, key)
c2 = time.process_time()
r2 = resource.getrusage(resource.RUSAGE_SELF)
syncer.run_once()
print(json.dumps({"open": c1 - c0, "pass": c2 - c1, "user": r2.ru_utime - r1.ru_utime, "sys": r2.ru_stime - r1.ru_stime, "idle": time.process_time() - c2, "runs": total["runs_created"],
                  "finished": total["finished"], "decisions": total["decisions"]}))
"""


def loop_home(root: Path, trials: int, parallel: int = 16) -> Path:
    """A home after `autoresearch --json plan.yaml` of ``trials`` ``python3 -c`` trials (tracking on, the
    syncer off: everything is left for the catch-up)."""
    home, work = root / "source", root / "work"
    work.mkdir(parents=True)
    (work / "plan.yaml").write_text(
        "name: user\nobjective: {metric: v, goal: minimize}\n"
        "trial: {command: \"python3 -c \\\"print('v={x}')\\\"\", gpus: 0}\n"
        "space: {x: {low: 0.0, high: 1.0}}\nproposer: {kind: random}\n"
        f"budget: {{trials: {trials}, parallel: {parallel}}}\n")
    env = {**os.environ, "AUTORESEARCH_HOME": str(home), "AUTORESEARCH_TRACKING": "on", "AUTORESEARCH_SYNC": "off",
           "AUTORESEARCH_GPUS": "0"}
    env.pop("MLFLOW_TRACKING_URI", None)
    done = subprocess.run([sys.executable, "-m", "autoresearch.cli", "--json", str(work / "plan.yaml")], cwd=work,
                          env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return home


def fresh_copy(source: Path, home: Path) -> None:
    """A copy of ``source``'s home bound to a fresh store of its own: the copied ledger is bound to the
    source's ``mlflow.db`` (its loop's run maker bound it), so every copy mirrored into that one
    store, which grew by a loop each run (the later runs, and the second path, measured into a
    store several loops big)."""
    import shutil
    import sqlite3

    shutil.copytree(source, home, ignore=shutil.ignore_patterns("*.fifo", "*.sock", "*.listen", "mlflow.db*",
                                                                "mlartifacts"))
    with sqlite3.connect(home / "ledger.db") as db:
        db.execute("UPDATE tracking_state SET value=? WHERE name='uri'", (f"sqlite:///{home / 'mlflow.db'}",))
    db.close()


def catch_up(trials: int, repeat: int, code: dict[str, str]) -> int:
    """The mirror's CPU a trial: a loop's home (its ``trials`` trials ended, nothing mirrored) mirrored
    into a fresh SQLite store by ``Syncer.run_once`` in a fresh process, once per path, side by side."""
    import json

    cpu: dict[str, list[dict[str, float]]] = {name: [] for name in code}
    with tempfile.TemporaryDirectory() as tmp:
        source = loop_home(Path(tmp), trials)
        for r in range(repeat):
            for name, (path, bulk) in ((n, c.split(":", 1)) for n, c in code.items()):
                home = Path(tmp) / f"{name}-{r}"
                fresh_copy(source, home)
                env = {**os.environ, "AUTORESEARCH_HOME": str(home), "AUTORESEARCH_SYNC": "off",
                       "AUTORESEARCH_MIRROR_BULK": bulk, "PYTHONPATH": path}
                env.pop("MLFLOW_TRACKING_URI", None)
                out = subprocess.run([sys.executable, "-c", _CATCH_UP, str(home)], env=env, capture_output=True,
                                     text=True, cwd=home)  # (not this checkout's folder: -c puts the cwd first)
                assert out.returncode == 0, out.stderr[-2000:]
                row = json.loads(out.stdout.strip().splitlines()[-1])
                assert row["runs"] == trials + 1 and row["finished"] == trials + 1, row
                cpu[name].append(row)
    print(f"\nThe mirror's catch-up after a loop of {trials} `python3 -c` trials (nothing mirrored during it), "
          f"into a fresh SQLite store, process CPU; medians of {repeat}; load {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} cores\n")
    print("| path | import mlflow + open the store, CPU s | the passes, CPU s (user + kernel) | CPU ms a trial | "
          "an idle pass after, CPU s |")
    print("|---|---|---|---|---|")
    for name, rows in cpu.items():
        med = {k: statistics.median(r.get(k, float("nan")) for r in rows) for k in ("open", "pass", "user", "sys", "idle")}
        print(f"| {name} | {med['open']:.2f} | {med['pass']:.2f} ({med['user']:.2f} + {med['sys']:.2f}) | "
              f"{med['pass'] / trials * 1000:.1f} | "
              f"{med['idle']:.2f} |", flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cold-sqlite", action="store_true", help="only the cold SQLite sync, bulk vs log_batch")
    ap.add_argument("--points", type=int, default=100_000)
    ap.add_argument("--trials", type=int, default=16)
    ap.add_argument("--naive-sample", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--catch-up", type=int, metavar="TRIALS", help="only the mirror's CPU a trial after a loop of "
                                                                    "TRIALS trials (e.g. 600)")
    ap.add_argument("--code", action="append", metavar="NAME=PYTHONPATH:on|off",
                    help="catch-up: a path to measure (its code, AUTORESEARCH_MIRROR_BULK); default: this checkout, "
                         "bulk on and off")
    args = ap.parse_args()
    if args.catch_up:
        root = str(Path(__file__).resolve().parent.parent)
        code = dict(c.split("=", 1) for c in args.code) if args.code else {
            "bulk (SQL batches)": f"{root}:on", "client (MlflowClient calls)": f"{root}:off"}
        return catch_up(args.catch_up, args.repeat, code)
    if args.cold_sqlite:
        return cold_sqlite(args.points, args.trials, args.repeat)
    os.environ["AUTORESEARCH_SYNC"] = "off"  # measure the catch-up from the end, not a race with a live syncer
    os.environ["AUTORESEARCH_GPUS"] = "2"
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        server_proc, server_uri = start_server(Path(tmp))
        try:
            for store in ("sqlite", "server"):
                opens, syncs, trial_s = [], [], []
                for r in range(args.repeat):
                    home = Path(tmp) / f"{store}-{r}"
                    home.mkdir()
                    trial_s.append(run_trials(home, args.points, args.trials))
                    uri = f"sqlite:///{home / 'mlflow.db'}" if store == "sqlite" else server_uri
                    opened, synced, sent = batched(home, uri)
                    assert sent == args.points, sent
                    opens.append(opened)
                    syncs.append(synced)
                lives = []
                for r in range(args.repeat):
                    home = Path(tmp) / f"{store}-live-{r}"
                    home.mkdir()
                    uri = f"sqlite:///{home / 'mlflow.db'}" if store == "sqlite" else server_uri
                    lives.append(live(home, uri, args.points, args.trials)[1])
                per_point = naive(f"sqlite:///{Path(tmp) / 'naive.db'}" if store == "sqlite" else server_uri,
                                  args.naive_sample)
                batched_s = statistics.median(syncs)
                rows.append((store, statistics.median(trial_s), statistics.median(opens), batched_s,
                             statistics.median(lives), per_point * 1000, per_point * args.points,
                             per_point * args.points / batched_s))
                print(rows[-1], flush=True)
        finally:
            os.killpg(server_proc.pid, signal.SIGTERM)
            try:
                server_proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(server_proc.pid, signal.SIGKILL)
                server_proc.wait(5)
    print(f"\n{args.points:,} points from {args.trials} concurrent trials; medians of {args.repeat} runs; "
          f"naive = one log_metric per point, timed on {args.naive_sample} points and scaled\n")
    head = ("store", "trials s", "open s", "cold sync s (end→all in)", "live syncer: end→all in s", "naive ms/pt",
            "naive s (scaled)", "cold speed-up")
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for store, trials_s, opened, synced, live_s, ms, naive_s, ratio in rows:
        print(f"| {store} | {trials_s:.1f} | {opened:.1f} | {synced:.2f} | {live_s:.2f} | {ms:.2f} | {naive_s:.0f} "
              f"| {ratio:.0f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
