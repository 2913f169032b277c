"""The hindsight node: after an episode, the policy writes a skill about it.

``with_hindsight(agent_graph, llm)`` wraps any compiled agent graph: the agent runs as a
subgraph, then a ``hindsight`` node hands the episode's captured policy calls to the
*same* chat model, greedy, under ``capture(purpose="analyzer")``, and puts the parsed
``Skill`` into the state. The analyzer call is recorded in the episode's capture scope
like any other call (purpose ``analyzer``), so the trainer can find it and stage-1 SFT
can reuse it. A skill that fails to parse, or an analyzer that raises, gives an invalid
``Skill`` with its reason; the episode itself is never failed by its hindsight.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Sequence
from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph

from seed_agents.backends.grammar import skill_tag
from seed_agents.capture import capture, current_scope
from seed_agents.chat_model import SeedChatModel
from seed_agents.skills import (
    Analyzer,
    build_analyzer_messages,
    episode_steps,
    first_user_message,
    parse_skill,
    tool_names,
)
from seed_agents.types import AnswerFormat, EpisodeRecord, LLMCall, Skill, SkillFailures, SkillOpening, StopReason, Task


class HindsightState(TypedDict, total=False):
    """The outer state when the agent graph's own schema cannot be read."""

    task: Task
    success: bool
    reward: float
    steps: int
    stop_reason: StopReason
    invalid_actions: int
    metadata: dict[str, Any]
    skill: Skill


async def write_skill(
    llm: Any,
    calls: Sequence[LLMCall],
    task_text: str,
    success: bool,
    *,
    max_tokens: int = 512,
    min_words: int = 5,
    max_words: int = 120,
    max_chars_per_step: int = 1500,
    max_steps: int = 30,
    trajectory_id: str | None = None,
    task_id: str | None = None,
    episode: EpisodeRecord | None = None,
    constrained: bool = True,
    answer_format: AnswerFormat = "paper",
    opening: SkillOpening = "words",
    failures: SkillFailures = "write",
) -> Skill:
    """Ask ``llm`` (greedy) for a hindsight skill about the episode made of ``calls``.

    ``llm`` is a chat model, or a ``seed_agents.stage1.analyzers.Analyzer`` such as an env
    suite's offline analyzer, which reads ``episode`` (the structured turns) instead of the prompt.
    ``trajectory_id`` and ``task_id`` default to the capture labels of the calls. Never
    raises for a bad reply or a failing backend: both give ``valid=False`` with a reason.
    ``constrained``: a ``SeedChatModel`` decodes under ``skill_tag`` (same word limits), so
    its reply always parses; other chat models are asked for the JSON by the prompt alone.
    ``opening``: ``call`` makes that grammar open the skill with "Call <tool> with", the tool
    one of those the episode's policy calls were offered (``skills.tool_names``); an
    episode offered none keeps the word opening. ``failures``: ``skip`` asks nothing about a
    failed episode and returns an invalid skill saying so (its rows then get no teacher).
    """
    labels = calls[0].scope if calls else {}
    ids = {
        "trajectory_id": trajectory_id if trajectory_id is not None else str(labels.get("trajectory_id", "")),
        "task_id": task_id if task_id is not None else str(labels.get("task_id", "")),
        "success": bool(success),
    }
    if failures == "skip" and not success:
        return Skill(**ids, valid=False, reject_reason="not written: skills.failures skip")
    steps = episode_steps(calls)
    messages = build_analyzer_messages(task_text, success, steps,
                                       max_chars_per_step=max_chars_per_step, max_steps=max_steps,
                                       answer_format=answer_format)
    call_id = None
    try:
        if isinstance(llm, Analyzer):  # not a chat model: no LLM call to capture
            answer = await llm.analyze(messages, episode)
            if answer.error is not None:
                return Skill(**ids, valid=False, reject_reason=f"analyzer error: {answer.error}")
            raw = answer.text
        else:
            bound: dict[str, Any] = {"temperature": 0.0, "max_tokens": max_tokens}
            if constrained and isinstance(llm, SeedChatModel):
                names = tool_names(calls) if opening == "call" else []
                bound["structural_tag"] = skill_tag(min_words=min_words, max_words=max_words, max_tokens=max_tokens,
                                                    call_names=names)
            with capture(purpose="analyzer"):
                reply = await llm.bind(**bound).ainvoke(messages)
            raw = reply.content if isinstance(reply.content, str) else str(reply.content)
            call_id = (reply.response_metadata or {}).get("call_id")
    except Exception as e:  # noqa: BLE001 - hindsight must not fail the episode
        return Skill(**ids, valid=False, reject_reason=f"analyzer error: {type(e).__name__}: {e}")
    summary, skill, reason = parse_skill(raw, min_words=min_words, max_words=max_words)
    return Skill(**ids, summary=summary, skill=skill, valid=reason is None, reject_reason=reason,
                 call_id=call_id, raw=raw)


def episode_policy_calls() -> list[LLMCall]:
    """The policy calls of the current episode, from the active capture scope.

    The scope must hold one episode (the runner opens one per episode). When it is
    labelled with a ``trajectory_id``, only calls carrying that label are taken.
    """
    scope = current_scope()
    if scope is None:
        return []
    tid = scope.labels.get("trajectory_id")
    return [c for c in scope.calls if c.purpose == "policy" and (tid is None or c.scope.get("trajectory_id") == tid)]


def _outer_schema(agent_graph: Any) -> type:
    """The agent's own state schema plus ``skill``, so every key it returns (``answer``,
    ``messages`` with their reducers, ...) survives the wrap; else ``HindsightState``."""
    schema = getattr(getattr(agent_graph, "builder", None), "state_schema", None)
    try:
        hints = typing.get_type_hints(schema, include_extras=True) if schema is not None else {}
    except Exception:  # noqa: BLE001 - an unreadable schema falls back to the default
        hints = {}
    if not hints or not isinstance(schema, type) or not issubclass(schema, dict):
        return HindsightState
    # ``task`` too: agents whose own schema lacks it (a prebuilt ReAct agent) still let the
    # runner pass the task through, so a success_fn can judge the answer against it.
    return TypedDict(f"{schema.__name__}WithSkill", {"task": Task, **hints, "skill": Skill}, total=False)  # type: ignore[operator]


def with_hindsight(
    agent_graph: Any,
    llm: Any,
    *,
    success_key: str = "success",
    success_fn: Callable[[dict[str, Any]], bool] | None = None,
    task_text: Callable[[dict[str, Any]], str] | None = None,
    state_schema: type | None = None,
    **skill_options: Any,
) -> Any:
    """Compile ``START -> agent (subgraph) -> hindsight -> END``.

    Run it under ``capture()`` (the runner does). ``success_key`` names the state key
    holding the outcome (absent: ``reward >= 1``); ``success_fn(final_state)`` replaces
    that for agents whose outcome is judged from their answer (the runner's ``reward_fn``
    runs only after the graph, too late for the analyzer); ``task_text(final_state)`` gives the
    task as the analyzer sees it (default: the first user message of the first policy
    call). ``state_schema`` overrides the outer schema, which by default is the agent's
    own plus ``skill``. ``skill_options`` go to ``write_skill`` (``max_tokens``, ...).
    """

    async def hindsight(state: dict[str, Any]) -> dict[str, Any]:
        calls = episode_policy_calls()
        if success_fn is not None:
            success = bool(success_fn(state))
        else:
            outcome = state.get(success_key)
            success = bool(outcome) if outcome is not None else float(state.get("reward", 0.0)) >= 1.0
        task = state.get("task")
        if not calls:
            reason = "no policy calls captured for this episode (run the graph under capture())"
            return {"skill": Skill(task_id=getattr(task, "task_id", ""), success=success, valid=False, reject_reason=reason)}
        text = task_text(state) if task_text is not None else first_user_message(calls)
        episode = EpisodeRecord.from_metadata(state.get("metadata") or {}, task_id=getattr(task, "task_id", ""),
                                              success=success, reward=float(state.get("reward", 0.0)),
                                              tools=tool_names(calls))
        return {"skill": await write_skill(llm, calls, text, success, episode=episode, **skill_options)}

    g = StateGraph(state_schema or _outer_schema(agent_graph))
    g.add_node("agent", agent_graph)
    g.add_node("hindsight", hindsight)
    g.add_edge(START, "agent")
    g.add_edge("agent", "hindsight")
    g.add_edge("hindsight", END)
    return g.compile()
