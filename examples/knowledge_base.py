"""A generated knowledge base behind lookup tools: tool tasks no model can answer from memory.

The tool-agent benchmark (``bench/tool_agent.py``) needs questions whose answers exist
only behind the tools: facts about invented places (generated from a seed, so no
pretrained model has seen them) and arithmetic on numbers too large to do in one's head.
Three kinds of question, each with one verifiable integer answer:

- ``lookup``: "What is the population of Varnok?" (one ``lookup`` call);
- ``arithmetic``: "What is 48213 multiplied by 917?" (one ``multiply`` or ``add`` call);
- ``lookup_sum``: "What is the population of Varnok plus the population of Quessa?"
  (two lookups and an ``add``: a multi-step task).

Training and held-out tasks ask about disjoint places, so a held-out gain is a gain in
using the tools, not a memorised fact. The manifests are a pure function of the seed
(``manifest(split)``) and are also committed under ``bench/tool_agent/`` so a change in
the generator shows up as a diff (``tests/unit/test_knowledge_base.py`` checks both).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any, Literal

from langchain_core.tools import BaseTool, tool

from seed_agents.tool_calls import carries_markup
from seed_agents.types import Task

FIELDS = ("population", "area", "founded")
"""Each place's facts: population (people), area (square km), founded (year)."""

_ONSETS = ("b", "br", "d", "dr", "f", "g", "gr", "k", "kr", "l", "m", "n", "p", "qu", "r", "s", "t", "tr", "v", "z")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ou")
_CODAS = ("", "n", "r", "s", "th", "x", "k", "l", "m")

KB_SEED = 20260

SYSTEM_PROMPT = (
    "You answer questions about places in a private atlas. You do not know these facts: "
    "look them up with the lookup tool (place, field), where field is one of population, "
    "area, founded. Use add and multiply for arithmetic. When you know the answer, reply "
    "with the number only."
)


def _name(rng: random.Random) -> str:
    syllables = rng.choice((2, 2, 3))
    word = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables))
    return word.capitalize()


@cache
def atlas(seed: int = KB_SEED, size: int = 96) -> dict[str, dict[str, int]]:
    """``size`` invented places with their facts, a pure function of ``seed``."""
    rng = random.Random(f"atlas-{seed}")
    places: dict[str, dict[str, int]] = {}
    while len(places) < size:
        name = _name(rng)
        if name in places or len(name) < 5:
            continue
        places[name] = {"population": rng.randint(10_000, 999_999), "area": rng.randint(100, 9_999),
                        "founded": rng.randint(1100, 1990)}
    return places


def _normalise(text: str) -> str:
    return re.sub(r"[^a-z]", "", text.lower())


def lookup_fact(place: str, field: str, places: dict[str, dict[str, int]] | None = None) -> str:
    """The tool's answer as text; a wrong name or field is an answer too (the agent reads
    it and can try again), never an exception."""
    places = atlas() if places is None else places
    by_key = {_normalise(name): name for name in places}
    name = by_key.get(_normalise(place))
    if name is None:
        return f"No place named {place!r} in the atlas."
    key = _normalise(field)
    if key not in FIELDS:
        return f"Unknown field {field!r}; fields are: {', '.join(FIELDS)}."
    return f"The {key} of {name} is {places[name][key]}."


Field = Literal["population", "area", "founded"]


@tool
def lookup(place: str, field: Field) -> str:
    """Look up a fact about a place in the atlas: its population, area or founding year."""
    return lookup_fact(place, field)


@tool
def add(a: int, b: int) -> int:
    """Add two integers exactly."""
    return int(a) + int(b)


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers exactly."""
    return int(a) * int(b)


TOOLS: list[BaseTool] = [lookup, add, multiply]

QUESTIONS = {"population": "What is the population of {place}?",
             "area": "What is the area of {place} in square km?",
             "founded": "In which year was {place} founded?"}

SPLITS = {"train": (0, 48), "heldout": (48, 96)}
"""Which places (by index in the atlas) each split asks about: disjoint by construction."""


def make_tasks(split: str, n: int, seed: int = KB_SEED) -> list[Task]:
    """``n`` questions of ``split`` (``train`` or ``heldout``): a fixed mix of the three
    kinds (half lookups, a quarter each of arithmetic and two-step sums), stable ids."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; splits: {', '.join(SPLITS)}")
    places = atlas(seed)
    names = list(places)[slice(*SPLITS[split])]
    rng = random.Random(f"tasks-{seed}-{split}")
    tasks = []
    for i in range(n):
        kind = ("lookup", "arithmetic", "lookup", "lookup_sum")[i % 4]
        if kind == "lookup":
            place, field = rng.choice(names), rng.choice(FIELDS)
            question, answer = QUESTIONS[field].format(place=place), places[place][field]
        elif kind == "arithmetic":
            a, b = rng.randint(1_000, 99_999), rng.randint(100, 999)
            if rng.random() < 0.5:
                question, answer = f"What is {a} multiplied by {b}?", a * b
            else:
                a, b = a * 97, b * 1_013
                question, answer = f"What is {a} plus {b}?", a + b
        else:
            first, second = rng.sample(names, 2)
            question = f"What is the population of {first} plus the population of {second}?"
            answer = places[first]["population"] + places[second]["population"]
        tasks.append(Task(task_id=f"kb-{split}-{i:03d}", split=split,
                          data={"question": question, "answer": answer, "kind": kind}))
    return tasks


def write_manifest(tasks: Sequence[Task], path: Path) -> None:
    """One task per line, the format ``graph.tasks`` and ``eval.tasks`` read."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(t.model_dump(mode="json"), sort_keys=True) + "\n" for t in tasks))


# -- the agent and its reward ---------------------------------------------------------

def final_answer(state: dict[str, Any]) -> str:
    """The agent's answer: the tool agent's ``answer``, else the last message's text."""
    if state.get("answer"):
        return str(state["answer"])
    messages = state.get("messages") or []
    return str(messages[-1].content) if messages else ""


def answer_reward(task: Task, state: dict[str, Any]) -> float:
    """1.0 when the last integer in the final answer (thousands separators allowed) is the
    expected one; a tool's output echoed by the agent counts only if it is that integer.

    0.0 for an answer that carries chat-template markup (``carries_markup``), whatever its
    number: a small model rewarded for copying the tool's response whole, tags included,
    learns to answer with the ``<tool_response>`` tags around the fact, which no user should see.
    The answer is read as the model wrote it; nothing is stripped before scoring."""
    answer = final_answer(state)
    if carries_markup(answer):
        return 0.0
    numbers = re.findall(r"-?\d[\d,]*", answer)
    if not numbers:
        return 0.0
    return float(int(numbers[-1].replace(",", "")) == int(task.data["answer"]))


def build_agent(llm: Any) -> Any:
    """The hand-written LangGraph tool agent (``graphs.tool_agent``) over the atlas tools.
    Every question needs a tool, so the first turn must call one (``tool_choice="any"``,
    decoded under the tools' grammar); SmolLM2 left to choose answers from memory."""
    from seed_agents.graphs.tool_agent import build_tool_agent

    return build_tool_agent(llm, TOOLS, system_prompt=SYSTEM_PROMPT, max_turns=4, first_tool_choice="any")


def build_create_agent(llm: Any) -> Any:
    """The same tools behind LangChain v1's ``create_agent`` (graph input: messages)."""
    from langchain.agents import create_agent

    return create_agent(llm, TOOLS, system_prompt=SYSTEM_PROMPT)
