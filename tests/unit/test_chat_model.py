"""SeedChatModel: rendering, tools, capture, and wrapping LangGraph's prebuilt agent."""

import asyncio

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

from seed_agents.capture import capture
from seed_agents.chat_model import SeedChatModel
from seed_agents.graphs.calculator import TOOLS, build_react_calculator, calculator_reward, calculator_tasks
from seed_agents.graphs.tool_agent import build_tool_agent
from seed_agents.runner import EpisodeRunner, RunnerConfig
from seed_agents.testing import FakeBackend
from seed_agents.types import SamplingParams, StopReason

CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 3, "b": 4}}\n</tool_call>'


def llm_with(tokenizer, replies, **kw):
    return SeedChatModel(backend=FakeBackend(tokenizer, replies), tokenizer=tokenizer,
                         sampling=SamplingParams(max_tokens=64, temperature=0.5), **kw)


def test_prompt_ids_are_the_rendered_chat_template(tokenizer):
    llm = llm_with(tokenizer, ["hello"])
    with capture() as cap:
        msg = llm.invoke([SystemMessage("Be brief."), HumanMessage("hi")])
    call = cap.calls[0]
    expected = tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
        add_generation_prompt=True, tokenize=False)
    assert tokenizer.decode(call.prompt_ids) == expected
    assert msg.content == "hello" and call.text == "hello"
    assert call.completion_ids == tokenizer("hello", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    assert call.sampling.temperature == 0.5 and tokenizer.eos_token_id in call.sampling.stop_token_ids
    assert msg.response_metadata["call_id"] == call.call_id and msg.usage_metadata["output_tokens"] == len(call.completion_ids)


def test_sampling_overrides_via_bind_and_purpose_override(tokenizer):
    llm = llm_with(tokenizer, ["x"])
    with capture(purpose="analyzer") as cap:
        llm.bind(temperature=0.0, max_tokens=7).invoke("q")
    assert cap.calls[0].sampling.temperature == 0.0 and cap.calls[0].sampling.max_tokens == 7
    assert cap.calls[0].purpose == "analyzer"


def test_bind_tools_renders_schemas_and_parses_calls(tokenizer):
    llm = llm_with(tokenizer, [CALL]).bind_tools(TOOLS)
    with capture() as cap:
        msg = llm.invoke("What is 3 + 4?")
    assert msg.tool_calls[0]["name"] == "add" and msg.tool_calls[0]["args"] == {"a": 3, "b": 4}
    prompt = tokenizer.decode(cap.calls[0].prompt_ids)
    assert "<tools>" in prompt and '"name": "multiply"' in prompt  # SmolLM2 has no tool template: Hermes fallback
    assert cap.calls[0].tools[0]["function"]["name"] == "add"


def test_tool_history_is_rendered_for_templates_without_tools(tokenizer):
    llm = llm_with(tokenizer, ["7"]).bind_tools(TOOLS)
    history = [HumanMessage("3+4?"), AIMessage("", tool_calls=[{"name": "add", "args": {"a": 3, "b": 4}, "id": "c1"}]),
               ToolMessage("7.0", tool_call_id="c1")]
    with capture() as cap:
        llm.invoke(history)
    prompt = tokenizer.decode(cap.calls[0].prompt_ids)
    assert '{"name": "add", "arguments": {"a": 3, "b": 4}}' in prompt and "<tool_response>\n7.0\n</tool_response>" in prompt


def test_malformed_tool_call_is_reported_not_raised(tokenizer):
    msg = llm_with(tokenizer, ["<tool_call>{oops}</tool_call>"]).bind_tools(TOOLS).invoke("q")
    assert msg.tool_calls == [] and msg.invalid_tool_calls[0]["error"].startswith("not JSON")


def test_stop_strings_cut_the_recorded_ids_at_the_stopping_token(tokenizer):
    """Stop strings are token-exact (more in test_chat_model_streaming.py)."""
    with capture() as cap:
        msg = llm_with(tokenizer, ["one\ntwo"]).invoke("q", stop=["\n"])
    assert msg.content == "one" and msg.response_metadata["stop_sequence"] == "\n"
    assert cap.calls[0].text == tokenizer.decode(cap.calls[0].completion_ids) and cap.calls[0].text.startswith("one\n")


def test_async_invoke_is_captured(tokenizer):
    llm = llm_with(tokenizer, ["a", "b"])

    async def main():
        with capture() as cap:
            await asyncio.gather(llm.ainvoke("1"), llm.ainvoke("2"))
        return cap

    assert len(asyncio.run(main()).calls) == 2


def test_wrapping_langgraph_prebuilt_react_agent(tokenizer):
    """An existing agent improves with us by swapping its chat model; nothing else."""
    llm = llm_with(tokenizer, ['<tool_call>\n{"name": "add", "arguments": {"a": 3, "b": 4}}\n</tool_call>',
                               '<tool_call>\n{"name": "multiply", "arguments": {"a": 7, "b": 5}}\n</tool_call>',
                               "The answer is 35."])
    agent = build_react_calculator(llm)
    with capture(run="demo") as cap:
        state = agent.invoke({"messages": [("user", "What is (3 + 4) * 5?")]})
    assert [c.text.split('"name": "')[1].split('"')[0] for c in cap.calls[:2]] == ["add", "multiply"]
    assert len(cap.calls) == 3 and state["messages"][-1].content == "The answer is 35."
    tool_results = [m.content for m in state["messages"] if isinstance(m, ToolMessage)]
    assert tool_results == ["7.0", "35.0"]
    # the tool result reached the model's next prompt, token-exactly captured
    assert "<tool_response>\n7.0\n</tool_response>" in tokenizer.decode(cap.calls[1].prompt_ids)
    assert all(c.scope["run"] == "demo" for c in cap.calls)


def test_react_calculator_under_the_runner_with_reward(tokenizer):
    tasks = calculator_tasks(2, seed=1)
    answers = {t.data["question"]: t.data["answer"] for t in tasks}

    def reply(prompt_ids):
        text = tokenizer.decode(prompt_ids)
        question = next(q for q in answers if q in text)
        return f"It is {answers[question]}."

    graph = build_react_calculator(llm_with(tokenizer, reply))
    runner = EpisodeRunner(graph, RunnerConfig(progress=False, group_size=2), reward_fn=calculator_reward,
                           make_input=lambda t: {"messages": [("user", t.data["question"])]})
    trajs = asyncio.run(runner.run(tasks))
    assert len(trajs) == 4 and all(t.reward == 1.0 and t.success for t in trajs)
    assert all(len(t.calls) == 1 for t in trajs)


def test_generic_tool_agent_feeds_back_malformed_calls(tokenizer):
    llm = llm_with(tokenizer, ["<tool_call>{bad</tool_call>", CALL, "7"])
    graph = build_tool_agent(llm, TOOLS, max_turns=5)
    from seed_agents.types import Task

    state = asyncio.run(graph.ainvoke({"task": Task(task_id="q", data={"question": "3+4?"})}))
    assert state["invalid_actions"] == 1 and state["answer"] == "7" and state["stop_reason"] == StopReason.DONE
    assert state["steps"] == 3


def test_the_tool_agent_gives_each_leading_turn_its_tool_choice(tokenizer):
    """``turn_tool_choices`` forces each of the first turns as it says (a named tool, any tool,
    or free); the turns after choose freely. A forced turn's prompt ends in the call's opening,
    naming the tool where one is named."""
    import pytest

    from seed_agents.types import Task

    for choices, forced in (((), [True, False, False]), (("any", "any"), [True, True, False]),
                            (("add", None), [True, False, False]), ((None, "any"), [False, True, False])):
        graph = build_tool_agent(llm_with(tokenizer, [CALL, CALL, "7"]), TOOLS, max_turns=5,
                                 **({"turn_tool_choices": choices} if choices else {"first_tool_choice": "any"}))
        with capture() as cap:
            state = asyncio.run(graph.ainvoke({"task": Task(task_id="q", data={"question": "3+4?"})}))
        assert [c.messages[-1]["role"] == "assistant" for c in cap.calls] == forced and state["answer"] == "7"
        if choices and choices[0] == "add":
            assert cap.calls[0].messages[-1]["content"].endswith('"name": "add", "arguments":')
    with pytest.raises(ValueError, match="both set"):
        build_tool_agent(llm_with(tokenizer, ["7"]), TOOLS, first_tool_choice="any", turn_tool_choices=("any",))
