"""Hostile input, generated: a hostile OpenAPI spec against ``seed_agents.tools.openapi``.

A spec, however broken (wrong types anywhere the tools read, ``$ref``s to nowhere, to
themselves or fanning out, non-string keys, odd names and unicode, YAML alias bombs,
thousands of operations, ``servers`` off the allowlist), either loads into valid tools or
raises one ``SpecError`` of one line: never another exception, never a hang. Valid tools
means each is shown to a model as plain JSON of bounded size (every ``$ref`` inlined, as
LangChain binds it) and each call ends as a tool message, sent only to the base URL.

Hypothesis mutates a valid spec (replace, delete or re-key 1-4 places) and draws specs from
scratch; the inputs it found, and the ones too big to draw, are an explicit list. Budgets
are fixed and generation derandomized, so a run is repeatable and bounded (about 15 s on 2
busy cores); a longer hunt is the same code with bigger budgets and ``derandomize=False``.
The hostile-response half is ``test_openapi_hostile.py``.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain_core.messages import ToolMessage
from langchain_core.tools import StructuredTool
from langchain_core.utils.function_calling import convert_to_openai_tool

from seed_agents.errors import UserError
from seed_agents.tools.openapi import SpecError, load_spec, openapi_tools
from seed_agents.tools.openapi_spec import _TAKEN, MAX_TOOLS

TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
FUZZ = settings(deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))

BASE_SPEC: dict[str, Any] = {
    "openapi": "3.0.3",
    "info": {"title": "Shop", "version": "1"},
    "servers": [{"url": "https://evil.example/api"}],  # never where requests go: base_url is
    "paths": {
        "/items": {
            "get": {"operationId": "list_items", "summary": "List items", "parameters": [
                {"name": "q", "in": "query", "required": True, "schema": {"type": "string", "pattern": "^[a-z]+$"}},
                {"name": "page-size", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 50, "default": 10}},
                {"name": "color", "in": "query", "schema": {"$ref": "#/components/schemas/Color"}},
                {"name": "X-Trace", "in": "header", "schema": {"type": "string"}},
            ]},
            "post": {"operationId": "create_item", "requestBody": {"required": True, "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/NewItem"}}}}},
        },
        "/items/{item_id}": {
            "parameters": [{"$ref": "#/components/parameters/ItemId"}],
            "get": {"operationId": "get_item"},
            "delete": {"operationId": "delete_item"},
        },
        "/trees": {"post": {"operationId": "plant_tree", "requestBody": {"content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/Node"}}}}}},
        "/search": {"post": {"operationId": "search", "requestBody": {"content": {"application/json": {"schema": {
            "type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "null"}]}}}}}}},
    },
    "components": {
        "parameters": {"ItemId": {"name": "item_id", "in": "path", "required": True, "schema": {"type": "string"}}},
        "schemas": {
            "Color": {"type": "string", "enum": ["red", "green"]},
            "NewItem": {"type": "object", "required": ["name"], "properties": {
                "name": {"type": "string", "minLength": 1}, "price": {"type": ["number", "null"], "exclusiveMinimum": 0},
                "size": {"allOf": [{"$ref": "#/components/schemas/Size"}, {"properties": {"depth": {"type": "number"}}}]}}},
            "Size": {"type": "object", "properties": {"width": {"type": "number"}}},
            "Node": {"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#/components/schemas/Node"}}}},
        },
    },
}

# what a hostile spec puts where a well-formed one has its values
REFS = ["#/components/schemas/Node", "#/components/schemas/Size", "#/components/schemas/Loop", "#/components",
        "#/paths/~1items/get", "#/paths/~1items~1%7Bitem_id%7D", "#/info/title", "#/nope", "#", "#/", "http://evil/x.json"]
KEYS = st.sampled_from(["$ref", "type", "properties", "items", "enum", "const", "anyOf", "oneOf", "allOf", "required",
                        "default", "in", "name", "schema", "content", "application/json", "parameters", "requestBody",
                        "get", "post", "operationId", "/x", "minimum", "pattern", "nullable"])
SCALARS = (st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
           | st.sampled_from(["object", "array", "string", "integer", "null", "path", "query", "(?=x)", "[", "~", "__class__",
                              "model_config", "def", "1x", "é名", "a b/c", "\x00", "𝔘"]))
VALUES = st.recursive(SCALARS | st.sampled_from(REFS).map(lambda r: {"$ref": r}),
                      lambda kids: st.lists(kids, max_size=4) | st.dictionaries(KEYS | st.text(max_size=6) | st.integers(),
                                                                                 kids, max_size=4),
                      max_leaves=12)


def pointers(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in children:
        yield from pointers(child, (*prefix, key))


@st.composite
def mutated_specs(draw: st.DrawFn) -> dict[str, Any]:
    """The well-formed spec with 1-4 places replaced, deleted or re-keyed."""
    doc = copy.deepcopy(BASE_SPEC)
    doc["components"]["schemas"]["Loop"] = {"$ref": "#/components/schemas/Loop"}
    for _ in range(draw(st.integers(1, 4))):
        where = draw(st.sampled_from([p for p in pointers(doc) if p]))
        parent = doc
        for key in where[:-1]:
            parent = parent[key]
        action = draw(st.sampled_from(["replace", "replace", "delete", "rekey"]))
        if action == "delete" and isinstance(parent, dict):
            del parent[where[-1]]
        elif action == "rekey" and isinstance(parent, dict):
            parent[draw(KEYS | st.text(max_size=6) | st.integers() | st.none())] = parent.pop(where[-1])
        else:
            parent[where[-1]] = draw(VALUES)
    return doc


NAMES = st.text(min_size=0, max_size=20) | st.sampled_from(["", "_", "__class__", "model_fields", "self", "op", "body", "1st",
                                                           "page-size", "a.b", "名前", "x" * 200, "body\n", "𝔘𝔫𝔦"])
TYPES = st.sampled_from(["string", "integer", "number", "boolean", "array", "object", "null", "file", None])


@st.composite
def schemas(draw: st.DrawFn, depth: int = 0) -> dict[str, Any]:
    kind = draw(TYPES)
    schema: dict[str, Any] = {} if kind is None else {"type": kind}
    if kind == "array" and depth < 3:
        schema["items"] = draw(schemas(depth + 1))
    if kind == "object" and depth < 3:
        schema["properties"] = draw(st.dictionaries(NAMES, schemas(depth + 1), max_size=3))
        schema["required"] = draw(st.lists(st.sampled_from([*schema["properties"], "ghost"]), max_size=2))
    if kind == "string" and draw(st.booleans()):
        schema["enum"] = draw(st.lists(st.text(max_size=5), min_size=1, max_size=3))
    if draw(st.booleans()):
        schema["default"] = draw(SCALARS)
    return schema


@st.composite
def generated_specs(draw: st.DrawFn) -> dict[str, Any]:
    """A spec drawn from scratch: many paths, odd names, parameters and bodies of any schema."""
    paths: dict[str, Any] = {}
    for path in draw(st.lists(st.text(max_size=15).map(lambda p: "/" + p), max_size=8, unique=True)):
        item: dict[str, Any] = {}
        for method in draw(st.lists(st.sampled_from(["get", "post", "put", "delete", "patch", "head", "options"]),
                                    min_size=1, max_size=3, unique=True)):
            op: dict[str, Any] = {"parameters": [
                {"name": draw(NAMES), "in": draw(st.sampled_from(["path", "query", "header", "cookie", "body"])),
                 "required": draw(st.booleans()), "schema": draw(schemas())} for _ in range(draw(st.integers(0, 3)))]}
            if draw(st.booleans()):
                op["operationId"] = draw(NAMES)
            if draw(st.booleans()):
                media = draw(st.sampled_from(["application/json", "application/merge-patch+json", "text/plain",
                                              "application/json; charset=utf-8"]))
                op["requestBody"] = {"required": draw(st.booleans()), "content": {media: {"schema": draw(schemas())}}}
            item[method] = op
        paths[path] = item
    return {"openapi": draw(st.sampled_from(["3.0.0", "3.1.0"])), "paths": paths,
            "servers": [{"url": draw(st.sampled_from(["https://evil.example", "http://127.0.0.1:1", "file:///etc"]))}]}


def assert_loads_or_refuses(doc: Any) -> None:
    """The contract for any spec: valid tools whose calls end as tool messages, or one SpecError line."""
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"ok": True})

    try:
        tools = openapi_tools(doc, base_url="https://shop.example/api", allow_hosts=["shop.example"],
                              transport=httpx.MockTransport(answer), max_retries=0)
    except SpecError as e:
        assert isinstance(e, UserError) and str(e) and "\n" not in str(e) and len(str(e)) <= 500
        return
    assert len({t.name for t in tools}) == len(tools)
    for tool in tools:
        assert TOOL_NAME.fullmatch(tool.name), tool.name
        shown = json.dumps(convert_to_openai_tool(tool), allow_nan=False)  # what a bound model is shown: plain JSON,
        assert len(shown) < 2**20  # every $ref inlined, and not megabytes of it
        message = tool.invoke({"type": "tool_call", "id": "c1", "name": tool.name, "args": {}})
        assert isinstance(message, ToolMessage) and isinstance(message.content, str)
    assert all(r.url.host == "shop.example" for r in seen)  # the spec's servers never decide where requests go


@settings(FUZZ, max_examples=150)
@given(doc=mutated_specs())
def test_a_mutated_spec_loads_or_is_refused_in_one_line(doc: dict[str, Any]) -> None:
    assert_loads_or_refuses(doc)


@settings(FUZZ, max_examples=60)
@given(doc=generated_specs())
def test_a_generated_spec_loads_or_is_refused_in_one_line(doc: dict[str, Any]) -> None:
    assert_loads_or_refuses(doc)


def _deep(levels: int, leaf: Any, wrap: Callable[[Any], Any]) -> Any:
    for _ in range(levels):
        leaf = wrap(leaf)
    return leaf


def _spec_with(param_schema: dict[str, Any], schemas_: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"openapi": "3.0.0", "paths": {"/x": {"get": {"operationId": "x", "parameters": [
        {"name": "p", "in": "query", "schema": param_schema}]}}}, "components": {"schemas": schemas_ or {}}}


def _fan_out(levels: int) -> dict[str, Any]:
    """S0 is [S1, S1, S1], S1 is [S2, S2, S2], ...: 3**levels paths through the refs."""
    names = {f"S{i}": {"anyOf": [{"$ref": f"#/components/schemas/S{i + 1}"}] * 2
                       + [{"type": "array", "items": {"$ref": f"#/components/schemas/S{i + 1}"}}]} for i in range(levels)}
    return _spec_with({"$ref": "#/components/schemas/S0"}, {**names, f"S{levels}": {"type": "string"}})


def _cyclic() -> dict[str, Any]:
    doc = copy.deepcopy(BASE_SPEC)
    doc["paths"]["/items"]["get"]["x-self"] = doc
    return doc


def _file(name: str, content: str | bytes) -> Callable[[Path], Path]:
    def write(tmp_path: Path) -> Path:
        path = tmp_path / name
        path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
        return path
    return write


def _alias_bomb(tmp_path: Path) -> Path:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    (path := tmp_path / "bomb.yaml").write_text("\n".join([*lines, "openapi: '3.0.0'", "paths: {}"]))
    return path


HOSTILE_SPECS: dict[str, Callable[[Path], Any]] = {
    "schema nested 500 deep": lambda _: _spec_with(_deep(500, {"type": "string"}, lambda s: {"type": "array", "items": s})),
    "a $ref chain 300 long": lambda _: _spec_with({"$ref": "#/components/schemas/C0"}, {
        **{f"C{i}": {"type": "array", "items": {"$ref": f"#/components/schemas/C{i + 1}"}} for i in range(300)},
        "C300": {"type": "string"}}),
    "a $ref to itself": lambda _: _spec_with({"$ref": "#/components/schemas/A"}, {"A": {"$ref": "#/components/schemas/A"}}),
    "$refs fanning out 3**12 ways": lambda _: _fan_out(12),
    "a default nested 5000 deep": lambda _: _spec_with({"type": "array", "default": _deep(5000, [], lambda x: [x])}),
    "a default holding a $ref key": lambda _: _spec_with({"type": "object", "default": {"$ref": "#"}}),
    "a document that contains itself": lambda _: _cyclic(),
    "a YAML alias bomb (10**9 values)": _alias_bomb,
    "a YAML alias to itself": _file("self.yaml", "openapi: '3.0.0'\npaths: {}\nx: &a [*a]\n"),
    "JSON nested 100000 deep": _file("deep.json", "[" * 100_000 + "]" * 100_000),
    "YAML nested 100000 deep": _file("deep.yaml", "a: " + "[" * 100_000),
    "not YAML": _file("bad.yaml", "paths: [\n  a: }"),
    "not text": _file("bin.json", b"\xff\xfe\x00\x81garbage"),
    "a missing file": lambda tmp: tmp / "missing.yaml",
    "a folder": lambda tmp: tmp,
    "Swagger 2": lambda _: {"swagger": "2.0", "paths": {}},
    "non-string path keys": lambda _: {"openapi": "3.0.0", "paths": {200: {}}},
    f"{MAX_TOOLS + 1} operations": lambda _: {"openapi": "3.0.0", "paths": {
        f"/p{i}": {"get": {"operationId": f"op{i}"}} for i in range(MAX_TOOLS + 1)}},
    "an enum of objects": lambda _: _spec_with({"enum": [{"a": 1}]}),
    "an empty enum": lambda _: _spec_with({"type": "string", "enum": []}),
    "a pattern pydantic cannot run": lambda _: _spec_with({"type": "string", "pattern": "(?<=a)b"}),
    "an infinite default": lambda _: _spec_with({"type": "number", "default": float("inf")}),
    "whole-number limits given as floats": lambda _: _spec_with({"type": "integer", "minimum": 9.223372036854776e18,
                                                                 "exclusiveMaximum": 3.5, "default": 10}),
    "an argument named $ref": lambda _: _spec_with({"type": "object", "properties": {"$ref": {"type": "string"}}}),
    "a $ref outside the document": lambda _: _spec_with({"$ref": "https://evil.example/schema.json"}),
    "a $ref to a string": lambda _: _spec_with({"$ref": "#/openapi"}),
    "names that are no identifiers": lambda _: {"openapi": "3.0.0", "paths": {"/é名/{__class__}": {"post": {
        "operationId": "é名 op", "parameters": [{"name": n, "in": "query", "schema": {}} for n in ("", "1", "model_config", "a-b", "a_b", "名")]
        + [{"name": "__class__", "in": "path", "schema": {"type": "string"}}],
        "requestBody": {"content": {"application/json": {"schema": {"type": "object", "properties": {"body": {}, "self": {}}}}}}}}}},
}


@pytest.mark.parametrize("make", list(HOSTILE_SPECS.values()), ids=list(HOSTILE_SPECS))
def test_hostile_specs_load_or_fail_in_one_line_quickly(make: Callable[[Path], Any], tmp_path: Path) -> None:
    start = time.monotonic()
    assert_loads_or_refuses(make(tmp_path))
    assert time.monotonic() - start < 10  # a fan-out or alias bomb would take hours, not seconds


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_api_arguments_named_like_langchains_own_reach_the_api(use_async: bool) -> None:
    """Found by the fuzz: a query parameter 'self' crashed the call, 'config' and
    'run_manager' were silently dropped (LangChain's ``_run`` takes those names itself)."""
    taken = set(inspect.signature(StructuredTool._run).parameters) | set(inspect.signature(StructuredTool._arun).parameters)
    assert taken - {"args", "kwargs"} == set(_TAKEN)  # the names the tools rename are exactly LangChain's
    seen: list[httpx.Request] = []
    doc = _spec_with({"type": "string"})
    doc["paths"]["/x"]["get"]["parameters"] = [{"name": n, "in": "query", "schema": {"type": "string"}} for n in sorted(_TAKEN)]
    tool = openapi_tools(doc, base_url="https://a.example", allow_hosts=["a.example"],
                         transport=httpx.MockTransport(lambda r: seen.append(r) or httpx.Response(200, text="ok")))[0]
    call = {"type": "tool_call", "id": "c1", "name": "x", "args": {f"{n}_": "v" for n in _TAKEN}}
    message = asyncio.run(tool.ainvoke(call)) if use_async else tool.invoke(call)
    assert message.status == "success" and dict(seen[0].url.params) == dict.fromkeys(_TAKEN, "v")


def test_a_huge_spec_costs_what_its_allowed_tools_cost() -> None:
    doc = {"openapi": "3.0.0", "paths": {f"/p{i}": {"get": {"operationId": f"op{i}", "parameters": [
        {"name": "q", "in": "query", "schema": {"type": "string"}}]}} for i in range(5000)}}
    start = time.monotonic()
    tools = openapi_tools(doc, base_url="https://a.example", allow_hosts=["a.example"], allow_operations=["op7", "op4999"])
    assert [t.name for t in tools] == ["op7", "op4999"] and time.monotonic() - start < 5


@settings(FUZZ, max_examples=60)
@given(source=st.text(max_size=40) | st.from_regex(r"https?://[\[\]a-z0-9.:@%]{0,20}/?", fullmatch=True))
def test_any_spec_source_string_loads_or_is_refused(source: str) -> None:
    try:
        load_spec(source, allow_hosts=["spec.example"], timeout_s=0.5)
    except SpecError as e:
        assert str(e) and "\n" not in str(e)


def test_a_spec_over_the_size_cap_is_refused(tmp_path: Path) -> None:
    (path := tmp_path / "big.json").write_text(json.dumps(BASE_SPEC) + " " * 2000)
    with pytest.raises(SpecError, match="is over 1000 bytes"):
        load_spec(path, max_bytes=1000)
    assert load_spec(path)["paths"]  # under the default cap it loads


def test_an_async_only_transport_serves_the_spec_too() -> None:
    """Found by reading: an async-only transport was ignored and the spec fetched from the network."""
    class AsyncOnly(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            return httpx.Response(200, json=BASE_SPEC)

    assert load_spec("https://spec.example/openapi.json", allow_hosts=["spec.example"], transport=AsyncOnly()) == BASE_SPEC


def test_path_extensions_are_not_paths() -> None:
    doc = {**BASE_SPEC, "paths": {**BASE_SPEC["paths"], "x-internal": {"note": "an OpenAPI extension, not a path"}}}
    assert {t.name for t in openapi_tools(doc, base_url="https://a.example", allow_hosts=["a.example"])} >= {"get_item"}
