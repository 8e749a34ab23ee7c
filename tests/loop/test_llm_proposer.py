"""The LLM proposer against loopback fakes of the Anthropic and OpenAI HTTP APIs.

The real SDK clients talk HTTP to tests/fakes/llm_server.py through ``base_url``;
nothing is patched.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from autoresearch.errors import AuthError, PlanError
from autoresearch.loop.plan import Plan, parse_plan
from autoresearch.loop.proposers._base import ProposerContext, TrialRecord
from autoresearch.loop.proposers._providers import ProposerError
from autoresearch.loop.proposers.llm import LLMProposer, prompts_dir
from tests.fakes.llm_server import (
    FakeLLMServer,
    anthropic_malformed,
    anthropic_overloaded,
    anthropic_rate_limited,
    anthropic_tool_answer,
    anthropic_unauthorized,
    openai_json_answer,
    openai_malformed,
    openai_rate_limited,
    openai_server_error,
)

SPACE = {"lr": {"low": 1e-4, "high": 0.3, "log": True}, "hidden": {"choices": [32, 64, 128, 256]}}
OBJECTIVE = {"metric": "val_loss", "goal": "minimize"}
HISTORY = [
    TrialRecord(1, {"lr": 0.1, "hidden": 64}, "succeeded", objective=0.42, rationale="a first guess"),
    TrialRecord(2, {"lr": 0.01, "hidden": 128}, "succeeded", objective=0.31),
    TrialRecord(3, {"lr": 0.3, "hidden": 256}, "failed",
                failure="exit code 1\nTraceback (most recent call last):\nRuntimeError: loss is nan at epoch 2"),
]


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeLLMServer]:
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "OPENAI_API_KEY", "ANTHROPIC_BASE_URL",
                 "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    with FakeLLMServer() as fake:
        yield fake


def plan(provider: str, model: str, base_url: str, options: dict[str, object] | None = None,
         **proposer: object) -> Plan:
    return parse_plan({
        "name": "llm-test", "objective": OBJECTIVE, "space": SPACE,
        "trial": {"command": "python train.py --lr {lr} --hidden {hidden}"},
        "proposer": {"kind": "llm", "provider": provider, "model": model, "base_url": base_url,
                     "options": {"backoff_s": 0.01, **(options or {})}, **proposer},
    })


def claude(server: FakeLLMServer, **options: object) -> LLMProposer:
    return LLMProposer(ProposerContext(plan("anthropic", "claude-sonnet-4-6", server.url, options, temperature=0.7)),
                       api_key="sk-ant-test")


def gpt(server: FakeLLMServer, model: str = "gpt-4.1", **options: object) -> LLMProposer:
    return LLMProposer(ProposerContext(plan("openai", model, server.openai_url, options)), api_key="sk-test")


def answer(*proposals: dict[str, object]) -> dict[str, object]:
    return {"rationale": "lower lr helped; try around 0.01", "proposals": list(proposals)}


def test_anthropic_proposals_are_validated_and_carry_provenance(server: FakeLLMServer) -> None:
    server.script(anthropic_tool_answer(answer(
        {"params": {"lr": 0.005, "hidden": 128}, "rationale": "refine near the best"},
        {"params": {"lr": 2.0, "hidden": "64"}, "rationale": "too high on purpose"},
        {"params": {"lr": 0.02, "hidden": 100}, "rationale": "not a valid choice"},
    ), input_tokens=1000, output_tokens=200))

    result = claude(server).propose(HISTORY, 3)

    assert [p.params for p in result.proposals] == [{"lr": 0.005, "hidden": 128}, {"lr": 0.3, "hidden": 64}]
    assert result.proposals[0].rationale == "refine near the best"
    assert "clipped lr from 2.0 to 0.3" in result.rationale
    assert "hidden=100 is not one of [32, 64, 128, 256]" in result.rationale
    template = (prompts_dir() / "propose_params.md").read_bytes()
    assert result.info.prompt_sha256 == hashlib.sha256(template).hexdigest()
    assert (result.info.kind, result.info.provider, result.info.model, result.info.prompt_name) == (
        "llm", "anthropic", "claude-sonnet-4-6", "propose_params")
    assert (result.tokens_in, result.tokens_out) == (1000, 200)
    assert result.cost_usd == pytest.approx((1000 * 3.0 + 200 * 15.0) / 1e6)  # sonnet list price
    assert result.latency_s > 0

    sent = server.requests[0]
    assert sent.path == "/v1/messages"
    assert "sk-ant-test" in (sent.headers.get("x-api-key") or sent.headers.get("authorization") or "")
    assert sent.body["tool_choice"] == {"type": "tool", "name": "propose_trials"}
    assert sent.body["temperature"] == 0.7
    user = sent.body["messages"][0]["content"]
    assert "#2 succeeded: val_loss=0.31" in user  # the history
    assert "RuntimeError: loss is nan at epoch 2" in user  # a user error's log tail is fed back


def test_anthropic_429_and_overload_are_retried(server: FakeLLMServer) -> None:
    server.script(anthropic_rate_limited(), anthropic_overloaded(),
                  anthropic_tool_answer(answer({"params": {"lr": 0.003, "hidden": 32}, "rationale": "r"})))

    result = claude(server).propose(HISTORY, 1)

    assert [p.params for p in result.proposals] == [{"lr": 0.003, "hidden": 32}]
    assert len(server.requests) == 3


def test_openai_malformed_answer_is_retried_and_its_tokens_counted(server: FakeLLMServer) -> None:
    server.script(openai_malformed(), openai_rate_limited(),
                  openai_json_answer(answer({"params": {"lr": 0.01, "hidden": 64}, "rationale": "mid"}),
                                     prompt_tokens=1000, completion_tokens=100))

    result = gpt(server).propose(HISTORY, 2)

    assert [p.params for p in result.proposals] == [{"lr": 0.01, "hidden": 64}]
    assert len(server.requests) == 3
    assert (result.tokens_in, result.tokens_out) == (1380 + 1000, 40 + 100)  # the malformed answer's too
    assert result.cost_usd == pytest.approx((2380 * 2.0 + 140 * 8.0) / 1e6)
    sent = server.requests[-1]
    assert sent.path == "/v1/chat/completions" and sent.headers["authorization"] == "Bearer sk-test"
    schema = sent.body["response_format"]["json_schema"]["schema"]
    assert schema["properties"]["proposals"]["items"]["properties"]["params"]["properties"]["hidden"] == {
        "enum": [32, 64, 128, 256]}


def test_persistent_server_errors_end_in_one_clear_error(server: FakeLLMServer) -> None:
    server.script(openai_server_error())

    with pytest.raises(ProposerError) as err:
        gpt(server, retries=2).propose(HISTORY, 1)

    assert "failed with 500 after all retries" in err.value.message
    assert err.value.hint
    assert len(server.requests) == 3


def test_malformed_every_time_is_a_proposer_error(server: FakeLLMServer) -> None:
    server.script(anthropic_malformed())

    with pytest.raises(ProposerError) as err:
        claude(server, retries=1).propose(HISTORY, 1)

    assert "did not answer with valid structured output" in err.value.message
    assert "cut off at max_tokens" in err.value.message
    assert err.value.details["tokens_in"] == 2 * 1490


def test_missing_api_key_fails_at_plan_load_and_suggests_tpe(server: FakeLLMServer) -> None:
    hosted = plan("anthropic", "claude-sonnet-4-6", "")
    with pytest.raises(AuthError) as err:
        LLMProposer.check(hosted)
    assert "ANTHROPIC_API_KEY" in err.value.message
    assert "proposer: {kind: tpe}" in err.value.hint

    with pytest.raises(AuthError) as err:
        LLMProposer(ProposerContext(plan("openai", "gpt-4.1", "", api_key_env="MY_LAB_KEY")))
    assert "$MY_LAB_KEY" in err.value.message and "kind: tpe" in err.value.hint
    assert server.requests == []  # nothing was sent


def test_rejected_key_is_an_auth_error(server: FakeLLMServer) -> None:
    server.script(anthropic_unauthorized())

    with pytest.raises(AuthError) as err:
        claude(server).propose([], 1)

    assert "invalid x-api-key" in err.value.message
    assert len(server.requests) == 1  # 401 is not retried


def test_openai_compatible_server_needs_no_key_and_unknown_models_cost_nothing(server: FakeLLMServer) -> None:
    server.script(openai_json_answer(answer({"params": {"lr": 0.001, "hidden": 256}, "rationale": "wide"}),
                                     model="qwen2.5:7b"))
    proposer = LLMProposer(ProposerContext(plan("openai", "qwen2.5:7b", server.openai_url, temperature=0.2)))

    result = proposer.propose([], 1)

    assert result.proposals[0].params == {"lr": 0.001, "hidden": 256}
    assert result.cost_usd == 0.0
    assert "no price known for model 'qwen2.5:7b'" in result.rationale
    assert server.requests[0].headers["authorization"] == "Bearer not-needed"


def test_invalid_answer_gets_one_repair_round_with_the_reasons(server: FakeLLMServer) -> None:
    server.script(
        anthropic_tool_answer(answer({"params": {"lr": 0.1, "hidden": 64}, "rationale": "same as #1"},
                                     {"params": {"hidden": 64}, "rationale": "forgot lr"})),
        anthropic_tool_answer(answer({"params": {"lr": 0.05, "hidden": 64}, "rationale": "fixed"})),
    )

    result = claude(server).propose(HISTORY, 2)

    assert [p.params for p in result.proposals] == [{"lr": 0.05, "hidden": 64}]
    repair = server.requests[1].body["messages"][0]["content"]
    assert "already tried" in repair and "missing parameter 'lr'" in repair
    assert result.tokens_in == 2 * 1523


def test_nothing_valid_twice_is_an_error_not_an_exhausted_search(server: FakeLLMServer) -> None:
    server.script(anthropic_tool_answer(answer({"params": {"lr": "fast", "hidden": 64}, "rationale": "?"})))

    with pytest.raises(ProposerError) as err:
        claude(server).propose(HISTORY, 1)

    assert "lr='fast' is not a number" in err.value.message


def test_bad_proposer_config_is_a_plan_error() -> None:
    with pytest.raises(PlanError) as err:
        LLMProposer.check(plan("gemini", "gemini-pro", ""))
    assert "anthropic" in err.value.hint
    with pytest.raises(PlanError) as err:
        LLMProposer.check({"proposer": {"kind": "llm", "provider": "openai", "base_url": "http://127.0.0.1:1/v1"}})
    assert "model" in err.value.message


def test_prompts_are_found_in_the_checkout_or_where_configured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AUTORESEARCH_PROMPTS", raising=False)
    assert (prompts_dir() / "propose_params.md").is_file()
    monkeypatch.setenv("AUTORESEARCH_PROMPTS", str(tmp_path))
    assert prompts_dir() == tmp_path
