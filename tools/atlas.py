"""The atlas: a tool-use task family that ships with the package, and the main job's agent.

Questions about invented places whose facts exist only behind a ``lookup`` tool ("What is
the population of Varnok?"), generated from a seed so no pretrained model has seen them,
with one verifiable integer answer each. ``seed-agents train`` with no config trains the
agent ``build_free_agent`` builds on them: a LangGraph tool agent left free to answer or
call on every turn (``tool_choice`` auto, as users' agents are). Training and held-out
tasks ask about disjoint places, so a held-out gain is a gain in using the tool, not a
memorised fact.

Splits: ``train`` (``train_tasks``, ``make_tasks("train")``) trains; ``heldout``
(``heldout_tasks``, ``make_tasks("heldout")``) is the set past figures were both tuned and
reported on, kept so they replay; ``validation`` (``validation_tasks``) is where settings are
chosen, on the held-out places; ``test`` (``final_test_tasks``) asks about places no run has
seen, half in phrasings no other split uses, and is read once, by a preregistered comparison
(bench/preregistered/).

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
ATLAS_SIZE = 800
"""Places are drawn one after another from the seed, so the first 400 (all that past runs asked
about) are the same at any size; 400-800 are the test split's."""
SPLITS = {"train": (0, 300), "heldout": (300, 400)}
"""Which places (by index in the atlas) each split asks about: disjoint by construction.
``heldout`` is the one held-out set that past runs were both tuned and reported on."""
EVAL_SPLITS = {"validation": (300, 400), "test": (400, 800)}
"""The splits a result is read on: ``validation`` (the old held-out places: every choice of
settings is made here) and ``test`` (places no run has been tuned or reported on, asked half
in phrasings no training or validation task uses; a preregistered comparison reads it once)."""
EVAL_TASKS_PER_LEVEL = {"validation": 150, "test": 300}
"""Distinct questions per level: the test split's 300 give a paired comparison its task count."""
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
TEST_QUESTIONS = {"population": "How many people live in {place}?",
                  "area": "How many square km does {place} cover?",
                  "founded": "When was {place} founded? Give the year."}
TEST_LEVEL1 = "Take the {noun} of {place} and add {k}. What do you get?"
TEST_LEVEL2 = "Add the {noun} of {first} to the {noun} of {second}: what is the total?"
"""Phrasings only the test split uses (``unseen``): a gain that holds on them is not a
template learnt by heart."""


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


def unseen_question(level: int, calls: Sequence[dict[str, Any]]) -> str:
    """The test split's other phrasing of the task that ``calls`` solve."""
    first = calls[0]["args"]
    if level == 0:
        return TEST_QUESTIONS[first["field"]].format(place=first["place"])
    if level == 1:
        return TEST_LEVEL1.format(noun=NOUNS[first["field"]], place=first["place"], k=calls[1]["args"]["b"])
    return TEST_LEVEL2.format(noun=NOUNS[first["field"]], first=first["place"], second=calls[1]["args"]["place"])


def _question_key(level: int, calls: Sequence[dict[str, Any]]) -> tuple[Any, ...]:
    """What makes two questions the same fact asked twice (a level-1 offset or a phrasing does not)."""
    looked = [(c["args"]["place"], c["args"]["field"]) for c in calls if c["name"] == "lookup"]
    return (level, frozenset(looked))


def eval_split_tasks(split: str, per_level: int | None = None, levels: Sequence[int] = LEVELS,
                     seed: int = ATLAS_SEED) -> list[Task]:
    """``per_level`` distinct questions of each level about ``split``'s places (``EVAL_SPLITS``;
    default ``EVAL_TASKS_PER_LEVEL``), interleaved by level, no fact asked twice within a level.
    On ``test`` every second task of a level is asked in its unseen phrasing
    (``data["phrasing"]``: ``seen`` or ``unseen``), so a result can be read on each half."""
    if split not in EVAL_SPLITS:
        raise ValueError(f"unknown split {split!r}; evaluation splits: {', '.join(EVAL_SPLITS)}")
    per_level = EVAL_TASKS_PER_LEVEL[split] if per_level is None else per_level
    facts = places(seed)
    names = list(facts)[slice(*EVAL_SPLITS[split])]
    by_level: dict[int, list[dict[str, Any]]] = {}
    for level in levels:
        rng, seen, drawn = random.Random(f"atlas-{split}-{seed}-{level}"), set(), []
        for _ in range(100 * per_level):
            if len(drawn) == per_level:
                break
            data = make_task(level, names, rng, facts)
            if (key := _question_key(level, data["calls"])) in seen:
                continue
            seen.add(key)
            unseen = split == "test" and len(drawn) % 2 == 1
            if unseen:
                data["question"] = unseen_question(level, data["calls"])
            drawn.append({**data, "level": level, "phrasing": "unseen" if unseen else "seen"})
        if len(drawn) < per_level:
            raise ValueError(f"{split} has only {len(drawn)} distinct level-{level} questions, {per_level} asked")
        by_level[level] = drawn
    return [Task(task_id=f"atlas-{split}-L{level}-{i:03d}", split=split, data=by_level[level][i])
            for i in range(per_level) for level in levels]


def make_tasks(split: str, per_level: int | None = None, levels: Sequence[int] = LEVELS,
               seed: int = ATLAS_SEED) -> list[Task]:
    """``per_level`` tasks of each level in ``levels`` about ``split``'s places (default:
    the committed manifest's count), interleaved by level; each level has its own random
    stream, so asking for fewer tasks or fewer levels gives a prefix of the same tasks.
    ``train`` and ``heldout`` are the committed manifests; ``validation`` and ``test`` are
    ``eval_split_tasks``'s."""
    if split in EVAL_SPLITS:
        return eval_split_tasks(split, per_level, levels, seed)
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; splits: {', '.join([*SPLITS, *EVAL_SPLITS])}")
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
    """The main job's training tasks (split ``train``): the level-0 questions of the training places."""
    return make_tasks("train", levels=[0])


def heldout_tasks() -> list[Task]:
    """The main job's held-out tasks (split ``heldout``, the places ``validation`` now asks
    about): ``HELDOUT_TASKS`` distinct level-0 questions (place and field) about the held-out
    places, in a fixed order, so no question counts twice. Kept as it was so past runs replay;
    a new figure reads ``validation_tasks`` while tuning and ``final_test_tasks`` once."""
    facts = places()
    names = list(facts)[slice(*SPLITS["heldout"])]
    pairs = [(place, field) for place in names for field in FIELDS]
    random.Random(f"atlas-heldout-distinct-{ATLAS_SEED}").shuffle(pairs)
    return [Task(task_id=f"atlas-test-L0-{i:03d}", split="heldout",
                 data={"question": QUESTIONS[field].format(place=place), "answer": facts[place][field], "level": 0,
                       "calls": [_call("lookup", place=place, field=field)]})
            for i, (place, field) in enumerate(pairs[:HELDOUT_TASKS])]


def validation_tasks() -> list[Task]:
    """Split ``validation``: the level-0 questions every choice of settings is read on."""
    return eval_split_tasks("validation", levels=[0])


def final_test_tasks() -> list[Task]:
    """Split ``test``: 300 level-0 questions about places nothing was tuned on, half in unseen
    phrasings (not named ``test_*``: a test module that imports it would collect it)."""
    return eval_split_tasks("test", levels=[0])


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
