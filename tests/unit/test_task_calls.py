"""The task contract (``data["calls"]``) and an episode's calls read back from its trajectory."""

import pytest

from seed_agents.task_calls import called_the_tools, episode_calls, final_answer, matched, task_calls
from seed_agents.types import LLMCall, Trajectory

TOOLS = [{"type": "function", "function": {"name": n, "parameters": {}}} for n in ("lookup", "add")]


def call(text: str, tools=TOOLS) -> LLMCall:
    return LLMCall(messages=[{"role": "user", "content": "q"}], tools=tools, prompt_ids=[1], completion_ids=[2],
                   logprobs=[-0.1], text=text)


def test_the_task_contract():
    assert task_calls({}) is None and task_calls({"calls": []}) is None
    assert task_calls({"calls": [{"name": "add", "args": {"a": 1}}]}) == [{"name": "add", "args": {"a": 1}}]
    for bad in ("add", [{"args": {}}], [{"name": "add", "args": [1]}], [{"name": ""}]):
        with pytest.raises(ValueError, match='data\\["calls"\\]'):
            task_calls({"calls": bad})
    need = [{"name": "lookup", "args": {}}, {"name": "lookup", "args": {}}]
    assert not called_the_tools(need, [{"name": "lookup", "args": {}}])  # named twice: called twice
    assert called_the_tools(need, [{"name": "lookup"}, {"name": "add"}, {"name": "lookup"}])
    assert not matched([{"name": "add", "args": {"a": 1}}], [{"name": "add", "args": {"a": 2}}],
                       lambda want, got: want == {"name": got["name"], "args": got["args"]})


def test_an_episode_is_read_back_from_its_trajectory():
    """A forced call's prefill is in the prompt: put back before parsing; a call is not an answer."""
    forced = LLMCall(messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": '<tool_call>\n{"name": "'}],
                     tools=TOOLS, prompt_ids=[1], completion_ids=[2], logprobs=[0.0],
                     text='add", "arguments": {"a": 1, "b": 2}}\n</tool_call>')
    traj = Trajectory(task_id="t", group_id="g", calls=[forced, call("3")])
    made, content = episode_calls(traj)
    assert [c["name"] for c in made] == ["add"] and content == "3" and final_answer(traj) == "3"
    assert final_answer(traj.model_copy(update={"calls": [forced]})) is None
    assert final_answer(traj.model_copy(update={"calls": [call("<tool_call>{oops")]})) is None  # invalid: not an answer
    assert final_answer(traj.model_copy(update={"calls": []})) is None
    # with no tool bound nothing is parsed: the whole text is the answer, tags included
    assert final_answer(traj.model_copy(update={"calls": [call(" <tool_call>x ", tools=None)]})) == "<tool_call>x"
