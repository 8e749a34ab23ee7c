"""Backend profiles: config.yaml's named backends, how a name resolves, every broken config,
and one home holding the jobs of several backends."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from autoresearch.backends import get_backend, open_backend
from autoresearch.backends.fake import FakeBackend
from autoresearch.backends.profiles import load, resolve
from autoresearch.engine import jobs
from autoresearch.engine.runtime import Runtime
from autoresearch.engine.watcher import Watcher, fifo_name
from autoresearch.errors import SpecError
from tests.conftest import wait_for
from tests.runtime.test_cli import cli


def write_config(home: Path, text: str) -> Path:
    home.mkdir(parents=True, exist_ok=True)
    path = home / "config.yaml"
    path.write_text(text)
    return path


TWO = "default: alpha\nbackends:\n  alpha: {kind: local, node_name: node-a}\n  beta: {kind: local, node_name: node-b}\n"


def test_a_profile_resolves_to_its_kind_and_options_and_keeps_its_name(home: Path) -> None:
    write_config(home, TWO)
    backend = open_backend("beta", home)
    assert (backend.name, type(backend).__name__, backend.nodes()[0].name) == ("beta", "LocalBackend", "node-b")
    assert get_backend("local").name == "local"  # a kind with its defaults, when no profile has that name
    assert Runtime(home).backend.name == "alpha"  # default:
    os.environ["AUTORESEARCH_BACKEND"] = "beta"
    try:
        assert Runtime(home).backend.name == "beta"  # the variable still wins over default:
    finally:
        del os.environ["AUTORESEARCH_BACKEND"]


def test_an_unknown_profile_lists_the_profiles_and_kinds(home: Path) -> None:
    write_config(home, TWO)
    with pytest.raises(SpecError) as err:
        resolve("bta", home)
    assert "unknown backend 'bta'" in err.value.message and "alpha, beta" in err.value.message
    assert "did you mean 'beta'" in err.value.hint and "local" in err.value.hint


BROKEN = {
    "not a mapping": ("- alpha\n", "must be a mapping"),
    "unknown top key": ("backend: {}\n", "did you mean 'backends'"),
    "backends not a mapping": ("backends: [alpha]\n", "backends must be a mapping"),
    "a profile not a mapping": ("backends: {alpha: local}\n", "backends.alpha must be a mapping"),
    "no kind": ("backends: {alpha: {node_name: x}}\n", "has no kind"),
    "unknown kind": ("backends: {alpha: {kind: lcal}}\n", "did you mean 'local'"),
    "option typo": ("backends: {alpha: {kind: local, node_nme: x}}\n", "did you mean 'node_name'"),
    "YAML error": ("backends:\n  alpha: {kind: local\n", "line 3"),
    "a path as a name": ("backends: {'../x': {kind: local}}\n", "is not a name"),
    "default unknown": ("default: gamma\nbackends: {alpha: {kind: local}}\n", "neither a profile nor"),
    "markup and NUL": ("backends: {alpha: {kind: \"[red]\\0\"}}\n", "unknown kind"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_config_is_one_error_naming_the_file(home: Path, case: str) -> None:
    text, words = BROKEN[case]
    path = write_config(home, text)
    with pytest.raises(SpecError) as err:
        load(home)
    assert str(path) in err.value.message and words in err.value.render()
    assert "profiles file" in err.value.hint
    proc = cli("status", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "hint:" in proc.stderr


def test_a_config_that_is_not_utf8_or_too_big_is_refused(home: Path) -> None:
    path = write_config(home, "")
    path.write_bytes(b"backends: {\xff: 1}\n")
    with pytest.raises(SpecError, match="not UTF-8"):
        load(home)
    path.write_text("# " + "x" * (1 << 20) + "\n")
    with pytest.raises(SpecError, match="at most"):
        load(home)


def test_no_config_costs_no_yaml_import_on_a_status_read(home: Path) -> None:
    code = ("import sys; from autoresearch.api import Api; Api().status(); "
            "print('yaml' in sys.modules)")
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"


# -- --backend on every command ------------------------------------------------------------------


def test_submit_backend_flag_and_two_profiles_in_one_home(home: Path) -> None:
    write_config(home, TWO)
    a = cli("submit", "--", "true").stdout.strip()
    b = cli("submit", "--backend", "beta", "--", "/bin/sh", "-c", "echo from-beta").stdout.strip()
    wait_for(lambda: all(json.loads(cli("status", j, "--json").stdout)["state"] == "succeeded" for j in (a, b)))
    view = json.loads(cli("status", b, "--json").stdout)
    assert view["attempt_list"][0]["node"] == "node-b" and view["backend"] == "beta"
    assert "backend=beta" in cli("status", b).stdout
    assert "from-beta" in cli("logs", b).stdout  # read through the job's own backend
    nodes = {n["name"]: n["backend"] for n in json.loads(cli("nodes", "--json").stdout)["nodes"]}
    assert nodes["node-a"] == "alpha" and nodes["node-b"] == "beta"
    assert {j["id"] for j in json.loads(cli("list", "--json").stdout)["jobs"]} == {int(a), int(b)}


def test_bad_backend_flags_exit_2_with_the_list(home: Path) -> None:
    write_config(home, TWO)
    for args in (["submit", "--backend", "gamma", "--", "true"], ["serve", "--backend", "gamma"]):
        proc = cli(*args, check=False, stdin=None)
        assert proc.returncode == 2, proc.stderr
        assert "unknown backend 'gamma'" in proc.stderr and "alpha, beta" in proc.stderr


def test_an_image_on_local_is_refused_at_submit_naming_docker(home: Path) -> None:
    proc = cli("submit", "--image", "python:3.11-slim", "--", "true", check=False)
    assert proc.returncode == 2 and "cannot run containers" in proc.stderr
    assert "docker" in proc.stderr.split("hint:")[1]
    assert json.loads(cli("list", "--json").stdout)["jobs"] == []  # nothing recorded


def test_serve_opens_the_named_backend(home: Path) -> None:
    pytest.importorskip("mcp")
    from autoresearch.tools.server import build_server, server_api

    write_config(home, TWO)
    server = build_server(home=home, backend="beta")
    assert server_api(server)._runtime.backend.name == "beta"


# -- one home, several backends --------------------------------------------------------------


def two_runtimes(home: Path) -> tuple[Runtime, Runtime, FakeBackend]:
    from autoresearch.backends import NodeInfo

    # Node names are unique across a home's backends (the nodes table is keyed by name).
    a, b = FakeBackend([NodeInfo("node-a", ("0",))]), FakeBackend([NodeInfo("node-b", ("0",))])
    a.name, b.name = "a", "b"
    ra, rb = Runtime(home, a), Runtime(home, b)
    ra._others["b"] = rb  # what open_backend("b") would build from config.yaml
    return ra, rb, b


def test_a_pass_reconciles_only_its_own_backends_attempts(home: Path) -> None:
    ra, rb, b = two_runtimes(home)
    job = jobs.submit(rb, {"command": ["train"], "workdir": str(home.parent)})
    rb.tick()
    assert rb.jobs.job(job)["state"] in ("starting", "running")
    ra.tick()  # backend a knows nothing of b's attempt: it must not call it lost
    assert rb.jobs.job(job)["state"] in ("starting", "running") and rb.jobs.job(job)["attempts"] == 1
    jobs.cancel(ra, [job])  # a cancel through another backend's engine stops it on its own backend
    wait_for(lambda: (rb.tick(), rb.jobs.job(job)["state"])[1] == "cancelled")


def test_a_read_runs_the_pass_of_other_backends_with_unfinished_jobs(home: Path) -> None:
    ra, rb, b = two_runtimes(home)
    from autoresearch.engine import isolation

    job = rb.jobs.add_job(_spec(home), "", "b", isolation.job_policy(rb.ledger, "", b))  # queued, no pass yet
    ra.tick_all()
    assert rb.jobs.job(job)["state"] in ("starting", "running")  # b's pass ran from a's read


def _spec(home: Path) -> Any:
    from autoresearch.engine.spec import make_spec

    return make_spec({"command": ["train"], "workdir": str(home.parent)})


def test_each_backend_has_its_own_wake_fifo(home: Path) -> None:
    home.mkdir(parents=True, exist_ok=True)
    assert fifo_name("local") == "wake.fifo" and fifo_name("beta") == "wake.beta.fifo"
    with Watcher(home, "beta"):
        assert (home / "wake.beta.fifo").exists() and not (home / "wake.fifo").exists()


# -- autoresearch backends ---------------------------------------------------------------------


def test_backends_lists_profiles_capabilities_and_who_answers(home: Path, monkeypatch: pytest.MonkeyPatch,
                                                              tmp_path: Path) -> None:
    fakes = Path(__file__).resolve().parents[1] / "fakes" / "bin"
    monkeypatch.setenv("PATH", f"{fakes}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_DOCKER_DIR", str(tmp_path / "engine"))
    monkeypatch.setenv("FAKE_DOCKER_DOWN", "1")
    write_config(home, TWO + "  box: {kind: docker, image: python:3.11}\n")
    start = time.monotonic()
    proc = cli("backends", "--json")
    rows = {r["name"]: r for r in json.loads(proc.stdout)}
    assert time.monotonic() - start < 30
    assert rows["alpha"]["default"] and rows["alpha"]["ok"] and rows["alpha"]["profile"]
    assert rows["box"]["ok"] is False and "does not answer" in rows["box"]["error"] and rows["box"]["hint"]
    assert "containers" in rows["box"]["capabilities"] and rows["box"]["options"] == {"image": "python:3.11"}
    assert "fake" not in rows  # a test double is never offered
    text = cli("backends").stdout
    assert "do not" in text and "hint:" in text
    write_config(home, "backends: [\n")
    assert cli("backends", check=False).returncode == 2


def test_backends_masks_secret_options(home: Path) -> None:
    from autoresearch.backends.check import _masked

    masked = _masked({"api_token": "s3cret", "image": "x"})
    assert "s3cret" not in json.dumps(masked) and masked["image"] == "x"


@pytest.mark.parametrize(("options", "words"), [
    ("{kind: local, node_name: [1, 2]}", "node_name must be text"),
    ("{kind: docker, gpus: true}", "gpus must be a whole number"),
    ("{kind: docker, timeout: .nan}", "timeout must be a finite number"),
    ("{kind: docker, run_args: --rm}", "run_args must be a list of text"),
    ("{kind: docker, gpus: 99999999999999999999}", "profile 'box'"),
])
def test_an_option_of_the_wrong_type_is_refused_when_the_config_is_read(home: Path, options: str, words: str) -> None:
    write_config(home, f"backends: {{box: {options}}}\n")
    with pytest.raises(SpecError) as err:
        open_backend("box", home)
    assert words in err.value.message and err.value.hint


def test_two_backends_reporting_one_node_name_refuse_the_second_submit_and_reads_go_on(home: Path) -> None:
    write_config(home, "backends: {box: {kind: local}}\n")  # the same host name as the built-in local
    assert cli("submit", "--", "true").returncode == 0
    proc = cli("submit", "--backend", "box", "--", "true", check=False)
    assert proc.returncode == 2 and "which backend 'local'" in proc.stderr and "node_name" in proc.stderr
    assert cli("status").returncode == 0 and cli("nodes", "--json").returncode == 0
    nodes = json.loads(cli("nodes", "--json").stdout)["nodes"]
    assert [n["backend"] for n in nodes] == ["local"]  # no tug of war over the row


def test_backends_refuses_a_timeout_that_is_not_seconds_and_lists_without_probing(home: Path) -> None:
    for bad in ("nan", "inf", "-1", "0"):
        proc = cli("backends", "--timeout", bad, check=False)
        assert proc.returncode == 2 and "hint:" in proc.stderr, (bad, proc.stderr)
    rows = json.loads(cli("backends", "--no-probe", "--json").stdout)
    local = next(r for r in rows if r["name"] == "local")
    assert local["ok"] is None and local["default"] and "places" in local["capabilities"]


def test_a_removed_profiles_node_is_taken_over(home: Path) -> None:
    write_config(home, "default: box\nbackends: {box: {kind: local}}\n")
    assert cli("submit", "--", "true").returncode == 0  # box registers this host's node
    (home / "config.yaml").unlink()  # box is gone: the built-in local reports the same host name
    assert cli("submit", "--", "true").returncode == 0
    assert [n["backend"] for n in json.loads(cli("nodes", "--json").stdout)["nodes"]] == ["local"]


@pytest.mark.parametrize("backends", [
    "{a: {kind: ray, address: 'http://127.0.0.1:8265'}, b: {kind: ray, address: 'http://localhost:8265/'}}",
    "{a: {kind: ray}, b: {kind: ray, address: 'http://127.0.0.1:8265'}}",  # the default address
    "{a: {kind: slurm, partition: gpu}, b: {kind: slurm, partition: cpu, conf: /etc/slurm/../slurm/slurm.conf}}",
    "{a: {kind: docker, image: x}, b: {kind: docker, image: y}}",  # one daemon, one node name
])
def test_two_profiles_on_one_engine_are_refused_when_the_config_is_read(home: Path, backends: str,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RAY_ADDRESS", "SLURM_CONF", "DOCKER_HOST"):
        monkeypatch.delenv(name, raising=False)
    write_config(home, f"backends: {backends}\n")
    with pytest.raises(SpecError) as err:
        load(home)
    assert "backends.a and backends.b both drive the" in err.value.message
    assert "one profile per engine" in err.value.hint and "wait for ever" in err.value.hint


def test_profiles_on_different_engines_or_engines_without_nodes_load(home: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    write_config(home, "backends:\n"
                       "  a: {kind: ray, address: 'http://127.0.0.1:8265'}\n"
                       "  b: {kind: ray, address: 'http://127.0.0.1:8266'}\n"
                       "  c: {kind: docker, image: x}\n  d: {kind: docker, image: y, node_name: gpu-box-2}\n"
                       "  k1: {kind: kubernetes, api: 'https://k8s:6443', namespace: one}\n"
                       "  k2: {kind: kubernetes, api: 'https://k8s:6443', namespace: two}\n")
    assert sorted(load(home).profiles) == ["a", "b", "c", "d", "k1", "k2"]


def test_a_fresh_process_reads_config_yaml_without_yaml_once_it_was_parsed(home: Path) -> None:
    """The CLI's submit through a profile: the first process parses config.yaml (yaml, ~20 ms to import)
    and leaves what it says beside it; the next ones read that while the file is unchanged."""
    from tests.runtime.test_cli_imports import loaded

    write_config(home, "backends:\n  mine: {kind: local}\ndefault: mine\n")
    assert loaded("submit", "--backend", "mine", "--", "true", watch=("yaml",)) == ["yaml"]
    assert loaded("submit", "--backend", "mine", "--", "true", watch=("yaml",)) == []
    write_config(home, "backends:\n  other: {kind: local}\ndefault: other\n")  # an edit: parsed again
    assert loaded("submit", "--backend", "other", "--", "true", watch=("yaml",)) == ["yaml"]
    assert set(load(home).profiles) == {"other"}


def test_what_json_cannot_say_as_yaml_did_is_parsed_every_time(home: Path) -> None:
    from autoresearch.backends import profiles

    path = write_config(home, "backends:\n  mine: {kind: local}\nx: {1: 2}\n")
    data = profiles._read_parsed(path, os.stat(path))
    assert data["x"] == {1: 2} and not (home / ".config.yaml.json").exists()
    path = write_config(home, "backends:\n  mine: {kind: local}\n")
    profiles._read_parsed(path, os.stat(path))
    saved = json.loads((home / ".config.yaml.json").read_text())
    saved["data"]["backends"]["mine"]["kind"] = "forged"  # stale or forged: the stamp no longer matches
    saved["stamp"][0] += 1
    (home / ".config.yaml.json").write_text(json.dumps(saved))
    assert profiles._read_parsed(path, os.stat(path))["backends"]["mine"]["kind"] == "local"
