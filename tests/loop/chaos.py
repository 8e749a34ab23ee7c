"""Chaos for the loop controller: ``kill -9`` of ``autoresearch plan.yaml`` at random points,
a resume after each, then a run to the end; and what must hold after it.

Used by tests/loop/test_chaos.py (a short run in the suite) and bench/bench_chaos.py (the
long one). The controller is a real process with MLflow tracking on (its trials' runs are
made ahead of launch) and the background syncer on; the trials are ``sleep``-like shell
commands. A kill lands either early (starting, proposing, waiting for the trials' MLflow
runs) or a random number of decisions into the controller's work (so kills fall on every
kind of decision boundary), plus a random few milliseconds.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PLAN = """\
name: chaos
objective: {{metric: loss}}
trial:
  command: "sh -c 'sleep {sleep}; echo loss: {{x}}'"
  grace: 1
space:
  x: {{low: 0.0, high: 1.0}}
proposer: {{kind: random, seed: 7}}
budget: {{trials: {trials}, parallel: {parallel}}}
repeats: {{seeds: 2}}
"""


@dataclass
class ChaosResult:
    kills: int = 0
    trials: int = 0  # trials of the loop, every state
    launched: int = 0  # trials that got a job and count against the budget (not crashed on infra)
    lost: list[str] = field(default_factory=list)  # trials neither ended nor accounted for
    duplicates: list[str] = field(default_factory=list)  # trials launched (or decided) more than once
    orphans: list[str] = field(default_factory=list)  # processes of the home still alive at the end
    runs_not_ended: list[str] = field(default_factory=list)  # MLflow runs still RUNNING after a sync
    final_rc: int = 0
    wall_s: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicates or self.orphans or self.runs_not_ended) and self.final_rc == 0


def _env(home: Path) -> dict[str, str]:
    env = {**os.environ, "AUTORESEARCH_HOME": str(home), "AUTORESEARCH_GPUS": "0", "AUTORESEARCH_SYNC": "on",
           "AUTORESEARCH_SYNC_IDLE_S": "2", "PYTHONUNBUFFERED": "1"}
    for name in ("AUTORESEARCH_TRACKING", "MLFLOW_TRACKING_URI", "AUTORESEARCH_BACKEND"):
        env.pop(name, None)
    return env


def _decisions(home: Path) -> int:
    try:
        with sqlite3.connect(f"file:{home / 'ledger.db'}?mode=ro", uri=True, timeout=5) as db:
            return int(db.execute("SELECT COUNT(*) FROM decisions WHERE kind != 'replan'").fetchone()[0])
    except sqlite3.Error:
        return 0


def _controller(home: Path, plan: Path, log: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "autoresearch.cli", str(plan), "--json", "--no-report"],
                            cwd=plan.parent, env=_env(home), stdout=log, stderr=log, stdin=subprocess.DEVNULL)


def _processes_of(home: Path) -> list[str]:
    """Processes (but us) whose command line or environment names the home."""
    mark = str(home).encode()
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read()
            with open(f"/proc/{pid}/stat", "rb") as f:
                zombie = f.read().rsplit(b")", 1)[-1].split()[0] == b"Z"
        except OSError:
            continue
        if not zombie and (mark in cmd or mark in env):
            words = cmd.replace(b"\0", b" ").decode(errors="replace").strip()
            found.append(f"{pid}: {words[:120]}")
    return found


def run_chaos(root: Path, kills: int = 6, trials: int = 8, parallel: int = 3, sleep: float = 0.3,
              seed: int = 0, max_decisions: int = 4, early: float = 0.4, life_s: float = 30.0,
              settle_s: float = 30.0) -> ChaosResult:
    """``kills`` lives of the controller, then one run to the end, then the checks. A life ends
    by ``kill -9`` within 0.2..2 s of its start (with probability ``early``), else once
    1..``max_decisions`` new decisions are in the ledger (at most ``life_s``)."""
    rng = random.Random(seed)
    home, result = root / "home", ChaosResult()
    plan = root / "plan.yaml"
    plan.write_text(PLAN.format(sleep=sleep, trials=trials, parallel=parallel))
    t0 = time.monotonic()
    with open(root / "controller.log", "ab") as log:
        for _ in range(kills):
            if rng.random() < early:  # while it starts, proposes, waits for its trials' MLflow runs
                target, deadline = 1 << 30, time.monotonic() + rng.uniform(0.2, 2.0)
            else:  # a few decisions into its work (a resume writes 'replan' at once: not counted)
                target, deadline = _decisions(home) + rng.randint(1, max_decisions), time.monotonic() + life_s
            proc = _controller(home, plan, log)
            while proc.poll() is None and _decisions(home) < target and time.monotonic() < deadline:
                time.sleep(0.005)
            time.sleep(rng.random() * 0.05)
            if proc.poll() is not None:
                result.notes.append(f"the loop ended before kill {result.kills + 1}")
                break
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            result.kills += 1
            result.notes.append(f"kill {result.kills} at {time.monotonic() - t0:.1f}s")
        final = _controller(home, plan, log)
        try:
            result.final_rc = final.wait(timeout=120)
        except subprocess.TimeoutExpired:
            final.kill()
            final.wait()
            result.final_rc = -9
    result.notes.append(f"final run ended at {time.monotonic() - t0:.1f}s")
    _check_ledger(home, result)
    _settle(home, result, settle_s)
    result.notes.append(f"settled at {time.monotonic() - t0:.1f}s")
    sync = subprocess.run([sys.executable, "-m", "autoresearch.cli", "sync"], env=_env(home), capture_output=True,
                          text=True, timeout=120)
    if sync.returncode != 0:
        result.notes.append(f"sync: {sync.stderr.strip()[-300:]}")
    _check_runs(home, result)
    result.notes.append(f"synced at {time.monotonic() - t0:.1f}s")
    _settle(home, result, settle_s)  # (a syncer kicked by that sync's end, if any)
    result.orphans = _processes_of(home)
    result.wall_s = time.monotonic() - t0
    return result


def _check_ledger(home: Path, result: ChaosResult) -> None:
    db = sqlite3.connect(home / "ledger.db", timeout=10)
    db.row_factory = sqlite3.Row
    with db:
        trials = db.execute("SELECT id, state, job_id FROM trials").fetchall()
        jobs = db.execute("SELECT id, state, spec FROM jobs").fetchall()
        launches = Counter(r[0] for r in db.execute("SELECT trial_id FROM decisions WHERE kind='launch'"))
    result.trials = len(trials)
    by_trial: dict[int, list[int]] = {}
    for job in jobs:
        tag = (json.loads(job["spec"]).get("tags") or {}).get("autoresearch.trial_id")
        if tag is not None:
            by_trial.setdefault(int(tag), []).append(job["id"])
        if job["state"] not in ("succeeded", "failed", "cancelled"):
            result.lost.append(f"job {job['id']} is still {job['state']}")
    for trial_id, ids in by_trial.items():
        if len(ids) > 1:
            result.duplicates.append(f"trial {trial_id}: jobs {ids}")
    result.duplicates += [f"trial {t}: {n} launch decisions" for t, n in launches.items() if n > 1]
    for t in trials:
        ids = by_trial.get(t["id"], [])
        if t["state"] in ("proposed", "queued", "running"):
            result.lost.append(f"trial {t['id']} is still {t['state']}")
        if t["id"] in launches and not ids and t["state"] != "failed":
            result.lost.append(f"trial {t['id']} was decided for launch but has no job ({t['state']})")
        if t["job_id"] is not None and t["job_id"] not in ids:
            result.lost.append(f"trial {t['id']} points at job {t['job_id']}, not its own")
        if ids and t["job_id"] is None:
            result.lost.append(f"trial {t['id']} has job {ids} it does not know")
    result.launched = sum(1 for t in trials if t["job_id"] is not None and t["state"] != "crashed")


def _check_runs(home: Path, result: ChaosResult) -> None:
    path = home / "mlflow.db"
    if not path.exists():
        result.runs_not_ended.append("no MLflow database")
        return
    with sqlite3.connect(path, timeout=10) as db:
        for run_id, name, status in db.execute("SELECT run_uuid, name, status FROM runs WHERE status NOT IN "
                                               "('FINISHED', 'FAILED', 'KILLED')"):
            result.runs_not_ended.append(f"{name} ({run_id[:8]}) is {status}")
        if not db.execute("SELECT COUNT(*) FROM runs").fetchone()[0]:
            result.runs_not_ended.append("no MLflow run at all")


def _settle(home: Path, result: ChaosResult, timeout: float) -> None:
    """Give what legitimately outlives the loop a moment to leave: attempts' supervisors, the
    run helper of a killed controller (it leaves at the end of its input), the idle syncer."""
    deadline = time.monotonic() + timeout
    while _processes_of(home) and time.monotonic() < deadline:
        time.sleep(0.2)
