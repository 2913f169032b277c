"""The gateway honours ``tool_choice`` exactly as ``SeedChatModel.bind_tools`` does.

Fake upstream (``FakeVLLM``), real SQLite store: the body sent upstream carries the
grammar (``structured_outputs.structural_tag``), a forced call's prefill is in the prompt,
the reply parses as a call, and the stored record equals what ``SeedChatModel`` records
for the same conversation and choice.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from langchain_core.messages import HumanMessage, SystemMessage

from seed_agents.backends.grammar import tool_call_tag
from seed_agents.capture import capture
from seed_agents.chat_model import SeedChatModel, forced_tool_prefix
from seed_agents.testing import FakeBackend
from seed_agents.types import SamplingParams
from tests.unit.test_gateway import TOOLS, chat, make_client, stream_chunks

TWO_TOOLS = [*TOOLS, {"type": "function", "function": {"name": "get_time", "description": "Time in a city.",
                                                       "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
QUESTION = [{"role": "system", "content": "You are a weather bot."}, {"role": "user", "content": "Weather in Paris?"}]
REST_OF_CALL = ' {"city": "Paris"}}\n</tool_call>'  # what the model writes after a forced call's prefill


@pytest.fixture
def client(fake, store, tokenizer):
    with make_client(fake, store, tokenizer) as c:
        yield c


def _constraint(body: dict[str, Any]) -> str | None:
    return (body.get("structured_outputs") or {}).get("structural_tag")


@pytest.mark.parametrize(("choice", "seed_choice", "tools"), [
    ("required", "any", TOOLS),
    ({"type": "function", "function": {"name": "get_weather"}}, "get_weather", TWO_TOOLS),
])
def test_a_forced_call_is_constrained_prefilled_and_parses(client, store, fake, tokenizer, choice, seed_choice, tools):
    fake.script = REST_OF_CALL
    r = chat(client, QUESTION, tools=tools, tool_choice=choice, max_tokens=64, temperature=0.5)
    assert r.status_code == 200, r.text
    msg = r.json()["choices"][0]
    assert msg["finish_reason"] == "tool_calls" and msg["message"]["content"] is None
    (tc,) = msg["message"]["tool_calls"]
    assert tc["function"]["name"] == "get_weather" and json.loads(tc["function"]["arguments"]) == {"city": "Paris"}

    sent = fake.requests[-1]
    prefix = forced_tool_prefix(seed_choice, tools)
    assert _constraint(sent) == tool_call_tag(tools, prefix)  # the grammar starts inside the forced call
    assert tokenizer.decode(sent["prompt"]).endswith(prefix)  # and the prefill is the prompt's end

    # the record is SeedChatModel's, forced the same way
    (gw_call,) = store.calls(r.headers["x-session-id"])
    llm = SeedChatModel(backend=FakeBackend(tokenizer, REST_OF_CALL), tokenizer=tokenizer,
                        sampling=SamplingParams(max_tokens=64, temperature=0.5)).bind_tools(tools, tool_choice=seed_choice)
    with capture() as cap:
        reply = llm.invoke([SystemMessage("You are a weather bot."), HumanMessage("Weather in Paris?")])
    (direct,) = cap.calls
    assert reply.tool_calls[0]["args"] == {"city": "Paris"}
    assert gw_call.prompt_ids == direct.prompt_ids and gw_call.messages == direct.messages
    assert gw_call.text == direct.text and gw_call.completion_ids == direct.completion_ids
    assert gw_call.sampling == direct.sampling


def test_a_forced_call_streams_as_a_tool_call(client, fake):
    fake.script = REST_OF_CALL
    r = chat(client, QUESTION, tools=TOOLS, tool_choice="required", stream=True)
    chunks = [c for c in stream_chunks(r) if isinstance(c, dict)]
    calls = [tc for c in chunks for tc in c["choices"][0]["delta"].get("tool_calls") or []]
    assert [tc["function"]["name"] for tc in calls] == ["get_weather"]
    assert not any(c["choices"][0]["delta"].get("content") for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert _constraint(fake.requests[-1]) is not None


def test_auto_is_constrained_like_seed_chat_model_and_none_offers_no_tools(client, store, fake, tokenizer):
    chat(client, QUESTION, tools=TOOLS)
    assert _constraint(fake.requests[-1]) == tool_call_tag(TOOLS)  # auto: <tool_call> opens only a valid call

    fake.script = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    r = chat(client, QUESTION, tools=TOOLS, tool_choice="none")
    sent = fake.requests[-1]
    assert _constraint(sent) is None and "get_weather" not in tokenizer.decode(sent["prompt"])
    assert "tool_calls" not in r.json()["choices"][0]["message"]  # nothing offered, nothing parsed
    (call,) = store.calls(r.headers["x-session-id"])
    assert call.tools is None


@pytest.mark.parametrize(("choice", "tools"), [
    ("always", TOOLS),
    ({"type": "function", "function": {"name": "get_time"}}, TOOLS),
    ("required", None),
    ({"type": "function"}, TOOLS),
])
def test_a_bad_tool_choice_is_a_400_and_stores_nothing(client, store, fake, choice, tools):
    r = chat(client, QUESTION, tools=tools, tool_choice=choice)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_tool_choice", r.text
    assert store.sessions() == [] and fake.requests == []


def test_the_session_keeps_how_the_deployed_agent_sampled(client, store, fake):
    """Issue 66: the loop replays a session as the deployment sampled it, so the gateway keeps
    max_tokens (the largest asked), the temperature and the tool_choice of the session's
    calls, typed, in its metadata (and each call's tool_choice in its scope)."""
    from seed_agents.transcript import DeployedSampling, session_sampling

    fake.script = REST_OF_CALL
    first = chat(client, QUESTION, tools=TWO_TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}},
                 max_tokens=300, temperature=0.4)
    sid = first.headers["x-session-id"]
    assert session_sampling(store.get_session(sid).metadata) == DeployedSampling(
        max_tokens=300, temperature=0.4, tool_choice="get_weather")
    fake.script = "Sunny."
    chat(client, QUESTION, headers={"X-Session-Id": sid}, tools=TWO_TOOLS, max_tokens=100, temperature=0.9)
    kept = session_sampling(store.get_session(sid).metadata)
    assert kept == DeployedSampling(max_tokens=300, temperature=0.4, tool_choice="get_weather", later_tool_choice="auto")
    assert kept.tool_choice_turns == "first"
    assert [c.scope["tool_choice"] for c in store.calls(sid)] == ["get_weather", "auto"]

    fake.script = REST_OF_CALL  # forced on every turn; no max_tokens sent: the gateway's default
    every = chat(client, QUESTION, tools=TOOLS, tool_choice="required").headers["x-session-id"]
    chat(client, QUESTION, headers={"X-Session-Id": every}, tools=TOOLS, tool_choice="required")
    kept = session_sampling(store.get_session(every).metadata)
    assert (kept.max_tokens, kept.temperature, kept.tool_choice, kept.tool_choice_turns) == (512, 1.0, "required", "every")
