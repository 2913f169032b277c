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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from langchain_core.tools import BaseTool, tool

from seed_agents.tools.atlas import (  # noqa: F401 - re-exported: the benchmarks and tests read them from here
    FIELDS,
    QUESTIONS,
    SYSTEM_PROMPT,
    Field,
    add,
    answer_reward,
    final_answer,
    generate_places,
    multiply,
)
from seed_agents.tools.atlas import lookup_fact as _lookup_fact
from seed_agents.types import Task

KB_SEED = 20260


def atlas(seed: int = KB_SEED, size: int = 96) -> dict[str, dict[str, int]]:
    """``size`` invented places with their facts, a pure function of ``seed``
    (``seed_agents.tools.atlas.generate_places``; this benchmark's seed and size by default)."""
    return generate_places(seed, size)


def lookup_fact(place: str, field: str, places: dict[str, dict[str, int]] | None = None) -> str:
    """The tool's answer as text (``seed_agents.tools.atlas.lookup_fact``), over this
    benchmark's atlas unless ``places`` is given."""
    return _lookup_fact(place, field, atlas() if places is None else places)


@tool
def lookup(place: str, field: Field) -> str:
    """Look up a fact about a place in the atlas: its population, area or founding year."""
    return lookup_fact(place, field)


TOOLS: list[BaseTool] = [lookup, add, multiply]

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
