"""A tenant's plan cannot steer the server's secrets (docs/security.md, "Secrets, paths and files of a
tenant"): over a real tokened HTTP server, with a fake LLM endpoint on loopback that records every
request's Authorization header."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from autoresearch.engine import grants
from autoresearch.errors import AuthError, SpecError
from tests.fakes.llm_server import FakeLLMServer, openai_json_answer
from tests.tools.conftest import NEEDS_BWRAP, connect, http_server, text

TOKEN_A = "token-for-team-a-0123456789"
SERVER_SECRET = "server-secret-value-0123456789"
SERVER_OPENAI = "sk-server-openai-key-0123456789"
GRANTED = "sk-granted-to-team-a-0123456789"


def plan_text(proposer: str, name: str = "secrets") -> str:
    return f"""\
name: {name}
objective: {{metric: loss}}
trial:
  command: {sys.executable} -c "print('loss:', {{x}})"
space:
  x: {{low: 0.0, high: 1.0}}
proposer: {proposer}
budget: {{trials: 1, parallel: 1}}
"""


async def call(client: Any, tool: str, **args: Any) -> Any:
    result = await client.call_tool(tool, args)
    return ("error", text(result)) if result.is_error else result.structured_content


async def refused(client: Any, plan: str) -> str:
    result = await call(client, "start_loop", plan=plan)
    assert isinstance(result, tuple), f"start_loop({plan}) was not refused: {result}"
    return str(result[1])


def authorizations(fake: FakeLLMServer) -> list[str]:
    return [r.headers.get("authorization", "") for r in fake.requests]


@pytest.fixture
def setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("AUTORESEARCH_TRACKING", "off")
    monkeypatch.setenv("SERVER_SECRET", SERVER_SECRET)
    monkeypatch.setenv("OPENAI_API_KEY", SERVER_OPENAI)
    monkeypatch.setenv("LLM_KEY_TEAM_A", GRANTED)
    root = tmp_path / "root"
    root.mkdir()
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{TOKEN_A} team-a\n")
    with FakeLLMServer() as fake:
        fake.script(openai_json_answer({"rationale": "r", "proposals": [{"params": {"x": 0.5}, "rationale": "x"}]}))
        yield root, tokens, tmp_path / "home", fake


@pytest.mark.anyio
@NEEDS_BWRAP
async def test_a_tenant_plan_cannot_send_a_server_variable_or_key_to_its_own_url(setting: Any) -> None:
    root, tokens, home, fake = setting
    url = f"{fake.url}/v1"
    (root / "named.yaml").write_text(plan_text(
        f"{{kind: llm, provider: openai, model: m, base_url: '{url}', api_key_env: SERVER_SECRET}}", "named"))
    (root / "default.yaml").write_text(plan_text(f"{{kind: llm, provider: openai, model: m, base_url: '{url}'}}",
                                                 "default"))
    (root / "userinfo.yaml").write_text(plan_text(
        "{kind: llm, provider: openai, model: m, base_url: 'http://127.0.0.1@evil.example/v1'}", "userinfo"))
    (root / "prompt.yaml").write_text(plan_text(
        "{kind: llm, provider: openai, model: m, prompt: ../../tokens}", "prompt"))
    with http_server(home, tokens=tokens, root=root) as mcp_url:
        async with connect(mcp_url, TOKEN_A) as a:
            message = await refused(a, "named.yaml")
            assert "[auth]" in message and "$SERVER_SECRET" in message, message
            assert "tenants.grants.team-a" in message  # the hint says what the operator can do
            message = await refused(a, "default.yaml")  # no allow-list: no base_url at all
            assert "is not an endpoint this server lets tenants call" in message, message
            message = await refused(a, "userinfo.yaml")
            assert "user name or password" in message, message
            message = await refused(a, "prompt.yaml")
            assert "proposer.prompt" in message, message
    assert fake.requests == []  # nothing reached the endpoint: no key, no prompt


@pytest.mark.slow  # two loops started over HTTP, each until its first LLM call: ~6 s here
@pytest.mark.anyio
@NEEDS_BWRAP
async def test_a_tenant_loop_runs_with_a_clean_environment_and_only_its_grant(setting: Any) -> None:
    root, tokens, home, fake = setting
    home.mkdir()
    url = f"{fake.url}/v1"
    (home / "config.yaml").write_text(
        f"tenants:\n  llm_base_urls: ['HTTP://127.0.0.1:{fake.port}/v1/']\n"
        "  grants: {team-a: [LLM_KEY_TEAM_A]}\n")
    (root / "granted.yaml").write_text(plan_text(
        f"{{kind: llm, provider: openai, model: m, base_url: '{url}', api_key_env: LLM_KEY_TEAM_A}}", "granted"))
    (root / "bare.yaml").write_text(plan_text(f"{{kind: llm, provider: openai, model: m, base_url: '{url}/'}}",
                                              "bare"))
    with http_server(home, tokens=tokens, root=root) as mcp_url:
        async with connect(mcp_url, TOKEN_A) as a:
            started = await call(a, "start_loop", plan="granted.yaml")
            assert isinstance(started, dict), started
            environ = Path(f"/proc/{started['pid']}/environ").read_bytes().split(b"\0")
            names = {item.split(b"=", 1)[0].decode() for item in environ if item}
            assert "LLM_KEY_TEAM_A" in names  # the grant
            assert not names & {"SERVER_SECRET", "OPENAI_API_KEY", "AUTORESEARCH_TOKENS"}, names
            deadline = time.monotonic() + 60
            while not fake.requests:
                assert time.monotonic() < deadline, "the loop never asked its LLM"
                time.sleep(0.05)
            assert authorizations(fake)[0] == f"Bearer {GRANTED}"
            await call(a, "stop_loop", loop="granted", rationale="done")

            started = await call(a, "start_loop", plan="bare.yaml")  # the server's OPENAI_API_KEY is not lent
            assert isinstance(started, dict), started
            deadline = time.monotonic() + 60
            while len(fake.requests) < 2:
                assert time.monotonic() < deadline, "the second loop never asked its LLM"
                time.sleep(0.05)
            await call(a, "stop_loop", loop="bare", rationale="done")
    sent = " ".join(authorizations(fake))
    assert SERVER_OPENAI not in sent and SERVER_SECRET not in sent, sent


ALLOWED = ("http://127.0.0.1:8000/v1", "https://llm.internal.example/api", "http://[::1]:9000/v1")


@pytest.mark.parametrize("url", [
    "http://127.0.0.1:8000/v1", "HTTP://127.0.0.1:8000/v1/", "http://127.0.0.1:8000/v1/chat",
    "https://LLM.internal.example./api", "https://llm.internal.example:443/api/v2", "http://[0:0::1]:9000/v1",
    "http://127.0.0.1.:8000/v1", "http://127.0.0.1:08000/v1",
])
def test_allowed_endpoints_match_by_value(url: str) -> None:
    assert grants.allowed_url(url, ALLOWED)


@pytest.mark.parametrize("url", [
    "http://127.0.0.1:8000/v10", "http://127.0.0.1:8001/v1", "https://127.0.0.1:8000/v1", "http://127.0.0.1/v1",
    "http://127.0.0.1:8000/", "http://localhost:8000/v1", "http://[::2]:9000/v1",
    "https://llm.internal.example.evil.com/api", "https://evil.com/llm.internal.example/api",
    "http://0x7f.1:8000/v1", "http://2130706433:8000/v1", "http://[::ffff:127.0.0.1]:8000/v1", "http://127.1:8000/v1",
])
def test_other_endpoints_are_refused(url: str) -> None:
    assert not grants.allowed_url(url, ALLOWED)


@pytest.mark.parametrize("url", [
    "http://127.0.0.1:8000@evil.example/v1", "http://user:pw@127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1/../x",
    "http://127.0.0.1:8000/v1/./chat", "http://127.0.0.1:8000/v1/%2e%2e/x", "http://127.0.0.1:8000\\@evil/v1",
    "http://127.0.0.1:8000/v1?u=http://evil", "http://127.0.0.1:8000/v1#x", "ftp://127.0.0.1:8000/v1",
    "file:///etc/passwd", "//127.0.0.1:8000/v1", "http:///v1", "http://127.0.0.1:8000/v1\n", "http://ev il/v1",
    "http://127.0.0.1:99999/v1", "", "x" * 3000, "http://[::1/v1", "http://evil_host/v1",
    "http://\u217docalhost:8000/v1", "http://127.0.0.1:8000/v1\u0000", "http:\\\\127.0.0.1\\v1",
])
def test_tricky_urls_are_not_urls(url: str) -> None:
    with pytest.raises(ValueError):
        grants.endpoint(url)


def test_check_plan_refuses_unless_granted_and_allowed() -> None:
    tenancy = grants.parse({"llm_base_urls": list(ALLOWED), "grants": {"team-a": ["LLM_KEY"]}})
    grants.check_plan({"proposer": {"api_key_env": "LLM_KEY", "base_url": ALLOWED[0]}}, "team-a", tenancy)
    grants.check_plan({"proposer": {"kind": "tpe"}}, "team-b", tenancy)
    for proposer in ({"api_key_env": "LLM_KEY"}, {"api_key_env": "PATH"}, {"base_url": "http://evil/v1"},
                     {"base_url": 7}, {"prompt": "/etc/passwd"}, {"prompt": "~/x"}, {"prompt": "a/../../b"}):
        with pytest.raises(AuthError):
            grants.check_plan({"proposer": proposer}, "team-b", tenancy)


def test_controller_env_keeps_runtime_settings_and_grants_only() -> None:
    tenancy = grants.parse({"grants": {"team-a": ["LLM_KEY"]}})
    server = {"PATH": "/bin", "PYTHONPATH": "/src", "LC_ALL": "C", "AUTORESEARCH_HOME": "/h",
              "AUTORESEARCH_TOKENS": "/t", "LLM_KEY": "k", "OPENAI_API_KEY": "o", "HF_TOKEN": "h",
              "LD_PRELOAD": "/x.so", "AWS_SECRET_ACCESS_KEY": "a"}
    assert grants.controller_env(server, "team-a", tenancy) == {
        "PATH": "/bin", "PYTHONPATH": "/src", "LC_ALL": "C", "AUTORESEARCH_HOME": "/h", "LLM_KEY": "k"}
    assert "LLM_KEY" not in grants.controller_env(server, "team-b", tenancy)


@pytest.mark.parametrize("section", [
    [], {"grants": {"a": "LLM_KEY"}}, {"grants": {"a": ["BAD NAME"]}}, {"grants": {"a": ["AUTORESEARCH_TOKENS"]}},
    {"llm_base_urls": ["http://u@h/v1"]}, {"llm_base_urls": "http://h/v1"}, {"urls": []}, {"grants": {"": []}}, {"grants": {"a": ["KEY\n"]}},
])
def test_a_bad_tenants_section_is_refused_naming_the_key(section: Any, tmp_path: Path) -> None:
    import yaml

    from autoresearch.backends import profiles

    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"tenants": section}))
    with pytest.raises(SpecError, match="tenants"):
        profiles.load(tmp_path)
    assert os.path.exists(tmp_path / "config.yaml")
