"""SeedChatModel as a drop-in LangChain chat model: streaming, stop strings, tool_choice.

Scripted fakes pin the text-level rules (deltas, held-back partial characters and tags,
tool-call chunks, prefill); the tiny local model shows the token-level ones (streamed ids
== invoked ids, stop strings, abandoned streams stop the backend and record an incomplete call), and
a LangGraph agent streams tokens in ``stream_mode="messages"`` while being captured.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from langchain_core.messages import AIMessageChunk, BaseMessage, HumanMessage

from seed_agents.backends.base import CompletionPiece, StreamingBackend
from seed_agents.backends.local import LocalBackend
from seed_agents.capture import capture
from seed_agents.chat_model import SeedChatModel
from seed_agents.graphs.calculator import TOOLS, build_react_calculator
from seed_agents.reply import ReplyBuilder
from seed_agents.skills import teacher_prompt_ids
from seed_agents.testing import FakeBackend, ScriptedServer
from seed_agents.types import SamplingParams
from tests.conformance import ChatModelConformance

CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 3, "b": 4}}\n</tool_call>'


class StreamingFake(FakeBackend):
    """``FakeBackend`` that streams its scripted reply one token per piece."""

    def stream(self, prompt_ids: list[int], params: SamplingParams) -> Iterator[CompletionPiece]:
        c = self.generate(prompt_ids, params)
        for i, (t, lp) in enumerate(zip(c.token_ids, c.logprobs)):
            yield CompletionPiece([t], [lp], c.finish_reason if i == len(c.token_ids) - 1 else None)

    async def astream(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[CompletionPiece]:
        for piece in self.stream(prompt_ids, params):
            yield piece


def fake_llm(tokenizer: Any, replies: Any, streaming: bool = True, **kw: Any) -> SeedChatModel:
    backend = (StreamingFake if streaming else FakeBackend)(tokenizer, replies)
    return SeedChatModel(backend=backend, tokenizer=tokenizer, sampling=SamplingParams(max_tokens=64), **kw)


def joined(chunks: list[AIMessageChunk]) -> AIMessageChunk:
    full = chunks[0]
    for c in chunks[1:]:
        full = full + c
    return full


@pytest.fixture(scope="module")
def local_llm(tiny_model_dir: str) -> SeedChatModel:
    backend = LocalBackend(tiny_model_dir)
    return SeedChatModel(backend=backend, tokenizer=backend.tokenizer, temperature=0.0, max_tokens=24)


class TestLocalChatConformance(ChatModelConformance):
    @pytest.fixture
    def chat_model(self, local_llm: SeedChatModel) -> SeedChatModel:
        return local_llm


# -- the reply builder: text-level rules ----------------------------------------------------

def feed_all(tokenizer: Any, text: str, **kw: Any) -> tuple[list[str], ReplyBuilder]:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    b = ReplyBuilder(lambda x: tokenizer.decode(x, skip_special_tokens=True), **kw)
    deltas = []
    for i, t in enumerate(ids):
        deltas.append(b.feed(CompletionPiece([t], [0.0], "stop" if i == len(ids) - 1 else None)))
        if b.done:
            break
    content = b.reply()[0]
    deltas.append(b.last_delta(content))
    return [d for d in deltas if d], b


@pytest.mark.parametrize("text, kw", [
    ("Hello world, how are you?  ", {}),
    ("Café ☕ 東京 🚀 done", {}),
    ("Sure. " + CALL, {"parse_tools": True}),
    ("  Let me think <tool_ca and more", {"parse_tools": True}),
    ("one two\nthree", {"stop": ["\n"]}),
    ("abc STOP def", {"stop": ["STOP", "zz"]}),
])
def test_deltas_concatenate_to_the_final_content(tokenizer, text, kw):
    deltas, b = feed_all(tokenizer, text, **kw)
    assert "".join(deltas) == b.reply()[0]
    assert not any("\ufffd" in d for d in deltas), "half a UTF-8 character was streamed"


def test_partial_tool_tag_and_partial_stop_string_are_held_back(tokenizer):
    b = ReplyBuilder(lambda x: tokenizer.decode(x), parse_tools=True, stop=["END"])
    shown = ""
    for word in ["Hi", " there", " <", "tool", "_call", ">"]:
        shown += b.feed(CompletionPiece(tokenizer(word, add_special_tokens=False)["input_ids"], [0.0] * len(
            tokenizer(word, add_special_tokens=False)["input_ids"])))
        assert "<" not in shown
    assert shown == "Hi there"
    b2 = ReplyBuilder(lambda x: tokenizer.decode(x), stop=["END"])
    ids = tokenizer("go E", add_special_tokens=False)["input_ids"]
    assert b2.feed(CompletionPiece(ids, [0.0] * len(ids))) == "go"  # "E" may start "END"


def test_stop_string_cuts_ids_at_the_completing_token(tokenizer):
    _, b = feed_all(tokenizer, "alpha beta gamma delta", stop=["ta ga"])
    text = b.text
    assert b.finish_reason == "stop" and b.stop_sequence == "ta ga"
    assert "ta ga" in text and "ta ga" not in tokenizer.decode(b.token_ids[:-1])
    assert b.reply()[0] == "alpha be"


# -- streaming through the chat model (scripted) ---------------------------------------------

@pytest.mark.parametrize("streaming_backend", [True, False])
def test_stream_with_tools_ends_with_tool_call_chunks(tokenizer, streaming_backend):
    llm = fake_llm(tokenizer, ["Let me add. " + CALL], streaming=streaming_backend).bind_tools(TOOLS)
    with capture() as cap:
        chunks = list(llm.stream("3+4?"))
    assert isinstance(llm.bound.backend, StreamingBackend) == streaming_backend
    full = joined(chunks)
    assert full.content == "Let me add." and "<" not in "".join(str(c.content) for c in chunks)
    assert [(tc["name"], tc["args"]) for tc in full.tool_calls] == [("add", {"a": 3, "b": 4})]
    assert chunks[-1].tool_call_chunks and all(not c.tool_call_chunks for c in chunks[:-1])
    assert full.usage_metadata["output_tokens"] == len(cap.calls[0].completion_ids)
    assert full.response_metadata["finish_reason"] == "stop" and len(cap.calls) == 1
    if streaming_backend:
        assert len(chunks) > 3


def test_streamed_malformed_call_stays_invalid(tokenizer):
    """Streamed, a malformed call's raw text travels as a JSON string (LangChain would
    otherwise "repair" "{oops" into a call with empty arguments)."""
    full = joined(list(fake_llm(tokenizer, ["<tool_call>{oops</tool_call>"]).bind_tools(TOOLS).stream("q")))
    assert full.tool_calls == [] and json.loads(full.invalid_tool_calls[0]["args"]) == "{oops"


def test_streaming_flag_makes_invoke_stream(tokenizer):
    llm = fake_llm(tokenizer, ["hello there"], streaming=True)
    used = []
    real = llm.backend.stream
    llm.backend.stream = lambda *a: (used.append(1), (yield from real(*a)))[1]  # type: ignore[method-assign]
    assert llm.invoke("q").content == "hello there" and not used
    flagged = llm.model_copy(update={"streaming": True})
    assert flagged.invoke("q").content == "hello there" and used


def test_standard_constructor_params_set_sampling(tokenizer):
    llm = SeedChatModel(backend=FakeBackend(tokenizer, ["x"]), tokenizer=tokenizer, temperature=0, max_tokens=7,
                        seed=3, stop=["\n"], timeout=60, max_retries=2)
    assert (llm.sampling.temperature, llm.sampling.max_tokens, llm.sampling.seed) == (0, 7, 3)
    ls = llm._get_ls_params()
    assert ls["ls_temperature"] == 0 and ls["ls_max_tokens"] == 7 and ls["ls_stop"] == ["\n"]
    assert llm._get_ls_params(model="other")["ls_model_name"] == "other"


def test_default_stop_applies_and_a_call_stop_replaces_it(tokenizer):
    llm = fake_llm(tokenizer, ["a;b|c"], stop=[";"])
    assert llm.invoke("q").content == "a"
    assert llm.invoke("q", stop=["|"]).content == "a;b"


# -- tool_choice -------------------------------------------------------------------------------

def test_tool_choice_none_offers_no_tools(tokenizer):
    with capture() as cap:
        msg = fake_llm(tokenizer, [CALL]).bind_tools(TOOLS, tool_choice="none").invoke("3+4?")
    assert "<tools>" not in tokenizer.decode(cap.calls[0].prompt_ids) and cap.calls[0].tools is None
    assert msg.tool_calls == [] and "<tool_call>" in msg.content


@pytest.mark.parametrize("choice, prefill", [
    ("add", '<tool_call>\n{"name": "add", "arguments":'),
    ({"type": "function", "function": {"name": "add"}}, '<tool_call>\n{"name": "add", "arguments":'),
    ("any", '<tool_call>\n{"name": "'),
    ("required", '<tool_call>\n{"name": "'),
    (True, '<tool_call>\n{"name": "'),
])
def test_forced_tool_call_is_prefilled_in_the_prompt(tokenizer, choice, prefill):
    rest = ' {"a": 3, "b": 4}}\n</tool_call>' if prefill.endswith(":") else 'add", "arguments": {"a": 3, "b": 4}}\n</tool_call>'
    llm = fake_llm(tokenizer, [rest]).bind_tools(TOOLS, tool_choice=choice)
    with capture() as cap:
        msg = llm.invoke("3+4?")
    call = cap.calls[0]
    assert [(tc["name"], tc["args"]) for tc in msg.tool_calls] == [("add", {"a": 3, "b": 4})]
    assert tokenizer.decode(call.prompt_ids).endswith("<|im_start|>assistant\n" + prefill)
    assert call.messages[-1] == {"role": "assistant", "content": prefill}
    assert call.text == rest and call.completion_ids == tokenizer(rest, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    # streamed, the same call arrives as a tool-call chunk
    assert joined(list(llm.stream("3+4?"))).tool_calls[0]["args"] == {"a": 3, "b": 4}


def test_any_with_a_single_tool_fixes_its_name(tokenizer):
    with capture() as cap:
        fake_llm(tokenizer, [' {"a": 1, "b": 2}}']).bind_tools(TOOLS[:1], tool_choice="any").invoke("q")
    assert tokenizer.decode(cap.calls[0].prompt_ids).endswith('{"name": "add", "arguments":')


def test_unknown_forced_tool_is_an_error_at_bind_time(tokenizer):
    with pytest.raises(ValueError, match="names no bound tool"):
        fake_llm(tokenizer, ["x"]).bind_tools(TOOLS, tool_choice="divide")


def test_forced_call_rerenders_to_the_same_prompt_ids(tokenizer):
    """Teacher prompts re-render recorded messages: the prefill must survive that."""

    class Unchanged:
        def inject(self, messages: list[BaseMessage], skill: str) -> list[BaseMessage]:
            return messages

    llm = fake_llm(tokenizer, [' {"a": 3, "b": 4}}\n</tool_call>'])
    with capture() as cap:
        llm.bind_tools(TOOLS, tool_choice="add").invoke([HumanMessage("3+4?")])
    assert teacher_prompt_ids(llm, cap.calls[0], "", Unchanged()) == cap.calls[0].prompt_ids


def test_forced_tool_call_on_the_tiny_model_records_only_sampled_ids(local_llm):
    # unconstrained: under the tool grammar the logprobs are the masked ones (docs/constrained_decoding.md)
    with capture() as cap:
        local_llm.model_copy(update={"constrain_tool_calls": False}).bind_tools(TOOLS, tool_choice="any").invoke(
            "3+4?", max_tokens=6)
    call = cap.calls[0]
    tok = local_llm.tokenizer
    assert tok.decode(call.prompt_ids).endswith('<tool_call>\n{"name": "')
    assert len(call.completion_ids) == len(call.logprobs) <= 6
    assert call.logprobs == pytest.approx(local_llm.backend.score(call.prompt_ids, call.completion_ids), abs=1e-4)


# -- abandoned streams ------------------------------------------------------------------------

def _count_forwards(model: Any) -> tuple[list[int], Any]:
    n = [0]
    return n, model.register_forward_hook(lambda *a: n.__setitem__(0, n[0] + 1))


def _assert_incomplete_and_untrained(cap: Any) -> None:
    from seed_agents.rows import trajectory_to_rows
    from seed_agents.types import Trajectory

    (call,) = cap.calls
    assert not call.complete and call.finish_reason == "error"
    assert 1 <= len(call.completion_ids) < 50 and len(call.logprobs) == len(call.completion_ids)
    assert trajectory_to_rows(Trajectory(task_id="t", group_id="g", calls=[call])) == []


def test_abandoned_stream_records_an_incomplete_call_and_stops_the_backend(local_llm):
    n, hook = _count_forwards(local_llm.backend.model)
    try:
        with capture() as cap:
            stream = local_llm.stream("Tell me a story.", max_tokens=2000, temperature=1.0)
            got = [next(stream) for _ in range(3)]
            stream.close()
            after_close = n[0]
            time.sleep(0.3)
        assert all(c.content for c in got)
        assert n[0] == after_close < 50, "the backend kept generating after the consumer left"
        _assert_incomplete_and_untrained(cap)
    finally:
        hook.remove()


async def test_abandoned_async_stream_records_an_incomplete_call_and_stops_the_backend(local_llm):
    n, hook = _count_forwards(local_llm.backend.model)
    try:
        with capture() as cap:
            stream = local_llm.astream("Tell me a story.", max_tokens=2000, temperature=1.0)
            for _ in range(3):
                await stream.__anext__()
            await stream.aclose()
            # LangChain's astream leaves its inner generator to the event loop's async-gen
            # finalizer, which closes it (and so the backend) a step later, not at once.
            await asyncio.sleep(0.3)
            settled = n[0]
            await asyncio.sleep(0.3)
        assert n[0] == settled < 50
        _assert_incomplete_and_untrained(cap)
    finally:
        hook.remove()


# -- LangGraph: stream_mode="messages" --------------------------------------------------------

def test_langgraph_messages_mode_streams_tokens_and_captures_them_token_exactly(local_llm):
    """Token chunks reach the graph's consumer while the call is recorded with the same ids
    as a plain greedy invoke."""
    agent = build_react_calculator(local_llm)
    question = {"messages": [("user", "What is 3 + 4?")]}
    with capture() as cap:
        events = list(agent.stream(question, stream_mode="messages"))
    tokens = [m for m, meta in events if isinstance(m, AIMessageChunk) and meta.get("langgraph_node") == "model"]  # create_agent's node
    assert sum(1 for m in tokens if m.content) > 3, "tokens were not streamed"
    streamed = cap.calls[0]
    with capture() as plain:
        state = agent.invoke(question)  # no streaming consumer: the batched generate path
    assert len(cap.calls) == len(plain.calls) == 1
    assert plain.calls[0].prompt_ids == streamed.prompt_ids
    assert plain.calls[0].completion_ids == streamed.completion_ids
    assert "".join(str(m.content) for m in tokens) == state["messages"][-1].content


def test_langgraph_messages_mode_runs_streamed_tool_calls(tokenizer):
    llm = fake_llm(tokenizer, [CALL, '<tool_call>\n{"name": "multiply", "arguments": {"a": 7, "b": 5}}\n</tool_call>',
                               "The answer is 35."])
    agent = build_react_calculator(llm)
    with capture() as cap:
        events = list(agent.stream({"messages": [("user", "What is (3 + 4) * 5?")]}, stream_mode="messages"))
    tool_results = [m.content for m, _ in events if m.type == "tool"]
    assert tool_results == ["7.0", "35.0"] and len(cap.calls) == 3
    answer = "".join(str(m.content) for m, meta in events if isinstance(m, AIMessageChunk))
    assert answer == "The answer is 35."


# -- vLLM stream transport (a scripted SSE server, no vLLM) -----------------------------------

def _sse_stub(answers: list[tuple[int, list[str]]]) -> ScriptedServer:
    """A scripted SSE ``/v1/completions``: ``(status, lines)`` in order, the last repeating."""
    return ScriptedServer.replaying([(status, "text/event-stream" if status == 200 else "application/json",
                                      "".join(line + "\n\n" for line in lines).encode()) for status, lines in answers])


def _event(ids: list[int], lps: list[float], finish: str | None = None) -> str:
    return "data: " + json.dumps({"choices": [{"index": 0, "text": "", "token_ids": ids,
                                               "logprobs": {"token_logprobs": lps}, "finish_reason": finish}]})


_GOOD = [_event([5], [-0.5]), _event([6, 7], [-1.0, -2.0]), _event([], [], "length"), "data: [DONE]"]


@pytest.fixture
def sse_stub() -> Iterator[Any]:
    stubs: list[ScriptedServer] = []

    def make(answers: list[tuple[int, list[str]]]) -> ScriptedServer:
        stubs.append(_sse_stub(answers))
        return stubs[-1]

    yield make
    for s in stubs:
        s.close()


@pytest.mark.parametrize("use_async", [False, True])
async def test_vllm_stream_parses_events_and_retries_before_the_first_byte(sse_stub, use_async):
    from seed_agents.backends.base import join_pieces
    from seed_agents.backends.vllm import VLLMBackend

    stub = sse_stub([(503, ['{"error": {"message": "warming up"}}']), (200, _GOOD)])
    backend = VLLMBackend(stub.url, "m", max_retries=2, backoff_s=0.01, policy_version=3)
    params = SamplingParams(max_tokens=3)
    pieces = [p async for p in backend.astream([1, 2], params)] if use_async else list(backend.stream([1, 2], params))
    c = join_pieces(pieces)
    assert (c.token_ids, c.logprobs, c.finish_reason, c.policy_version) == ([5, 6, 7], [-0.5, -1.0, -2.0], "length", 3)
    assert len(stub.requests) == 2 and stub.requests[-1]["stream"] is True and stub.requests[-1]["return_token_ids"]
    backend.close()


@pytest.mark.parametrize("lines, match", [
    (_GOOD[:2], "without \\[DONE\\]"),
    ([_GOOD[0], 'data: {"error": {"message": "engine died"}}'], "engine died"),
    (["data: {not json"], "not JSON"),
    (["data: " + json.dumps({"choices": [{"token_ids": [1, 2], "logprobs": {"token_logprobs": [-1.0]}}]})], "2 token ids but 1"),
])
def test_vllm_stream_failures_are_backend_errors(sse_stub, lines, match):
    from seed_agents.backends.base import BackendError
    from seed_agents.backends.vllm import VLLMBackend

    backend = VLLMBackend(sse_stub([(200, lines)]).url, "m", max_retries=0)
    with pytest.raises(BackendError, match=match):
        list(backend.stream([1], SamplingParams(max_tokens=3)))
    backend.close()


def test_vllm_stream_rejected_request_and_dead_server(sse_stub):
    import socket

    from seed_agents.backends.base import BackendError, BackendUnavailable
    from seed_agents.backends.vllm import VLLMBackend

    backend = VLLMBackend(sse_stub([(400, ['{"error": {"message": "prompt too long"}}'])]).url, "m", max_retries=2)
    with pytest.raises(BackendError, match="prompt too long"):
        list(backend.stream([1], SamplingParams(max_tokens=3)))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dead = VLLMBackend(f"http://127.0.0.1:{port}", "m", max_retries=1, backoff_s=0.01)
    with pytest.raises(BackendUnavailable):
        list(dead.stream([1], SamplingParams(max_tokens=3)))
    with pytest.raises(BackendUnavailable, match="circuit open"):  # the breaker covers streams too
        list(dead.stream([1], SamplingParams(max_tokens=3)))
