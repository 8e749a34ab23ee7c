"""Isolation between projects (docs/security.md): on a tokened HTTP server a project's job
sees neither another project's files, nor the ledger, nor the tokens file, nor the
server's environment; single-user jobs keep inheriting the caller's environment; the
home and its files are private to their owner."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_state
from tests.tools.conftest import NEEDS_BWRAP, connect, http_server, text
from tests.tools.test_transports import TOKEN_A, TOKEN_B, ok, wait_job

SECRET = "server-secret-value-7f3a9c"
B_TEXT = "team-b-private-output-5521"


def _log(home: Path, job_id: int) -> str:
    return (home / "jobs" / str(job_id) / "attempt-1.log").read_text()


@pytest.mark.anyio
@NEEDS_BWRAP
async def test_a_tenant_job_sees_nothing_of_another_project_nor_the_servers_secrets(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tokens = tmp_path / "auth" / "tokens"
    tokens.parent.mkdir()
    tokens.write_text(f"{TOKEN_A} team-a\n{TOKEN_B} team-b\n")
    root = tmp_path / "root"
    root.mkdir()
    home = tmp_path / "home"
    monkeypatch.setenv("MY_SECRET_KEY", SECRET)  # the server's environment: never a tenant's
    with http_server(home, tokens=tokens, root=root) as url:
        async with connect(url, TOKEN_A) as a, connect(url, TOKEN_B) as b:
            theirs = await ok(b, "submit", {"command": ["sh", "-c", f"echo {B_TEXT}"], "checkpoint": True})
            await wait_job(b, theirs["id"], ("succeeded",))
            assert B_TEXT in _log(home, theirs["id"])
            probe = "; ".join([
                f"cat $AUTORESEARCH_HOME/jobs/{theirs['id']}/attempt-1.log",
                "cat $AUTORESEARCH_TOKENS", f"cat {tokens}", "cat $AUTORESEARCH_HOME/ledger.db | head -c 200",
                f"ls $AUTORESEARCH_HOME/jobs/{theirs['id']}", "cat /proc/*/environ | tr '\\0' '\\n'", "env",
                f"{sys.executable} -c 'from autoresearch import report; report(3, acc=0.5)'",
                "echo saved > $AUTORESEARCH_CHECKPOINT_DIR/ckpt", "echo probe-done",
            ])
            mine = await ok(a, "submit", {"command": ["sh", "-c", probe], "checkpoint": True})
            done = await wait_job(a, mine["id"], ("succeeded", "failed"))
            assert "probe-done" in text(await a.call_tool("logs", {"job_id": mine["id"], "tail_lines": 5}))
            log = _log(home, mine["id"])
            assert done["state"] == "succeeded", log
            for leaked in (B_TEXT, TOKEN_A, TOKEN_B, SECRET, "AUTORESEARCH_TOKENS", "SQLite format"):
                assert leaked not in log, (leaked, log)
            assert "AUTORESEARCH_JOB_ID=" in log and "PATH=" in log  # what a job needs, it still gets
            # Its own metrics file and checkpoint dir work inside the sandbox.
            metrics = (await ok(a, "metrics", {"job_id": mine["id"], "names": ["acc"]}))["metrics"]
            assert [(m["name"], m["last"], m["step"]) for m in metrics] == [("acc", 0.5, 3)]
            assert (home / "jobs" / str(mine["id"]) / "checkpoint" / "ckpt").read_text() == "saved\n"
            # And nothing of A's leaked the other way round either: B's job was a tenant job too.
            assert SECRET not in _log(home, theirs["id"])


@NEEDS_BWRAP
def test_the_recorded_policy_holds_whichever_process_launches_the_job(
        api: Any, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tenant job queued behind another starts from that job's supervisor pass (not the
    server): it is still sandboxed, with a clean environment."""
    from autoresearch.engine import isolation

    tokens = tmp_path / "tokens"
    tokens.write_text(f"{TOKEN_A} team-a\n")
    with api._ledger.tx() as c:
        isolation.register_tenant(c, "team-a", isolation.tenant_policy([str(tokens)]))
    monkeypatch.setenv("MY_SECRET_KEY", SECRET)
    blocker = api.submit({"command": ["sleep", "1"], "gpus": 2})
    queued = api.submit({"command": ["sh", "-c", f"env; cat {tokens}; ls {home}; echo done"], "gpus": 2},
                        project="team-a")
    assert api.status(queued.id).state == "queued"
    row = api._ledger.one("SELECT isolation FROM jobs WHERE id=?", (queued.id,))
    assert json.loads(row["isolation"])["mode"] == "tenant"
    wait_state(api, blocker.id, "succeeded")
    wait_state(api, queued.id, "succeeded")
    log = _log(home, queued.id)
    assert "done" in log and SECRET not in log and TOKEN_A not in log and "ledger.db" not in log, log
    assert SECRET in os.environ["MY_SECRET_KEY"]


def test_single_user_jobs_still_inherit_the_callers_environment(api: Any, home: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_SECRET_KEY", SECRET)
    job = api.submit({"command": ["sh", "-c", "echo key=$MY_SECRET_KEY; ls $AUTORESEARCH_HOME"]})
    wait_state(api, job.id, "succeeded")
    log = _log(home, job.id)
    assert f"key={SECRET}" in log and "ledger.db" in log


def test_a_tenant_job_is_refused_when_no_sandbox_can_be_made(api: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from autoresearch.backends import _sandbox
    from autoresearch.engine import isolation
    from autoresearch.errors import BackendError

    with api._ledger.tx() as c:
        isolation.register_tenant(c, "team-a", isolation.tenant_policy())
    monkeypatch.setenv("PATH", "/nonexistent")  # bubblewrap not installed
    _sandbox._probe.cache_clear()
    try:
        with pytest.raises(BackendError, match="must run in a sandbox") as err:
            api.submit({"command": ["/bin/true"]}, project="team-a")
        assert "apt-get install -y bubblewrap" in err.value.hint
        assert api._ledger.one("SELECT COUNT(*) AS n FROM jobs")["n"] == 0  # nothing recorded, nothing run
    finally:
        _sandbox._probe.cache_clear()


@NEEDS_BWRAP
def test_a_tenant_job_stopped_gets_its_grace_period(api: Any, home: Path) -> None:
    """bwrap itself dies on SIGTERM: the stop must reach the job, which exits on its own terms."""
    from autoresearch.engine import isolation

    with api._ledger.tx() as c:
        isolation.register_tenant(c, "team-a", isolation.tenant_policy())
    job = api.submit({"command": ["sh", "-c", "trap 'echo got-term; exit 7' TERM; echo up; "
                                              "while :; do sleep 0.1; done"], "grace": "20s", "timeout": "60s"},
                     project="team-a")
    from tests.conftest import wait_for

    log = home / "jobs" / str(job.id) / "attempt-1.log"
    wait_for(lambda: log.exists() and "up" in log.read_text())
    api.cancel([job.id])
    view = wait_state(api, job.id, "cancelled")
    assert "got-term" in _log(home, job.id)
    assert view.exit_code == 7 and view.attempt_list[-1].signal is None, view


def test_the_home_and_its_files_are_private(api: Any, home: Path) -> None:
    job = api.submit({"command": [sys.executable, "-c", "from autoresearch import report; report(1, x=1)"]})
    wait_state(api, job.id, "succeeded")
    job_dir = home / "jobs" / str(job.id)
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    for path in (home / "ledger.db", job_dir / "attempt-1.log", job_dir / "attempt-1.metrics.jsonl",
                 job_dir / "attempt-1" / "exit.json", job_dir / "attempt-1" / "request.json"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert stat.S_IMODE(job_dir.stat().st_mode) == 0o700


@NEEDS_BWRAP
def test_a_tenant_writes_only_its_own_places(api: Any, home: Path, tmp_path: Path) -> None:
    """The shared root is read-only to tenants; the project dir is theirs alone; a trial
    worktree of the project's own loop is writable, another project's is not there at all."""
    import time

    from autoresearch.engine import isolation

    shared = tmp_path / "shared"
    shared.mkdir()
    with api._ledger.tx() as c:
        for project in ("team-a", "team-b"):
            isolation.register_tenant(c, project, isolation.tenant_policy())
            c.execute("INSERT INTO loops(name, plan, state, created_at, updated_at, project) VALUES (?,?,?,?,?,?)",
                      (f"loop-{project}", "{}", "running", time.time(), time.time(), project))
    worktrees = {p: home / "loops" / f"loop-{p}" / "worktrees" / "trial-1" for p in ("team-a", "team-b")}
    for path in worktrees.values():
        path.mkdir(parents=True)
    a = api.submit({"command": ["sh", "-c", "echo x > mine.txt; echo a-data > $AUTORESEARCH_PROJECT_DIR/a.txt; "
                                            "echo project-a-wrote"], "workdir": str(worktrees["team-a"])},
                   project="team-a")
    wait_state(api, a.id, "succeeded")
    assert (worktrees["team-a"] / "mine.txt").read_text() == "x\n"
    assert (home / "projects" / "team-a" / "a.txt").read_text() == "a-data\n"
    b = api.submit({"command": ["sh", "-c", f"cat {home}/projects/team-a/a.txt; echo y > taken.txt; "
                                            "echo b-ran"], "workdir": str(shared)}, project="team-b")
    wait_state(api, b.id, ("succeeded", "failed"))
    log = _log(home, b.id)
    assert "b-ran" in log and "a-data" not in log and "Read-only file system" in log, log
    assert not (shared / "taken.txt").exists()
    c_job = api.submit({"command": ["sh", "-c", "echo z > stolen.txt"], "workdir": str(worktrees["team-a"]),
                        "max_retries": 0}, project="team-b")
    assert wait_state(api, c_job.id, ("succeeded", "failed")).state == "failed"
    assert not (worktrees["team-a"] / "stolen.txt").exists()


def test_a_home_made_before_private_homes_is_tightened_on_upgrade(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from autoresearch.store import ledger as ledger_module
    from autoresearch.store.ledger import Ledger

    home = tmp_path / "old-home"
    full = list(ledger_module.MIGRATIONS)
    monkeypatch.setattr(ledger_module, "MIGRATIONS", [m for m in full if m[0] != "isolation-1"])
    Ledger(home)  # what an earlier version left: a world-readable home and ledger
    home.chmod(0o755)
    (home / "ledger.db").chmod(0o644)
    monkeypatch.setattr(ledger_module, "MIGRATIONS", full)
    ledger = Ledger(home)
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert stat.S_IMODE((home / "ledger.db").stat().st_mode) == 0o600
    assert ledger.one("SELECT COUNT(*) AS n FROM tenants")["n"] == 0


@NEEDS_BWRAP
def test_a_sandboxed_death_by_signal_is_recorded_as_a_signal(api: Any) -> None:
    from autoresearch.engine import isolation

    with api._ledger.tx() as c:
        isolation.register_tenant(c, "team-a", isolation.tenant_policy())
    job = api.submit({"command": ["sh", "-c", "kill -KILL $$"], "max_retries": 0}, project="team-a")
    view = wait_state(api, job.id, "failed")
    attempt = view.attempt_list[-1]
    assert (attempt.exit_code, attempt.signal, attempt.end_reason) == (None, 9, "infra"), attempt


@NEEDS_BWRAP
def test_a_project_name_cannot_lead_its_directory_out_of_projects(api: Any, home: Path) -> None:
    from autoresearch.engine import isolation

    other = api.submit({"command": ["sh", "-c", f"echo {B_TEXT}"]})
    wait_state(api, other.id, "succeeded")
    with api._ledger.tx() as c:
        isolation.register_tenant(c, "../jobs", isolation.tenant_policy())
    job = api.submit({"command": ["sh", "-c", f"echo dir=$AUTORESEARCH_PROJECT_DIR; "
                                              f"cat $AUTORESEARCH_PROJECT_DIR/{other.id}/attempt-1.log"]},
                     project="../jobs")
    wait_state(api, job.id, ("succeeded", "failed"))
    log = _log(home, job.id)
    assert f"dir={home}/projects/" in log and B_TEXT not in log, log


TENANT_FROM_A_TMP_VENV = """\
import sys, time
from autoresearch.engine import isolation
from autoresearch.api import Api
api = Api(sys.argv[1])
with api._ledger.tx() as c:
    isolation.register_tenant(c, "team-a", isolation.tenant_policy([]))
job = api.submit({"command": [sys.executable, "-c", "from autoresearch import report; report(1, x=2)"],
                  "workdir": sys.argv[2]}, project="team-a")
deadline = time.monotonic() + 60
while api.status(job.id).state not in ("succeeded", "failed") and time.monotonic() < deadline:
    time.sleep(0.1)
print(sys.prefix, api.status(job.id).state, [(m.name, m.last) for m in api.metrics(job.id)])
"""


@NEEDS_BWRAP
def test_a_server_whose_python_lives_under_tmp_still_runs_tenant_jobs(home: Path, tmp_path: Path) -> None:
    # The sandbox makes /tmp private; a venv (or a clone) there vanished from the tenant's view,
    # so every tenant job failed at its first line.
    import subprocess
    import venv

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(system_site_packages=True, with_pip=False, symlinks=True).create(env_dir)
    # A venv made from a venv's python sees the base interpreter's packages, not the outer venv's
    # (where the README's `pip install -e .` put autoresearch and its dependencies): this one sees
    # this checkout and the outer venv's site-packages too, editable finders included.
    import site

    outer = [str(Path(__file__).resolve().parents[2]), *site.getsitepackages()]
    inner = next(env_dir.glob("lib/python*/site-packages"))
    (inner / "_outer.pth").write_text("".join(f"import site; site.addsitedir({p!r})\n" for p in outer))
    script = tmp_path / "serve.py"
    script.write_text(TENANT_FROM_A_TMP_VENV)
    workdir = tmp_path / "wd"  # beside the venv, not above it (the workdir is visible)
    workdir.mkdir()
    done = subprocess.run([str(env_dir / "bin" / "python"), str(script), str(home), str(workdir)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert done.returncode == 0, done.stderr
    prefix, state, metrics = done.stdout.split(" ", 2)
    assert prefix.startswith(str(tmp_path)) and str(tmp_path).startswith("/tmp")
    assert state == "succeeded" and "('x', 2.0)" in metrics, done.stdout
