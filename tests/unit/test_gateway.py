"""Capture gateway: OpenAI format, token-exact records, sessions, streaming, error shapes.

The upstream is ``FakeVLLM`` (in-process, deterministic ids and logprobs) and the store a
real SQLite ``TraceStore`` in ``tmp_path``; nothing here opens a socket.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

from seed_agents.capture import capture
from seed_agents.chat_model import SeedChatModel
from seed_agents.gateway.app import build_app
from seed_agents.gateway.config import GatewayConfig
from seed_agents.gateway.testing import FakeVLLM, fake_logprob
from seed_agents.gateway.upstream import Upstream
from seed_agents.store import TraceStore
from seed_agents.testing import FakeBackend
from seed_agents.types import SamplingParams

MODEL = "tiny"  # the conftest fake upstream serves this name
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
CONVERSATION = [
    {"role": "system", "content": "You are a weather bot."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
]



def make_client(fake: FakeVLLM, store: TraceStore, tokenizer: Any, **overrides: Any) -> TestClient:
    cfg = GatewayConfig(upstream="http://fake", model=MODEL, **overrides)
    upstream = Upstream("http://fake", MODEL, transport=fake.transport(), retries=0)
    return TestClient(build_app(cfg, store, upstream, tokenizer=tokenizer))


@pytest.fixture
def client(fake, store, tokenizer):
    with make_client(fake, store, tokenizer) as c:
        yield c


def chat(client: TestClient, messages: list[dict[str, Any]] | None = None, headers: dict[str, str] | None = None,
         path: str = "/v1/chat/completions", **body: Any) -> httpx.Response:
    payload = {"model": MODEL, "messages": messages or [{"role": "user", "content": "hi"}], **body}
    return client.post(path, json=payload, headers=headers or {})


def stream_chunks(response: httpx.Response) -> list[Any]:
    """The SSE payloads of a streamed reply: dicts, and the final '[DONE]' string."""
    out = []
    for line in response.text.splitlines():
        if line.startswith("data: "):
            payload = line[6:]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def streamed_content(chunks: list[Any]) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if isinstance(c, dict) and c.get("choices"))


# -- OpenAI format and the stored record ---------------------------------------------------------


def test_models_lists_the_configured_name(client):
    data = client.get("/v1/models").json()
    assert [m["id"] for m in data["data"]] == [MODEL] and data["object"] == "list"


def test_reply_is_openai_format_and_the_call_is_stored_token_exactly(client, store, fake, tokenizer):
    r = chat(client, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
             temperature=0.3, top_p=0.9, max_tokens=20, seed=7)
    assert r.status_code == 200, r.text
    body = r.json()
    sid = r.headers["x-session-id"]
    assert body["object"] == "chat.completion" and body["model"] == MODEL
    choice = body["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "Hello there."} and choice["finish_reason"] == "stop"

    (call,) = store.calls(sid)
    expected_prompt = tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert tokenizer.decode(call.prompt_ids) == expected_prompt
    assert fake.requests[0]["prompt"] == call.prompt_ids  # what went upstream is what is stored
    ids, _ = fake.completion_ids(20)
    assert call.completion_ids == ids
    assert call.logprobs == [fake_logprob(i, len(call.prompt_ids)) for i in range(len(ids))]
    assert call.text == "Hello there." and call.finish_reason == "stop" and call.purpose == "policy"
    assert call.sampling == SamplingParams(max_tokens=20, temperature=0.3, top_p=0.9, seed=7, stop_token_ids=(tokenizer.eos_token_id,))
    assert body["usage"] == {"prompt_tokens": len(call.prompt_ids), "completion_tokens": len(ids), "total_tokens": len(call.prompt_ids) + len(ids)}
    assert r.headers["x-call-id"] == call.call_id and body["id"] == f"chatcmpl-{call.call_id}"
    sent = fake.requests[0]
    assert sent["return_token_ids"] is True and sent["logprobs"] == 0 and sent["seed"] == 7 and not sent.get("stream")


def test_stored_call_equals_what_seed_chat_model_records(client, store, fake, tokenizer):
    """The gateway renders with SeedChatModel's code: same prompt ids, tools included."""
    fake.script = CALL_TEXT
    r = chat(client, CONVERSATION, tools=TOOLS, temperature=0.5, max_tokens=64)
    (gateway_call,) = store.calls(r.headers["x-session-id"])

    # tools sent with tool_choice auto: constrained as SeedChatModel constrains them by default
    llm = SeedChatModel(backend=FakeBackend(tokenizer, CALL_TEXT), tokenizer=tokenizer,
                        sampling=SamplingParams(max_tokens=64, temperature=0.5)).bind(tools=TOOLS)
    lc_messages = [SystemMessage("You are a weather bot."), HumanMessage("Weather in Paris?"),
                   AIMessage("", tool_calls=[{"name": "get_weather", "args": {"city": "Paris"}, "id": "call_1"}]),
                   ToolMessage("sunny, 21 C", tool_call_id="call_1")]
    with capture() as cap:
        llm.invoke(lc_messages)
    (direct,) = cap.calls
    assert gateway_call.prompt_ids == direct.prompt_ids
    assert gateway_call.messages == direct.messages and gateway_call.tools == direct.tools
    assert gateway_call.completion_ids == direct.completion_ids and gateway_call.text == direct.text
    assert gateway_call.sampling == direct.sampling


def test_tool_calls_are_parsed_into_openai_tool_calls(client, fake):
    fake.script = "Let me check.\n" + CALL_TEXT
    r = chat(client, [{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS)
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (tc,) = choice["message"]["tool_calls"]
    assert tc["type"] == "function" and tc["function"]["name"] == "get_weather"
    assert json.loads(tc["function"]["arguments"]) == {"city": "Paris"} and tc["id"].startswith("call_")
    assert choice["message"]["content"] == "Let me check."


def test_only_tool_call_has_null_content_and_malformed_call_stays_visible(client, fake):
    fake.script = CALL_TEXT
    assert chat(client, tools=TOOLS).json()["choices"][0]["message"]["content"] is None
    fake.script = "<tool_call>{not json</tool_call>"
    msg = chat(client, tools=TOOLS).json()["choices"][0]
    assert msg["finish_reason"] == "stop" and "tool_calls" not in msg["message"]
    assert msg["message"]["content"] == "<tool_call>{not json</tool_call>"


# -- sessions --------------------------------------------------------------------------------------


def test_an_assistant_tool_call_may_omit_content_as_openai_allows(client, store):
    """The OpenAI SDK's ``message.model_dump(exclude_none=True)`` sends a tool-calling
    assistant turn without ``content``; the next turn must be answered, not refused."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    messages = [{"role": "user", "content": "book"},
                {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "booked"}]
    r = client.post("/v1/chat/completions", json={"model": "tiny", "messages": messages, "tools": tools})
    assert r.status_code == 200, r.text
    (call,) = store.calls(r.headers["x-session-id"])
    assert [m["role"] for m in call.messages[1:]] == ["user", "assistant", "user"]  # SmolLM2's hermes rendering
    assert '"name": "f"' in call.messages[2]["content"] and "booked" in call.messages[3]["content"]


def test_session_is_created_echoed_and_reused(client, store):
    first = chat(client)
    sid = first.headers["x-session-id"]
    second = chat(client, headers={"X-Session-Id": sid})
    assert second.headers["x-session-id"] == sid
    assert [c.call_id for c in store.calls(sid)] == [first.headers["x-call-id"], second.headers["x-call-id"]]
    other = chat(client)
    assert other.headers["x-session-id"] != sid


def test_session_from_path_prefix_and_task_key(client, store):
    r = chat(client, path="/s/my-session.1/v1/chat/completions", headers={"X-Task-Key": "weather:paris"})
    assert r.status_code == 200 and r.headers["x-session-id"] == "my-session.1"
    session = store.get_session("my-session.1")
    assert session.task_key == "weather:paris" and session.num_calls == 1
    assert client.get("/s/my-session.1/v1/models").status_code == 200
    clash = chat(client, path="/s/a/v1/chat/completions", headers={"X-Session-Id": "b"})
    assert clash.status_code == 400 and clash.json()["error"]["code"] == "session_conflict"
    bad = chat(client, headers={"X-Session-Id": "no spaces/allowed"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_session_id"


def test_a_failed_first_call_leaves_no_empty_session(client, store, fake):
    fake.fail_status = 500
    r = chat(client, headers={"X-Session-Id": "s-fail"})
    assert r.status_code == 502 and r.headers["x-session-id"] == "s-fail"
    assert store.get_session("s-fail") is None


def test_calls_on_an_ended_session_are_refused(client, store):
    sid = chat(client).headers["x-session-id"]
    store.end_session(sid)
    r = chat(client, headers={"X-Session-Id": sid})
    assert r.status_code == 409 and r.json()["error"]["code"] == "session_ended"
    assert len(store.calls(sid)) == 1


# -- streaming ---------------------------------------------------------------------------------


def _comparable(call) -> dict[str, Any]:
    return call.model_dump(exclude={"call_id", "latency_s", "started_at", "scope"})


@pytest.mark.parametrize("script, tools", [
    ("Hello there, how are you today?", None),
    ("  Sure.\n" + CALL_TEXT + "\nDone.  ", TOOLS),
    ("I will check <tool the weather", TOOLS),  # a partial tag that never becomes a tool call
])
def test_streaming_and_non_streaming_store_the_same_record(client, store, fake, script, tools):
    fake.script = script
    plain = chat(client, CONVERSATION[:2], tools=tools, seed=1, temperature=0.0)
    streamed = chat(client, CONVERSATION[:2], tools=tools, seed=1, temperature=0.0, stream=True)
    assert streamed.status_code == 200 and streamed.headers["content-type"].startswith("text/event-stream")
    (a,) = store.calls(plain.headers["x-session-id"])
    (b,) = store.calls(streamed.headers["x-session-id"])
    assert _comparable(a) == _comparable(b)
    assert a.scope["stream"] is False and b.scope["stream"] is True

    chunks = stream_chunks(streamed)
    assert chunks[-1] == "[DONE]" and chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    message = plain.json()["choices"][0]["message"]
    assert streamed_content(chunks) == (message["content"] or "")
    finish = [c["choices"][0]["finish_reason"] for c in chunks[:-1] if c["choices"][0]["finish_reason"]]
    assert finish == [plain.json()["choices"][0]["finish_reason"]]
    tool_deltas = [tc for c in chunks[:-1] for tc in c["choices"][0]["delta"].get("tool_calls", [])]
    assert [(t["function"]["name"], t["function"]["arguments"]) for t in tool_deltas] == \
        [(t["function"]["name"], t["function"]["arguments"]) for t in message.get("tool_calls", [])]
    assert all(c["id"] == f"chatcmpl-{b.call_id}" for c in chunks[:-1])


def test_stream_include_usage_sends_a_usage_chunk(client, store):
    r = chat(client, stream=True, stream_options={"include_usage": True})
    chunks = stream_chunks(r)
    usage = chunks[-2]
    (call,) = store.calls(r.headers["x-session-id"])
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == len(call.completion_ids)


def test_stream_broken_upstream_sends_an_error_event_and_stores_nothing(client, store, fake):
    fake.break_after = 2
    r = chat(client, stream=True, headers={"X-Session-Id": "broken"})
    chunks = stream_chunks(r)
    assert "[DONE]" not in chunks and chunks[-1]["error"]["code"] == "upstream_truncated"
    assert store.get_session("broken") is None


async def test_stream_abandoned_by_the_client_stores_nothing(fake, store, tokenizer):
    """A client that goes away mid-stream: Starlette stops iterating and closes the
    generator; the call must not be stored (nor the session created)."""
    from seed_agents.gateway import app as app_module
    from seed_agents.gateway.recording import Turn
    from seed_agents.gateway.render import parse_request

    fake.script = "one two three four five six"
    cfg = GatewayConfig(upstream="http://fake", model=MODEL)
    upstream = Upstream("http://fake", MODEL, transport=fake.transport(), retries=0)
    app = build_app(cfg, store, upstream, tokenizer=tokenizer)
    gw = app.state.gateway
    req = parse_request({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True})
    ids, rendered = gw.renderer.render(req.messages, None)
    turn = Turn(session_id="gone", task_key=None, call_id="c-gone", messages=req.messages, tools=None, prompt_ids=ids,
                rendered=rendered, params=gw.renderer.sampling(req, 64, 4096), model=MODEL, policy_version=0, stream=True)
    from contextlib import AsyncExitStack

    stack = AsyncExitStack()
    pieces = await upstream.open_stream(MODEL, ids, turn.params, stack)

    class _Request:
        async def is_disconnected(self) -> bool:
            return False

    events = app_module._stream_events(gw, _Request(), req, turn, pieces, stack)
    first = [await events.__anext__() for _ in range(2)]
    assert first[0].startswith("data: ")
    await events.aclose()  # what Starlette does when the client disconnects
    assert store.get_session("gone") is None and gw.stats["streams_not_stored"] == 1
    await upstream.aclose()


# -- errors: OpenAI-shaped, never a 500, never a stored call -------------------------------------


def _assert_error(r: httpx.Response, status: int, code: str | None = None) -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "code"} and err["message"]
    if code:
        assert err["code"] == code


def test_bad_requests_get_openai_errors_and_store_nothing(client, store):
    h = {"content-type": "application/json"}
    _assert_error(client.post("/v1/chat/completions", content=b"{not json", headers=h), 400, "invalid_json")
    _assert_error(client.post("/v1/chat/completions", json=[1, 2]), 400)
    _assert_error(client.post("/v1/chat/completions", json={"model": MODEL}), 400)
    _assert_error(chat(client, n=2), 400, "unsupported_parameter")
    _assert_error(chat(client, stop=["\n"]), 400, "unsupported_parameter")
    _assert_error(chat(client, frequency_penalty=0.5), 400, "unsupported_parameter")
    _assert_error(chat(client, max_tokens=100000), 400, "max_tokens_too_large")
    _assert_error(chat(client, [{"role": "wizard", "content": "x"}]), 400, "invalid_messages")
    _assert_error(chat(client, [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]), 400)
    _assert_error(chat(client, tools=[{"type": "function"}]), 400)
    _assert_error(client.post("/v1/chat/completions", json={"model": "gpt-4", "messages": [{"role": "user", "content": "x"}]}), 404, "model_not_found")
    _assert_error(client.get("/v1/nothing-here"), 404)
    assert store.sessions() == []


def test_accepted_but_ignored_client_fields(client):
    r = chat(client, user="u1", tool_choice="auto", parallel_tool_calls=False, n=1, frequency_penalty=0, logprobs=False)
    assert r.status_code == 200, r.text


def test_oversize_request_is_413(fake, store, tokenizer):
    with make_client(fake, store, tokenizer, security={"max_request_bytes": 2048}) as c:
        big = chat(c, [{"role": "user", "content": "x" * 4000}])
        _assert_error(big, 413, "request_too_large")
        # without a content-length header the limit holds while reading
        body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "y" * 4000}]}).encode()
        chunked = c.post("/v1/chat/completions", content=iter([body[:1000], body[1000:]]), headers={"content-type": "application/json"})
        _assert_error(chunked, 413, "request_too_large")
    assert store.sessions() == []


@pytest.mark.parametrize("status, expect", [(500, 502), (503, 503), (401, 502), (400, 400), (404, 502)])
def test_upstream_errors_map_to_gateway_errors(client, store, fake, status, expect):
    fake.fail_status = status
    _assert_error(chat(client), expect)
    _assert_error(chat(client, stream=True), expect)
    assert store.sessions() == []


def test_upstream_down_is_502_with_retries(store, tokenizer):
    attempts = []

    def refuse(request: httpx.Request) -> httpx.Response:
        attempts.append(request)
        raise httpx.ConnectError("connection refused", request=request)

    cfg = GatewayConfig(upstream="http://down", model=MODEL)
    upstream = Upstream("http://down", MODEL, transport=httpx.MockTransport(refuse), retries=2)
    with TestClient(build_app(cfg, store, upstream, tokenizer=tokenizer)) as c:
        _assert_error(chat(c), 502, "upstream_unreachable")
    assert len(attempts) == 3 and store.sessions() == []


def test_store_failure_is_503_not_500(client, store, monkeypatch):
    from seed_agents.store import StoreError

    def broken(*a, **k):
        raise StoreError("disk full")

    monkeypatch.setattr(store, "add_call", broken)
    _assert_error(chat(client), 503, "store_error")
    chunks = stream_chunks(chat(client, stream=True))
    assert "[DONE]" not in chunks and chunks[-1]["error"]["code"] == "store_error"


# -- admin: policy switch ------------------------------------------------------------------------


def test_admin_policy_switch_stamps_new_calls(client, store, fake):
    fake.served.append("tiny-v2")
    r = client.put("/v1/admin/policy", json={"upstream_model": "tiny-v2", "policy_version": 3})
    assert r.status_code == 200 and client.get("/v1/admin/policy").json() == {"upstream_model": "tiny-v2", "policy_version": 3}
    sid = chat(client).headers["x-session-id"]
    assert store.calls(sid)[0].policy_version == 3 and fake.requests[-1]["model"] == "tiny-v2"
    _assert_error(client.put("/v1/admin/policy", json={"upstream_model": "typo", "policy_version": 4}), 409, "model_not_served")
    _assert_error(client.put("/v1/admin/policy", json={"upstream_model": "tiny"}), 400)
    assert client.get("/v1/admin/policy").json()["policy_version"] == 3


def test_admin_export_returns_the_stored_session(client):
    sid = chat(client).headers["x-session-id"]
    data = client.get(f"/v1/admin/sessions/{sid}").json()
    assert data["session"]["session_id"] == sid and len(data["calls"]) == 1 and data["rewards"] == []
    _assert_error(client.get("/v1/admin/sessions/nope"), 404, "session_not_found")


def test_a_gateway_bug_is_an_openai_shaped_500(fake, store, tokenizer, monkeypatch):
    cfg = GatewayConfig(upstream="http://fake", model=MODEL)
    upstream = Upstream("http://fake", MODEL, transport=fake.transport(), retries=0)
    c = TestClient(build_app(cfg, store, upstream, tokenizer=tokenizer), raise_server_exceptions=False)

    def boom(*a, **k):
        raise RuntimeError("bug")

    monkeypatch.setattr(c.app.state.gateway.renderer, "render", boom)
    with c:
        _assert_error(chat(c), 500, "internal_error")
    assert store.sessions() == []


# -- the command line ------------------------------------------------------------------------------


def test_cli_flags_and_config(tmp_path, monkeypatch):
    from seed_agents.app.cli import _parser, main
    from seed_agents.app.commands.gateway import load_gateway_config
    from seed_agents.errors import ConfigError

    args = _parser().parse_args(["gateway", "--upstream", "http://u:8000", "--model", "m", "--store", "sqlite:///x.db",
                                 "--port", "9", "--security.max-request-bytes", "4096"])
    assert args.config is None and args.config_flags(args) == {
        "upstream": ["http://u:8000"], "model": "m", "store": "sqlite:///x.db", "port": "9",
        "security": {"max_request_bytes": "4096"}}
    replicas = _parser().parse_args(["gateway", "--upstream", "http://a:8000", "http://b:8000", "--model", "m"])
    assert load_gateway_config(None, replicas.config_flags(replicas)).upstream == ["http://a:8000", "http://b:8000"]
    assert load_gateway_config(None, {"upstream": "http://a:1,http://b:2", "model": "m"}).upstream == ["http://a:1", "http://b:2"]
    for bad in ("not a url", "http://a:1,http://a:1/v1", "http://a:port"):  # one line naming the field, no traceback
        with pytest.raises(ConfigError, match="upstream"):
            load_gateway_config(None, {"upstream": bad, "model": "m"})

    yaml_file = tmp_path / "gw.yaml"
    yaml_file.write_text("model: from-yaml\nport: 7000\nsecurity:\n  redact_env: [MY_TOKEN]\n")
    cfg = load_gateway_config(str(yaml_file), {"upstream": "http://u", "port": 9100, "model": None,
                                               "security": {"max_request_bytes": 4096}})
    assert (cfg.model, cfg.port, cfg.host, cfg.security.redact_env) == ("from-yaml", 9100, "127.0.0.1", ["MY_TOKEN"])
    assert cfg.security.max_request_bytes == 4096  # a flag of a section keeps the YAML's other keys
    with pytest.raises(ConfigError, match="model"):
        load_gateway_config(None, {"upstream": "http://u"})
    yaml_file.write_text("model: m\nupstream: http://u\nupstream_api_key_env: sk-live-0123456789abcdef\n")
    with pytest.raises(ConfigError) as e:
        load_gateway_config(str(yaml_file), {})
    assert "sk-live" not in str(e.value)  # a pasted key is never echoed
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # what main() sets for its process, undone after the test
    assert main(["gateway", "--config", str(tmp_path / "missing.yaml"), "--upstream", "http://u", "--model", "m"]) == 2
