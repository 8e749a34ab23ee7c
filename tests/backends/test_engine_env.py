"""Engines whose nodes are not this host get only what the job asked for (backends/_env.py): the
job's env and the runtime's variables, never the submitter's environment; a secret goes as a
reference to the engine's own store (a Kubernetes Secret, a Databricks secret scope)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from autoresearch.api import Api
from autoresearch.backends import LaunchRequest, get_backend
from autoresearch.errors import SpecError
from tests.conftest import wait_for, wait_state
from tests.fakes.k8s_api import FakeKubernetes

SUBMITTER = {"HF_TOKEN": "hf_submitters_own_token_0123", "AWS_SECRET_ACCESS_KEY": "aws-submitters-secret-0123",
             "MLFLOW_TRACKING_TOKEN": "mlflow-submitters-token-0123", "SOME_HOST_PATH": "/home/submitter/private"}
PRINT = "import os; print('got', os.environ.get('HF_TOKEN'), os.environ.get('BATCH'), os.environ.get('AWS_SECRET_ACCESS_KEY'))"


@pytest.fixture
def submitter(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    for name, value in SUBMITTER.items():
        monkeypatch.setenv(name, value)


def job(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    return {"command": [sys.executable, "-c", PRINT], "workdir": str(tmp_path), "env": {"BATCH": "64"}, **extra}


def leaked(text: str) -> list[str]:
    return [name for name, value in SUBMITTER.items() if value in text]


@pytest.mark.parametrize("kind", ["kubernetes", "databricks"])
def test_the_submitters_environment_stays_home(kind: str, tmp_path: Path, submitter: None) -> None:
    import contextlib

    dbx: Any = None
    if kind == "databricks":
        pytest.importorskip("databricks.sdk", reason="databricks-sdk is not installed (pip install -e '.[test]')")
        from tests.fakes.databricks_api import FakeDatabricks

        dbx = FakeDatabricks(tmp_path / "workspace")
    with FakeKubernetes(tmp_path / "cluster") as k8s, dbx or contextlib.nullcontext():
        options: dict[str, Any] = {"api": k8s.url, "namespace": "default", "image": "python:3.11"} \
            if kind == "kubernetes" else {"host": dbx.url, "token": dbx.token}
        api = Api(backend=get_backend(kind, state_dir=str(tmp_path / "state"), **options))
        job_id = api.submit(job(tmp_path)).id
        if kind == "kubernetes":
            sent = json.dumps(wait_for(lambda: next(iter(k8s.jobs.values()), None)))
        else:
            submit = wait_for(lambda: next(iter(dbx.submits()), None))
            script = dbx.file(submit["tasks"][0]["ai_runtime_task"]["deployments"][0]["command_path"])
            sent = json.dumps(submit) + script.read_text()
        assert leaked(sent) == []  # HF_TOKEN, AWS_SECRET_ACCESS_KEY, MLFLOW_TRACKING_TOKEN, host paths
        assert '"BATCH"' in sent or "BATCH=64" in sent
        wait_state(api, job_id, "succeeded", timeout=60)


def test_a_kubernetes_job_gets_the_jobs_env_and_a_secret_reference_only(
        tmp_path: Path, submitter: None) -> None:
    with FakeKubernetes(tmp_path / "cluster") as k8s:
        k8s.secrets[("default", "hf-creds")] = {"token": "from-the-cluster-secret"}
        api = Api(backend=get_backend("kubernetes", api=k8s.url, namespace="default", image="python:3.11",
                                      state_dir=str(tmp_path / "state")))
        job_id = api.submit(job(tmp_path, secret_env={"HF_TOKEN": "hf-creds/token"})).id
        manifest = wait_for(lambda: next(iter(k8s.jobs.values()), None))
        env = manifest["spec"]["template"]["spec"]["containers"][0]["env"]
        assert leaked(json.dumps(manifest)) == []
        assert {"name": "BATCH", "value": "64"} in env
        assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-creds", "key": "token"}}} in env
        names = {item["name"] for item in env}
        assert not names & {"PATH", "HOME", "PWD", "SHELL", "USER", "PYTHONPATH"}, names
        assert {"AUTORESEARCH_JOB_ID", "AUTORESEARCH_ATTEMPT", "PYTHONUNBUFFERED"} <= names
        wait_state(api, job_id, "succeeded", timeout=60)
        assert "got from-the-cluster-secret 64" in api.logs(job_id).text


def test_a_databricks_run_names_the_secret_scope_never_the_value(tmp_path: Path, submitter: None) -> None:
    pytest.importorskip("databricks.sdk", reason="databricks-sdk is not installed (pip install -e '.[test]')")
    from tests.fakes.databricks_api import FakeDatabricks

    with FakeDatabricks(tmp_path / "workspace") as dbx:
        dbx.secrets["ml-team/hf"] = "from-the-secret-scope"
        api = Api(backend=get_backend("databricks", host=dbx.url, token=dbx.token, state_dir=str(tmp_path / "state")))
        job_id = api.submit(job(tmp_path, secret_env={"HF_TOKEN": "ml-team/hf"})).id
        submit = wait_for(lambda: next(iter(dbx.submits()), None))
        assert submit["tasks"][0]["environment_variables_key"] == "autoresearch"
        assert submit["environment_variables"] == [{"environment_variables_key": "autoresearch",
                                                    "spec": {"variables": {"HF_TOKEN": "{{secrets/ml-team/hf}}"}}}]
        script = dbx.file(submit["tasks"][0]["ai_runtime_task"]["deployments"][0]["command_path"]).read_text()
        assert "export BATCH=64" in script
        assert leaked(json.dumps(submit) + script) == []
        assert "export PATH=" not in script and "export HOME=" not in script
        wait_state(api, job_id, "succeeded", timeout=60)
        assert "got from-the-secret-scope 64" in api.logs(job_id).text


def test_a_job_may_still_send_a_variable_the_submitter_also_has(submitter: None, tmp_path: Path) -> None:
    """What the job's own env names goes, even when its value is the submitter's (the rule is what was
    asked, not what differs)."""
    from autoresearch.backends._env import sent_env

    env = {**os.environ, "BATCH": "64", "AUTORESEARCH_JOB_ID": "3", "AUTORESEARCH_TOKENS": "/srv/tokens"}
    request = LaunchRequest(key="3.1", argv=["true"], env=env, workdir="/", log_path="", run_dir="",
                            job_env=("BATCH", "HF_TOKEN"))
    sent = sent_env(request)
    assert sent["HF_TOKEN"] == SUBMITTER["HF_TOKEN"] and sent["BATCH"] == "64" and sent["AUTORESEARCH_JOB_ID"] == "3"
    assert not sent.keys() & {"AWS_SECRET_ACCESS_KEY", "MLFLOW_TRACKING_TOKEN", "SOME_HOST_PATH", "PATH",
                              "AUTORESEARCH_TOKENS"}


@pytest.mark.parametrize("kind", ["local", "sim"])
def test_secret_env_is_refused_where_no_secret_store_resolves_it(kind: str, home: Path, tmp_path: Path) -> None:
    api = Api(backend=kind)
    with pytest.raises(SpecError, match="no secret store"):
        api.submit({"command": ["true"], "workdir": str(tmp_path), "secret_env": {"HF_TOKEN": "s/k"}})
    assert api.list_jobs().jobs == []


@pytest.mark.parametrize("secret_env, words", [
    ({"HF_TOKEN": "noslash"}, "not a secret reference"), ({"HF_TOKEN": "../etc/passwd"}, "not a secret reference"),
    ({"HF_TOKEN": "a/b/c"}, "not a secret reference"), ({"HF_TOKEN": "s/.."}, "not a secret reference"),
    ({"1BAD": "s/k"}, "not a variable name"), ({"A=B": "s/k"}, "not a variable name"),
    ({"HF_TOKEN": "s/k\n"}, "not a secret reference"), ({"BATCH": "s/k"}, "in both env and secret_env"),
])
def test_bad_secret_env_is_refused_at_the_edge(secret_env: dict[str, str], words: str, tmp_path: Path,
                                               home: Path) -> None:
    from autoresearch.engine.spec import make_spec

    with pytest.raises(SpecError, match=words) as err:
        make_spec(job(tmp_path, secret_env=secret_env))
    assert "secret_env" in err.value.hint


def test_kubernetes_refuses_a_reference_that_is_no_secret_name(tmp_path: Path) -> None:
    from autoresearch.backends._k8s_job import job_manifest

    request = LaunchRequest(key="1.1", argv=["true"], env={}, workdir="/", log_path="", run_dir="",
                            image="python:3.11", secret_env={"HF_TOKEN": "Upper_Case/token"})
    with pytest.raises(SpecError, match="not a Kubernetes Secret"):
        job_manifest(request, "ar-x", "o")


def test_the_cli_takes_secret_env_and_words_a_refusal(home: Path, tmp_path: Path) -> None:
    import subprocess

    done = subprocess.run([sys.executable, "-m", "autoresearch.cli", "submit", "--secret-env", "HF_TOKEN=hf/token",
                           "--", "true"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "no secret store for secret_env (HF_TOKEN)" in done.stderr, done.stderr


def test_ray_shares_the_rule(submitter: None) -> None:
    """Ray's runtime_env comes from the same helper: the job's env (even a value equal to the
    submitter's), the runtime's variables, nothing else of the submitter's environment."""
    from autoresearch.backends.ray import RayBackend

    env = {**os.environ, "BATCH": "64", "AUTORESEARCH_JOB_ID": "3"}
    request = LaunchRequest(key="3.1", argv=["python", "train.py"], env=env, workdir="/w", log_path="", run_dir="",
                            job_env=("BATCH", "HF_TOKEN"))
    sent = RayBackend(address="http://127.0.0.1:1")._runtime_env(request)["env_vars"]
    assert sent["HF_TOKEN"] == SUBMITTER["HF_TOKEN"] and sent["BATCH"] == "64" and sent["AUTORESEARCH_JOB_ID"] == "3"
    assert leaked(json.dumps({k: v for k, v in sent.items() if k != "HF_TOKEN"})) == []
    assert "PATH" not in sent and "HOME" not in sent
