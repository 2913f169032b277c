"""The end-of-run summary is a function of the run dir's files: built here from a few lines of JSON."""

import json

import pytest

from seed_agents.observe.run_summary import ANY_TOOL, RIGHT_TOOL, format_summary, run_summary
from seed_agents.tool_calls import format_tool_call
from seed_agents.types import FaultKind, LLMCall, Task, Trajectory

TOOLS = [{"type": "function", "function": {"name": n, "parameters": {}}} for n in ("lookup", "add")]
LOOKUP = format_tool_call("lookup", {"place": "Varnok", "field": "area"})
ADD = format_tool_call("add", {"a": 1, "b": 2})


def call(text: str, tools=TOOLS, last: dict | None = None) -> LLMCall:
    return LLMCall(messages=[{"role": "user", "content": "q"}, *([last] if last else [])], tools=tools,
                   prompt_ids=[1], completion_ids=[2], logprobs=[-0.1], text=text)


def episode(task_id: str, updates: int, *texts: str, success: bool = False, tools=TOOLS,
            fault: FaultKind | None = None) -> Trajectory:
    return Trajectory(task_id=task_id, group_id="g", calls=[call(t, tools) for t in texts], success=success,
                      fault=fault, metadata={"iteration": updates - 1})


def write(path, records) -> None:
    path.write_text("".join((r.model_dump_json() if hasattr(r, "model_dump_json") else json.dumps(r)) + "\n"
                            for r in records))


def run_dir(tmp_path, trajs, tasks, *, updates=(0, 2), success=(0.25, 0.75), temperature=0.0):
    (tmp_path / "config.json").write_text(json.dumps({"eval": {"temperature": temperature}}))
    write(tmp_path / "metrics.jsonl", [{"iteration": i, "success_rate": s} for i, s in enumerate((0.5, 0.25))]
          + [{"iteration": 1, "note": "not a metrics row of an update"}])
    write(tmp_path / "eval.jsonl", [{"iteration": u - 1, "updates": u, "success_rate": s, "episodes": 4,
                                     "episodes_measured": 4} for u, s in zip(updates, success, strict=True)])
    write(tmp_path / "eval_trajectories.jsonl", trajs)
    write(tmp_path / "eval_tasks.jsonl", tasks)
    return tmp_path


NAMED = [Task(task_id="a", data={"question": "q", "calls": [{"name": "lookup", "args": {}}]}),
         Task(task_id="b", data={"question": "q", "calls": [{"name": "lookup", "args": {}}, {"name": "add", "args": {}}]})]


def test_the_summary_reads_success_tool_use_and_markup_from_the_run_dir(tmp_path):
    trajs = [episode("a", 0, "It is 5."), episode("b", 0, "It is 5."),  # before: no tool called
             episode("a", 0, LOOKUP, "<tool_response>\nThe area of Varnok is 5."),  # called it, quoted it
             episode("b", 0, LOOKUP, LOOKUP),  # ran out of turns calling: no answer
             episode("a", 2, LOOKUP, "5"), episode("b", 2, LOOKUP, ADD, "5"),
             episode("b", 2, LOOKUP, "5</tool_response>"), episode("b", 2, ADD, "8"),
             episode("a", 2, "x", fault=FaultKind.BACKEND)]  # says nothing about the policy: left out
    s = run_summary(run_dir(tmp_path, trajs, NAMED))
    assert s["updates"] == 2 and s["training_success"] == [0.5, 0.25]
    held = s["heldout"]
    assert held["tool_measure"] == RIGHT_TOOL and held["temperature"] == 0.0 and held["gain"] == pytest.approx(0.5)
    before, after = held["before"], held["after"]
    assert (before["updates"], before["success_rate"], after["updates"], after["success_rate"]) == (0, 0.25, 2, 0.75)
    assert before["tool_share"] == pytest.approx(1 / 4) and after["tool_share"] == pytest.approx(2 / 4)
    assert (before["answers"], before["markup_share"]) == (3, pytest.approx(1 / 3))
    assert (after["answers"], after["markup_share"]) == (4, pytest.approx(1 / 4))
    assert after["per_tool"] == {"add": {"needed": 3, "called": 2}, "lookup": {"needed": 4, "called": 3}}
    text = format_summary({**s, "wall_s": 125.4, "learning_curve": str(tmp_path / "learning_curve.png")})
    assert "held-out success (greedy, 4 episodes): 0.25 after 0 updates -> 0.75 after 2 (+0.50)" in text
    assert "called every tool its task names: 0.25 -> 0.50 (at the end, per tool: add 2/3, lookup 3/4)" in text
    assert "answers with chat-template markup: 0.33 -> 0.25 (of 4 final answers at the end)" in text
    assert "training success per update: 0.50 0.25" in text and "wall time: 2 min 5 s" in text
    assert f"learning curve: {tmp_path / 'learning_curve.png'}" in text
    assert len(text.splitlines()) <= 24  # one screen


def test_tasks_that_name_no_calls_are_measured_by_any_tool_and_say_so(tmp_path):
    tasks = [NAMED[0], Task(task_id="c", data={"question": "q"})]
    trajs = [episode("a", 0, "5"), episode("c", 0, ADD, "3"), episode("a", 1, LOOKUP, "5"), episode("c", 1, "3")]
    s = run_summary(run_dir(tmp_path, trajs, tasks, updates=(0, 1)))
    assert s["heldout"]["tool_measure"] == ANY_TOOL
    assert s["heldout"]["before"]["tool_share"] == 0.5 and "per_tool" not in s["heldout"]["after"]
    assert 'called any tool: 0.50 -> 0.50 (the held-out tasks do not all name their calls in data["calls"])' in \
        format_summary(s)


def test_without_tools_or_held_out_evaluation_the_summary_says_what_it_did_not_measure(tmp_path):
    trajs = [episode("c", 2, "go north", tools=None)]
    s = run_summary(run_dir(tmp_path, trajs, [], updates=(2,), success=(0.0,), temperature=0.5))
    assert s["heldout"]["tool_measure"] is None and s["heldout"]["gain"] is None
    text = format_summary(s)
    assert "held-out success (at T 0.5, 4 episodes): 0.00 after 2 updates (one evaluation" in text
    assert "tool use: not measured" in text
    (tmp_path / "eval.jsonl").unlink()
    assert run_summary(tmp_path)["heldout"] is None
    assert "held-out success: not measured (add an `eval` section" in format_summary(run_summary(tmp_path))
