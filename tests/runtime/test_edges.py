"""Bad input refused at the edge (issue 14, items 7 and 8): specs the OS cannot run, job
files that are not a mapping or not UTF-8, a malformed environment variable, a bad --uri.
Each is exit 2 with one error line and a hint, and nothing in the ledger."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from autoresearch.errors import SpecError
from tests.runtime.test_cli import cli


def jobs_in(home: Path) -> int:
    if not (home / "ledger.db").exists():
        return 0
    with sqlite3.connect(home / "ledger.db") as db:
        return int(db.execute("SELECT COUNT(*) FROM jobs").fetchone()[0])


def assert_refused(proc: Any, needle: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith("error: ") and lines[-1].startswith("hint: "), proc.stderr
    assert needle in proc.stderr


BAD_SPECS = [
    ({"command": ["echo", "a\0b"]}, "NUL byte"),
    ({"command": "echo a\0b", "shell": True}, "NUL byte"),
    ({"command": ["true"], "env": {"A=B": "1"}}, "'A=B' is not a valid variable name"),
    ({"command": ["true"], "env": {"": "1"}}, "'' is not a valid variable name"),
    ({"command": ["true"], "env": {"A\0B": "1"}}, "is not a valid variable name"),
    ({"command": ["true"], "env": {"A": "x\0y"}}, "the value of A contains a NUL byte"),
    ({"command": ["true"], "workdir": "/tmp/\0"}, "NUL byte"),
    ({"command": ["true"], "mounts": {"data\0": "/tmp"}}, "NUL byte"),
    ({"command": ["true"], "workdir": "/" + "x" * 5000}, "File name too long"),
    ({"command": ["true"], "timeout": float("nan")}, "finite duration"),
    ({"command": ["true"], "timeout": 10**400}, "finite duration"),
    ({"command": ["true"], "memory": float("inf")}, "finite size"),
    ({"command": ["true"], "memory": "9" * 400}, "finite size"),
    ({"command": ["true"], "memory": 10**30}, "memory"),
    ({"command": ["true"], "cpus": float("nan")}, "cpus"),
]


@pytest.mark.parametrize(("spec", "needle"), BAD_SPECS, ids=[n for _, n in BAD_SPECS])
def test_unrunnable_spec_is_refused_at_submit(api: Any, tmp_path: Path, spec: dict[str, Any], needle: str) -> None:
    with pytest.raises(SpecError) as info:
        api.submit({"workdir": str(tmp_path), **spec})
    assert needle in info.value.message and info.value.hint
    assert api._ledger.one("SELECT COUNT(*) AS n FROM jobs")["n"] == 0


def test_existing_mount_target_is_refused_but_our_own_link_is_not(api: Any, tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()  # a real directory where the link would go
    source = tmp_path / "dataset"
    source.mkdir()
    with pytest.raises(SpecError, match="mount target .* exists and is not a link"):
        api.submit({"command": ["true"], "workdir": str(tmp_path), "mounts": {"data": str(source)}})
    assert api._ledger.one("SELECT COUNT(*) AS n FROM jobs")["n"] == 0
    (tmp_path / "linked").symlink_to(source)  # the link a previous job made: fine
    view = api.submit({"command": ["true"], "workdir": str(tmp_path), "mounts": {"linked": str(source)}})
    assert view.id == 1


def test_what_the_os_can_pass_is_still_accepted(api: Any, tmp_path: Path) -> None:
    view = api.submit({"command": ["printf", "a\x01b="], "workdir": str(tmp_path), "env": {"A": "B=C", "E": ""}})
    assert view.id == 1  # '=' in a value, an empty value, control characters other than NUL


def test_cli_refuses_bad_env_name_and_existing_mount(home: Path, tmp_path: Path) -> None:
    proc = cli("submit", "--env", "=x", "--", "true", check=False)
    assert_refused(proc, "is not KEY=VALUE")
    (tmp_path / "target").mkdir()
    proc = cli("submit", "--workdir", str(tmp_path), "--mount", f"target={tmp_path}", "--", "true", check=False)
    assert_refused(proc, "exists and is not a link")
    assert jobs_in(home) == 0


def test_submit_file_that_is_a_list_or_not_utf8(home: Path, tmp_path: Path) -> None:
    listed = tmp_path / "list.yaml"
    listed.write_text("- command: [true]\n- command: [false]\n")
    assert_refused(cli("submit", "-f", str(listed), check=False), "must be a mapping")
    assert_refused(cli("submit", "-f", str(listed), "--", "true", check=False), "must be a mapping")
    binary = tmp_path / "bad.yaml"
    binary.write_bytes(b"command: [\xff\xfe]\n")
    assert_refused(cli("submit", "-f", str(binary), check=False), "not UTF-8")
    huge = tmp_path / "huge.yaml"
    huge.write_text("command: [true]\ngpus: " + "9" * 5000 + "\n")
    assert_refused(cli("submit", "-f", str(huge), check=False), "not valid YAML")
    assert jobs_in(home) == 0


def test_submit_file_with_bad_values_is_refused(home: Path, tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text('command: ["echo", "a\\0b"]\nenv: {"A=B": "1"}\n')
    assert_refused(cli("submit", "-f", str(spec), check=False), "invalid job spec")
    assert jobs_in(home) == 0


def test_malformed_ledger_timeout_is_a_warning_not_a_traceback(home: Path) -> None:
    env = {**os.environ, "AUTORESEARCH_LEDGER_TIMEOUT": "abc"}
    proc = cli("submit", "--", "true", check=False, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "AUTORESEARCH_LEDGER_TIMEOUT='abc' is not a number of seconds" in proc.stderr
    assert cli("list", env={**os.environ, "AUTORESEARCH_LEDGER_TIMEOUT": "nan"}).returncode == 0


@pytest.mark.parametrize("uri", ["not a uri", "sqlite:relative.db", "sqlite:////no/such/dir/mlflow.db"])
def test_sync_with_a_bad_uri_is_a_usage_error(home: Path, uri: str) -> None:
    proc = cli("sync", "--uri", uri, check=False)
    assert_refused(proc, "--uri: tracking URI")


@pytest.mark.parametrize("job", ["99999999999999999999", "9223372036854775808", "²", "١"])
def test_job_ids_beyond_sqlite_or_ascii_are_not_found(home: Path, job: str) -> None:
    cli("submit", "--", "true")
    assert_refused(cli("status", job, check=False), "no job")
    assert_refused(cli("cancel", job, check=False), "no job")


def test_shell_commands_are_judged_by_sh_not_shlex(api: Any, tmp_path: Path) -> None:
    from tests.conftest import wait_state

    view = api.submit({"command": "true # don't", "shell": True, "workdir": str(tmp_path)})
    assert view.name == "true"
    assert wait_state(api, view.id, ("succeeded", "failed")).state == "succeeded"
