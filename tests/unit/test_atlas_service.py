"""The atlas over HTTP (``examples.atlas_service``) is the atlas the LangChain tools serve:
the tools generated from its spec have the same names, schemas and answers, every
operation is a read, and its reward is the atlas's answer check."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.utils.function_calling import convert_to_openai_tool

from examples.atlas_service import atlas_reward, create_app
from examples.atlas_tasks import TOOLS, make_tasks
from seed_agents.tools.openapi import OpenAPIToolsConfig, openapi_tools

BASE = "http://atlas.test"


@pytest.fixture(scope="module")
def app() -> Any:
    return create_app()


@pytest.fixture(scope="module")
def http_tools(app: Any) -> dict[str, Any]:
    tools = openapi_tools(app.openapi(), OpenAPIToolsConfig(base_url=BASE, allow_hosts=["atlas.test"]),
                          transport=httpx.ASGITransport(app=app))
    return {t.name: t for t in tools}


def test_generated_tools_are_the_atlas_tools(http_tools: dict[str, Any]) -> None:
    """Same names, descriptions and argument schemas: the model is shown the same prompt."""
    assert [convert_to_openai_tool(t) for t in http_tools.values()] == [convert_to_openai_tool(t) for t in TOOLS]
    assert not any(t.metadata["mutating"] for t in http_tools.values())


def test_every_operation_is_a_get(app: Any) -> None:
    ops = [(method, item["operationId"]) for item_path in app.openapi()["paths"].values()
           for method, item in item_path.items()]
    assert sorted(ops) == [("get", "add"), ("get", "lookup"), ("get", "multiply")]


def _calls() -> list[dict[str, Any]]:
    """Every call that solves a few tasks of each level, plus calls with an unknown place,
    another spelling of a known place and a negative factor."""
    tasks = make_tasks("train", per_level=3) + make_tasks("heldout", per_level=2)
    calls = [c for t in tasks for c in t.data["calls"]]
    place = calls[0]["args"]["place"]
    return [*calls, {"name": "lookup", "args": {"place": "Nowhereville", "field": "area"}},
            {"name": "lookup", "args": {"place": f"  {place.upper()} ", "field": "founded"}},
            {"name": "multiply", "args": {"a": 48213, "b": -917}}]


@pytest.mark.parametrize("call", _calls(), ids=lambda c: f"{c['name']}-{'-'.join(map(str, c['args'].values()))}")
def test_each_operation_answers_what_the_langchain_tool_answers(http_tools: dict[str, Any], call: dict[str, Any]) -> None:
    local = {t.name: t for t in TOOLS}[call["name"]]
    over_http = asyncio.run(http_tools[call["name"]].ainvoke(call["args"]))
    assert over_http == str(local.invoke(call["args"]))  # a ToolMessage carries the int as its text


def test_a_field_outside_the_enum_is_refused_like_the_tools_schema_refuses_it(app: Any) -> None:
    async def get() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as client:
            return await client.get("/lookup", params={"place": "Malam", "field": "height"})

    assert asyncio.run(get()).status_code == 422


def test_reward_pays_the_right_final_answer_only() -> None:
    task = make_tasks("train", per_level=1, levels=[1])[0]
    answer = task.data["answer"]
    right = {"messages": [HumanMessage(task.data["question"]), AIMessage(f"The answer is {answer:,}.")]}
    wrong = {"messages": [HumanMessage(task.data["question"]), AIMessage(f"{answer + 1}")]}
    assert atlas_reward(task, right) == 1.0
    assert atlas_reward(task, {"answer": str(answer)}) == 1.0
    assert atlas_reward(task, wrong) == 0.0
    assert atlas_reward(task, {"messages": [AIMessage("I do not know.")]}) == 0.0
