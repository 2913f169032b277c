"""Tools generated from an OpenAPI spec: schema mapping, guards, auth, retries, caps, and
the promise that every failure reaches the model as a message, never as an exception."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import httpx
import pytest
from langchain_core.messages import AIMessage, ToolMessage
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

from seed_agents.tools.openapi import (
    AuthConfig,
    OpenAPIToolsConfig,
    load_spec,
    openapi_tools,
    read_only_predicate,
    retry_after_seconds,
)

BASE = "https://shop.example/api"
HOSTS = ["shop.example"]
FAST = {"backoff_s": 0.01, "backoff_max_s": 0.02}
CANARY = "canary-secret-7f3a9c1e5b"

SPEC: dict[str, Any] = {
    "openapi": "3.0.3",
    "info": {"title": "Shop", "version": "1"},
    "paths": {
        "/items": {
            "get": {
                "operationId": "list_items", "summary": "List items", "description": "Items matching a query.",
                "parameters": [
                    {"name": "q", "in": "query", "required": True, "schema": {"type": "string"}, "description": "Search text."},
                    {"name": "page-size", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 50, "default": 10}},
                    {"name": "color", "in": "query", "schema": {"$ref": "#/components/schemas/Color"}},
                    {"name": "tags", "in": "query", "schema": {"type": "array", "items": {"type": "string"}}},
                    {"name": "X-Trace", "in": "header", "schema": {"type": "string"}},
                ],
            },
            "post": {
                "operationId": "create_item", "summary": "Create an item",
                "requestBody": {"required": True, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/NewItem"}}}},
            },
        },
        "/items/{item_id}": {
            "parameters": [{"$ref": "#/components/parameters/ItemId"}],
            "get": {"operationId": "get_item", "summary": "Get one item"},
            "delete": {"operationId": "delete_item", "summary": "Delete an item"},
        },
        "/items/search": {
            "post": {"operationId": "search_items", "summary": "Search with a list of terms",
                     "requestBody": {"content": {"application/json": {"schema": {"type": "array", "items": {"type": "string"}}}}}},
        },
        "/trees": {
            "post": {"operationId": "plant_tree",
                     "requestBody": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Node"}}}}},
        },
        "/upload": {"post": {"operationId": "upload", "requestBody": {"content": {"multipart/form-data": {"schema": {}}}}}},
    },
    "components": {
        "parameters": {"ItemId": {"name": "item_id", "in": "path", "required": True, "schema": {"type": "string"},
                                  "description": "The item's id."}},
        "schemas": {
            "Color": {"type": "string", "enum": ["red", "green", "blue"], "description": "A color."},
            "NewItem": {"type": "object", "required": ["name", "price"], "properties": {
                "name": {"type": "string", "description": "Display name."},
                "price": {"type": "number", "minimum": 0},
                "color": {"$ref": "#/components/schemas/Color"},
                "size": {"$ref": "#/components/schemas/Size"},
                "note": {"type": "string", "nullable": True},
            }},
            "Size": {"type": "object", "required": ["width"], "properties": {"width": {"type": "number"}, "height": {"type": "number"}}},
            "Node": {"type": "object", "properties": {"label": {"type": "string"},
                                                      "children": {"type": "array", "items": {"$ref": "#/components/schemas/Node"}}}},
        },
    },
}


Step = httpx.Response | Exception | Callable[[httpx.Request], httpx.Response]


class FakeAPI:
    """A scripted API: answers from ``script`` in order (then ``default``), records every request."""

    def __init__(self, *script: Step, default: Step | None = None) -> None:
        self.script = list(script)
        self.default = default if default is not None else httpx.Response(200, json={"ok": True})
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        step = self.script.pop(0) if self.script else self.default
        if callable(step):
            step = step(request)
        if isinstance(step, Exception):
            raise step
        return step

    @property
    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self)


def make_tools(api: FakeAPI, **fields: Any) -> dict[str, Any]:
    tools = openapi_tools(SPEC, transport=api.transport, **{"base_url": BASE, "allow_hosts": HOSTS, **FAST, **fields})
    return {t.name: t for t in tools}


def call(tool: Any, args: dict[str, Any]) -> ToolMessage:
    """Invoke as a model's tool call does, so the ToolMessage status is visible."""
    return tool.invoke({"type": "tool_call", "id": "c1", "name": tool.name, "args": args})


# ------------------------------------------------------------------------ the schema


def test_operations_become_tools_with_descriptions_and_mutating_flags() -> None:
    tools = make_tools(FakeAPI(), safe_operations=["search_items"])
    assert set(tools) == {"list_items", "create_item", "get_item", "delete_item", "search_items", "plant_tree"}  # upload: not JSON
    assert tools["list_items"].description == "List items\n\nItems matching a query."
    assert {n: t.metadata["mutating"] for n, t in tools.items()} == {
        "list_items": False, "get_item": False, "search_items": False,  # search_items: POST, but listed as safe
        "create_item": True, "delete_item": True, "plant_tree": True}
    assert tools["get_item"].metadata == {"operation_id": "get_item", "method": "GET", "path": "/items/{item_id}", "mutating": False}


def test_path_query_and_refs_map_to_the_args_schema() -> None:
    schema = make_tools(FakeAPI())["list_items"].tool_call_schema.model_json_schema()
    props = schema["properties"]
    assert schema["required"] == ["q"]
    assert props["q"]["type"] == "string" and props["q"]["description"] == "Search text."
    assert props["page_size"]["default"] == 10  # "page-size": the model sees a Python name, the API gets its own
    assert {"minimum": 1, "maximum": 50, "type": "integer"}.items() <= props["page_size"].items()
    assert props["color"]["anyOf"][0]["enum"] == ["red", "green", "blue"]  # $ref to an enum, optional
    assert props["tags"]["anyOf"][0] == {"items": {"type": "string"}, "type": "array"}
    assert "X-Trace" not in props  # header parameters are not the model's business
    item = make_tools(FakeAPI())["get_item"].tool_call_schema.model_json_schema()
    assert item["required"] == ["item_id"] and item["properties"]["item_id"]["description"] == "The item's id."


def test_json_body_is_flattened_with_nested_refs_resolved() -> None:
    tools = make_tools(FakeAPI())
    schema = tools["create_item"].tool_call_schema.model_json_schema()
    assert sorted(schema["required"]) == ["name", "price"]
    assert schema["properties"]["name"]["description"] == "Display name."
    size = schema["$defs"]["Size"]
    assert size["required"] == ["width"] and set(size["properties"]) == {"width", "height"}
    whole = tools["search_items"].tool_call_schema.model_json_schema()  # a non-object body stays one argument
    assert set(whole["properties"]) == {"body"}
    tree = tools["plant_tree"].tool_call_schema.model_json_schema()  # a recursive schema ends, one level down
    assert "children" in tree["properties"]


def test_requests_carry_path_query_and_body() -> None:
    api = FakeAPI()
    tools = make_tools(api)
    tools["list_items"].invoke({"q": "lamp", "page_size": 5, "color": "red", "tags": ["a", "b"]})
    tools["get_item"].invoke({"item_id": "a/b c"})
    tools["create_item"].invoke({"name": "Lamp", "price": 9.5, "size": {"width": 2}})
    tools["search_items"].invoke({"body": ["x", "y"]})
    listed, got, created, searched = api.requests
    assert listed.method == "GET" and listed.url.path == "/api/items"
    assert sorted(listed.url.params.multi_items()) == [("color", "red"), ("page-size", "5"), ("q", "lamp"), ("tags", "a"), ("tags", "b")]
    assert got.url.raw_path == b"/api/items/a%2Fb%20c"  # one path segment, whatever the value holds
    assert created.method == "POST" and json.loads(created.content) == {"name": "Lamp", "price": 9.5, "size": {"width": 2}}
    assert json.loads(searched.content) == ["x", "y"]


def test_spec_loads_from_yaml_file_and_url(tmp_path: Any) -> None:
    import yaml

    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(SPEC))
    assert load_spec(path)["paths"].keys() == SPEC["paths"].keys()
    served = httpx.MockTransport(lambda r: httpx.Response(200, json=SPEC))
    tools = openapi_tools("https://shop.example/openapi.json", base_url=BASE, allow_hosts=HOSTS, transport=served)
    assert len(tools) == 6
    with pytest.raises(ValueError, match="not in allow_hosts"):
        load_spec("https://evil.example/openapi.json", allow_hosts=HOSTS, transport=served)
    with pytest.raises(ValueError, match="not an OpenAPI 3 document"):
        load_spec({"swagger": "2.0", "paths": {}})


# ----------------------------------------------------------------------- allowlists


def test_operation_allowlist_builds_only_listed_tools() -> None:
    tools = make_tools(FakeAPI(), allow_operations=["list_items", "get_item"])
    assert set(tools) == {"list_items", "get_item"}
    config = OpenAPIToolsConfig(base_url=BASE, allow_hosts=HOSTS, allow_operations=["get_item"])
    assert [t.name for t in openapi_tools(SPEC, config)] == ["get_item"]
    assert [t.name for t in openapi_tools(SPEC, config, allow_operations=["list_items"])] == ["list_items"]  # fields override
    with pytest.raises(ValueError, match="does not have: \\['drop_tables'\\]"):
        make_tools(FakeAPI(), allow_operations=["list_items", "drop_tables"])


def test_base_url_host_must_be_allowed() -> None:
    with pytest.raises(ValueError, match="not in allow_hosts"):
        openapi_tools(SPEC, base_url="https://evil.example/api", allow_hosts=HOSTS)
    with pytest.raises(ValueError):
        OpenAPIToolsConfig(base_url=BASE, allow_hosts=[])


def test_redirects_to_other_hosts_and_operations_are_refused() -> None:
    api = FakeAPI(httpx.Response(302, headers={"location": "https://evil.example/steal"}),
                  httpx.Response(307, headers={"location": f"{BASE}/admin/wipe"}),
                  httpx.Response(302, headers={"location": "http://shop.example/api/items/1"}))
    tools = make_tools(api, allow_operations=["get_item", "create_item"])
    off_host = call(tools["get_item"], {"item_id": "1"})
    assert off_host.status == "error" and "refused: evil.example is not an allowed host" in off_host.content
    off_route = call(tools["create_item"], {"name": "x", "price": 1})
    assert "refused: POST /api/admin/wipe is not an allowed operation" in off_route.content
    downgrade = call(tools["get_item"], {"item_id": "1"})
    assert "refused: a redirect from https to http" in downgrade.content
    assert [str(r.url) for r in api.requests] == [f"{BASE}/items/1", f"{BASE}/items", f"{BASE}/items/1"]  # no redirect was followed


def test_a_path_argument_cannot_change_the_route() -> None:
    api = FakeAPI()
    result = call(make_tools(api)["get_item"], {"item_id": ".."})
    assert result.status == "error" and "invalid path parameter" in result.content and not api.requests


# ----------------------------------------------------------------------------- auth


@pytest.mark.parametrize(("auth", "header", "expected"), [
    (AuthConfig(kind="bearer", env="SHOP_TOKEN"), "authorization", f"Bearer {CANARY}"),
    (AuthConfig(kind="header", env="SHOP_TOKEN", header="X-Api-Key"), "x-api-key", CANARY),
])
def test_auth_is_read_from_the_environment_per_request(monkeypatch: pytest.MonkeyPatch, auth: AuthConfig, header: str, expected: str) -> None:
    api = FakeAPI()
    tools = make_tools(api, auth=auth)
    monkeypatch.setenv("SHOP_TOKEN", CANARY)  # set after the tools were built: read at request time
    tools["get_item"].invoke({"item_id": "1"})
    assert api.requests[0].headers[header] == expected


def test_missing_auth_env_is_a_tool_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SHOP_TOKEN", raising=False)
    api = FakeAPI()
    result = call(make_tools(api, auth=AuthConfig(kind="bearer", env="SHOP_TOKEN"))["get_item"], {"item_id": "1"})
    assert result.status == "error" and "environment variable SHOP_TOKEN is not set" in result.content and not api.requests


def test_canary_secret_never_appears_in_tools_results_or_logs(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("SHOP_TOKEN", CANARY)
    caplog.set_level(logging.DEBUG)
    def echo(r: httpx.Request) -> httpx.Response:
        return httpx.Response(500, json={"detail": f"bad key {r.headers['x-api-key']}"})

    api = FakeAPI(echo, echo, echo, lambda r: httpx.Response(200, json={"you_sent": r.headers["x-api-key"]}),
                  *[httpx.ConnectError(f"refused with {CANARY}")] * 3)
    tools = make_tools(api, auth=AuthConfig(kind="header", env="SHOP_TOKEN"), max_retries=2)
    seen = [call(tools["get_item"], {"item_id": "1"}).content,  # 3 x 500 echoing the key
            call(tools["get_item"], {"item_id": "1"}).content,  # 200 echoing the key
            call(tools["get_item"], {"item_id": "1"}).content,  # connection error mentioning it
            call(tools["list_items"], {"q": 3, "page_size": CANARY}).content]  # invalid args holding it
    surfaces = [*seen, caplog.text, *(repr(t) for t in tools.values()), *(str(t.args) for t in tools.values()),
                *(json.dumps(t.tool_call_schema.model_json_schema()) for t in tools.values()),
                *(json.dumps(t.metadata) for t in tools.values())]
    assert all(CANARY not in s and CANARY[:12] not in s for s in surfaces)
    assert "HTTP 500" in seen[0] and "***" in seen[1]


# --------------------------------------------------------------------------- retries


def test_429_with_retry_after_is_retried_then_succeeds() -> None:
    api = FakeAPI(httpx.Response(429, headers={"retry-after": "1"}), httpx.Response(200, json={"id": "1"}))
    start = time.monotonic()
    result = call(make_tools(api)["get_item"], {"item_id": "1"})
    assert result.status == "success" and json.loads(result.content) == {"id": "1"}
    assert len(api.requests) == 2 and time.monotonic() - start >= 0.95  # waited as told, not the 10 ms backoff


def test_retry_after_longer_than_the_cap_is_not_waited_for() -> None:
    api = FakeAPI(default=httpx.Response(429, headers={"retry-after": "3600"}))
    result = call(make_tools(api, max_retry_after_s=5)["get_item"], {"item_id": "1"})
    assert len(api.requests) == 1 and "HTTP 429" in result.content and "rate limited: try again in 3600 s" in result.content


def test_retry_after_parses_seconds_and_http_dates() -> None:
    now = datetime(2030, 1, 1, tzinfo=UTC)
    assert retry_after_seconds("7") == 7.0
    assert retry_after_seconds(format_datetime(now + timedelta(seconds=30), usegmt=True), now=now.timestamp()) == 30.0
    assert retry_after_seconds(format_datetime(now - timedelta(seconds=30), usegmt=True), now=now.timestamp()) == 0.0
    assert retry_after_seconds("soon") is None and retry_after_seconds(None) is None


def test_5xx_exhausted_is_a_message_not_an_exception() -> None:
    api = FakeAPI(default=httpx.Response(503, json={"detail": "maintenance"}))
    result = call(make_tools(api, max_retries=2)["get_item"], {"item_id": "1"})
    assert len(api.requests) == 3
    assert result.status == "error" and result.content.startswith("Error: get_item failed with HTTP 503 Service Unavailable: maintenance")


def test_a_mutating_call_is_not_retried_after_an_ambiguous_502() -> None:
    api = FakeAPI(default=httpx.Response(502))
    result = call(make_tools(api, max_retries=3)["create_item"], {"name": "x", "price": 1})
    assert len(api.requests) == 1 and "HTTP 502" in result.content


def test_connection_errors_are_retried_then_reported() -> None:
    api = FakeAPI(default=httpx.Response(200))
    api.script = [httpx.ConnectError("refused")] * 3
    result = call(make_tools(api, max_retries=2)["create_item"], {"name": "x", "price": 1})
    assert len(api.requests) == 3 and "cannot reach the service (ConnectError)" in result.content


def test_timeout_is_a_message() -> None:
    result = call(make_tools(FakeAPI(httpx.ReadTimeout("slow")), timeout_s=0.5)["get_item"], {"item_id": "1"})
    assert result.status == "error" and "no answer within 0.5 s" in result.content


# ------------------------------------------------------------------------ size caps


def test_oversized_response_is_truncated_with_a_marker() -> None:
    api = FakeAPI(httpx.Response(200, content=b"x" * 5000))
    result = call(make_tools(api, max_response_bytes=1000)["get_item"], {"item_id": "1"})
    assert result.content.startswith("x" * 1000) and result.content.count("x") == 1000
    assert "[truncated: the response is longer than 1000 bytes" in result.content


def test_oversized_response_can_be_an_error_instead() -> None:
    api = FakeAPI(httpx.Response(200, content=b"x" * 5000), httpx.Response(200, content=iter([b"y" * 800] * 4)))
    tool = make_tools(api, max_response_bytes=1000, oversize="error")["get_item"]
    declared, streamed = call(tool, {"item_id": "1"}), call(tool, {"item_id": "1"})  # with and without Content-Length
    assert "5000 bytes, over the 1000-byte limit" in declared.content and "over the 1000-byte limit" in streamed.content


# ------------------------------------------------------------------ invalid arguments


def test_invalid_arguments_say_what_to_fix() -> None:
    api = FakeAPI()
    tools = make_tools(api)
    missing = call(tools["list_items"], {"page_size": 5})
    wrong = call(tools["list_items"], {"q": "x", "color": "purple", "page_size": 500, "title": "x"})
    assert missing.status == "error" and "invalid arguments for list_items: q: Field required" in missing.content
    assert all(s in wrong.content for s in ("color: Input should be 'red', 'green' or 'blue'", "page_size: Input should be less than or equal to 50",
                                         "title: Extra inputs"))
    assert not api.requests


# ---------------------------------------------------------------- in a LangGraph graph


def _failing(request: httpx.Request) -> httpx.Response | Exception:
    """Each item id fails its own way (calls run concurrently, so no scripted order)."""
    failures: dict[str, httpx.Response | Exception] = {
        "404": httpx.Response(404, json={"detail": "no such item"}), "500": httpx.Response(500),
        "timeout": httpx.ReadTimeout("slow"), "down": httpx.ConnectError("down"),
        "redirect": httpx.Response(302, headers={"location": "https://evil.example/"}),
        "big": httpx.Response(200, content=b"z" * 2000), "429": httpx.Response(429, headers={"retry-after": "999"}),
    }
    return failures[request.url.path.rsplit("/", 1)[-1]]


FAILING_CALLS = [("get_item", {"item_id": i}) for i in ("404", "500", "timeout", "down", "redirect", "big", "429", "..")] + [
    ("list_items", {"color": "purple"}), ("create_item", {}), ("delete_item", {"item_id": "1"}), ("no_such_tool", {})]


@pytest.mark.parametrize("use_async", [False, True])
async def test_a_tool_node_never_raises_on_any_failure(use_async: bool) -> None:
    tool_calls = [{"name": n, "args": a, "id": f"call-{i}", "type": "tool_call"} for i, (n, a) in enumerate(FAILING_CALLS)]
    tools = make_tools(FakeAPI(default=_failing), max_retries=1, max_response_bytes=1000, oversize="error",
                       allow_operations=["get_item", "list_items", "create_item"])
    graph = StateGraph(MessagesState)
    graph.add_node("tools", ToolNode(list(tools.values())))  # default error handling: whatever a tool raises propagates
    graph.add_edge(START, "tools")
    graph.add_edge("tools", END)
    app = graph.compile()
    state = {"messages": [AIMessage("", tool_calls=tool_calls)]}
    out = await app.ainvoke(state) if use_async else app.invoke(state)
    messages: list[ToolMessage] = out["messages"][1:]
    assert len(messages) == len(tool_calls)
    assert all(m.status == "error" and m.content.startswith("Error") for m in messages[:-2]), [m.content for m in messages]
    assert "delete_item is not a valid tool" in messages[-2].content  # not allowed: not a tool at all
    assert "no_such_tool is not a valid tool" in messages[-1].content


async def test_async_and_sync_tools_give_the_same_results() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"path": request.url.path, "q": request.url.params.get("q")})

    sync_tools, async_tools = make_tools(FakeAPI(default=answer)), make_tools(FakeAPI(default=answer))
    for name, args in (("list_items", {"q": "lamp"}), ("get_item", {"item_id": "7"})):
        assert sync_tools[name].invoke(args) == await async_tools[name].ainvoke(args)


def test_read_only_predicate_follows_the_tools() -> None:
    tools = list(make_tools(FakeAPI(), safe_operations=["search_items"]).values())
    read_only = read_only_predicate(tools, BASE)
    assert read_only(httpx.Request("GET", f"{BASE}/items/3"))
    assert read_only(httpx.Request("POST", f"{BASE}/items/search"))  # safe by config
    assert not read_only(httpx.Request("DELETE", f"{BASE}/items/3"))
    assert not read_only(httpx.Request("POST", f"{BASE}/unknown"))  # unknown and not GET: mutating
