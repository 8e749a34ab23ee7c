"""The batched SQL path into a SQLite store writes what MLflow's client path writes.

The same ended loop (trials with params, a patch, a failure, NaN, a trial that never ran, a
promotion that retags verdicts) is mirrored twice from copies of one home: through batched SQL
transactions (the default) and through MlflowClient calls (``AUTORESEARCH_MIRROR_BULK=off``).
What MlflowClient reads back must be the same: runs, names, status, times, tags, params,
metrics and their history, artifacts and their content; and the UI's search still works.
"""

from __future__ import annotations

import math
import os
import shutil
import stat
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from autoresearch import tracking
from tests.conftest import wait_state
from tests.tracking.conftest import client, make_decision, make_loop, make_trial, submit_trial

REPORT = ("from autoresearch import report\nimport math\nfor i in range(4):\n"
          "    report(step=i, loss=1.0 / (i + 1), acc=math.nan if i == 2 else i / 4)\n{tail}")


@pytest.fixture(scope="module")
def ended_loop(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    """A home whose loop has ended, nothing mirrored yet."""
    from autoresearch.api import Api

    root = tmp_path_factory.mktemp("bulk")
    home = root / "source"
    env = {"AUTORESEARCH_HOME": str(home), "AUTORESEARCH_GPUS": "2", "AUTORESEARCH_SYNC": "off"}
    old = {k: os.environ.get(k) for k in (*env, "MLFLOW_TRACKING_URI", "AUTORESEARCH_BACKEND")}
    os.environ.update(env)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    os.environ.pop("AUTORESEARCH_BACKEND", None)
    try:
        api = Api(home)
        plan = {"name": "bulk", "objective": {"metric": "loss", "goal": "minimize"},
                "space": {"lr": {"low": 0.001, "high": 1.0}}}
        loop = make_loop(api, "bulk", plan)
        propose = make_decision(api, loop, "propose", rationale="lr sweep <b>markup</b>",
                                outputs={"proposals": [{"lr": 0.1}]})
        first = make_trial(api, loop, propose, {"lr": 0.1, "optim": {"name": "adam", "betas": [0.9, 0.99]}}, seed=1)
        second = make_trial(api, loop, propose, {"lr": 0.01}, parent_trial=first, proposer="llm",
                            patch="--- a/train.py\n+++ b/train.py\n@@ -1 +1 @@\n-warmup=0\n+warmup=100\n")
        failing = make_trial(api, loop, propose, {"lr": 0.5})
        never = make_trial(api, loop, propose, {"lr": 0.9})
        trials = [first, second, failing, never]
        jobs = [submit_trial(api, t, [sys.executable, "-c", REPORT.format(tail=tail)], root)
                for t, tail in ((first, ""), (second, "print('x' * 5000)"), (failing, "raise SystemExit(3)"))]
        for job, state in zip(jobs, ("succeeded", "succeeded", "failed"), strict=True):
            wait_state(api, job, state, timeout=60)
        promote = make_decision(api, loop, "promote", outputs={"promoted": True}, inputs={})
        now = time.time()
        with api._ledger.tx() as c:
            c.execute("UPDATE decisions SET trial_id=? WHERE id=?", (first, promote))
            for t, state in ((first, "succeeded"), (second, "succeeded"), (failing, "failed")):
                c.execute("UPDATE trials SET state=?, objective=?, ended_at=?, updated_at=? WHERE id=?",
                          (state, 0.25, now, now, t))
            c.execute("UPDATE trials SET state='skipped', failure='the loop ended first', updated_at=? WHERE id=?",
                      (now, never))
            c.execute("UPDATE loops SET state='done', updated_at=? WHERE id=?", (now, loop))
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return home, trials


def _copy_home(source: Path, dest: Path) -> None:
    """A copy of the ended loop's home. A helper of the source home (its pass daemon) may close the
    ledger as we copy, which folds and removes ledger.db-wal/-shm under copytree: then copy again
    (the ledger file then holds everything)."""
    for _ in range(20):
        try:
            shutil.copytree(source, dest, ignore=shutil.ignore_patterns("*.fifo", "*.sock", "*.listen"))
            return
        except shutil.Error:
            shutil.rmtree(dest, ignore_errors=True)
            time.sleep(0.1)
    raise AssertionError(f"{source} kept changing under the copy")


def _counted(calls: dict[str, int], name: str, real: Any) -> Any:
    def counted(self: Any, *args: Any, **kw: Any) -> Any:
        calls[name] = calls.get(name, 0) + 1
        return real(self, *args, **kw)
    return counted


def _mirror(source: Path, dest: Path, bulk: str, trials: list[int], monkeypatch: pytest.MonkeyPatch) -> str:
    _copy_home(source, dest)
    monkeypatch.setenv("AUTORESEARCH_HOME", str(dest))
    monkeypatch.setenv("AUTORESEARCH_SYNC", "off")
    monkeypatch.setenv("AUTORESEARCH_MIRROR_BULK", bulk)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    from mlflow.tracking import MlflowClient

    calls: dict[str, int] = {}
    with monkeypatch.context() as m:
        for name in ("create_run", "log_batch", "set_terminated", "log_text"):
            m.setattr(MlflowClient, name, _counted(calls, name, getattr(MlflowClient, name)))
        assert set(tracking.prepare_runs(dest, trials)) == set(trials)  # the run maker's batch, before launch
        tracking.sync(dest)
    if bulk == "on":  # the trials' runs went in batches: only the loop's own run through the client
        assert calls.get("create_run") == 1 and calls.get("set_terminated") == 1 and not calls.get("log_text"), calls
        assert calls.get("log_batch", 0) <= 2, calls  # the loop run's params and tags; its decision metrics
    else:
        assert calls["create_run"] == len(trials) + 1 and calls["set_terminated"] == len(trials) + 1, calls
    return f"sqlite:///{dest / 'mlflow.db'}"


def _nan(value: float) -> float | str:
    return "NaN" if math.isnan(value) else value  # (NaN != NaN: compared as a word)


def _readback(uri: str, tmp: Path) -> dict[str, Any]:
    """Everything MlflowClient reads back about the experiment's runs, keyed by entity, free of what
    differs between two homes by nature (the run ids, the home's id and path)."""
    from mlflow.entities import ViewType

    c = client(uri)
    exp = c.get_experiment_by_name("bulk")
    runs = c.search_runs([exp.experiment_id], run_view_type=ViewType.ALL, max_results=1000)
    entity = {r.info.run_id: r.data.tags["autoresearch.entity"].split("/", 1)[1] for r in runs}
    out: dict[str, Any] = {}
    for r in runs:
        tags = {k: v for k, v in r.data.tags.items() if k not in ("autoresearch.entity", "autoresearch.home")}
        if "mlflow.parentRunId" in tags:
            tags["mlflow.parentRunId"] = entity[tags["mlflow.parentRunId"]]
        assert r.data.tags["autoresearch.home"].endswith(str(Path(uri[len("sqlite:///"):]).parent))
        artifacts: dict[str, str] = {}
        todo = [None]
        while todo:
            for f in c.list_artifacts(r.info.run_id, todo.pop()):
                if f.is_dir:
                    todo.append(f.path)
                else:
                    local = Path(c.download_artifacts(r.info.run_id, f.path, str(tmp)))
                    artifacts[f.path] = local.read_text()
        history = {k: sorted((m.step, m.timestamp, _nan(m.value)) for m in c.get_metric_history(r.info.run_id, k))
                   for k in r.data.metrics}
        info = r.info
        out[entity[info.run_id]] = {
            "name": info.run_name, "status": info.status, "start": info.start_time, "end": info.end_time,
            "stage": info.lifecycle_stage, "user": info.user_id,
            "artifact_uri": info.artifact_uri.split(f"/{info.run_id}/", 1)[1],
            "tags": tags, "params": r.data.params, "metrics": {k: _nan(v) for k, v in r.data.metrics.items()}, "history": history,
            "artifacts": artifacts}
    return out


@pytest.mark.slow
def test_the_batched_path_writes_what_the_client_path_writes(
        ended_loop: tuple[Path, list[int]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source, trials = ended_loop
    bulk_uri = _mirror(source, tmp_path / "bulk", "on", trials, monkeypatch)
    client_uri = _mirror(source, tmp_path / "client", "off", trials, monkeypatch)
    bulk, plain = _readback(bulk_uri, tmp_path / "a"), _readback(client_uri, tmp_path / "b")
    assert sorted(bulk) == sorted(plain) == sorted([*(f"trial:{t}" for t in trials), "loop:1"])
    for entity in plain:
        assert bulk[entity] == plain[entity], entity
    # what the loop made of it, as a reader sees it
    first, second, failing, never = (f"trial:{t}" for t in trials)
    assert bulk[first]["status"] == "FINISHED" and bulk[failing]["status"] == "FAILED"
    assert bulk[never]["status"] == "KILLED" and bulk[never]["tags"]["autoresearch.skipped"] == "the loop ended first"
    assert bulk[first]["tags"]["autoresearch.verdict"] == "incumbent"
    assert bulk[first]["params"] == {"lr": "0.1", "optim.name": "adam", "optim.betas": "[0.9, 0.99]"}
    assert bulk[first]["name"].startswith(f"trial-{trials[0]} succeeded lr=0.1")
    assert "+warmup=100" in bulk[second]["artifacts"]["patch.diff"]
    assert "x" * 5000 in bulk[second]["artifacts"]["logs/attempt-1.log"]
    assert bulk["loop:1"]["status"] == "FINISHED" and any(p.startswith("decisions/") for p in bulk["loop:1"]["artifacts"])
    assert bulk[first]["history"]["acc"][2][2] == "NaN"  # kept
    # the folders and files written directly (logs, patch, plan) are private whatever the umask (the
    # decisions go up through MLflow's log_artifacts, private under the mirror's processes' umask)
    direct = [p for p in (tmp_path / "bulk" / "mlartifacts").rglob("*") if "decisions" not in p.parts]
    assert sum(p.name.endswith(".log") for p in direct) == 3 and sum(p.name == "patch.diff" for p in direct) == 1
    for path in direct:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode & 0o077 == 0, (path, oct(mode))


@pytest.mark.slow
def test_the_ui_search_finds_runs_written_in_batches(
        ended_loop: tuple[Path, list[int]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source, trials = ended_loop
    uri = _mirror(source, tmp_path / "bulk", "on", trials, monkeypatch)
    c = client(uri)
    exp = c.get_experiment_by_name("bulk").experiment_id

    def found(filter_string: str, **kw: Any) -> list[str]:
        return [r.data.tags["autoresearch.trial_id"] for r in c.search_runs([exp], filter_string, **kw)]

    assert found("params.lr = '0.01'") == [str(trials[1])]
    assert found("params.`optim.name` = 'adam'") == [str(trials[0])]
    assert sorted(found("tags.`autoresearch.kind` = 'trial' and attributes.status = 'FINISHED'")) == sorted(
        str(t) for t in trials[:2])
    assert found("tags.`autoresearch.verdict` = 'incumbent'") == [str(trials[0])]
    assert sorted(found("metrics.loss < 0.3")) == sorted(str(t) for t in trials[:3])  # the last point: 0.25
    assert found("tags.`autoresearch.trial_state` = 'failed'") == [str(trials[2])]
    assert found("attributes.run_name LIKE '% failed %'") == [str(trials[2])]
    ordered = found("tags.`autoresearch.kind` = 'trial'", order_by=["params.lr DESC"])
    assert ordered == [str(t) for t in (trials[2], trials[0], trials[1])]
    skipped = c.search_runs([exp], "tags.`autoresearch.skipped` = 'the loop ended first'")
    assert [r.info.status for r in skipped] == ["KILLED"]


def test_a_crash_between_the_batch_and_the_ledger_makes_no_second_run(
        ended_loop: tuple[Path, list[int]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """kill -9 after MLflow committed a batch of runs, before the ledger recorded their ids: the next
    pass finds them by their entity tag; every trial keeps one run, and the sync completes."""
    from autoresearch.tracking._store import MirrorStore
    from autoresearch.tracking._sync import Syncer

    source, trials = ended_loop
    dest = tmp_path / "crash"
    _copy_home(source, dest)
    monkeypatch.setenv("AUTORESEARCH_HOME", str(dest))
    monkeypatch.setenv("AUTORESEARCH_SYNC", "off")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)

    def killed(*args: Any) -> None:
        raise KeyboardInterrupt("killed")

    syncer = Syncer(dest)
    with monkeypatch.context() as m:
        m.setattr(MirrorStore, "set_run", killed)
        with pytest.raises(KeyboardInterrupt):
            syncer.create_runs([(f"trial:{t}", "bulk", f"trial-{t}", None, None) for t in trials])
    rows = syncer.store.runs_of([f"trial:{t}" for t in trials])
    assert rows == {f"trial:{t}": None for t in trials}  # reserved, the ids never recorded
    made = client(syncer.uri).search_runs([syncer.experiment_id("bulk")])
    assert len(made) == len(trials)  # MLflow has them

    tracking.sync(dest)
    c = client(syncer.uri)
    runs = c.search_runs([syncer.experiment_id("bulk")], "tags.`autoresearch.entity` LIKE '%/trial:%'")
    assert sorted(r.data.tags["autoresearch.entity"].split(":")[-1] for r in runs) == sorted(str(t) for t in trials)
    assert {r.info.run_id for r in runs} == {r.info.run_id for r in made}  # the runs made first, adopted
    assert sum(1 for r in c.search_runs([syncer.experiment_id("bulk")])) == len(trials) + 1  # + the loop's
