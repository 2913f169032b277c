"""The family the main job ships with: its tasks' splits and its agent's reward."""

from __future__ import annotations

from seed_agents.app.builders import read_tasks
from seed_agents.task_calls import task_calls
from seed_agents.tools import atlas


def test_the_main_job_holds_out_at_least_100_distinct_questions_about_places_never_trained_on():
    train, heldout = atlas.train_tasks(), atlas.heldout_tasks()
    assert len(heldout) >= 100 and len({t.data["question"] for t in heldout}) == len(heldout)
    place = lambda t: task_calls(t.data)[0]["args"]["place"]  # noqa: E731
    assert not {place(t) for t in train} & {place(t) for t in heldout}
    assert {t.data["level"] for t in train + heldout} == {0}
    facts = atlas.places()
    for t in heldout:
        call = task_calls(t.data)[0]
        assert facts[call["args"]["place"]][call["args"]["field"]] == t.data["answer"]


def test_the_config_names_the_tasks_by_import_path():
    assert [t.task_id for t in read_tasks("seed_agents.tools.atlas:heldout_tasks")] == \
        [t.task_id for t in atlas.heldout_tasks()]


def test_the_reward_pays_for_the_number_alone_never_for_markup():
    task = atlas.heldout_tasks()[0]
    n = task.data["answer"]
    assert atlas.answer_reward(task, {"answer": f"{n:,}"}) == 1.0
    assert atlas.answer_reward(task, {"answer": f"<tool_response>\nThe area is {n}.\n</tool_response>"}) == 0.0
    assert atlas.answer_reward(task, {"answer": str(n + 1)}) == 0.0
