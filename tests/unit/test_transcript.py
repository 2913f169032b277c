"""A session is replayable with nothing else: its task and tool results come from its own
messages, through the gateway (structured OpenAI messages) and through ``StoreSink`` (an
in-process ``SeedChatModel`` agent, the Hermes rendering SmolLM2 gets), and the recording
derived from them answers a shadow replay without the live API.
"""

from __future__ import annotations

import httpx
import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

from seed_agents.capture import capture
from seed_agents.chat_model import SeedChatModel, render_chat
from seed_agents.store import StoreSink
from seed_agents.testing import FakeBackend
from seed_agents.tools.openapi import OpenAPIToolsConfig, openapi_tools
from seed_agents.tools.replay import ReplayConfig, ReplayTransport, recording_from_transcript
from seed_agents.transcript import ToolResult, Transcript, session_transcript, transcript_of
from tests.clinic_service import create_app
from tests.unit.test_gateway import chat, make_client

SYSTEM = "You book clinic appointments."
QUESTION = "Is there a free slot on 2025-03-03?"
SLOTS_JSON = '{"date":"2025-03-03","free":["09:00","10:30","14:00"]}'
CLINIC_SPEC = create_app().openapi()
TOOLS_CFG = OpenAPIToolsConfig(base_url="https://clinic.example", allow_hosts=["clinic.example"])
OPENAI_TOOLS = [{"type": "function", "function": {"name": "list_slots", "description": "Free slots",
                                                  "parameters": {"type": "object", "properties": {"date": {"type": "string"}}}}}]
CONVERSATION = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": QUESTION},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "list_slots", "arguments": '{"date": "2025-03-03"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": SLOTS_JSON},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c2", "type": "function", "function": {"name": "get_booking", "arguments": '{"booking_id": 7}'}}]},
    {"role": "tool", "tool_call_id": "c2", "content": "Error: get_booking failed with HTTP 404 Not Found: no booking 7"},
]
EXPECTED = Transcript(question=QUESTION, system_prompt=SYSTEM, tools=["list_slots"], tool_results=[
    ToolResult(name="list_slots", args={"date": "2025-03-03"}, content=SLOTS_JSON),
    ToolResult(name="get_booking", args={"booking_id": 7}, content="Error: get_booking failed with HTTP 404 Not Found: no booking 7"),
])
LC_CONVERSATION = [SystemMessage(SYSTEM), HumanMessage(QUESTION),
                   AIMessage("", tool_calls=[{"name": "list_slots", "args": {"date": "2025-03-03"}, "id": "c1"}]),
                   ToolMessage(SLOTS_JSON, tool_call_id="c1"),
                   AIMessage("", tool_calls=[{"name": "get_booking", "args": {"booking_id": 7}, "id": "c2"}]),
                   ToolMessage("Error: get_booking failed with HTTP 404 Not Found: no booking 7", tool_call_id="c2")]


def test_the_transcript_is_the_same_from_openai_messages_and_from_the_hermes_rendering(tokenizer):
    assert transcript_of(CONVERSATION, OPENAI_TOOLS) == EXPECTED
    _, rendered = render_chat(tokenizer, LC_CONVERSATION, OPENAI_TOOLS, "hermes")  # SmolLM2's ChatML knows no tools
    assert rendered[0]["content"] != SYSTEM and not any(m["role"] == "tool" for m in rendered)
    assert transcript_of(rendered, OPENAI_TOOLS) == EXPECTED
    _, native = render_chat(tokenizer, LC_CONVERSATION, OPENAI_TOOLS, "native")
    assert transcript_of(native, OPENAI_TOOLS) == EXPECTED
    assert EXPECTED.task("t1").data == {"question": QUESTION, "tools": ["list_slots"], "system_prompt": SYSTEM}
    assert Transcript().task("t1") is None  # no question, no task


def test_a_gateway_session_keeps_its_transcript_and_a_shorter_history_does_not_erase_it(fake, store, tokenizer):
    with make_client(fake, store, tokenizer) as client:
        sid = chat(client, CONVERSATION[:2], tools=OPENAI_TOOLS).headers["x-session-id"]
        assert session_transcript(store.get_session(sid).metadata) == EXPECTED.model_copy(update={"tool_results": []})
        chat(client, CONVERSATION, tools=OPENAI_TOOLS, headers={"X-Session-Id": sid})
        assert session_transcript(store.get_session(sid).metadata) == EXPECTED
        chat(client, CONVERSATION[:2], tools=OPENAI_TOOLS, headers={"X-Session-Id": sid})  # a client that trimmed history
        assert session_transcript(store.get_session(sid).metadata) == EXPECTED


def test_an_in_process_agent_on_store_sink_keeps_the_same_transcript(store, tokenizer):
    llm = SeedChatModel(backend=FakeBackend(tokenizer, "Yes: 09:00."), tokenizer=tokenizer).bind_tools(OPENAI_TOOLS)
    with capture(sink=StoreSink(store, default_session_id="in-process")):
        llm.invoke(LC_CONVERSATION)
    assert session_transcript(store.get_session("in-process").metadata) == EXPECTED


def test_the_sampling_record_is_idempotent_and_in_process_agents_keep_one_too(store, tokenizer):
    """A call stored again (the spool replays its writes) changes nothing; an in-process agent
    records max_tokens and temperature, and no tool_choice (SeedChatModel labels none)."""
    from seed_agents.transcript import DeployedSampling, record_transcript, session_sampling
    from seed_agents.types import LLMCall, SamplingParams

    llm = SeedChatModel(backend=FakeBackend(tokenizer, "Yes: 09:00."), tokenizer=tokenizer, max_tokens=300, temperature=0.2)
    with capture(sink=StoreSink(store, default_session_id="in-process")):
        llm.invoke(LC_CONVERSATION)
    assert session_sampling(store.get_session("in-process").metadata) == DeployedSampling(max_tokens=300, temperature=0.2)
    first = LLMCall(call_id="c-first", messages=CONVERSATION[:2], prompt_ids=[1], completion_ids=[2], logprobs=[0.0],
                    sampling=SamplingParams(max_tokens=64, temperature=0.5), scope={"tool_choice": "required"})
    for _ in range(2):  # the write and its replay: add_call numbers the call 0 both times
        record_transcript(store, "spooled", transcript_of(CONVERSATION[:2]), call=first, turn=store.add_call("spooled", first))
    kept = session_sampling(store.get_session("spooled").metadata)
    assert kept == DeployedSampling(max_tokens=64, temperature=0.5, tool_choice="required") and kept.tool_choice_turns is None


def test_the_metadata_endpoint_sets_an_explicit_task_for_the_feedback_role(fake, store, tokenizer, monkeypatch):
    monkeypatch.setenv("T_CLIENT_KEY", "client-key-123456")
    monkeypatch.setenv("T_FEEDBACK_KEY", "feedback-key-123456")
    security = {"client_keys_env": "T_CLIENT_KEY", "feedback_keys_env": "T_FEEDBACK_KEY"}
    with make_client(fake, store, tokenizer, security=security) as client:
        sid = chat(client, CONVERSATION[:2], headers={"Authorization": "Bearer client-key-123456"}).headers["x-session-id"]
        body = {"task": {"task_id": "slots-0303", "data": {"question": QUESTION, "expect": "09:00"}}}
        as_client = client.put(f"/v1/sessions/{sid}/metadata", json=body, headers={"Authorization": "Bearer client-key-123456"})
        assert as_client.status_code == 403
        ok = client.put(f"/v1/sessions/{sid}/metadata", json=body, headers={"Authorization": "Bearer feedback-key-123456"})
        assert ok.status_code == 200 and ok.json()["set"] == ["task"], ok.text
        meta = store.get_session(sid).metadata
        assert meta["task"]["data"]["expect"] == "09:00" and meta["transcript"]["question"] == QUESTION
        bad = client.put(f"/v1/sessions/{sid}/metadata", json={"tsk": {}}, headers={"Authorization": "Bearer feedback-key-123456"})
        assert bad.status_code == 400
        missing = client.put("/v1/sessions/nope/metadata", json=body, headers={"Authorization": "Bearer feedback-key-123456"})
        assert missing.status_code == 404


def _never_live(request: httpx.Request) -> httpx.Response:
    raise AssertionError(f"a replay reached the live API: {request.method} {request.url}")


@pytest.mark.asyncio
async def test_the_derived_recording_answers_the_sessions_calls_in_a_shadow_replay():
    results = [*EXPECTED.tool_results,
               ToolResult(name="book_slot", args={"patient": "Ana", "date": "2025-03-03", "time": "09:00"},
                          content='{"patient":"Ana","date":"2025-03-03","time":"09:00","booking_id":1}'),
               ToolResult(name="list_slots", args={"date": "2025-03-04"}, content="Error: list_slots: cannot reach the service")]
    recording = recording_from_transcript(CLINIC_SPEC, TOOLS_CFG, results)
    assert [(e.method, e.status, e.mutating) for e in recording.exchanges] == [
        ("GET", 200, False), ("GET", 404, False), ("POST", 200, True)]  # the unreachable read made no exchange
    shadow = ReplayTransport(ReplayConfig(mode="shadow", read_source="recording_only"), recording,
                             live=httpx.MockTransport(_never_live))
    tools = {t.name: t for t in openapi_tools(CLINIC_SPEC, TOOLS_CFG, transport=shadow)}
    assert await tools["list_slots"].ainvoke({"date": "2025-03-03"}) == SLOTS_JSON
    assert "HTTP 404" in await tools["get_booking"].ainvoke({"booking_id": 7})
    booked = await tools["book_slot"].ainvoke({"patient": "Ana", "date": "2025-03-03", "time": "09:00"})
    assert '"booking_id":1' in booked and shadow.counters.blocked_writes == 1 and shadow.counters.live_writes == 0
