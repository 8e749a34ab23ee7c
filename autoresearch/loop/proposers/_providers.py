"""One structured LLM call, for the Anthropic Messages API or OpenAI Chat Completions.

Structured output: Anthropic is forced to call one tool whose ``input_schema`` is
the answer's JSON Schema; OpenAI (and OpenAI-compatible servers: vLLM, Ollama,
LiteLLM) gets ``response_format: {type: json_schema}``. Retries (tenacity) cover
429, 5xx, 529 (overloaded), dropped connections and answers that do not parse;
the SDKs' own retries are off so there is one retry policy, and ``Retry-After`` is
honoured. Tokens of every attempt are counted, malformed ones included.

The SDKs are imported inside :func:`complete` only: importing ``anthropic`` costs
~2.5 s and must not land on the CLI's or the controller's fast paths.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autoresearch.errors import AuthError, AutoresearchError, ProposerError

PROVIDERS = ("anthropic", "openai")
KEY_ENV = {"anthropic": ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"), "openai": ("OPENAI_API_KEY",)}
TOOL_NAME = "propose_trials"
MAX_RETRY_AFTER_S = 60.0


class MalformedAnswer(Exception):
    """The model answered, but not with JSON matching the schema (retried)."""


@dataclass
class Completion:
    data: dict[str, Any]
    text: str  # free text around the structured answer (its own rationale)
    model: str
    tokens_in: int
    tokens_out: int
    attempts: int
    latency_s: float


def resolve_key(provider: str, api_key: str | None, base_url: str | None,
                environ: Mapping[str, str] | None = None) -> str | None:
    """The key to use, or None when none is configured (``environ``: where to look; default ours).

    A server of our own (``base_url`` set: vLLM, Ollama) usually needs no key, so it
    gets a placeholder; the hosted APIs need a real one.
    """
    if api_key:
        return api_key
    environ = os.environ if environ is None else environ
    for name in KEY_ENV.get(provider, ()):
        if environ.get(name):
            return environ[name]
    if base_url and not _is_hosted(base_url):
        return "not-needed"
    return None


def _is_hosted(base_url: str) -> bool:
    return any(host in base_url for host in ("api.anthropic.com", "api.openai.com"))


def missing_key_error(provider: str) -> AuthError:
    names = " or ".join(KEY_ENV.get(provider, ("an API key",)))
    return AuthError(
        f"the llm proposer needs an API key for {provider}: {names} is not set",
        hint=f"export {KEY_ENV.get(provider, ('the key',))[0]}=..., point proposer.base_url at a local "
             "OpenAI-compatible server (vLLM, Ollama), or search without an LLM: proposer: {kind: tpe}",
    )


def complete(*, provider: str, model: str, system: str, user: str, schema: dict[str, Any],
             api_key: str | None = None, base_url: str | None = None, temperature: float | None = None,
             max_tokens: int = 4096, timeout_s: float = 120.0, retries: int = 4,
             backoff_s: float = 1.0) -> Completion:
    """Ask once (with retries) for an answer matching ``schema``; raise typed errors."""
    import tenacity

    if provider not in PROVIDERS:
        raise ProposerError(f"unknown llm provider {provider!r}", hint=f"use one of: {', '.join(PROVIDERS)}")
    key = resolve_key(provider, api_key, base_url)
    if key is None:
        raise missing_key_error(provider)
    call = _anthropic_call if provider == "anthropic" else _openai_call
    client = _client(provider, key, base_url, timeout_s)
    tokens = [0, 0]

    def once() -> Completion:
        started = time.monotonic()
        data, text, used_model, t_in, t_out = call(client, model, system, user, schema, temperature, max_tokens,
                                                   tokens)
        return Completion(data, text, used_model, t_in, t_out, 0, time.monotonic() - started)

    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception(_retryable),
        stop=tenacity.stop_after_attempt(retries + 1),
        wait=_wait(backoff_s),
        reraise=True,
    )
    started = time.monotonic()
    try:
        result = retrying(once)
    except MalformedAnswer as err:
        raise ProposerError(
            f"{provider} model {model} did not answer with valid structured output after {retries + 1} tries: {err}",
            hint="raise proposer.max_tokens, use a model that supports tool calls / JSON schema, or lower the "
                 "number of proposals per call",
            tokens_in=tokens[0], tokens_out=tokens[1]) from None
    except Exception as err:  # SDK errors: translate after the last retry
        raise _translate(err, provider, model, base_url, tokens) from None
    result.tokens_in, result.tokens_out = tokens
    result.attempts = retrying.statistics.get("attempt_number", 1)
    result.latency_s = time.monotonic() - started
    return result


_CLIENTS: dict[tuple[str, str, str | None, float], Any] = {}


def _client(provider: str, key: str, base_url: str | None, timeout_s: float) -> Any:
    """One SDK client per (provider, key, endpoint): they pool connections, so reuse them."""
    cache_key = (provider, key, base_url, timeout_s)
    if cache_key not in _CLIENTS:
        if provider == "anthropic":
            import anthropic

            client: Any = anthropic.Anthropic(api_key=key, base_url=base_url, max_retries=0, timeout=timeout_s)
        else:
            import openai

            client = openai.OpenAI(api_key=key, base_url=base_url, max_retries=0, timeout=timeout_s)
        _CLIENTS[cache_key] = client
    return _CLIENTS[cache_key]


def _anthropic_call(client: Any, model: str, system: str, user: str, schema: dict[str, Any],
                    temperature: float | None, max_tokens: int, tokens: list[int]) -> tuple[Any, ...]:
    kwargs: dict[str, Any] = {}
    if temperature is not None:
        # The SDK (2.x) no longer has a temperature argument; the HTTP API still takes it.
        kwargs["extra_body"] = {"temperature": temperature}
    message = client.messages.create(
        model=model, max_tokens=max_tokens, system=system,
        messages=[{"role": "user", "content": user}],
        tools=[{"name": TOOL_NAME, "description": "Submit the proposed trials.", "input_schema": schema}],
        tool_choice={"type": "tool", "name": TOOL_NAME},
        **kwargs,
    )
    usage = getattr(message, "usage", None)
    t_in, t_out = int(getattr(usage, "input_tokens", 0) or 0), int(getattr(usage, "output_tokens", 0) or 0)
    tokens[0] += t_in
    tokens[1] += t_out
    text = "\n".join(b.text for b in message.content if getattr(b, "type", "") == "text")
    for block in message.content:
        if getattr(block, "type", "") == "tool_use" and block.name == TOOL_NAME:
            return _check(block.input, schema), text, message.model, t_in, t_out
    # Some proxies drop tool calls and answer in text: accept a JSON object there.
    return _check(_parse_text(text, message.stop_reason), schema), text, message.model, t_in, t_out


def _openai_call(client: Any, model: str, system: str, user: str, schema: dict[str, Any],
                 temperature: float | None, max_tokens: int, tokens: list[int]) -> tuple[Any, ...]:
    kwargs: dict[str, Any] = {}
    if temperature is not None:
        kwargs["temperature"] = temperature
    completion = client.chat.completions.create(
        model=model, max_completion_tokens=max_tokens,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],
        response_format={"type": "json_schema",
                         "json_schema": {"name": TOOL_NAME, "schema": schema, "strict": False}},
        **kwargs,
    )
    usage = getattr(completion, "usage", None)
    t_in, t_out = int(getattr(usage, "prompt_tokens", 0) or 0), int(getattr(usage, "completion_tokens", 0) or 0)
    tokens[0] += t_in
    tokens[1] += t_out
    if not completion.choices:
        raise MalformedAnswer("the answer has no choices")
    choice = completion.choices[0]
    if getattr(choice.message, "refusal", None):
        raise MalformedAnswer(f"the model refused: {choice.message.refusal}")
    text = choice.message.content or ""
    return _check(_parse_text(text, choice.finish_reason), schema), "", completion.model, t_in, t_out


_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)


def _parse_text(text: str, stop_reason: str | None) -> Any:
    candidates = [text.strip(), *(m.strip() for m in _FENCE.findall(text))]
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        candidates.append(text[start:end + 1])
    for candidate in candidates:
        try:
            return json.loads(candidate)
        except json.JSONDecodeError:
            continue
    cut = " (the answer was cut off at max_tokens)" if stop_reason in ("max_tokens", "length") else ""
    raise MalformedAnswer(f"no JSON object in the answer{cut}: {text[:120]!r}")


def _check(data: Any, schema: dict[str, Any]) -> dict[str, Any]:
    """Top-level shape only; the proposer validates every proposal against the space."""
    if not isinstance(data, dict):
        raise MalformedAnswer(f"expected a JSON object, got {type(data).__name__}")
    missing = [k for k in schema.get("required", []) if k not in data]
    if missing:
        raise MalformedAnswer(f"the answer lacks {', '.join(missing)}")
    for key, sub in schema.get("properties", {}).items():
        if sub.get("type") == "array" and key in data and not isinstance(data[key], list):
            raise MalformedAnswer(f"{key} should be a list, got {type(data[key]).__name__}")
    return data


def _status(err: BaseException) -> int | None:
    status = getattr(err, "status_code", None)
    return int(status) if isinstance(status, int) else None


def _retryable(err: BaseException) -> bool:
    if isinstance(err, MalformedAnswer):
        return True
    status = _status(err)
    if status is not None:
        return status == 429 or status == 408 or status >= 500
    # APIConnectionError / APITimeoutError of either SDK (a dropped or refused connection).
    return type(err).__name__ in ("APIConnectionError", "APITimeoutError")


def _wait(backoff_s: float) -> Any:
    import tenacity

    exponential = tenacity.wait_exponential(multiplier=backoff_s, max=30)

    def wait(state: Any) -> float:
        delay = float(exponential(state))
        err = state.outcome.exception() if state.outcome else None
        response = getattr(err, "response", None)
        header = response.headers.get("retry-after") if response is not None else None
        if header:
            try:
                return min(max(float(header), 0.0), MAX_RETRY_AFTER_S)
            except ValueError:
                pass
        return delay

    return wait


def _translate(err: Exception, provider: str, model: str, base_url: str | None, tokens: list[int]) -> Exception:
    if isinstance(err, AutoresearchError):
        return err
    where = base_url or f"the {provider} API"
    status = _status(err)
    detail = _api_message(err)
    usage = {"tokens_in": tokens[0], "tokens_out": tokens[1]}
    if status in (401, 403):
        return AuthError(f"{provider} rejected the API key ({status}): {detail}",
                         hint=f"check {KEY_ENV[provider][0]}, or use proposer: {{kind: tpe}}", **usage)
    if status == 404:
        return ProposerError(f"{where} has no model {model!r} ({detail})",
                             hint="check proposer.model (and proposer.base_url for a local server)", **usage)
    if status == 429:
        return ProposerError(f"{provider} kept rate-limiting after all retries: {detail}",
                             hint="lower budget.parallel, wait, or raise your rate limit", **usage)
    if status is not None and status >= 500:
        return ProposerError(f"{where} failed with {status} after all retries: {detail}",
                             hint="the provider is having trouble; the loop can be resumed later", **usage)
    if status is not None:
        return ProposerError(f"{provider} refused the request ({status}): {detail}",
                             hint="check proposer.model and proposer.temperature for this provider", **usage)
    if type(err).__name__ in ("APIConnectionError", "APITimeoutError"):
        return ProposerError(f"cannot reach {where}: {err}",
                             hint="check proposer.base_url and that the server is running", **usage)
    return ProposerError(f"{provider} call failed: {type(err).__name__}: {err}",
                         hint="run with --debug for details", **usage)


def _api_message(err: Exception) -> str:
    body = getattr(err, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])[:300]
    return str(err)[:300]
