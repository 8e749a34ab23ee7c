"""Secrets by rule (autoresearch/util/redact.py): what is shown to people and agents never carries
a job's secrets — its env's secret-named values (whatever their length) and secret-looking
command-line arguments — whichever process shows them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from autoresearch.util.redact import command_secrets, is_secret, mask, redact, redact_command
from tests.conftest import wait_state
from tests.tools.conftest import connect, text

CLI = [sys.executable, "-m", "autoresearch.cli"]
# prints the short env secret, the command's secrets, and words that merely contain them
SCRIPT = ("import os, sys; print('key', os.environ['OPENAI_API_KEY']); print('args', *sys.argv[1:]); "
          "print('tab cab abc'); print('step 1 done')")
ARGS = ["--api-key", "sk-123", "--token=xyz", "--lr", "1"]
SECRETS = ("sk-123", "xyz")


def cli(*args: str) -> str:
    proc = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _submit_secret_job(api: Any, tmp_path: Path) -> int:
    out = cli("submit", "--json", "--env", "OPENAI_API_KEY=ab", "--workdir", str(tmp_path), "--",
              sys.executable, "-c", SCRIPT, *ARGS)
    job = int(json.loads(out)["id"])
    wait_state(api, job, "succeeded")
    return job


def _clean(blob: str) -> None:
    for value in SECRETS:
        assert value not in blob, f"{value!r} leaked: {blob}"
    assert "'ab'" not in blob and " ab\n" not in blob and not blob.rstrip().endswith(" ab")


def test_rules_name_secrets_by_word_not_by_substring() -> None:
    assert all(is_secret(n) for n in ("OPENAI_API_KEY", "hfToken", "--api-key", "APIKEY", "DB_PASSWORD", "token"))
    assert not any(is_secret(n) for n in ("TOKENIZERS_PARALLELISM", "max_tokens", "KEYBOARD", "api_key_env", "PWD"))
    assert command_secrets(["train.py", "--api-key", "sk-1", "--token=x", "--tokenizer", "gpt2"]) == ["sk-1", "x"]
    assert command_secrets("FOO_TOKEN=q python t.py --password 'p w'") == ["p w", "q"]
    assert redact_command(["t.py", "--api-key", "k", "--token=x", "--lr", "1"]) == \
        "t.py --api-key [REDACTED] --token=[REDACTED] --lr 1"
    assert redact_command("export HF_TOKEN=a; python t.py --secret b --max-tokens 5") == \
        "export HF_TOKEN=[REDACTED]; python t.py --secret [REDACTED] --max-tokens 5"
    # short values only as whole words, long ones anywhere; masks keep the byte length
    assert redact("ab tab x=ab", ["ab"]) == "[REDACTED] tab x=[REDACTED]"
    assert redact("id=xsk-longsecret9", ["sk-longsecret9"]) == "id=x[REDACTED]"
    assert mask(b"ab tab 'ab'", ["ab"]) == b"** tab '**'"


def test_status_and_list_json_and_logs_hide_the_jobs_secrets(api: Any, tmp_path: Path) -> None:
    job = _submit_secret_job(api, tmp_path)
    detail = json.loads(cli("status", str(job), "--json"))
    assert detail["command"].endswith("--api-key [REDACTED] --token=[REDACTED] --lr 1")
    listed = cli("list", "--json")
    table = cli("status", str(job))
    for blob in (json.dumps(detail), listed, table):
        _clean(blob)
    log = api.logs(job).text
    assert "key **\n" in log and "args --api-key ****** --token=*** --lr 1" in log
    assert "tab cab abc" in log and "step 1 done" in log  # no collateral damage from the short secret
    _clean(log)


def test_a_log_page_cut_inside_a_secret_still_hides_it(api: Any, tmp_path: Path) -> None:
    secret = "sk-" + "7" * 40
    view = api.submit({"command": [sys.executable, "-c", f"print('x' * 10 + '{secret}' + 'y' * 10)"],
                       "workdir": str(tmp_path), "env": {"MY_TOKEN": secret}})
    wait_state(api, view.id, "succeeded")
    pages, offset = [], 0
    while True:
        page = api.logs(view.id, offset=offset, max_bytes=7)
        pages.append(page.text)
        if page.next_offset >= page.size:
            break
        offset = page.next_offset
    whole = "".join(pages)
    assert whole == "x" * 10 + "*" * len(secret) + "y" * 10 + "\n"  # offsets stay byte-exact
    assert all("7" not in p for p in pages)
    grep = api.logs(view.id, grep="sk-")
    assert grep.text == ""  # a grep is no oracle for the secret either


@pytest.mark.anyio
async def test_mcp_status_list_logs_and_resource_hide_the_jobs_secrets(api: Any, tmp_path: Path) -> None:
    from autoresearch.tools.server import build_server

    server = build_server(api, root=tmp_path)
    async with connect(server) as client:
        sub = await client.call_tool("submit", {"command": [sys.executable, "-c", SCRIPT, *ARGS],
                                                "env": {"OPENAI_API_KEY": "ab"}})
        job = sub.structured_content["id"]
        wait_state(api, job, "succeeded")
        results = [await client.call_tool("status", {"job_id": job}), await client.call_tool("status", {}),
                   await client.call_tool("list_jobs", {}), await client.call_tool("logs", {"job_id": job}),
                   await client.call_tool("logs", {"job_id": job, "offset": 0})]
        resource = await client.read_resource(f"autoresearch://jobs/{job}/logs")
    for result in results:
        assert not result.is_error, text(result)
        _clean(text(result) + json.dumps(result.structured_content))
    assert "--api-key [REDACTED]" in json.dumps(results[0].structured_content)
    body = "".join(getattr(c, "text", "") for c in resource.contents)
    assert "args --api-key ******" in body
    _clean(body)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_a_warning_quoting_the_trials_output_hides_its_secrets(api: Any, tmp_path: Path) -> None:
    secret = "sk-live-0123456789"
    script = f"import os; open(os.environ['AUTORESEARCH_METRICS_FILE'], 'a').write('{secret} is not json\\n')"
    job = api.submit({"command": [sys.executable, "-c", script], "workdir": str(tmp_path),
                      "env": {"SERVICE_TOKEN": secret}}).id
    view = wait_state(api, job, "succeeded")
    assert view.warnings and "not a JSON line" in view.warnings[0]
    assert secret not in json.dumps(view.warnings)


def test_the_environment_is_scanned_again_only_when_it_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every job view adds the server's own secret-named variables; the environment is decoded
    and scanned once per change, not once per view, and a change is always seen."""
    from autoresearch.util import redact

    scans: list[int] = []
    real = redact.secret_values
    monkeypatch.setattr(redact, "secret_values", lambda *a, **k: scans.append(1) or real(*a, **k))
    monkeypatch.setenv("AMBIENT_TEST_TOKEN", "first-secret-value")
    first = redact.ambient_secrets()
    assert "first-secret-value" in first and len(scans) == 1
    first.clear()  # a caller's copy: the next answer is whole
    assert "first-secret-value" in redact.ambient_secrets() and len(scans) == 1  # unchanged: no scan
    monkeypatch.setenv("AMBIENT_TEST_TOKEN", "second-secret-value")  # same names, a new value
    again = redact.ambient_secrets()
    assert "second-secret-value" in again and "first-secret-value" not in again and len(scans) == 2
    monkeypatch.delenv("AMBIENT_TEST_TOKEN")
    assert "second-secret-value" not in redact.ambient_secrets() and len(scans) == 3
