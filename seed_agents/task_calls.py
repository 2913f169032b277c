"""The calls a task names and the calls an episode made: what "called the right tool" reads.

A tool task may name the calls that solve it in ``data["calls"]``: a list of
``{"name": <tool name>, "args": {<argument>: <value>, ...}}``, one item per call the
task needs (a tool needed twice is named twice). Nothing else reads the field, so a task
family without it trains the same; with it, the end-of-run summary
(``seed_agents.observe.run_summary``) can tell an agent that answers from memory from one
that uses its tools, which success alone cannot (a guess is sometimes right).

An episode's calls are read back from its captured ``Trajectory``: each policy call's text
is parsed as the chat model parses it, so the summary needs nothing but the run's files.
Whether an argument is right is a task family's own question (``examples/atlas_tasks.py``
reads places case-free and sums in either order), so ``matched`` takes the comparison.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from seed_agents.tool_calls import parse_tool_calls
from seed_agents.types import LLMCall, Trajectory

Call = dict[str, Any]
"""A call as a task names it or as ``parse_tool_calls`` returns it: ``name`` and ``args``."""


def task_calls(data: dict[str, Any]) -> list[Call] | None:
    """The calls ``data`` (a task's ``data``) names, or None where it names none. A field
    that is there but not a list of ``{"name": str, "args": dict}`` raises ``ValueError``:
    a typo would otherwise read as a task that needs no tool."""
    calls = data.get("calls")
    if calls is None or calls == []:
        return None
    if not isinstance(calls, list) or not all(
            isinstance(c, dict) and isinstance(c.get("name"), str) and c["name"] and isinstance(c.get("args", {}), dict)
            for c in calls):
        raise ValueError(f'data["calls"] must be a list of {{"name": str, "args": {{...}}}}, got {calls!r}')
    return calls


def _parsed(call: LLMCall) -> tuple[str, list[Call], list[Call]]:
    """(content, calls, invalid calls) of one policy call, as the chat model read its reply.
    A forced or guided call's prefill (``<tool_call>\\n{"name": "``) is in the prompt's last
    message, not in the completion: it is put back before parsing."""
    last = call.messages[-1] if call.messages else {}
    prefix = str(last.get("content") or "") if last.get("role") == "assistant" else ""
    return parse_tool_calls(prefix + call.text if prefix.startswith("<tool_call>") else call.text)


def episode_calls(traj: Trajectory) -> tuple[list[Call], str]:
    """(the tool calls that parsed, in order; the content of the last policy call)."""
    made: list[Call] = []
    content = ""
    for call in traj.policy_calls:
        content, calls, _ = _parsed(call)
        made += calls
    return made, content


def final_answer(traj: Trajectory) -> str | None:
    """The text the agent ended on, as the model wrote it: the last policy call's content
    where that reply holds no tool call (valid or malformed), else None (no answer: the
    episode ended on a call, out of turns).
    Without tools bound the chat model parses nothing, so the whole text is the answer."""
    calls = traj.policy_calls
    if not calls:
        return None
    if not calls[-1].tools:
        return calls[-1].text.strip()
    content, made, invalid = _parsed(calls[-1])
    return None if made or invalid else content


def same_name(expected: Call, made: Call) -> bool:
    return made.get("name") == expected["name"]


def matched(expected: Sequence[Call], made: Sequence[Call], same: Callable[[Call, Call], bool] = same_name) -> bool:
    """Every call in ``expected`` is among ``made`` by ``same``, each matched by a call of
    its own (a tool the task needs twice must be called twice)."""
    unused = list(made)
    for want in expected:
        match = next((c for c in unused if same(want, c)), None)
        if match is None:
            return False
        unused.remove(match)
    return True


def called_the_tools(expected: Sequence[Call], made: Sequence[Call]) -> bool:
    """Every tool the task names was called (arguments not compared), as often as named."""
    return matched(expected, made, same_name)
