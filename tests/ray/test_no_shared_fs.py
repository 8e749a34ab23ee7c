"""Without a shared filesystem (Ray, Kubernetes): report() prints marked lines, the runtime reads
them from the log the engine's API returns, once; and admission keeps priority order on an
engine that schedules itself but cannot preempt. No Ray needed: the fake backend, declared so."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autoresearch.api import Api
from autoresearch.backends import Capabilities, NodeInfo
from autoresearch.backends.fake import FakeBackend
from autoresearch.engine import scheduler as S
from autoresearch.report import MARK

NO_FS = Capabilities(gpus=True, places=False, shared_fs=False)


def test_report_prints_marked_records_when_the_runtime_says_so(tmp_path: Path) -> None:
    code = "from autoresearch import report; report(step=2, loss=0.5, bad='x'); report(acc=float('nan'))"
    env = {**os.environ, "AUTORESEARCH_METRICS_STDOUT": "1", "AUTORESEARCH_METRICS_FILE": str(tmp_path / "m")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    assert [line.startswith(MARK) for line in lines] == [True, True]
    first, second = (json.loads(line[len(MARK):]) for line in lines)
    assert (first["step"], first["metrics"]) == (2, {"loss": 0.5})
    assert second["metrics"] == {"acc": None}
    assert not (tmp_path / "m").exists()  # nothing written where the runtime cannot look


def test_marked_lines_in_the_engine_log_become_reported_points_once(home: Path, tmp_path: Path) -> None:
    fake = FakeBackend(nodes=1, gpus=2, capabilities=NO_FS)
    api = Api(home, backend=fake)
    job = api.submit({"command": ["train"], "workdir": str(tmp_path)}).id
    att = fake.attempts()[0]
    assert att.request.env.get("AUTORESEARCH_METRICS_STDOUT") == "1"
    assert "AUTORESEARCH_METRICS_FILE" not in att.request.env
    record = json.dumps({"step": 0, "metrics": {"loss": 2.0}})
    fake.emit(f"{job}.1", f"{MARK}{record}\nloss: 7\n{MARK}{{not json\n{MARK}{json.dumps({'metrics': {'loss': 1.0}})}")
    api.metrics(job)
    api.metrics(job)  # a second read adds nothing
    fake.finish(f"{job}.1", 0)
    api.tick()
    api.tick()
    rows = api._ledger.query("SELECT name, step, value, source FROM metrics WHERE job_id=? ORDER BY source, step",
                             (job,))
    assert [(r["name"], r["step"], r["value"], r["source"]) for r in rows] == [
        ("loss", 0, 7.0, "log"), ("loss", 0, 2.0, "report"), ("loss", 1, 1.0, "report")]
    assert {m.name: m.last for m in api.metrics(job)} == {"loss": 1.0}  # reported beats printed
    assert any("not a JSON line" in w for w in api.status(job).warnings)


def _nodes(*sizes: tuple[int, float], up: bool = True) -> list[S.NodeState]:
    return [S.NodeState(f"n{i}", tuple(str(g) for g in range(gpus)), cpus, 0, up) for i, (gpus, cpus) in
            enumerate(sizes)]


def test_admission_hands_an_engine_without_preemption_only_what_fits_in_priority_order() -> None:
    pending = [S.Pending(1, "normal", gpus=1), S.Pending(2, "normal", gpus=1), S.Pending(3, "critical", gpus=1),
               S.Pending(4, "normal")]
    got = S.admit(pending, _nodes((2, 4.0)), running=[])
    assert [p.job_id for p in got.placements] == [3, 1]  # critical first; 2 waits in our queue, not Ray's
    got = S.admit(pending, _nodes((2, 4.0)), running=[(1, 0.0)])
    assert [p.job_id for p in got.placements] == [3]
    # CPUs count too (an attempt takes at least one); a job no node can hold does not block others.
    cpu_only = [S.Pending(5, "normal", cpus=8), S.Pending(6, "normal"), S.Pending(7, "normal"), S.Pending(8, "normal")]
    assert [p.job_id for p in S.admit(cpu_only, _nodes((0, 2.0)), []).placements] == [6, 7]
    # The engine does not answer (its nodes are down): nothing is handed to it.
    assert S.admit(pending, _nodes((2, 4.0), up=False), []).placements == []
    assert S.admit(pending, [], []).placements == []
    # An engine that preempts by priority itself gets everything, in priority order.
    assert [p.job_id for p in S.admit(pending, [], [], preempts=True).placements] == [3, 1, 2, 4]


def test_runtime_admits_in_priority_order_on_a_non_preempting_engine(home: Path, tmp_path: Path) -> None:
    fake = FakeBackend(nodes=[NodeInfo("ray-1", gpu_ids=("0",), cpus=8)],
                       capabilities=Capabilities(gpus=True, places=False, shared_fs=False))
    api = Api(home, backend=fake)
    first = api.submit({"command": ["a"], "workdir": str(tmp_path), "gpus": 1}).id
    normal = api.submit({"command": ["b"], "workdir": str(tmp_path), "gpus": 1}).id
    critical = api.submit({"command": ["c"], "workdir": str(tmp_path), "gpus": 1, "priority": "critical"}).id
    assert [a.request.key for a in fake.attempts()] == [f"{first}.1"]
    assert fake.attempts()[0].request.gpus == 1
    fake.finish(f"{first}.1", 0)
    api.tick()
    assert [a.request.key for a in fake.attempts()][1:] == [f"{critical}.1"]
    assert api.status(normal).state == "queued"


def test_the_ray_backend_never_imports_ray() -> None:
    """A status read polls attempts: it must not pay ~1 s for ``import ray`` (invariant 7)."""
    code = ("import sys; from autoresearch.backends import get_backend; b = get_backend('ray', address="
            "'http://127.0.0.1:9'); b.nodes(); assert not any(m == 'ray' or m.startswith('ray.') for m in sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_job_for_a_head_that_does_not_answer_waits_queued(home: Path, tmp_path: Path) -> None:
    from autoresearch.backends.ray import RayBackend

    api = Api(home, backend=RayBackend(address="http://127.0.0.1:9", timeout=2))
    job = api.submit({"command": ["true"], "workdir": str(tmp_path)}).id
    api.tick()
    assert api.status(job).state == "queued"  # not launched into the void, no retry spent
    assert api._ledger.one("SELECT COUNT(*) AS n FROM attempts")["n"] == 0


def test_the_ray_timeout_option_bounds_each_call_and_garbage_falls_back() -> None:
    from autoresearch.backends.ray import RayBackend
    from autoresearch.errors import BackendError

    for garbage in (float("nan"), -1, 0, 10**9, "5"):
        assert RayBackend(address="http://127.0.0.1:9", timeout=garbage).timeout == 10.0  # type: ignore[arg-type]
    assert RayBackend(address="http://127.0.0.1:9", timeout=2.5).timeout == 2.5
    with socket.socket() as silent:  # a listener that never answers: the call gives up after the timeout
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        backend = RayBackend(address=f"http://127.0.0.1:{silent.getsockname()[1]}", timeout=1.0)
        t0 = time.monotonic()
        with pytest.raises(BackendError, match="does not answer"):
            backend.probe()
        assert time.monotonic() - t0 < 20  # 1 s and the loaded machine's slack, never urllib's default (none)
