"""Atlas tool tasks with a difficulty knob: a task family a 135M model can learn from.

The mixed atlas benchmark (``examples/knowledge_base.py``) sits below the band where RL
moves a small model: SmolLM2-135M solved 4-8% of its training episodes at T 0.7, so most
GRPO groups had no reward variance, and 16 held-out tasks move in 6-point steps. Public
small-model gains came from a verifiable task with base success of roughly 20-60%,
hundreds of distinct prompts and 8-16 samples each (docs/DESIGN.md, "Learning at small
scale"). This module makes that task family, one rung at a time:

- level 0: one lookup whose result is the answer ("What is the population of Varnok?");
- level 1: one lookup, then one ``add`` with a number from the question
  ("What is the area of Varnok plus 317?");
- level 2: two lookups combined by ``add`` ("What is the population of Varnok plus the
  population of Quessa?").

Every task carries the calls that solve it (``data["calls"]``, the contract of
``seed_agents.task_calls``, which the end-of-run summary reads too), so an episode is scored at
three levels (``score_levels``): a tool call parses; the needed calls were made with the
right arguments; the final answer is right. A format gain then shows up as such and cannot
pass for a competence gain. The reward is binary (``answer_reward``: the right integer).

The atlas is the knowledge base's generator under another seed and a larger size, so the
two benchmarks share no place. Training and held-out tasks ask about disjoint places (a
held-out gain is a gain in using the tools, not a memorised fact). Manifests are a pure
function of the seed (``make_tasks``) and are committed under ``bench/atlas/``;
``tests/unit/test_atlas_tasks.py`` checks one against the other.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from typing import Any

from langchain_core.messages import AIMessage
from langchain_core.tools import BaseTool, tool

from examples.knowledge_base import (
    FIELDS,
    QUESTIONS,
    SYSTEM_PROMPT,
    Field,
    add,
    answer_reward,
    atlas,
    final_answer,
    lookup_fact,
    multiply,
    write_manifest,
)
from seed_agents.task_calls import episode_calls, matched, task_calls
from seed_agents.types import Task, Trajectory

__all__ = ["ATLAS_SEED", "ATLAS_SIZE", "BUILDERS", "LEVELS", "SPLITS", "TASKS_PER_LEVEL", "TOOLS", "answer_reward",
           "build_agent", "build_auto_agent", "build_lookup_add_agent", "build_two_call_agent", "make_tasks", "places",
           "score_levels", "write_manifest"]

ATLAS_SEED = 22
"""Not the knowledge base's seed: this atlas shares no place with ``bench/tool_agent``."""
ATLAS_SIZE = 400
SPLITS = {"train": (0, 300), "heldout": (300, 400)}
"""Which places (by index in the atlas) each split asks about: disjoint by construction."""
LEVELS = (0, 1, 2)
TASKS_PER_LEVEL = {"train": 200, "heldout": 80}
"""The committed manifests: 600 training and 240 held-out tasks, levels interleaved."""

NOUNS = {"population": "population", "area": "area", "founded": "founding year"}
"""How a field reads inside a longer question."""
SUM_FIELDS = ("population", "area")
"""Level 2 adds two places' facts: a sum of founding years means nothing."""


def places(seed: int = ATLAS_SEED) -> dict[str, dict[str, int]]:
    """The atlas the tools read: ``ATLAS_SIZE`` invented places, a pure function of ``seed``."""
    return atlas(seed, ATLAS_SIZE)


@tool
def lookup(place: str, field: Field) -> str:
    """Look up a fact about a place in the atlas: its population, area or founding year."""
    return lookup_fact(place, field, places())


TOOLS: list[BaseTool] = [lookup, add, multiply]


def _call(name: str, **args: Any) -> dict[str, Any]:
    return {"name": name, "args": args}


def make_task(level: int, names: Sequence[str], rng: random.Random, facts: dict[str, dict[str, int]]) -> dict[str, Any]:
    """One task's data at ``level``: question, answer and the calls that solve it."""
    if level == 0:
        place, field = rng.choice(names), rng.choice(FIELDS)
        value = facts[place][field]
        return {"question": QUESTIONS[field].format(place=place), "answer": value,
                "calls": [_call("lookup", place=place, field=field)]}
    if level == 1:
        place, field, k = rng.choice(names), rng.choice(FIELDS), rng.randint(10, 999)
        value = facts[place][field]
        return {"question": f"What is the {NOUNS[field]} of {place} plus {k}?", "answer": value + k,
                "calls": [_call("lookup", place=place, field=field), _call("add", a=value, b=k)]}
    if level == 2:
        (first, second), field = rng.sample(list(names), 2), rng.choice(SUM_FIELDS)
        a, b = facts[first][field], facts[second][field]
        return {"question": f"What is the {NOUNS[field]} of {first} plus the {NOUNS[field]} of {second}?",
                "answer": a + b, "calls": [_call("lookup", place=first, field=field),
                                           _call("lookup", place=second, field=field), _call("add", a=a, b=b)]}
    raise ValueError(f"unknown level {level!r}; levels: {', '.join(map(str, LEVELS))}")


def make_tasks(split: str, per_level: int | None = None, levels: Sequence[int] = LEVELS,
               seed: int = ATLAS_SEED) -> list[Task]:
    """``per_level`` tasks of each level in ``levels`` about ``split``'s places (default:
    the committed manifest's count), interleaved by level; each level has its own random
    stream, so asking for fewer tasks or fewer levels gives a prefix of the same tasks."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; splits: {', '.join(SPLITS)}")
    per_level = TASKS_PER_LEVEL[split] if per_level is None else per_level
    facts = places(seed)
    names = list(facts)[slice(*SPLITS[split])]
    streams = {level: random.Random(f"atlas-tasks-{seed}-{split}-{level}") for level in levels}
    return [Task(task_id=f"atlas-{split}-L{level}-{i:03d}", split=split,
                 data={**make_task(level, names, streams[level], facts), "level": level})
            for i in range(per_level) for level in levels]


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


def build_auto_agent(llm: Any, max_turns: int = 4) -> Any:
    """The same agent left to choose between answering and calling on every turn."""
    from seed_agents.graphs.tool_agent import build_tool_agent

    return build_tool_agent(llm, TOOLS, system_prompt=SYSTEM_PROMPT, max_turns=max_turns)


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
