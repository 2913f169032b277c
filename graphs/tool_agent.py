"""A generic tool-using agent: the model calls tools until it answers or runs out of turns.

Input ``{"task": Task}`` with the question in ``task.data["question"]``. A malformed tool
call is not fatal: the error goes back to the model as a message and is counted, as an
invalid action is in the env agent. The final state carries ``answer``, ``steps``,
``invalid_actions`` and ``stop_reason`` for the runner and the reward function.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, SystemMessage
from langchain_core.tools import BaseTool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode

from seed_agents.faults import tool_error_message
from seed_agents.types import StopReason, Task


class ToolAgentState(TypedDict, total=False):
    task: Task
    messages: Annotated[list[AnyMessage], add_messages]
    steps: int
    invalid_actions: int
    answer: str
    stop_reason: StopReason


def build_tool_agent(llm: Any, tools: Sequence[BaseTool], *, system_prompt: str | None = None, max_turns: int = 6,
                     first_tool_choice: str | None = None, tool_choice: str | None = None,
                     turn_tool_choices: Sequence[str | None] = ()) -> Any:
    """Compile the agent. ``llm`` needs ``bind_tools`` (``SeedChatModel`` has it).

    ``first_tool_choice``: the ``tool_choice`` of the first turn only (e.g. ``"any"`` where
    every task needs a tool: a small model that would answer from memory must look first);
    ``turn_tool_choices``: that of each of the first turns, in order (``("lookup", "any")``:
    a task that needs a lookup and then another call, where the model left free answers after
    the first; ``None`` leaves a turn free); it replaces ``first_tool_choice``.
    ``tool_choice``: that of every later turn (the first ones too, unless the two above say
    otherwise). Unset, turns choose freely between answering and calling. The continual loop
    passes what the deployed agent sends (``ToolAgentConfig.tool_choice``), so a replay is
    forced where production is."""
    if max_turns < 1:
        raise ValueError(f"max_turns must be >= 1, got {max_turns}")
    if first_tool_choice and turn_tool_choices:
        raise ValueError("first_tool_choice and turn_tool_choices both set: give the first turn's in turn_tool_choices")
    bound = llm.bind_tools(list(tools), tool_choice=tool_choice) if tool_choice else llm.bind_tools(list(tools))
    leading = [llm.bind_tools(list(tools), tool_choice=choice) if choice else bound
               for choice in (turn_tool_choices or (first_tool_choice,))]

    def start(state: ToolAgentState) -> ToolAgentState:
        question = state["task"].data.get("question")
        if not isinstance(question, str) or not question:
            raise ValueError(f"task {state['task'].task_id!r} has no data['question']")
        msgs: list[AnyMessage] = [SystemMessage(system_prompt)] if system_prompt else []
        return {"messages": [*msgs, HumanMessage(question)], "steps": 0, "invalid_actions": 0}

    async def agent(state: ToolAgentState) -> ToolAgentState:
        reply: AIMessage = await (leading[state["steps"]] if state["steps"] < len(leading) else bound).ainvoke(
            state["messages"])
        update: ToolAgentState = {"messages": [reply], "steps": state["steps"] + 1}
        if reply.invalid_tool_calls:
            errors = "; ".join(str(c.get("error")) for c in reply.invalid_tool_calls)
            update["invalid_actions"] = state["invalid_actions"] + len(reply.invalid_tool_calls)
            update["messages"] = [reply, HumanMessage(f"Your tool call was malformed ({errors}). Use the exact <tool_call> JSON format.")]
        elif not reply.tool_calls:
            update["answer"] = reply.content if isinstance(reply.content, str) else str(reply.content)
            update["stop_reason"] = StopReason.DONE
        if "stop_reason" not in update and update["steps"] >= max_turns:
            update["stop_reason"] = StopReason.MAX_TURNS
        return update

    def route(state: ToolAgentState) -> str:
        if state.get("stop_reason") is not None:
            return END
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else "agent"

    g = StateGraph(ToolAgentState)
    g.add_node("start", start)
    g.add_node("agent", agent)
    g.add_node("tools", ToolNode(list(tools), handle_tool_errors=tool_error_message))
    g.add_edge(START, "start")
    g.add_edge("start", "agent")
    g.add_conditional_edges("agent", route, ["tools", "agent", END])
    g.add_edge("tools", "agent")
    return g.compile()
