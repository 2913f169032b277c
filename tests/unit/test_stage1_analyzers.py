"""Stage-1 analyzers: the OpenAI client against a local fake OpenAI-compatible server
(retries, Retry-After, 4xx, key handling, concurrency bound, rate limit, usage and cost),
LangChain and policy analyzers, configs. The suites' offline analyzers are tested in
test_textworld_analyzer.py and test_alfworld.py; the retry policy itself in test_http_policy.py."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from pydantic import ValidationError

from seed_agents.capture import capture
from seed_agents.chat_model import SeedChatModel
from seed_agents.graphs.env_agent import render_turn
from seed_agents.skills import build_analyzer_messages, parse_skill
from seed_agents.stage1.analyzers import (
    AnalyzerConfig,
    LangChainAnalyzer,
    OpenAIChatAnalyzer,
    PolicyAnalyzer,
    make_analyzer,
)
from seed_agents.testing import SKILL_JSON, FakeBackend
from seed_agents.tools.textworld import TextWorldSuite
from seed_agents.tools.textworld_analyzer import TextWorldAnalyzer

OBJECTIVE = ("Welcome to TextWorld! Here is your task for today. First of all, attempt to venture south. "
             "Then, take the whisk from the chest in the cookery. Alright, thanks!")
PLAYROOM = ["examine pillow", "take pillow", "go south", "inventory", "look"]
COOKERY = ["go north", "take whisk from chest", "close chest", "look", "inventory"]
START = render_turn(f"{OBJECTIVE}\n\n-= Playroom =-\nYou arrive in a playroom.\n\nThere is a pillow on the floor.", PLAYROOM)


# -- a fake OpenAI-compatible server ---------------------------------------------------------------


class FakeOpenAI:
    """``/v1/chat/completions`` that answers ``script[i]`` (status, headers, body) to request
    ``i`` when given, else 200 with ``reply`` and fixed usage; records every request."""

    def __init__(self, script: list[tuple[int, dict[str, str], Any] | None] | None = None, *, delay_s: float = 0.0,
                 delays: list[float] | None = None, reply: str = SKILL_JSON, usage: tuple[int, int] = (1000, 500)) -> None:
        self.script, self.delay_s, self.delays, self.reply, self.usage = list(script or []), delay_s, delays or [], reply, usage
        self.requests: list[dict[str, Any]] = []
        self.in_flight = self.max_in_flight = 0
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with fake.lock:
                    i = len(fake.requests)
                    fake.requests.append({"t": time.monotonic(), "path": self.path, "body": body,
                                          "auth": self.headers.get("Authorization")})
                    fake.in_flight += 1
                    fake.max_in_flight = max(fake.max_in_flight, fake.in_flight)
                try:
                    time.sleep(fake.delays[i] if i < len(fake.delays) else fake.delay_s)
                    planned = fake.script[i] if i < len(fake.script) else None
                    status, headers, payload = planned or (200, {}, {
                        "id": f"c{i}", "object": "chat.completion", "model": body["model"],
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": fake.reply}, "finish_reason": "stop"}],
                        "usage": {"prompt_tokens": fake.usage[0], "completion_tokens": fake.usage[1]}})
                    data = json.dumps(payload).encode()
                    self.send_response(status)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                finally:
                    with fake.lock:
                        fake.in_flight -= 1

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake_openai() -> Iterator[Callable[..., FakeOpenAI]]:
    servers: list[FakeOpenAI] = []

    def make(*args: Any, **kw: Any) -> FakeOpenAI:
        servers.append(FakeOpenAI(*args, **kw))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


MESSAGES = build_analyzer_messages(START, False, [(START, "look")])


def analyze_many(analyzer: Any, n: int) -> list[Any]:
    async def go() -> list[Any]:
        try:
            return list(await asyncio.gather(*(analyzer.analyze(MESSAGES) for _ in range(n))))
        finally:
            await analyzer.aclose()
    return asyncio.run(go())


def client(url: str, **kw: Any) -> OpenAIChatAnalyzer:
    return OpenAIChatAnalyzer(url, "big-model", **{"backoff_s": 0.01, "max_retries": 3, **kw})


def test_openai_request_reply_usage_and_cost(fake_openai, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    server = fake_openai()
    analyzer = client(server.url + "/v1/", price_per_mtok_prompt=1.0, price_per_mtok_completion=2.0, max_tokens=77)
    replies = analyze_many(analyzer, 2)
    assert [r.text for r in replies] == [SKILL_JSON] * 2 and all(r.error is None for r in replies)
    assert sum(r.prompt_tokens for r in replies) == 2000 and sum(r.completion_tokens for r in replies) == 1000
    assert sum(r.cost_usd for r in replies) == pytest.approx(2 * (1000 * 1.0 + 500 * 2.0) / 1e6)
    req = server.requests[0]
    assert req["path"] == "/v1/chat/completions" and req["auth"] is None  # no key variable: no header
    assert req["body"]["model"] == "big-model" and req["body"]["max_tokens"] == 77 and req["body"]["temperature"] == 0.0
    assert [m["role"] for m in req["body"]["messages"]] == ["system", "user"]
    assert req["body"]["messages"][1]["content"] == MESSAGES[1].content
    assert analyzer.name == "openai:big-model"


def test_openai_retries_5xx_and_429_honouring_retry_after(fake_openai):
    server = fake_openai([(500, {}, {"error": {"message": "overloaded"}}),
                          (429, {"Retry-After": "0.3"}, {"error": {"message": "slow down"}})])
    t0 = time.monotonic()
    (reply,) = analyze_many(client(server.url), 1)
    assert reply.error is None and reply.text == SKILL_JSON and reply.attempts == 3
    assert len(server.requests) == 3
    assert server.requests[2]["t"] - server.requests[1]["t"] >= 0.28  # waited as told, not the 10 ms backoff
    assert time.monotonic() - t0 < 5


def test_openai_retries_a_timeout(fake_openai):
    server = fake_openai(delays=[1.0])
    (reply,) = analyze_many(client(server.url, timeout_s=0.3), 1)
    assert reply.error is None and reply.attempts == 2


def test_openai_gives_up_after_max_retries(fake_openai):
    server = fake_openai([(503, {}, {"error": {"message": "down for maintenance"}})] * 10)
    (reply,) = analyze_many(client(server.url, max_retries=2), 1)
    assert reply.text == "" and reply.attempts == 3 and len(server.requests) == 3
    assert "after 3 attempts" in reply.error and "HTTP 503" in reply.error and "down for maintenance" in reply.error


def test_openai_does_not_retry_other_4xx(fake_openai):
    server = fake_openai([(400, {}, {"error": {"message": "max_tokens is too large"}})])
    (reply,) = analyze_many(client(server.url), 1)
    assert len(server.requests) == 1 and reply.attempts == 1
    assert "HTTP 400 (not retried)" in reply.error and "max_tokens is too large" in reply.error


def test_openai_connection_refused_is_retried_then_reported():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (reply,) = analyze_many(client(f"http://127.0.0.1:{port}", max_retries=1), 1)
    assert reply.attempts == 2 and "Connect" in reply.error


def test_api_key_is_sent_as_bearer_and_never_shown(fake_openai, monkeypatch):
    secret = "sk-test-SECRET-0123456789"
    monkeypatch.setenv("MY_ANALYZER_KEY", secret)
    ok = fake_openai()
    analyzer = client(ok.url, api_key_env="MY_ANALYZER_KEY")
    assert analyze_many(analyzer, 1)[0].error is None
    assert ok.requests[0]["auth"] == f"Bearer {secret}"
    # a server that echoes the key in its error: the error text is redacted
    bad = fake_openai([(401, {}, {"error": {"message": f"Incorrect API key provided: {secret}"}})])
    analyzer = client(bad.url, api_key_env="MY_ANALYZER_KEY")
    (reply,) = analyze_many(analyzer, 1)
    assert reply.error and "HTTP 401" in reply.error and secret not in reply.error and "***" in reply.error
    for shown in (repr(analyzer), str(vars(analyzer)), reply.model_dump_json()):
        assert secret not in shown
    with pytest.raises(ValidationError, match="NAME of an environment variable"):
        AnalyzerConfig(kind="openai", model="m", api_key_env=secret)


def test_concurrency_never_exceeds_the_bound(fake_openai):
    server = fake_openai(delay_s=0.15)
    replies = analyze_many(client(server.url, max_concurrency=2), 6)
    assert all(r.error is None for r in replies)
    assert server.max_in_flight == 2


def test_rate_limit_spaces_request_starts(fake_openai):
    server = fake_openai()
    analyzer = client(server.url, max_concurrency=4, requests_per_minute=600)  # one request per 0.1 s
    sent: list[float] = []
    post = analyzer._post

    async def timed_post(body: Any) -> Any:
        sent.append(time.monotonic())
        return await post(body)

    analyzer._post = timed_post  # type: ignore[method-assign]
    replies = analyze_many(analyzer, 4)
    assert all(r.error is None for r in replies) and len(server.requests) == 4
    gaps = [b - a for a, b in zip(sent, sent[1:])]
    assert min(gaps) >= 0.095, gaps


# -- LangChain and policy analyzers, configs ---------------------------------------------------------


def test_langchain_analyzer_from_spec():
    analyzer = LangChainAnalyzer.from_spec("langchain_core.language_models.fake_chat_models:FakeListChatModel",
                                           {"responses": [SKILL_JSON]})
    (reply,) = analyze_many(analyzer, 1)
    assert reply.error is None and reply.text == SKILL_JSON
    assert analyzer.name == "langchain:langchain_core.language_models.fake_chat_models:FakeListChatModel"
    with pytest.raises(ValueError, match="cannot import"):
        LangChainAnalyzer.from_spec("no_such_pkg.mod:Chat")


def test_langchain_analyzer_retries_provider_errors():
    class Flaky:
        calls = 0

        async def ainvoke(self, messages: Any) -> Any:
            Flaky.calls += 1
            if Flaky.calls < 3:
                raise ConnectionError("provider hiccup")
            from langchain_core.messages import AIMessage

            return AIMessage(SKILL_JSON, usage_metadata={"input_tokens": 5, "output_tokens": 3, "total_tokens": 8})

    (reply,) = analyze_many(LangChainAnalyzer(Flaky(), name="langchain:flaky", backoff_s=0.01), 1)
    assert reply.error is None and reply.attempts == 3 and (reply.prompt_tokens, reply.completion_tokens) == (5, 3)


def test_policy_analyzer_is_greedy_and_captured_as_analyzer(tokenizer):
    backend = FakeBackend(tokenizer, SKILL_JSON)
    llm = SeedChatModel(backend=backend, tokenizer=tokenizer, model_name="base")
    analyzer = PolicyAnalyzer(llm, max_tokens=200)

    async def go() -> Any:
        with capture() as cap:
            reply = await analyzer.analyze(MESSAGES)
        return reply, cap.calls

    reply, calls = asyncio.run(go())
    assert reply.error is None and parse_skill(reply.text)[2] is None
    assert analyzer.name == "policy:base"
    assert len(calls) == 1 and calls[0].purpose == "analyzer"
    assert calls[0].sampling.temperature == 0.0 and calls[0].sampling.max_tokens == 200
    assert reply.prompt_tokens == len(calls[0].prompt_ids) and reply.completion_tokens == len(calls[0].completion_ids)


def test_configs_and_make_analyzer(tokenizer):
    assert isinstance(make_analyzer(AnalyzerConfig(), suite=TextWorldSuite()), TextWorldAnalyzer)  # the suite's own
    with pytest.raises(ValueError, match="offline analyzer"):
        make_analyzer(AnalyzerConfig())  # rule_based without a suite
    a = make_analyzer(AnalyzerConfig(kind="openai", model="gpt-x", base_url="http://h:1/v1", requests_per_minute=30))
    assert isinstance(a, OpenAIChatAnalyzer) and a.base_url == "http://h:1" and a.name == "openai:gpt-x"
    llm = SeedChatModel(backend=FakeBackend(tokenizer, SKILL_JSON), tokenizer=tokenizer, model_name="pol")
    assert make_analyzer(AnalyzerConfig(kind="policy"), llm=llm).name == "policy:pol"
    with pytest.raises(ValueError, match="needs analyzer.backend"):
        make_analyzer(AnalyzerConfig(kind="policy"))
    with pytest.raises(ValidationError, match="analyzer.model is required"):
        AnalyzerConfig(kind="openai")
    with pytest.raises(ValidationError, match="analyzer.spec is required"):
        AnalyzerConfig(kind="langchain")
    with pytest.raises(ValidationError, match="extra"):
        AnalyzerConfig(api_key="sk-123")
    assert AnalyzerConfig(price_per_mtok_prompt=3, price_per_mtok_completion=15).cost(1_000_000, 100_000) == pytest.approx(4.5)
    for name, field in AnalyzerConfig.model_fields.items():
        assert field.description, name
