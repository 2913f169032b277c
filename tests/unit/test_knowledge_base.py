"""The atlas behind the tool-agent benchmark: stable manifests, disjoint splits, tools and
a reward that only the right integer passes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage

from examples.knowledge_base import (
    SPLITS,
    TOOLS,
    add,
    answer_reward,
    atlas,
    lookup,
    lookup_fact,
    make_tasks,
    multiply,
)
from seed_agents.types import Task

MANIFESTS = Path(__file__).resolve().parents[2] / "bench" / "tool_agent"


@pytest.mark.parametrize("split", ["train", "heldout"])
def test_committed_manifests_equal_the_generator(split: str) -> None:
    committed = [json.loads(line) for line in (MANIFESTS / f"{split}.jsonl").read_text().splitlines()]
    generated = [t.model_dump(mode="json") for t in make_tasks(split, len(committed))]
    assert committed == generated


def test_splits_ask_about_disjoint_places() -> None:
    names = list(atlas())
    train, heldout = (set(names[slice(*SPLITS[s])]) for s in ("train", "heldout"))
    assert not train & heldout

    def places(split: str) -> set[str]:
        return {n for t in make_tasks(split, 32) for n in names if n in t.data["question"]}

    assert places("train") <= train and places("heldout") <= heldout
    assert places("heldout") and not places("heldout") & train


def test_every_answer_comes_from_the_tools() -> None:
    places = atlas()
    for task in make_tasks("heldout", 16):
        q, answer = task.data["question"], task.data["answer"]
        if task.data["kind"] == "arithmetic":
            a, b = (int(x) for x in q.replace("?", "").split() if x.isdigit())
            tool = multiply if "multiplied" in q else add
            assert tool.invoke({"a": a, "b": b}) == answer
        else:
            named = [n for n in places if n in q]
            values = [int(lookup.invoke({"place": n, "field": "population" if "population" in q else
                                         "area" if "area" in q else "founded"}).split()[-1].rstrip("."))
                      for n in named]
            assert sum(values) == answer


def test_lookup_tolerates_case_and_reports_mistakes_as_text() -> None:
    name = next(iter(atlas()))
    assert lookup_fact(name.upper(), " Population") == f"The population of {name} is {atlas()[name]['population']}."
    assert "No place named" in lookup_fact("Atlantis", "population")
    assert "Unknown field" in lookup_fact(name, "colour")
    assert [t.name for t in TOOLS] == ["lookup", "add", "multiply"]


@pytest.mark.parametrize(("reply", "reward"), [
    ("68157096", 1.0), ("The answer is 68,157,096.", 1.0), ("68157096.", 1.0),
    ("68157097", 0.0), ("68157096 ... no wait, 12", 0.0), ("I do not know.", 0.0), ("", 0.0),
    # the right number inside chat-template markup is not an answer a user can be shown
    ("<tool_response>\n68157096\n</tool_response>", 0.0), ("<tool_response>\nThe product is 68157096", 0.0),
    ("68157096</tool_response>", 0.0), ('68157096 <tool_call>\n{"name": "add"}', 0.0),
])
def test_reward_checks_the_last_integer(reply: str, reward: float) -> None:
    task = Task(task_id="t", data={"question": "q", "answer": 68157096})
    assert answer_reward(task, {"answer": reply}) == reward
    assert answer_reward(task, {"messages": [AIMessage(reply)]}) == reward
