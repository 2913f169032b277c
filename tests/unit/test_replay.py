"""The record/replay/shadow transport: deterministic matching, recordings, and the promise
that a shadow replay never sends a mutating request to production. The "production"
and "sandbox" APIs are the demo library app, in-process (no sockets)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from langchain_core.messages import AIMessage
from langchain_core.tools import BaseTool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

from examples.library_service import create_app
from seed_agents.tools.openapi import AuthConfig, openapi_tools, read_only_predicate
from seed_agents.tools.replay import (
    MISS_STATUS,
    REPLAY_HEADER,
    Exchange,
    Recording,
    ReplayConfig,
    ReplayTransport,
    TokenBucket,
    Unreplayable,
    match_key,
)

PROD, SANDBOX = "https://library.prod", "https://library.sandbox"
SPEC = create_app().openapi()
EPISODE = [("search_books", {"q": "dune"}), ("borrow_book", {"book_id": 1, "member_id": "ann"}), ("get_book", {"book_id": 1}),
           ("borrow_book", {"book_id": 1, "member_id": "ann"}), ("list_loans", {"member_id": "ann"}),
           ("return_book", {"loan_id": 1}), ("get_book", {"book_id": 1})]
PROD_KEY, SANDBOX_KEY = "prod-key-2b7e151628aed2a6", "sandbox-key-3c4fcf098815"


def served(**apps: FastAPI) -> httpx.MockTransport:
    """A transport to in-process apps by host name: ``served(**{"library.prod": app})``."""
    clients = {host: TestClient(app) for host, app in apps.items()}

    def handle(request: httpx.Request) -> httpx.Response:
        client = clients.get(request.url.host)
        if client is None:
            raise httpx.ConnectError(f"no route to {request.url.host}")
        r = client.request(request.method, request.url.raw_path.decode(), content=request.content,
                           headers={k: v for k, v in request.headers.items() if k != "host"})
        return httpx.Response(r.status_code, headers=r.headers, content=r.content)

    return httpx.MockTransport(handle)


def nowhere(request: httpx.Request) -> httpx.Response:
    raise AssertionError(f"{request.method} {request.url} reached the network")


def library_tools(transport: httpx.BaseTransport, **fields: Any) -> dict[str, BaseTool]:
    tools = openapi_tools(SPEC, base_url=PROD, allow_hosts=["library.prod"], transport=transport, **fields)
    return {t.name: t for t in tools}


def play(tools: dict[str, BaseTool], episode: list[tuple[str, dict[str, Any]]] = EPISODE) -> list[str]:
    return [tools[name].invoke(args) for name, args in episode]


async def aplay(tools: dict[str, BaseTool], episode: list[tuple[str, dict[str, Any]]] = EPISODE) -> list[str]:
    return [await tools[name].ainvoke(args) for name, args in episode]


@pytest.fixture
def recorded() -> tuple[Recording, list[str]]:
    """The original production session: EPISODE recorded against a fresh library."""
    recording = Recording()
    transport = ReplayTransport(ReplayConfig(mode="record"), recording, live=served(**{"library.prod": create_app()}))
    outputs = play(library_tools(transport))
    assert transport.counters.live_writes == 3 and transport.counters.live_reads == 4
    return recording, outputs


# --------------------------------------------------------------------------- matching


def test_match_key_ignores_host_query_order_json_spacing_and_volatile_params() -> None:
    a = match_key("get", httpx.URL("https://a.example/books?q=x&limit=5&nonce=1"), b"", ignore_query=["nonce"])
    b = match_key("GET", httpx.URL("http://b.example:81/books?limit=5&q=x&nonce=2"), b"", ignore_query=["nonce"])
    assert a == b == "GET /books?limit=5&q=x"
    post = match_key("POST", httpx.URL("https://a/loans"), b'{"b": 1, "a": [1, 2]}')
    assert post == match_key("POST", httpx.URL("https://b/loans"), b'{"a":[1,2],"b":1}')
    assert post != match_key("POST", httpx.URL("https://a/loans"), b'{"a":[1,2],"b":2}')
    assert post.startswith("POST /loans #")


# ------------------------------------------------------------------- record / replay


def test_record_then_replay_gives_identical_tool_outputs(recorded: tuple[Recording, list[str]]) -> None:
    recording, outputs = recorded
    assert [e.status for e in recording.exchanges] == [200, 201, 200, 409, 200, 200, 200]
    transport = ReplayTransport(ReplayConfig(mode="replay"), recording, live=httpx.MockTransport(nowhere))
    assert play(library_tools(transport)) == outputs
    assert transport.counters.as_dict() == {"live_reads": 0, "live_writes": 0, "recorded": 7, "sandbox_writes": 0,
                                            "blocked_writes": 3, "misses": 0}


async def test_async_replay_matches_the_sync_recording(recorded: tuple[Recording, list[str]]) -> None:
    recording, outputs = recorded
    transport = ReplayTransport(ReplayConfig(mode="replay"), recording, live=httpx.MockTransport(nowhere))
    assert await aplay(library_tools(transport)) == outputs


def test_a_repeated_read_gets_the_last_answer_but_a_write_is_answered_once(recorded: tuple[Recording, list[str]]) -> None:
    recording, outputs = recorded
    tools = library_tools(ReplayTransport(ReplayConfig(mode="replay"), recording))
    reads = [tools["get_book"].invoke({"book_id": 1}) for _ in range(3)]
    assert reads[0] == outputs[2] and '"available":false' in reads[0]  # the n-th read gets the n-th answer
    assert reads[1] == reads[2] == outputs[6] and '"available":true' in reads[1]  # past the recording: the latest one
    assert [tools["return_book"].invoke({"loan_id": 1}) for _ in range(2)][1].startswith(f"Error: return_book failed with HTTP {MISS_STATUS}")


def test_a_replay_miss_is_an_error_the_agent_sees_and_is_counted(recorded: tuple[Recording, list[str]]) -> None:
    transport = ReplayTransport(ReplayConfig(mode="replay"), recorded[0])
    result = library_tools(transport)["get_book"].invoke({"book_id": 5})
    assert result.startswith("Error: get_book failed with HTTP 424") and "no recorded response for GET /books/5" in result
    assert transport.counters.misses == 1


def test_any_httpx_client_can_use_the_transport(recorded: tuple[Recording, list[str]]) -> None:
    with httpx.Client(transport=ReplayTransport(ReplayConfig(mode="replay"), recorded[0])) as client:
        response = client.get("http://anywhere.example/books?limit=10&available_only=false&q=dune")
    assert response.status_code == 200 and response.json()[0]["title"] == "Dune"
    assert response.headers[REPLAY_HEADER] == "recorded" and response.headers["content-type"] == "application/json"


def test_a_recording_round_trips_through_jsonl_and_survives_a_torn_line(tmp_path: Any, recorded: tuple[Recording, list[str]]) -> None:
    path = tmp_path / "session.jsonl"
    on_disk = Recording(path=path)
    for exchange in recorded[0].exchanges:
        on_disk.append(exchange)
    with path.open("a") as f:
        f.write('{"key": "GET /bo')  # killed mid-line
    loaded = Recording.load(path)
    assert loaded.exchanges == recorded[0].exchanges
    assert play(library_tools(ReplayTransport(ReplayConfig(mode="replay"), loaded))) == recorded[1]
    path.write_text("not json\n" + path.read_text())
    with pytest.raises(ValueError, match="session.jsonl:1 is not a recorded exchange"):
        Recording.load(path)


def test_recordings_never_hold_credentials(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIB_KEY", PROD_KEY)
    echo = httpx.MockTransport(lambda r: httpx.Response(200, json={"key": r.headers["x-api-key"], "q": r.url.params["q"]},
                                                        headers={"location": f"/x?token={r.headers['x-api-key']}"}))
    recording = Recording(path=tmp_path / "rec.jsonl")
    transport = ReplayTransport(ReplayConfig(mode="record"), recording, live=echo)
    tools = library_tools(transport, auth=AuthConfig(kind="header", env="LIB_KEY"))
    tools["search_books"].invoke({"q": PROD_KEY})
    text = (tmp_path / "rec.jsonl").read_text()
    assert PROD_KEY not in text and PROD_KEY[:10] not in text and "***" in text


# ---------------------------------------------------------------------------- shadow


def test_shadow_without_sandbox_never_sends_a_write_to_production(recorded: tuple[Recording, list[str]]) -> None:
    recording, outputs = recorded
    prod = create_app()
    transport = ReplayTransport(ReplayConfig(mode="shadow", read_source="live"), recording, live=served(**{"library.prod": prod}))
    results = play(library_tools(transport))
    assert prod.state.log.mutating() == 0
    assert prod.state.log.counts() == {"GET /books": 1, "GET /books/1": 2, "GET /loans": 1}  # reads went live, as configured
    assert [results[i] for i in (1, 3)] == [outputs[i] for i in (1, 3)]  # the borrow (201) and the 409 came from the recording
    assert transport.counters.as_dict() == {"live_reads": 4, "live_writes": 0, "recorded": 3, "sandbox_writes": 0,
                                            "blocked_writes": 3, "misses": 0}
    assert transport.unreplayable is None


def test_shadow_reading_from_the_recording_replays_the_original_world(recorded: tuple[Recording, list[str]]) -> None:
    recording, outputs = recorded
    prod = create_app()
    transport = ReplayTransport(ReplayConfig(mode="shadow", read_source="recording_only"), recording,
                                live=served(**{"library.prod": prod}))
    assert play(library_tools(transport)) == outputs
    assert prod.state.log.entries() == []


def test_a_write_with_no_recorded_answer_makes_the_episode_unreplayable(recorded: tuple[Recording, list[str]]) -> None:
    prod = create_app()
    transport = ReplayTransport(ReplayConfig(mode="shadow"), recorded[0], live=served(**{"library.prod": prod}))
    tools = library_tools(transport)
    with pytest.raises(Unreplayable, match="POST /loans would change production data"):
        tools["borrow_book"].invoke({"book_id": 2, "member_id": "bob"})  # the original session borrowed book 1
    assert isinstance(transport.unreplayable, Unreplayable)
    assert transport.counters.misses == 1 and transport.counters.blocked_writes == 1
    assert prod.state.log.mutating() == 0


async def test_unreplayable_leaves_a_graph_or_is_flagged_when_a_tool_node_swallows_it(recorded: tuple[Recording, list[str]]) -> None:
    call = AIMessage("", tool_calls=[{"name": "borrow_book", "args": {"book_id": 2, "member_id": "bob"}, "id": "c", "type": "tool_call"}])
    for handle_errors in (False, True):
        transport = ReplayTransport(ReplayConfig(mode="shadow"), recorded[0], live=httpx.MockTransport(nowhere))
        graph = StateGraph(MessagesState)
        graph.add_node("tools", ToolNode(list(library_tools(transport).values()), handle_tool_errors=handle_errors))
        graph.add_edge(START, "tools")
        graph.add_edge("tools", END)
        if handle_errors:  # a graph that catches everything: the runner still sees the flag
            await graph.compile().ainvoke({"messages": [call]})
        else:
            with pytest.raises(Unreplayable):
                await graph.compile().ainvoke({"messages": [call]})
        assert transport.unreplayable is not None


@pytest.mark.parametrize("use_async", [False, True])
async def test_shadow_writes_go_to_the_sandbox_without_production_credentials(
        recorded: tuple[Recording, list[str]], monkeypatch: pytest.MonkeyPatch, use_async: bool) -> None:
    monkeypatch.setenv("LIB_KEY", PROD_KEY)
    monkeypatch.setenv("SANDBOX_KEY", SANDBOX_KEY)
    prod, sandbox = create_app(api_key=PROD_KEY), create_app(api_key=SANDBOX_KEY)
    config = ReplayConfig(mode="shadow", read_source="live", production_base_url=PROD, sandbox_base_url=SANDBOX,
                          sandbox_auth=AuthConfig(kind="header", env="SANDBOX_KEY"))
    transport = ReplayTransport(config, recorded[0], live=served(**{"library.prod": prod, "library.sandbox": sandbox}))
    tools = library_tools(transport, auth=AuthConfig(kind="header", env="LIB_KEY"))
    results = await aplay(tools) if use_async else play(tools)
    assert results[1].startswith('{"id":1') and "already on loan" in results[3]  # the sandbox's own state answered
    assert prod.state.log.mutating() == 0
    assert sandbox.state.log.counts() == {"POST /loans": 2, "POST /loans/1/return": 1}  # 401 would mean prod's key was sent
    assert transport.counters.sandbox_writes == 3 and transport.counters.blocked_writes == 0


def test_shadow_live_reads_share_a_rate_limit_and_fall_back_to_the_recording(recorded: tuple[Recording, list[str]]) -> None:
    prod = create_app()
    config = ReplayConfig(mode="shadow", read_source="live", live_reads_per_s=0.001, live_read_burst=2, max_wait_s=0)
    first = ReplayTransport(config, recorded[0], live=served(**{"library.prod": prod}))
    second = first.fork()
    play(library_tools(first))
    play(library_tools(second))
    assert first.counters.live_reads + second.counters.live_reads == 2  # the burst, over both episodes
    assert second.counters.live_reads == 0 and second.counters.recorded == 7
    assert [(m, p) for m, p in prod.state.log.entries()] == [("GET", "/books"), ("GET", "/books/1")]


def test_a_fork_starts_a_fresh_episode_on_the_same_recording(recorded: tuple[Recording, list[str]]) -> None:
    base = ReplayTransport(ReplayConfig(mode="replay"), recorded[0])
    assert play(library_tools(base)) == recorded[1]
    fork = base.fork()
    assert play(library_tools(fork)) == recorded[1]  # cursors restart: the same answers in the same order
    assert fork.counters.recorded == 7 and base.counters.recorded == 7


def test_operations_marked_safe_may_read_live_in_shadow_mode() -> None:
    spec = {"openapi": "3.1.0", "info": {"title": "s", "version": "1"}, "paths": {
        "/search": {"post": {"operationId": "search", "requestBody": {"content": {"application/json": {
            "schema": {"type": "object", "properties": {"q": {"type": "string"}}}}}}}},
        "/orders": {"post": {"operationId": "order", "requestBody": {"content": {"application/json": {
            "schema": {"type": "object", "properties": {"sku": {"type": "string"}}}}}}}}}}
    seen: list[str] = []
    live = httpx.MockTransport(lambda r: seen.append(f"{r.method} {r.url.path}") or httpx.Response(200, json={"hits": []}))
    fields = {"base_url": "https://api.example", "allow_hosts": ["api.example"], "safe_operations": ["search"]}
    probe = openapi_tools(spec, **fields)
    transport = ReplayTransport(ReplayConfig(mode="shadow", read_source="live"), Recording(), live=live,
                                is_read_only=read_only_predicate(probe, fields["base_url"]))
    tools = {t.name: t for t in openapi_tools(spec, transport=transport, **fields)}
    assert tools["search"].invoke({"q": "x"}) == '{"hits":[]}'
    with pytest.raises(Unreplayable):
        tools["order"].invoke({"sku": "x"})
    assert seen == ["POST /search"]


# ------------------------------------------------------------------------ parts


def test_token_bucket_allows_bursts_then_the_rate() -> None:
    now = [0.0]
    bucket = TokenBucket(rate_per_s=2.0, burst=2, clock=lambda: now[0])
    assert bucket.reserve(0) == 0.0 and bucket.reserve(0) == 0.0
    assert bucket.reserve(0) is None  # empty; nothing taken
    assert bucket.reserve(1.0) == pytest.approx(0.5)  # a token in half a second, reserved
    now[0] = 2.0
    assert bucket.reserve(0) == 0.0 and bucket.reserve(0) == 0.0 and bucket.reserve(0) is None  # refilled to the burst only
    with pytest.raises(ValueError):
        TokenBucket(rate_per_s=0)


def test_config_keeps_the_sandbox_away_from_production() -> None:
    with pytest.raises(ValueError, match="needs production_base_url"):
        ReplayConfig(mode="shadow", sandbox_base_url=SANDBOX)
    with pytest.raises(ValueError, match="is production's origin"):
        ReplayConfig(mode="shadow", production_base_url=f"{PROD}/v1", sandbox_base_url=f"{PROD}/sandbox")


def test_exchange_lines_are_plain_json(recorded: tuple[Recording, list[str]]) -> None:
    line = json.loads(recorded[0].exchanges[1].model_dump_json())
    assert {k: line[k] for k in ("method", "url", "status", "mutating")} == {
        "method": "POST", "url": "https://library.prod/loans", "status": 201, "mutating": True}
    assert json.loads(line["body"]) == {"book_id": 1, "member_id": "ann", "days": 14}
    assert Exchange.model_validate(line) == recorded[0].exchanges[1]
