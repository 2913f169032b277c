"""The benchmarks' atlas agents and scoring, on the family that ships with the package.

The family itself (places, tools, tasks at three levels, the reward) is
``seed_agents.tools.atlas``, which the main job trains on. What is here serves the
learning-curve benchmarks (``bench/learning_curve.py`` and the others): the agents whose
first turns are forced (``build_agent``, ``build_two_call_agent``,
``build_lookup_add_agent``), the modes that name them (``BUILDERS``), and the three-level
score of an episode (``score_levels``): a tool call parses; the needed calls were made with
the right arguments; the final answer is right. A format gain then shows up as such and
cannot pass for a competence gain.

The benchmarks' manifests are a pure function of the seed (``make_tasks``) and are committed
under ``bench/atlas/``; ``tests/unit/test_atlas_tasks.py`` checks one against the other.
"""

from __future__ import annotations

import re
from typing import Any

from langchain_core.messages import AIMessage

from examples.knowledge_base import write_manifest
from seed_agents.task_calls import episode_calls, matched, task_calls
from seed_agents.tools.atlas import (
    ATLAS_SEED,
    ATLAS_SIZE,
    LEVELS,
    SPLITS,
    SYSTEM_PROMPT,
    TASKS_PER_LEVEL,
    TOOLS,
    answer_reward,
    build_free_agent,
    final_answer,
    make_tasks,
    places,
)
from seed_agents.types import Task, Trajectory

__all__ = ["ATLAS_SEED", "ATLAS_SIZE", "BUILDERS", "LEVELS", "SPLITS", "TASKS_PER_LEVEL", "TOOLS", "answer_reward",
           "build_agent", "build_auto_agent", "build_lookup_add_agent", "build_two_call_agent", "make_tasks", "places",
           "score_levels", "write_manifest"]

# -- the agent ------------------------------------------------------------------------

def build_agent(llm: Any, max_turns: int = 4) -> Any:
    """The tool agent with its first turn forced to call a tool (``tool_choice="any"``,
    decoded under the tools' grammar): every task needs a lookup first."""
    from seed_agents.graphs.tool_agent import build_tool_agent

    return build_tool_agent(llm, TOOLS, system_prompt=SYSTEM_PROMPT, max_turns=max_turns, first_tool_choice="any")


def build_two_call_agent(llm: Any, max_turns: int = 4) -> Any:
    """The tool agent with its first two turns forced to call a tool, any tool. Level 1 needs
    a lookup, then ``add``; forced on the first turn only, SmolLM2 answers after that call in
    every sampled episode (0 of 512: docs/results/atlas_band_levels12.json). Forced on two,
    it still solves none (0 of 128: docs/results/atlas_band_level1_forced_two.json): read
    greedily on four tasks, it called ``add`` first with a number made up for the fact ("plus
    305" in the question) every time, then ``add`` again."""
    from seed_agents.graphs.tool_agent import build_tool_agent

    return build_tool_agent(llm, TOOLS, system_prompt=SYSTEM_PROMPT, max_turns=max_turns,
                            turn_tool_choices=("any", "any"))


def build_lookup_add_agent(llm: Any, max_turns: int = 4) -> Any:
    """The tool agent for level 1 with its first call forced to be ``lookup`` and its second
    ``add`` (the way ``build_two_call_agent`` misses it, above). The tool sequence is then
    scripted, so what a curve on it measures is the rest, which stays the model's: the
    lookup's place and field, ``add``'s arguments (the number the lookup returned and the
    question's), and the answer after."""
    from seed_agents.graphs.tool_agent import build_tool_agent

    return build_tool_agent(llm, TOOLS, system_prompt=SYSTEM_PROMPT, max_turns=max_turns,
                            turn_tool_choices=("lookup", "add"))


#: Each ``--first-turn`` mode of the benches and the agent that plays it.
BUILDERS = {"forced": "build_agent", "auto": "build_auto_agent", "forced-two": "build_two_call_agent",
            "lookup-add": "build_lookup_add_agent"}


build_auto_agent = build_free_agent
"""The same agent left to choose between answering and calling on every turn (the main job's)."""


# -- three-level scoring --------------------------------------------------------------

def _episode_calls(episode: dict[str, Any] | Trajectory) -> tuple[list[dict[str, Any]], str]:
    """(the tool calls that parsed, in order; the final answer's text) of a final graph
    state or of a captured trajectory (``seed_agents.task_calls.episode_calls``)."""
    if isinstance(episode, Trajectory):
        return episode_calls(episode)
    made = [c for m in episode.get("messages") or [] if isinstance(m, AIMessage) for c in m.tool_calls]
    return made, final_answer(episode)


def _normalise(text: str) -> str:
    return re.sub(r"[^a-z]", "", text.lower())


def _as_int(value: Any) -> int | None:
    try:
        return int(str(value).replace(",", "").strip())
    except ValueError:
        return None


def same_call(expected: dict[str, Any], made: dict[str, Any]) -> bool:
    """Does ``made`` (a parsed call) do what ``expected`` (a task's call) does? Places and
    fields compare as the lookup tool reads them (case, spaces); add and multiply
    arguments as integers in either order."""
    if made.get("name") != expected["name"]:
        return False
    want, got = expected["args"], made.get("args") or {}
    if expected["name"] == "lookup":
        return all(_normalise(str(got.get(k, ""))) == _normalise(str(want[k])) for k in ("place", "field"))
    if expected["name"] in ("add", "multiply"):
        values = [_as_int(got.get(k)) for k in ("a", "b")]
        return None not in values and sorted(values) == sorted(int(want[k]) for k in ("a", "b"))  # type: ignore[type-var]
    return got == want


def score_levels(task: Task, episode: dict[str, Any] | Trajectory) -> dict[str, bool]:
    """The episode at three levels, each a yes or no:

    - ``parsed``: at least one tool call parsed (format);
    - ``right_calls``: every call the task needs (``data["calls"]``) was made, with the
      right arguments, each matched by a call of its own (competence with the tools);
    - ``right_answer``: the final answer is right (what ``answer_reward`` pays for).

    ``episode`` is a final state of the tool agent or a captured ``Trajectory`` (its
    policy calls' texts are parsed again). The levels need not nest: a model that does
    ``x + 317`` in its head has the answer without the ``add`` call.
    """
    made, answer = _episode_calls(episode)
    return {"parsed": bool(made), "right_calls": made_the_calls(task, made),
            "right_answer": answer_reward(task, {"answer": answer}) == 1.0}


def made_the_calls(task: Task, made: list[dict[str, Any]]) -> bool:
    """Every call the task needs (``data["calls"]``) is among ``made`` (parsed calls,
    ``{"name", "args"}``) with the right arguments, each matched by a call of its own."""
    expected = task_calls(task.data)
    return expected is not None and matched(expected, made, same_call)
