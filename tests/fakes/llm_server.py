"""Loopback fakes of the Anthropic Messages API and the OpenAI Chat Completions API.

The real ``anthropic`` and ``openai`` clients are pointed at these servers through
``base_url``: every byte goes over HTTP on 127.0.0.1, nothing in the SDKs is patched.
Each server answers from a script of recorded responses (``recorded/*.json``), one
per request, in order; when the script runs out it repeats the last answer given. Every
request is kept (path, headers, JSON body) so tests can check what was sent.

    with FakeLLMServer() as server:
        server.script(anthropic_rate_limited(), anthropic_tool_answer({"proposals": [...]}))
        client = anthropic.Anthropic(api_key="test", base_url=server.url)
"""

from __future__ import annotations

import copy
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

RECORDED = Path(__file__).parent / "recorded"


@dataclass
class Answer:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Request:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


def recorded(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((RECORDED / f"{name}.json").read_text())
    return data


def _json(status: int, data: Any, **headers: str) -> Answer:
    return Answer(status, json.dumps(data).encode(), {"content-type": "application/json", **headers})


# -- Anthropic Messages API -------------------------------------------------------------


def anthropic_tool_answer(tool_input: dict[str, Any], input_tokens: int = 1523, output_tokens: int = 211,
                          model: str | None = None) -> Answer:
    """A recorded ``tool_use`` message whose tool input is ``tool_input``."""
    data = copy.deepcopy(recorded("anthropic_tool_use"))
    data["content"][1]["input"] = tool_input
    data["usage"].update(input_tokens=input_tokens, output_tokens=output_tokens)
    if model:
        data["model"] = model
    return _json(200, data, **{"request-id": "req_fake_ok"})


def anthropic_malformed() -> Answer:
    """A 200 with no tool call, only truncated prose (stop_reason max_tokens)."""
    return _json(200, recorded("anthropic_malformed"))


def anthropic_rate_limited(retry_after: str = "0") -> Answer:
    return _json(429, recorded("anthropic_429"), **{"retry-after": retry_after, "x-should-retry": "true"})


def anthropic_overloaded() -> Answer:
    return _json(529, recorded("anthropic_529"))


def anthropic_unauthorized() -> Answer:
    return _json(401, recorded("anthropic_401"))


# -- OpenAI Chat Completions API --------------------------------------------------------


def openai_json_answer(content: dict[str, Any] | str, prompt_tokens: int = 1392, completion_tokens: int = 187,
                       model: str | None = None) -> Answer:
    """A recorded completion whose message content is ``content`` (JSON-encoded if not a string)."""
    data = copy.deepcopy(recorded("openai_json_schema"))
    data["choices"][0]["message"]["content"] = content if isinstance(content, str) else json.dumps(content)
    data["usage"].update(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                         total_tokens=prompt_tokens + completion_tokens)
    if model:
        data["model"] = model
    return _json(200, data)


def openai_malformed() -> Answer:
    """A 200 whose content is truncated JSON inside a code fence (finish_reason length)."""
    return _json(200, recorded("openai_malformed"))


def openai_rate_limited(retry_after: str = "0") -> Answer:
    return _json(429, recorded("openai_429"), **{"retry-after": retry_after})


def openai_server_error() -> Answer:
    return _json(500, recorded("openai_500"))


def openai_unauthorized() -> Answer:
    return _json(401, recorded("openai_401"))


# -- the server -------------------------------------------------------------------------


class FakeLLMServer:
    """A threaded HTTP server on 127.0.0.1 answering scripted responses for both APIs."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self._script: list[Answer] = []
        self._last: Answer | None = None
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out at once, as from a real server

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw or b"{}")
                except json.JSONDecodeError:
                    body = {"_raw": raw.decode("utf-8", "replace")}
                answer = outer._answer(Request(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(answer.status)
                for key, value in answer.headers.items():
                    self.send_header(key, value)
                self.send_header("content-length", str(len(answer.body)))
                self.end_headers()
                self.wfile.write(answer.body)

            def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
                return

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        """Base URL for the Anthropic client (it appends /v1/messages)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def openai_url(self) -> str:
        """Base URL for the OpenAI client (it appends /chat/completions), like vLLM's and Ollama's /v1."""
        return f"http://127.0.0.1:{self.port}/v1"

    def script(self, *answers: Answer) -> FakeLLMServer:
        with self._lock:
            self._script.extend(answers)
        return self

    def _answer(self, request: Request) -> Answer:
        with self._lock:
            self.requests.append(request)
            if not request.path.endswith(("/messages", "/chat/completions")):
                return _json(404, {"error": {"message": f"no route {request.path}"}})
            if self._script:
                self._last = self._script.pop(0)
            if self._last is None:
                return _json(500, {"error": {"message": "fake server: no scripted answer"}})
            return self._last

    def start(self) -> FakeLLMServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> FakeLLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
