"""Tasks from a JSONL file or from a function named by import path (a shipped family)."""

from __future__ import annotations

import pytest

from seed_agents.app.builders import read_tasks
from seed_agents.errors import ConfigError
from seed_agents.types import Task


def two_tasks() -> list[dict]:
    return [{"task_id": "a", "data": {"question": "q1"}}, Task(task_id="b", data={"question": "q2"})]


def no_tasks() -> list[Task]:
    return []


def test_a_function_named_by_import_path_gives_its_tasks():
    tasks = read_tasks(f"{__name__}:two_tasks")
    assert [t.task_id for t in tasks] == ["a", "b"] and all(isinstance(t, Task) for t in tasks)


def test_a_file_of_that_name_wins_over_the_function(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    name = f"{__name__}:two_tasks"
    (tmp_path / name).write_text('{"task_id": "from-file", "data": {}}\n')
    assert [t.task_id for t in read_tasks(name)] == ["from-file"]


@pytest.mark.parametrize("spec, says", [("no_such_module_xyz:tasks", "cannot import"),
                                        (f"{__name__}:missing", "has no attribute"),
                                        (f"{__name__}:no_tasks", "returned no tasks")])
def test_a_bad_function_is_one_config_error(spec, says):
    with pytest.raises(ConfigError, match=says):
        read_tasks(spec)


def test_a_missing_file_still_says_so():
    with pytest.raises(ConfigError, match="cannot read tasks file"):
        read_tasks("no/such/tasks.jsonl")
