"""The capture gateway in front of the real CPU vLLM server (tiny random model).

- an ``openai`` SDK client and a LangGraph agent on ``ChatOpenAI(base_url=gateway)`` run
  multi-turn tool conversations (the random model cannot call tools, so the tests append
  the tool calls and results themselves); every stored call is checked token-exactly:
  replaying its prompt ids straight to vLLM with the same seed gives the same completion
  ids, and vLLM's re-scoring (``prompt_logprobs``) matches the stored logprobs to 1e-3;
- streaming and non-streaming store the same record;
- a client that disconnects mid-stream leaves no call;
- a gateway subprocess (the real CLI) under 64 concurrent sessions: 0 lost, 0 duplicated,
  0 half-written calls, canary secrets absent from the store and its log; then kill -9
  mid-load loses at most the calls in flight and stores none half.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, MessagesState, StateGraph

from seed_agents.backends.vllm import VLLMBackend
from seed_agents.serve import VLLMServer, free_port
from seed_agents.store import TraceStore
from seed_agents.types import LLMCall

pytestmark = pytest.mark.integration

TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Weather in a city.",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
CANARY_KEY = "sk-gwcanary0a1b2c3d4e5f6a7b8c9d"
CANARY_ENV_VALUE = "integration-canary-5d2e8f0a91"


class ThreadedGateway:
    """The gateway app under uvicorn on a loopback port, in a thread of this process."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", access_log=False))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ThreadedGateway:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("gateway did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def gw(vllm_server: VLLMServer, tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ThreadedGateway, TraceStore]]:
    from seed_agents.gateway.app import build_app
    from seed_agents.gateway.config import GatewayConfig
    from seed_agents.gateway.upstream import Upstream

    db = tmp_path_factory.mktemp("gateway") / "traces.db"
    store = TraceStore.open(f"sqlite:///{db}")
    name = vllm_server.served_model_name
    cfg = GatewayConfig(upstream=vllm_server.url, model=name)
    app = build_app(cfg, store, Upstream(vllm_server.url, name, retries=1), tokenizer=tokenizer)
    with ThreadedGateway(app) as server:
        yield server, store
    store.close()


@pytest.fixture(scope="module")
def backend(vllm_server: VLLMServer) -> Iterator[VLLMBackend]:
    b = VLLMBackend(vllm_server.url, vllm_server.served_model_name, max_retries=1)
    yield b
    b.close()


def assert_token_exact(call: LLMCall, vllm_server: VLLMServer, backend: VLLMBackend) -> None:
    """The stored ids are what vLLM sampled, and the stored logprobs what it computes."""
    assert call.completion_ids and len(call.completion_ids) == len(call.logprobs)
    params = call.sampling
    body = {"model": vllm_server.served_model_name, "prompt": call.prompt_ids, "max_tokens": params.max_tokens,
            "temperature": params.temperature, "top_p": params.top_p, "seed": params.seed, "logprobs": 0,
            "return_token_ids": True, "stop_token_ids": list(params.stop_token_ids)}
    replay = httpx.post(f"{vllm_server.url}/v1/completions", json=body, timeout=60).json()["choices"][0]
    assert replay["token_ids"] == call.completion_ids
    rescored = backend.score(call.prompt_ids, call.completion_ids)
    assert max(abs(a - b) for a, b in zip(rescored, call.logprobs, strict=True)) < 1e-3


# -- clients: openai SDK and LangGraph ------------------------------------------------------------


def test_openai_sdk_multi_turn_tool_conversation(gw, vllm_server, backend, tokenizer):
    server, store = gw
    client = openai.OpenAI(base_url=f"{server.url}/s/sdk-1/v1", api_key="unused", max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You look up the weather."},
                                      {"role": "user", "content": "Weather in Paris?"}]
    for turn in range(3):
        raw = client.chat.completions.with_raw_response.create(
            model=vllm_server.served_model_name, messages=messages, tools=TOOLS, temperature=0.8, seed=turn, max_tokens=12,
            extra_headers={"X-Task-Key": "weather"})
        assert raw.headers["x-session-id"] == "sdk-1"
        reply = raw.parse()
        assert reply.choices[0].finish_reason in ("stop", "length") and reply.usage.completion_tokens > 0
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
        # the random model cannot call tools: the conversation carries on as if it had
        call_id = f"call_{turn}"
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": "lookup", "arguments": json.dumps({"city": "Paris"})}}]})
        messages.append({"role": "tool", "tool_call_id": call_id, "content": f"sunny, {20 + turn} C"})
    calls = store.calls("sdk-1")
    assert len(calls) == 3 and store.get_session("sdk-1").task_key == "weather"
    assert "sunny, 21 C" in tokenizer.decode(calls[2].prompt_ids) and "<tools>" in tokenizer.decode(calls[0].prompt_ids)
    for call in calls:
        assert_token_exact(call, vllm_server, backend)


def test_langgraph_agent_on_chat_openai(gw, vllm_server, backend, tokenizer):
    server, store = gw

    @tool
    def lookup(city: str) -> str:
        """Weather in a city."""
        return f"{city}: rain, 12 C"

    llm = ChatOpenAI(model=vllm_server.served_model_name, base_url=f"{server.url}/v1", api_key="unused",
                     temperature=0.7, max_tokens=10, seed=11, max_retries=0,
                     default_headers={"X-Session-Id": "graph-1", "X-Task-Key": "weather"}).bind_tools([lookup])

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [llm.invoke(state["messages"])]}

    def scripted_tool(state: MessagesState) -> dict[str, Any]:
        n = sum(isinstance(m, ToolMessage) for m in state["messages"])
        call = {"name": "lookup", "args": {"city": ["Oslo", "Rome"][n]}, "id": f"call_{n}"}
        return {"messages": [AIMessage("", tool_calls=[call]), ToolMessage(lookup.invoke(call["args"]), tool_call_id=call["id"])]}

    def route(state: MessagesState) -> str:
        return "tool" if sum(isinstance(m, ToolMessage) for m in state["messages"]) < 2 else END

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tool", scripted_tool)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", route, ["tool", END])
    builder.add_edge("tool", "agent")
    final = builder.compile().invoke({"messages": [HumanMessage("Weather in Oslo and Rome?")]})

    assert sum(isinstance(m, AIMessage) for m in final["messages"]) == 5  # 3 model replies + 2 scripted calls
    calls = store.calls("graph-1")
    assert len(calls) == 3
    assert "Rome: rain, 12 C" in tokenizer.decode(calls[2].prompt_ids)
    for call in calls:
        assert_token_exact(call, vllm_server, backend)


def test_streaming_and_non_streaming_store_the_same_record(gw, vllm_server):
    server, store = gw
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    kwargs = {"model": vllm_server.served_model_name, "messages": [{"role": "user", "content": "Tell me a story."}],
              "temperature": 0.0, "seed": 5, "max_tokens": 24}
    plain = client.chat.completions.with_raw_response.create(**kwargs)
    with client.chat.completions.with_streaming_response.create(**kwargs, stream=True) as streamed:
        sid = streamed.headers["x-session-id"]
        text = "".join(chunk.choices[0].delta.content or "" for chunk in streamed.parse() if chunk.choices)
    (a,) = store.calls(plain.headers["x-session-id"])
    (b,) = store.calls(sid)
    assert a.prompt_ids == b.prompt_ids and a.completion_ids == b.completion_ids and a.text == b.text
    assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4
    assert text == plain.parse().choices[0].message.content


def test_client_disconnecting_mid_stream_stores_nothing(gw, vllm_server):
    server, store = gw
    # 1500 tokens take ~7 s here: long enough to see whether vLLM keeps generating
    body = {"model": vllm_server.served_model_name, "messages": [{"role": "user", "content": "Go on and on."}],
            "stream": True, "max_tokens": 1500, "temperature": 1.0, "seed": 1}
    with httpx.Client(timeout=30) as client, client.stream("POST", f"{server.url}/v1/chat/completions", json=body,
                                                           headers={"X-Session-Id": "quitter"}) as r:
        assert r.status_code == 200
        next(r.iter_lines())  # one chunk, then hang up
    time.sleep(1.0)
    # the gateway closed its upstream stream, so vLLM aborted the request
    metrics = httpx.get(f"{vllm_server.url}/metrics", timeout=10).text
    running = [line for line in metrics.splitlines() if line.startswith("vllm:num_requests_running")]
    assert running and float(running[0].rsplit(" ", 1)[1]) == 0.0, running
    assert store.get_session("quitter") is None
    assert server.server.config.app.state.gateway.stats["streams_not_stored"] >= 1


# -- a gateway subprocess under load, then kill -9 --------------------------------------------------


class GatewayProcess:
    """``python -m seed_agents.gateway`` (the CLI command) with its log in a file."""

    def __init__(self, vllm_server: VLLMServer, tiny_model_dir: str, work: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.db = work / "traces.db"
        self.log_path = work / "gateway.log"
        config = work / "gateway.yaml"
        config.write_text(json.dumps({"security": {"redact_env": ["GW_CANARY"]}, "default_max_tokens": 8}))
        self.cmd = [sys.executable, "-m", "seed_agents.gateway", "--upstream", vllm_server.url,
                    "--model", vllm_server.served_model_name, "--tokenizer", tiny_model_dir,
                    "--store", f"sqlite:///{self.db}", "--port", str(self.port), "--config", str(config)]
        self.env = {**os.environ, "GW_CANARY": CANARY_ENV_VALUE, "SEED_GATEWAY_CLIENT_KEYS": "load-client-key"}
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> GatewayProcess:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.db.parent)
        deadline = time.monotonic() + 90
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited: {self.log_path.read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"gateway not up: {self.log_path.read_text()[-2000:]}")
            time.sleep(0.2)

    def kill9(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill9()


async def run_session(client: httpx.AsyncClient, url: str, model: str, sid: str, turns: int, done: list[tuple[str, str]],
                      secret: str | None = None) -> None:
    """One multi-turn session; every turn whose reply fully arrived goes into ``done``."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"Session {sid}: say something."}]
    for turn in range(turns):
        if secret and turn == 1:
            messages.append({"role": "tool", "tool_call_id": "c0", "content": f"config: key={secret} pw={CANARY_ENV_VALUE}"})
        # no seed: vLLM 0.32 on CPU crashes its engine when a seeded request's prompt is split by
        # chunked prefill ("CPU Generator does not use offset"), which 64 concurrent prompts cause
        body = {"model": model, "messages": messages, "max_tokens": 6, "temperature": 1.0, "stream": turn % 2 == 1}
        headers = {"X-Session-Id": sid, "Authorization": "Bearer load-client-key"}
        if body["stream"]:
            async with client.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers) as r:
                assert r.status_code == 200, await r.aread()
                lines = [line async for line in r.aiter_lines() if line.startswith("data: ")]
                assert lines[-1] == "data: [DONE]", lines[-1]
                content = "".join(json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                                  for line in lines[:-1] if json.loads(line[6:]).get("choices"))
                call_id = r.headers["x-call-id"]
        else:
            r = await client.post(f"{url}/v1/chat/completions", json=body, headers=headers)
            assert r.status_code == 200, r.text
            content, call_id = r.json()["choices"][0]["message"]["content"], r.headers["x-call-id"]
        done.append((sid, call_id))
        messages += [{"role": "assistant", "content": content}, {"role": "user", "content": "and then?"}]


async def load(url: str, model: str, sessions: list[str], turns: int, done: list[tuple[str, str]],
               kill_after: int | None = None, kill: Any = None) -> list[BaseException]:
    limits = httpx.Limits(max_connections=len(sessions), max_keepalive_connections=len(sessions))
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        tasks = [asyncio.create_task(run_session(client, url, model, sid, turns, done, CANARY_KEY if i == 0 else None))
                 for i, sid in enumerate(sessions)]
        if kill_after is not None:
            while len(done) < kill_after:
                await asyncio.sleep(0.02)
            kill()
        results = await asyncio.gather(*tasks, return_exceptions=True)
    return [r for r in results if isinstance(r, BaseException)]


def stored_calls(db: Path) -> dict[str, list[LLMCall]]:
    with TraceStore.open(f"sqlite:///{db}") as store:
        return {s.session_id: store.calls(s.session_id) for s in store.sessions()}


def test_load_then_kill9(vllm_server, tiny_model_dir, tmp_path):
    model = vllm_server.served_model_name
    # 1) 64 concurrent sessions x 4 turns (half of them streamed): every call stored exactly once
    sessions = [f"load-{i:02d}" for i in range(64)]
    done: list[tuple[str, str]] = []
    work = tmp_path / "run1"
    work.mkdir()
    started = time.perf_counter()
    with GatewayProcess(vllm_server, tiny_model_dir, work) as gwp:
        errors = asyncio.run(load(gwp.url, model, sessions, 4, done))
        unauthorized = httpx.post(f"{gwp.url}/v1/chat/completions", json={"model": model, "messages": []})
    wall = time.perf_counter() - started
    assert errors == [] and len(done) == 256 and unauthorized.status_code == 401
    stored = stored_calls(gwp.db)
    assert sorted(stored) == sessions
    for sid in sessions:  # 0 lost, 0 duplicated, in turn order
        assert [c.call_id for c in stored[sid]] == [cid for s, cid in done if s == sid]
    assert all(c.prompt_ids and c.completion_ids and len(c.completion_ids) == len(c.logprobs) for cs in stored.values() for c in cs)
    written = b"".join(p.read_bytes() for p in work.iterdir() if p.is_file())  # db, WAL, log, config
    assert CANARY_KEY.encode() not in written and CANARY_ENV_VALUE.encode() not in written
    assert b"flagged" in gwp.log_path.read_bytes()
    print(f"load: 256 calls from 64 concurrent sessions in {wall:.1f} s (incl. gateway start-up)")

    # 2) the same load, kill -9 after 60 finished calls: finished calls all stored, none half
    done2: list[tuple[str, str]] = []
    work2 = tmp_path / "run2"
    work2.mkdir()
    with GatewayProcess(vllm_server, tiny_model_dir, work2) as gwp2:
        errors2 = asyncio.run(load(gwp2.url, model, [f"kill-{i:02d}" for i in range(64)], 4, done2, kill_after=60, kill=gwp2.kill9))
    assert errors2, "the kill should have broken some sessions"
    con = sqlite3.connect(gwp2.db)
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    con.close()
    stored2 = {c.call_id: c for cs in stored_calls(gwp2.db).values() for c in cs}  # every row validates as an LLMCall
    finished = {cid for _, cid in done2}
    assert finished <= set(stored2)  # an answered call is a stored call
    in_flight = len(stored2) - len(finished)
    assert 0 <= in_flight <= len(errors2)  # extra stored calls are at most the ones cut off in flight
    assert all(len(c.completion_ids) == len(c.logprobs) > 0 for c in stored2.values())
    print(f"kill -9: {len(finished)} calls answered before the kill, {len(stored2)} stored, "
          f"{len(errors2)} sessions cut off ({in_flight} of their in-flight calls made it into the store)")
