"""OpenAPI tools and shadow replays against the demo library served by uvicorn on loopback.

The production service counts every request it receives; these tests read that log to
show that training replays sent it no mutating request, with and without a sandbox.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage
from langchain_core.tools import BaseTool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

from examples.library_service import DemoServer, create_app
from seed_agents.serve import free_port
from seed_agents.tools.openapi import AuthConfig, load_spec, openapi_tools
from seed_agents.tools.replay import Recording, ReplayConfig, ReplayTransport, Unreplayable

pytestmark = pytest.mark.integration

PROD_KEY, SANDBOX_KEY = "prod-key-integration-9d41c7", "sandbox-key-integration-52be0a"
AUTH = AuthConfig(kind="header", env="LIBRARY_KEY")
ORIGINAL = [("search_books", {"q": "dune"}), ("borrow_book", {"book_id": 1, "member_id": "ann"}),
            ("list_loans", {"member_id": "ann"}), ("return_book", {"loan_id": 1})]
DEVIATES = [("search_books", {"q": "foundation"}), ("borrow_book", {"book_id": 5, "member_id": "ann"})]


@pytest.fixture
def prod(monkeypatch: pytest.MonkeyPatch) -> Iterator[DemoServer]:
    monkeypatch.setenv("LIBRARY_KEY", PROD_KEY)
    with DemoServer(create_app(api_key=PROD_KEY)) as server:
        yield server


@pytest.fixture
def sandbox(monkeypatch: pytest.MonkeyPatch) -> Iterator[DemoServer]:
    monkeypatch.setenv("SANDBOX_KEY", SANDBOX_KEY)
    with DemoServer(create_app(api_key=SANDBOX_KEY)) as server:
        yield server


def live_tools(server: DemoServer, spec: dict[str, Any] | None = None, **fields: Any) -> dict[str, BaseTool]:
    """Tools generated from the service's live /openapi.json (or from ``spec``, fetched from it once)."""
    tools = openapi_tools(spec or f"{server.url}/openapi.json", base_url=server.url, allow_hosts=["127.0.0.1"], auth=AUTH, **fields)
    return {t.name: t for t in tools}


async def episode(tools: dict[str, BaseTool], steps: list[tuple[str, dict[str, Any]]]) -> list[str] | Unreplayable:
    """What the runner does with one replay: play it; an Unreplayable ends it as a fault."""
    try:
        return [await tools[name].ainvoke(args) for name, args in steps]
    except Unreplayable as signal:
        return signal


def record_original(prod: DemoServer, path: Path) -> Recording:
    recording = Recording(path=path)
    transport = ReplayTransport(ReplayConfig(mode="record", secret_envs=("LIBRARY_KEY",)), recording)
    tools = live_tools(prod, transport=transport)
    results = [tools[name].invoke(args) for name, args in ORIGINAL]
    assert '"member_id":"ann"' in results[1] and '"returned":true' in results[3]
    return Recording.load(path, append=False)


def test_tools_from_the_live_spec_call_the_service(prod: DemoServer) -> None:
    tools = live_tools(prod)
    assert {n: t.metadata["mutating"] for n, t in tools.items()} == {
        "search_books": False, "get_book": False, "list_loans": False, "borrow_book": True, "return_book": True}
    borrow = tools["borrow_book"].tool_call_schema.model_json_schema()
    assert sorted(borrow["required"]) == ["book_id", "member_id"] and borrow["properties"]["days"]["default"] == 14
    genre = tools["search_books"].tool_call_schema.model_json_schema()["properties"]["genre"]
    assert genre["anyOf"][0]["enum"] == ["fiction", "science", "history", "fantasy"]
    assert "The Hobbit" in tools["search_books"].invoke({"q": "hobbit"})
    assert '"book_id":2' in tools["borrow_book"].invoke({"book_id": 2, "member_id": "ann", "days": 7})
    assert "already on loan" in tools["borrow_book"].invoke({"book_id": 2, "member_id": "bob"})
    assert '"available":false' in asyncio.run(tools["get_book"].ainvoke({"book_id": 2}))
    assert prod.log.counts()["POST /loans"] == 2


def test_allowlists_refuse_other_hosts_and_operations(prod: DemoServer) -> None:
    with pytest.raises(ValueError, match="not in allow_hosts"):
        openapi_tools(f"{prod.url}/openapi.json", base_url=prod.url.replace("127.0.0.1", "localhost"), allow_hosts=["127.0.0.1"])
    with pytest.raises(ValueError, match="not in allow_hosts"):
        openapi_tools(f"{prod.url}/openapi.json", base_url=prod.url, allow_hosts=["localhost"])  # the spec URL's host too
    read_only = live_tools(prod, allow_operations=["search_books", "get_book"])
    assert set(read_only) == {"search_books", "get_book"}


def test_every_failure_reaches_the_model_as_a_message(prod: DemoServer, monkeypatch: pytest.MonkeyPatch) -> None:
    down = {t.name: t for t in openapi_tools(create_app().openapi(), base_url=f"http://127.0.0.1:{free_port()}", allow_hosts=["127.0.0.1"],
                                             max_retries=1, backoff_s=0.01)}
    calls = [("get_book", {"book_id": 99}), ("return_book", {"loan_id": 42}), ("borrow_book", {"book_id": "one"}),
             ("search_books", {"limit": 0})]
    tools = live_tools(prod)
    messages = [{"name": n, "args": a, "id": f"c{i}", "type": "tool_call"} for i, (n, a) in enumerate(calls)]
    graph = StateGraph(MessagesState)
    graph.add_node("tools", ToolNode(list(tools.values())))  # default handling: a raised exception would escape
    graph.add_edge(START, "tools")
    graph.add_edge("tools", END)
    out = graph.compile().invoke({"messages": [AIMessage("", tool_calls=messages)]})["messages"][1:]
    assert [m.status for m in out] == ["error"] * 4
    assert "HTTP 404 Not Found: no book with id 99" in out[0].content and "no loan with id 42" in out[1].content
    assert "invalid arguments for borrow_book" in out[2].content and "limit" in out[3].content
    assert "cannot reach the service" in down["get_book"].invoke({"book_id": 1})
    monkeypatch.setenv("LIBRARY_KEY", "a-wrong-key-123456")
    assert "HTTP 401 Unauthorized" in tools["list_loans"].invoke({})


def test_shadow_replays_without_a_sandbox_send_no_mutating_request_to_production(prod: DemoServer, tmp_path: Path) -> None:
    recording = record_original(prod, tmp_path / "session.jsonl")
    assert PROD_KEY not in (tmp_path / "session.jsonl").read_text()
    spec = load_spec(f"{prod.url}/openapi.json", allow_hosts=["127.0.0.1"])  # once, as the loop would
    writes_before, reads_before = prod.log.mutating(), len(prod.log.entries()) - prod.log.mutating()
    base = ReplayTransport(ReplayConfig(mode="shadow", read_source="live", live_reads_per_s=50, live_read_burst=10), recording)
    forks = [base.fork() for _ in range(3)]  # G = 3 replays of the same production task, concurrently
    plans = [ORIGINAL, ORIGINAL, DEVIATES]
    results = asyncio.run(_gather([episode(live_tools(prod, spec, transport=f), p) for f, p in zip(forks, plans, strict=True)]))
    base.close()

    assert prod.log.mutating() == writes_before  # the proof: production saw no write from a replay
    live_reads = sum(f.counters.live_reads for f in forks)
    assert live_reads == 5 and len(prod.log.entries()) - prod.log.mutating() == reads_before + live_reads
    for f in forks[:2]:  # reads live (as configured), both writes answered from the recording
        assert f.counters.as_dict() == {"live_reads": 2, "live_writes": 0, "recorded": 2, "sandbox_writes": 0,
                                        "blocked_writes": 2, "misses": 0}
        assert f.unreplayable is None
    assert all(not isinstance(r, Unreplayable) for r in results[:2])
    assert isinstance(results[2], Unreplayable) and forks[2].unreplayable is results[2]  # borrowed a book nobody recorded


def test_shadow_replays_with_a_sandbox_write_only_to_the_sandbox(prod: DemoServer, sandbox: DemoServer, tmp_path: Path) -> None:
    recording = record_original(prod, tmp_path / "session.jsonl")
    writes_before = prod.log.mutating()
    config = ReplayConfig(mode="shadow", read_source="recording", production_base_url=prod.url, sandbox_base_url=sandbox.url,
                          sandbox_auth=AuthConfig(kind="header", env="SANDBOX_KEY"))
    base = ReplayTransport(config, recording)
    forks = [base.fork() for _ in range(2)]
    spec = load_spec(f"{prod.url}/openapi.json", allow_hosts=["127.0.0.1"])
    results = asyncio.run(_gather([episode(live_tools(prod, spec, transport=f), p) for f, p in zip(forks, [ORIGINAL, DEVIATES], strict=True)]))
    base.close()

    assert prod.log.mutating() == writes_before
    assert sandbox.log.counts() == {"POST /loans": 2, "POST /loans/1/return": 1}  # a 401 would mean production's key leaked
    assert '"book_id":5' in results[1][1]  # the deviating write is served by the sandbox, not unreplayable
    assert forks[0].counters.sandbox_writes == 2 and forks[1].counters.sandbox_writes == 1
    assert forks[0].counters.live_reads == 0 and forks[0].counters.recorded == 2  # reads from the recording, as configured
    assert forks[1].counters.live_reads == 1  # "foundation" was never searched in production: read live, under the limit
    assert all(f.unreplayable is None for f in forks)


async def _gather(coros: list[Any]) -> list[Any]:
    return await asyncio.gather(*coros)


def test_an_unreplayable_write_ends_the_agent_episode_as_a_fault(prod: DemoServer, tiny_model_dir, tmp_path: Path) -> None:
    """The whole path: a tool agent (graphs.tool_agent) whose model asks for a write the
    recording does not hold; the runner records an `unreplayable` fault, never a failure."""
    from transformers import AutoTokenizer

    from seed_agents.chat_model import SeedChatModel
    from seed_agents.graphs.tool_agent import build_tool_agent
    from seed_agents.runner import EpisodeRunner, RunnerConfig
    from seed_agents.testing import FakeBackend
    from seed_agents.types import FaultKind, Task

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    recording = record_original(prod, tmp_path / "session.jsonl")
    transport = ReplayTransport(ReplayConfig(mode="shadow", read_source="recording"), recording)
    call = '<tool_call>\n{"name": "borrow_book", "arguments": {"book_id": 5, "member_id": "ann"}}\n</tool_call>'
    llm = SeedChatModel(backend=FakeBackend(tokenizer, call), tokenizer=tokenizer)
    graph = build_tool_agent(llm, list(live_tools(prod, transport=transport).values()))
    writes_before = prod.log.mutating()
    runner = EpisodeRunner(graph, RunnerConfig(group_size=1, progress=False))
    (traj,) = asyncio.run(runner.run([Task(task_id="borrow", data={"question": "Borrow book 5 for ann."})]))
    assert traj.fault == FaultKind.UNREPLAYABLE and "would change production data" in traj.error
    assert len(traj.calls) == 1 and not traj.trainable
    assert prod.log.mutating() == writes_before
