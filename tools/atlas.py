"""The atlas: a tool-use task family that ships with the package, and the main job's agent.

Questions about invented places whose facts exist only behind a ``lookup`` tool ("What is
the population of Varnok?"), generated from a seed so no pretrained model has seen them,
with one verifiable integer answer each. ``seed-agents train`` with no config trains the
agent ``build_free_agent`` builds on them: a LangGraph tool agent left free to answer or
call on every turn (``tool_choice`` auto, as users' agents are). Training and held-out
tasks ask about disjoint places, so a held-out gain is a gain in using the tool, not a
memorised fact.

Three levels (``make_task``): 0, one lookup whose result is the answer; 1, a lookup then an
``add`` with a number from the question; 2, two lookups combined by ``add``. Every task
names the calls that solve it (``data["calls"]``, ``seed_agents.task_calls``), so the
end-of-run summary scores the tool use apart from the answer: a format gain shows up as
one. The reward (``answer_reward``) is binary: the right integer, in an answer that carries
no chat-template markup.

``examples/atlas_tasks.py`` and ``examples/knowledge_base.py`` build the benchmarks' agents
and manifests on these pieces (``bench/learning_curve.py`` and the others).
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from functools import cache
from typing import Any, Literal

from langchain_core.tools import BaseTool, tool

from seed_agents.tool_calls import carries_markup
from seed_agents.types import Task

FIELDS = ("population", "area", "founded")
"""Each place's facts: population (people), area (square km), founded (year)."""

_ONSETS = ("b", "br", "d", "dr", "f", "g", "gr", "k", "kr", "l", "m", "n", "p", "qu", "r", "s", "t", "tr", "v", "z")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ou")
_CODAS = ("", "n", "r", "s", "th", "x", "k", "l", "m")

SYSTEM_PROMPT = (
    "You answer questions about places in a private atlas. You do not know these facts: "
    "look them up with the lookup tool (place, field), where field is one of population, "
    "area, founded. Use add and multiply for arithmetic. When you know the answer, reply "
    "with the number only."
)

ATLAS_SEED = 22
"""The main job's atlas (the knowledge-base benchmark uses another seed: no shared place)."""
ATLAS_SIZE = 400
SPLITS = {"train": (0, 300), "heldout": (300, 400)}
"""Which places (by index in the atlas) each split asks about: disjoint by construction."""
LEVELS = (0, 1, 2)
TASKS_PER_LEVEL = {"train": 200, "heldout": 80}
"""The benchmarks' committed manifests: 600 training and 240 held-out tasks, levels interleaved."""

QUESTIONS = {"population": "What is the population of {place}?",
             "area": "What is the area of {place} in square km?",
             "founded": "In which year was {place} founded?"}
NOUNS = {"population": "population", "area": "area", "founded": "founding year"}
"""How a field reads inside a longer question."""
SUM_FIELDS = ("population", "area")
"""Level 2 adds two places' facts: a sum of founding years means nothing."""


def _name(rng: random.Random) -> str:
    syllables = rng.choice((2, 2, 3))
    word = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables))
    return word.capitalize()


@cache
def generate_places(seed: int, size: int) -> dict[str, dict[str, int]]:
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


def places(seed: int = ATLAS_SEED) -> dict[str, dict[str, int]]:
    """The atlas the tools read: ``ATLAS_SIZE`` invented places, a pure function of ``seed``."""
    return generate_places(seed, ATLAS_SIZE)


def _normalise(text: str) -> str:
    return re.sub(r"[^a-z]", "", text.lower())


def lookup_fact(place: str, field: str, facts: dict[str, dict[str, int]]) -> str:
    """The tool's answer as text; a wrong name or field is an answer too (the agent reads
    it and can try again), never an exception."""
    by_key = {_normalise(name): name for name in facts}
    name = by_key.get(_normalise(place))
    if name is None:
        return f"No place named {place!r} in the atlas."
    key = _normalise(field)
    if key not in FIELDS:
        return f"Unknown field {field!r}; fields are: {', '.join(FIELDS)}."
    return f"The {key} of {name} is {facts[name][key]}."


Field = Literal["population", "area", "founded"]


@tool
def lookup(place: str, field: Field) -> str:
    """Look up a fact about a place in the atlas: its population, area or founding year."""
    return lookup_fact(place, field, places())


@tool
def add(a: int, b: int) -> int:
    """Add two integers exactly."""
    return int(a) + int(b)


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers exactly."""
    return int(a) * int(b)


TOOLS: list[BaseTool] = [lookup, add, multiply]


# -- tasks ----------------------------------------------------------------------------------

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


HELDOUT_TASKS = 120
"""The main job's held-out set: distinct level-0 questions about places never trained on."""


def train_tasks() -> list[Task]:
    """The main job's training tasks: the level-0 questions of the training places."""
    return make_tasks("train", levels=[0])


def heldout_tasks() -> list[Task]:
    """The main job's held-out tasks: ``HELDOUT_TASKS`` distinct level-0 questions (place and
    field) about the held-out places, in a fixed order, so no question counts twice."""
    facts = places()
    names = list(facts)[slice(*SPLITS["heldout"])]
    pairs = [(place, field) for place in names for field in FIELDS]
    random.Random(f"atlas-heldout-distinct-{ATLAS_SEED}").shuffle(pairs)
    return [Task(task_id=f"atlas-test-L0-{i:03d}", split="heldout",
                 data={"question": QUESTIONS[field].format(place=place), "answer": facts[place][field], "level": 0,
                       "calls": [_call("lookup", place=place, field=field)]})
            for i, (place, field) in enumerate(pairs[:HELDOUT_TASKS])]


# -- the agent and its reward ---------------------------------------------------------------

def build_free_agent(llm: Any, max_turns: int = 4) -> Any:
    """The tool agent over the atlas tools, left to choose between answering and calling on
    every turn (``tool_choice`` auto)."""
    from seed_agents.graphs.tool_agent import build_tool_agent

    return build_tool_agent(llm, TOOLS, system_prompt=SYSTEM_PROMPT, max_turns=max_turns)


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
