"""The atlas task family: stable manifests, disjoint places, answers the tools give, and
three-level scoring that keeps format apart from competence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

from examples.atlas_tasks import (
    LEVELS,
    SPLITS,
    TASKS_PER_LEVEL,
    TOOLS,
    answer_reward,
    make_tasks,
    places,
    score_levels,
)
from examples.knowledge_base import atlas
from seed_agents.types import LLMCall, Task, Trajectory

MANIFESTS = Path(__file__).resolve().parents[2] / "bench" / "atlas"


@pytest.mark.parametrize("split", ["train", "heldout"])
def test_committed_manifests_equal_the_generator(split: str) -> None:
    committed = [json.loads(line) for line in (MANIFESTS / f"{split}.jsonl").read_text().splitlines()]
    assert committed == [t.model_dump(mode="json") for t in make_tasks(split)]


def test_the_continual_atlas_canary_is_the_level_0_held_out_set() -> None:
    """configs/continual_atlas.yaml's canary: the learning curve's held-out tasks, so the
    demo's canary scores and the curve's held-out scores are on the same 80 tasks."""
    canary = Path(__file__).resolve().parents[2] / "configs" / "data" / "atlas_canary.jsonl"
    committed = [json.loads(line) for line in canary.read_text().splitlines()]
    assert committed == [t.model_dump(mode="json") for t in make_tasks("heldout", levels=[0])]
    assert len(committed) == 80


def test_counts_and_levels() -> None:
    train, heldout = make_tasks("train"), make_tasks("heldout")
    assert len(train) >= 500 and len(heldout) >= 200
    for split, tasks in (("train", train), ("heldout", heldout)):
        assert len({t.task_id for t in tasks}) == len(tasks)
        assert len({t.data["question"] for t in tasks}) > 0.9 * len(tasks)
        for level in LEVELS:
            assert sum(t.data["level"] == level for t in tasks) == TASKS_PER_LEVEL[split]
    # fewer tasks or levels: a prefix of the same tasks, not other ones
    assert make_tasks("train", per_level=5, levels=[1]) == [t for t in train if t.data["level"] == 1][:5]


def test_splits_ask_about_disjoint_places() -> None:
    names = list(places())
    assert len({n.lower() for n in names}) == len(names)
    asked = {split: {c["args"]["place"] for t in make_tasks(split) for c in t.data["calls"] if c["name"] == "lookup"}
             for split in SPLITS}
    assert asked["train"] <= set(names[slice(*SPLITS["train"])])
    assert asked["heldout"] <= set(names[slice(*SPLITS["heldout"])])
    assert not asked["train"] & asked["heldout"] and len(asked["heldout"]) > 50
    assert not set(names) & set(atlas())  # no place shared with the mixed benchmark's atlas


def test_the_needed_calls_give_the_answer() -> None:
    tools = {t.name: t for t in TOOLS}
    for task in make_tasks("heldout", per_level=10):
        results = []
        for call in task.data["calls"]:
            out = tools[call["name"]].invoke(call["args"])
            results.append(int(out.split()[-1].rstrip(".")) if call["name"] == "lookup" else out)
            if call["name"] == "lookup":
                assert call["args"]["place"] in task.data["question"]
        assert results[-1] == task.data["answer"]
        assert len(task.data["calls"]) == task.data["level"] + 1


# -- three-level scoring on hand-made episodes ------------------------------------------

TASK = Task(task_id="t", data={"question": "What is the area of Malam plus 305?", "answer": 9466, "level": 1,
                               "calls": [{"name": "lookup", "args": {"place": "Malam", "field": "area"}},
                                         {"name": "add", "args": {"a": 9161, "b": 305}}]})


def call(name: str, args: dict, i: int = 0) -> dict:
    return {"name": name, "args": args, "id": f"c{i}", "type": "tool_call"}


def state(*replies: AIMessage, answer: str | None = None) -> dict:
    messages = [SystemMessage("s"), HumanMessage(TASK.data["question"])]
    for r in replies:
        messages.append(r)
        messages += [ToolMessage("out", tool_call_id=c["id"]) for c in r.tool_calls]
    return {"messages": messages, **({"answer": answer} if answer is not None else {})}


LOOKUP = AIMessage("", tool_calls=[call("lookup", {"place": "malam", "field": "Area"})])
ADD = AIMessage("", tool_calls=[call("add", {"a": 305, "b": 9161}, 1)])


@pytest.mark.parametrize(("episode", "expected"), [
    (state(AIMessage("I think it is 9466."), answer="I think it is 9466."), (False, False, True)),  # a guess
    (state(AIMessage("", invalid_tool_calls=[{"name": None, "args": "{", "id": "x", "error": "not JSON",
                                              "type": "invalid_tool_call"}])), (False, False, False)),
    (state(LOOKUP, AIMessage("9161"), answer="9161"), (True, False, False)),  # stopped after the lookup
    (state(LOOKUP, ADD, AIMessage("It is 9,466."), answer="It is 9,466."), (True, True, True)),
    (state(LOOKUP, ADD, AIMessage("9465"), answer="9465"), (True, True, False)),  # miscopied the sum
    (state(AIMessage("", tool_calls=[call("lookup", {"place": "Malam", "field": "population"})]), ADD,
           AIMessage("9466"), answer="9466"), (True, False, True)),  # wrong field
    (state(LOOKUP, AIMessage("", tool_calls=[call("add", {"a": 9161, "b": 350}, 1)]), AIMessage("x"), answer="x"),
     (True, False, False)),  # wrong argument
    (state(LOOKUP, LOOKUP, ADD), (True, True, False)),  # ran out of turns without an answer
])
def test_score_levels_on_states(episode: dict, expected: tuple[bool, bool, bool]) -> None:
    scores = score_levels(TASK, episode)
    assert (scores["parsed"], scores["right_calls"], scores["right_answer"]) == expected
    assert scores["right_answer"] == (answer_reward(TASK, episode) == 1.0)


def llm_call(text: str, last: dict) -> LLMCall:
    return LLMCall(messages=[{"role": "user", "content": "q"}, last], prompt_ids=[1], completion_ids=[2],
                   logprobs=[0.0], text=text)


def test_score_levels_on_a_trajectory_reads_the_forced_prefix() -> None:
    forced = llm_call('lookup", "arguments": {"place": "Malam", "field": "area"}}\n</tool_call>',
                      {"role": "assistant", "content": '<tool_call>\n{"name": "'})
    add = llm_call('<tool_call>\n{"name": "add", "arguments": {"a": 9161, "b": 305}}\n</tool_call>',
                   {"role": "user", "content": "<tool_response>\nThe area of Malam is 9161.\n</tool_response>"})
    answer = llm_call("The answer is 9466.", {"role": "user", "content": "<tool_response>\n9466\n</tool_response>"})
    traj = Trajectory(task_id="t", group_id="g", calls=[forced, add, answer])
    assert score_levels(TASK, traj) == {"parsed": True, "right_calls": True, "right_answer": True}
    # the same first call without its prefill is prose: nothing parsed
    bare = llm_call(forced.text, {"role": "user", "content": "q"})
    assert score_levels(TASK, Trajectory(task_id="t", group_id="g", calls=[bare])) == {
        "parsed": False, "right_calls": False, "right_answer": False}
    # analyzer calls are not the policy's
    analyzer = answer.model_copy(update={"purpose": "analyzer", "text": "0"})
    assert score_levels(TASK, traj.model_copy(update={"calls": [*traj.calls, analyzer]}))["right_answer"]


def test_a_call_is_matched_once() -> None:
    task = Task(task_id="t", data={"answer": 2, "calls": [{"name": "lookup", "args": {"place": "A", "field": "area"}},
                                                          {"name": "lookup", "args": {"place": "A", "field": "area"}}]})
    one = {"messages": [AIMessage("", tool_calls=[call("lookup", {"place": "A", "field": "area"})])]}
    assert not score_levels(task, one)["right_calls"]


def test_band_cell_counts_groups_without_reward_variance() -> None:
    from bench.atlas_band import cell_figures

    def ep(task: str, reward: float, fault: str | None = None) -> dict:
        return {"task_id": task, "reward": reward, "fault": fault, "parsed": True, "right_calls": reward > 0,
                "right_answer": reward > 0, "tokens": 10, "steps": 2}

    cell = cell_figures([ep("a", 1.0), ep("a", 0.0), ep("b", 0.0), ep("b", 0.0), ep("b", 1.0, fault="timeout")])
    assert cell["success"] == pytest.approx(0.25) and cell["right_calls"] == pytest.approx(0.25)
    assert cell["zero_variance_groups"] == 0.5 and cell["faults"] == 1 and cell["answer_disagrees_with_reward"] == 0


def test_a_temperature_sweep_keeps_each_temperatures_cells_apart() -> None:
    from bench.atlas_band import _per_task, figures_by_temperature

    def ep(t: float, task: str, reward: float) -> dict:
        return {"temperature": t, "mode": "forced", "level": 0, "task_id": task, "reward": reward, "fault": None,
                "parsed": True, "right_calls": reward > 0, "right_answer": reward > 0, "tokens": 10, "steps": 2}

    episodes = [ep(0.3, "a", 1.0), ep(0.3, "a", 0.0), ep(0.7, "a", 0.0), ep(0.7, "a", 0.0)]
    by_t = figures_by_temperature(episodes)
    assert list(by_t) == ["0.3", "0.7"]
    assert by_t["0.3"]["forced"]["0"]["success"] == 0.5 and by_t["0.3"]["forced"]["0"]["zero_variance_groups"] == 0.0
    assert by_t["0.7"]["forced"]["0"]["success"] == 0.0 and by_t["0.7"]["forced"]["0"]["zero_variance_groups"] == 1.0
    assert _per_task(episodes) == {"0.3/forced": {"a": [1, 2]}, "0.7/forced": {"a": [0, 2]}}


@pytest.mark.parametrize("argv", [["--temperatures", "0"], ["--temperatures", "0.5", "0.5"],
                                  ["--result-name", "../x"]])
def test_the_band_probe_refuses_a_greedy_or_repeated_temperature_and_a_path_as_name(argv, capsys) -> None:
    from bench.atlas_band import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and "error:" in capsys.readouterr().err


def test_each_first_turn_mode_builds_the_agent_it_names(tokenizer) -> None:
    """The benches pick the agent by mode name: ``forced-two`` forces the lookup and the call
    after it (level 1's ``add``), then the answer is free; a forced turn's prompt ends in the
    call's opening."""
    import asyncio

    import examples.atlas_tasks as atlas_tasks
    from seed_agents.capture import capture
    from seed_agents.chat_model import SeedChatModel
    from seed_agents.testing import FakeBackend
    from seed_agents.types import SamplingParams

    task = make_tasks("train", 1, levels=(1,))[0]
    replies = [f'<tool_call>\n{json.dumps({"name": c["name"], "arguments": c["args"]})}\n</tool_call>'
               for c in task.data["calls"]] + [str(task.data["answer"])]
    from bench.atlas_band import MODES

    forced = {"forced": [True, False, False], "auto": [False, False, False], "forced-two": [True, True, False],
              "lookup-add": [True, True, False]}
    assert set(atlas_tasks.BUILDERS) == set(forced) == set(MODES)
    for mode, builder in atlas_tasks.BUILDERS.items():
        llm = SeedChatModel(backend=FakeBackend(tokenizer, replies), tokenizer=tokenizer,
                            sampling=SamplingParams(max_tokens=64, temperature=0.5))
        with capture() as cap:
            state = asyncio.run(getattr(atlas_tasks, builder)(llm).ainvoke({"task": task}))
        assert [c.messages[-1]["role"] == "assistant" for c in cap.calls] == forced[mode], mode
        assert answer_reward(task, state) == 1.0
        if mode == "lookup-add":  # the tools named: each forced opening carries its tool's name
            assert [c.messages[-1]["content"].endswith(f'"name": "{n}", "arguments":') for c, n in
                    zip(cap.calls, ("lookup", "add"))] == [True, True]


# -- the validation and test splits ---------------------------------------------------------

def _asked(tasks: list[Task]) -> set[str]:
    return {c["args"]["place"] for t in tasks for c in t.data["calls"] if c["name"] == "lookup"}


def test_train_validation_and_test_ask_about_disjoint_places() -> None:
    from seed_agents.tools import atlas as family

    train, heldout = _asked(make_tasks("train")), _asked(make_tasks("heldout"))
    validation, test = _asked(make_tasks("validation")), _asked(make_tasks("test"))
    assert not train & validation and not train & test and not validation & test
    assert validation <= set(list(places())[slice(*family.EVAL_SPLITS["validation"])])
    assert test <= set(list(places())[slice(*family.EVAL_SPLITS["test"])])
    assert not test & heldout  # the test places are ones no past run was tuned or reported on


def test_the_first_400_places_are_those_past_runs_asked_about() -> None:
    """Growing the atlas for the test split left every earlier place and fact as it was."""
    from seed_agents.tools.atlas import generate_places

    assert list(places().items())[:400] == list(generate_places(22, 400).items())


def test_test_phrasings_are_unseen_in_train_and_validation_and_half_the_test_split() -> None:
    import re

    def shape(question: str) -> str:  # the template: places and numbers blanked out
        names = "|".join(sorted(places(), key=len, reverse=True))
        return re.sub(r"\d+", "#", re.sub(rf"\b({names})\b", "@", question))

    test = make_tasks("test")
    seen = {shape(t.data["question"]) for split in ("train", "heldout", "validation") for t in make_tasks(split)}
    unseen = [t for t in test if t.data["phrasing"] == "unseen"]
    assert len(unseen) == len(test) // 2
    assert not {shape(t.data["question"]) for t in unseen} & seen
    assert {shape(t.data["question"]) for t in test if t.data["phrasing"] == "seen"} <= seen
    assert all(t.data["phrasing"] == "seen" for t in make_tasks("validation"))


def test_split_sizes_distinct_questions_and_determinism() -> None:
    from seed_agents.tools.atlas import final_test_tasks, validation_tasks

    test, validation = make_tasks("test"), make_tasks("validation")
    for tasks, per_level in ((test, 300), (validation, 150)):
        for level in LEVELS:
            mine = [t for t in tasks if t.data["level"] == level]
            assert len(mine) == per_level
            facts = {frozenset((c["args"]["place"], c["args"]["field"]) for c in t.data["calls"] if c["name"] == "lookup")
                     for t in mine}
            assert len(facts) == per_level  # no fact asked twice within a level
    assert make_tasks("test") == test and make_tasks("validation") == validation
    assert final_test_tasks() == [t for t in test if t.data["level"] == 0]
    assert validation_tasks() == [t for t in validation if t.data["level"] == 0]
    assert len({t.task_id for t in test + validation}) == len(test) + len(validation)


def test_every_split_task_is_answered_by_its_calls() -> None:
    from seed_agents.tools.atlas import lookup_fact

    for task in make_tasks("test", per_level=20) + make_tasks("validation", per_level=20):
        looked = [int(lookup_fact(c["args"]["place"], c["args"]["field"], places()).rsplit(" ", 1)[1].rstrip("."))
                  for c in task.data["calls"] if c["name"] == "lookup"]
        extra = [c["args"]["b"] for c in task.data["calls"] if c["name"] == "add" and task.data["level"] == 1]
        assert sum(looked) + sum(extra) == task.data["answer"]


def test_an_unknown_split_names_them_all() -> None:
    with pytest.raises(ValueError, match="validation, test"):
        make_tasks("dev")
