"""A text-environment agent as a LangGraph ``StateGraph``: observe -> act -> step.

The env object is not graph state (it is not serializable and belongs to one episode):
it travels in ``config["configurable"]["env"]``. Invalid actions are not fatal: the env
says so, the agent sees the feedback on its next turn, and the count lands in the
trajectory. Env calls run in worker threads so many episodes can share one event loop.

Each turn is also recorded as data (``seed_agents.envs.EnvStep``: the observation, the
admissible commands, the reply, the command sent, the env's verdict) under
``metadata["env_steps"]``, with the first observation under ``metadata["first_observation"]``;
an env suite's offline analyzer reads those instead of the prompt text.

Two prompt layouts:
- ``history="window"`` (default, the paper's): every turn is one fresh prompt holding
  the last ``history_window`` (observation, action) pairs; rows are step-level.
- ``history="chat"``: one growing chat; consecutive calls extend each other's tokens,
  so they merge into one episode-level row.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any, Literal, TypedDict

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph

from seed_agents.envs import EnvObservation, TextEnv
from seed_agents.types import (
    ENV_STEPS_KEY,
    FIRST_OBSERVATION_KEY,
    EnvStep,
    StopReason,
    Task,
)

SYSTEM_PROMPT = (
    "You are playing a text adventure game. Each turn you see what happened and a "
    "numbered list of valid commands. Answer with exactly one command from the list, "
    "copied exactly, and nothing else."
)


class EnvAgentState(TypedDict, total=False):
    task: Task
    observation: str
    admissible: list[str]
    history: list[tuple[str, str]]  # (observation, action) pairs already played
    messages: list[BaseMessage]  # chat layout only
    action: str
    reply: str  # the model's raw reply of the current turn
    steps: int
    invalid_actions: int
    reward: float
    done: bool
    success: bool
    stop_reason: StopReason
    metadata: dict[str, Any]  # the env's info, plus the structured turns (ENV_STEPS_KEY)


def parse_action(text: str, admissible: list[str]) -> str:
    """Map a model reply to an admissible command when it unambiguously names one.

    Accepts the command itself (any case, surrounding quotes/punctuation, a leading
    "> " or "Action:"), or its number in the list. Anything else is returned as the
    first line, stripped, for the env to reject: the env is the judge of validity.
    """
    line = next((ln for ln in text.strip().splitlines() if ln.strip()), "").strip()
    line = re.sub(r"^(?:>|action\s*:|command\s*:)\s*", "", line, flags=re.IGNORECASE)
    cleaned = line.strip().strip("`\"'").rstrip(".!").strip()
    lookup = {a.lower(): a for a in admissible}
    if cleaned.lower() in lookup:
        return lookup[cleaned.lower()]
    m = re.fullmatch(r"(\d+)[.)]?(?:\s+(.*))?", cleaned)
    if m:
        idx = int(m.group(1)) - 1
        rest = (m.group(2) or "").strip().lower()
        if rest in lookup:
            return lookup[rest]
        if not rest and 0 <= idx < len(admissible):
            return admissible[idx]
    return cleaned


def render_turn(observation: str, admissible: list[str]) -> str:
    options = "\n".join(f"{i}. {a}" for i, a in enumerate(admissible, 1))
    return f"{observation.strip()}\n\nValid commands:\n{options}\n\nYour command:"


def _env(config: RunnableConfig) -> TextEnv:
    env = (config.get("configurable") or {}).get("env")
    if env is None:
        raise ValueError('the env agent needs config={"configurable": {"env": <TextEnv>}}')
    return env


def _apply(obs: EnvObservation, state: EnvAgentState) -> EnvAgentState:
    return {
        "observation": obs.text,
        "admissible": obs.admissible_actions,
        "reward": state.get("reward", 0.0) + obs.reward,
        "done": obs.done,
        "success": obs.won,
        "metadata": {**state.get("metadata", {}), **obs.info},
    }


def build_env_agent(
    llm: Any,
    *,
    max_turns: int = 10,
    history: Literal["window", "chat"] = "window",
    history_window: int = 5,
    system_prompt: str = SYSTEM_PROMPT,
) -> Any:
    """Compile the agent graph; ``llm`` is any langchain chat model (``SeedChatModel``)."""
    if max_turns < 1:
        raise ValueError(f"max_turns must be >= 1, got {max_turns}")
    if history_window < 0:
        raise ValueError(f"history_window must be >= 0, got {history_window}")

    async def observe(state: EnvAgentState, config: RunnableConfig) -> EnvAgentState:
        obs = await asyncio.to_thread(_env(config).reset)
        update = _apply(obs, {})
        update["metadata"] = {**update["metadata"], FIRST_OBSERVATION_KEY: obs.text, ENV_STEPS_KEY: []}
        return {**update, "history": [], "messages": [], "steps": 0, "invalid_actions": 0}

    def prompt(state: EnvAgentState) -> list[BaseMessage]:
        turn = render_turn(state["observation"], state["admissible"])
        if history == "chat":
            return [SystemMessage(system_prompt), *state.get("messages", []), HumanMessage(turn)]
        recent = state.get("history", [])[-history_window:] if history_window else []
        past = "".join(f"Observation: {o.strip()}\nYour command: {a}\n\n" for o, a in recent)
        body = (f"Recent history:\n{past}" if past else "") + f"Current observation:\n{turn}"
        # The task must stay in view once the first observation leaves the window (ALFWorld
        # envs report it as info["objective"], the line the task_line skill injector anchors on).
        objective = str(state.get("metadata", {}).get("objective") or "").strip()
        if objective and objective not in body:
            body = f"{objective}\n\n{body}"
        return [SystemMessage(system_prompt), HumanMessage(body)]

    async def act(state: EnvAgentState) -> EnvAgentState:
        messages = prompt(state)
        reply = await llm.ainvoke(messages)
        text = reply.content if isinstance(reply.content, str) else str(reply.content)
        update: EnvAgentState = {"action": parse_action(text, state["admissible"]), "reply": text}
        if history == "chat":
            update["messages"] = [*messages[1:], AIMessage(text)]
        return update

    async def step(state: EnvAgentState, config: RunnableConfig) -> EnvAgentState:
        obs = await asyncio.to_thread(_env(config).step, state["action"])
        steps = state["steps"] + 1
        update = _apply(obs, state)
        # what an offline analyzer reads (EnvSuite.offline_analyzer): the turn as data, not prompt text
        turn = EnvStep(observation=state["observation"], admissible_actions=state["admissible"],
                       reply=state.get("reply", ""), action=state["action"], invalid=obs.invalid,
                       reward=obs.reward, done=obs.done)
        recorded = state.get("metadata", {}).get(ENV_STEPS_KEY, [])
        update["metadata"][ENV_STEPS_KEY] = [*recorded, turn.model_dump()]
        update["steps"] = steps
        update["invalid_actions"] = state["invalid_actions"] + int(obs.invalid)
        update["history"] = [*state["history"], (state["observation"], state["action"])]
        if obs.done:
            update["stop_reason"] = StopReason.DONE
        elif steps >= max_turns:
            update["stop_reason"] = StopReason.MAX_TURNS
        return update

    def route(state: EnvAgentState) -> str:
        return END if state.get("done") or state["steps"] >= max_turns else "act"

    g = StateGraph(EnvAgentState)
    g.add_node("observe", observe)
    g.add_node("act", act)
    g.add_node("step", step)
    g.add_edge(START, "observe")
    g.add_conditional_edges("observe", lambda s: END if s.get("done") else "act", ["act", END])
    g.add_edge("act", "step")
    g.add_conditional_edges("step", route, ["act", END])
    return g.compile()
