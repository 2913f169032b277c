"""Arithmetic with a calculator: the smallest tool task with a verifiable answer.

Shows the "wrap your existing agent" path three ways, each unchanged except that its
chat model is a ``SeedChatModel``: LangChain v1's ``create_agent`` (the current API),
a hand-written LangGraph ``StateGraph`` tool loop, and LangGraph's legacy prebuilt
``create_react_agent`` (deprecated in LangGraph 1.0, still met in existing code). Tasks
are generated from a seed (stable ids); the reward checks the final answer.
"""

from __future__ import annotations

import random
import re
from typing import Any

from langchain_core.tools import tool

from seed_agents.types import Task


@tool
def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


@tool
def multiply(a: float, b: float) -> float:
    """Multiply two numbers."""
    return a * b


TOOLS = [add, multiply]


def calculator_tasks(n: int, seed: int = 0, split: str = "train") -> list[Task]:
    """``n`` questions like "What is (3 + 4) * 5?" with their answers."""
    rng = random.Random(f"{split}-{seed}")
    tasks = []
    for i in range(n):
        a, b, c = rng.randint(2, 20), rng.randint(2, 20), rng.randint(2, 9)
        tasks.append(Task(task_id=f"calc-{split}-{seed}-{i}", split=split,
                          data={"question": f"What is ({a} + {b}) * {c}? Use the tools.", "answer": (a + b) * c}))
    return tasks


def final_answer(state: dict[str, Any]) -> str:
    messages = state.get("messages") or []
    return str(messages[-1].content) if messages else ""


def calculator_reward(task: Task, state: dict[str, Any]) -> float:
    """1.0 when the last number in the final answer equals the expected result."""
    numbers = re.findall(r"-?\d+(?:\.\d+)?", final_answer(state))
    return float(bool(numbers) and abs(float(numbers[-1]) - float(task.data["answer"])) < 1e-6)


def build_react_calculator(llm: Any) -> Any:
    """An off-the-shelf agent, LangChain v1's ``create_agent``; only the chat model is ours."""
    from langchain.agents import create_agent

    return create_agent(llm, TOOLS)


def build_graph_calculator(llm: Any) -> Any:
    """A hand-written LangGraph tool loop (model node, tool node, route on tool calls):
    the shape of most custom agents; only the chat model is ours."""
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    model = llm.bind_tools(TOOLS)

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    g = StateGraph(MessagesState)
    g.add_node("agent", agent)
    g.add_node("tools", ToolNode(TOOLS))
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    return g.compile()


def build_prebuilt_react_calculator(llm: Any) -> Any:
    """LangGraph's legacy prebuilt ``create_react_agent``, for code that still uses it;
    its deprecation warning is silenced here, where using it is the point."""
    import warnings

    from langgraph.prebuilt import create_react_agent

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return create_react_agent(llm, TOOLS)
