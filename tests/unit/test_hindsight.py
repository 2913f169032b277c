"""The hindsight node: the policy writes a skill about each episode, greedily, captured."""

import asyncio
import json

from seed_agents.capture import capture
from seed_agents.chat_model import SeedChatModel
from seed_agents.graphs.calculator import TOOLS
from seed_agents.graphs.env_agent import build_env_agent
from seed_agents.graphs.hindsight import with_hindsight, write_skill
from seed_agents.graphs.tool_agent import build_tool_agent
from seed_agents.runner import EpisodeRunner, RunnerConfig
from seed_agents.testing import FakeBackend, ScriptedEnv
from seed_agents.types import SamplingParams, Skill, Task

SKILL = "Open the door first, then go north; skip commands that change nothing."
GOOD = json.dumps({"episode_summary": "Opened the door and went north.", "episode_skill": SKILL})


def scripted(tokenizer, analyzer_reply=GOOD, policy=None):
    """Policy turns solve the ScriptedEnv (or follow ``policy``); the analyzer prompt gets ``analyzer_reply``."""
    seen = {"analyzer": 0}

    def reply(prompt_ids):
        text = tokenizer.decode(prompt_ids)
        if "episode_skill" in text:
            seen["analyzer"] += 1
            return analyzer_reply
        if policy is not None:
            return policy(text)
        current = text.rsplit("Valid commands:", 1)[1]
        return "open door" if "open door" in current else "go north"

    return reply, seen


def make_llm(tokenizer, replies, max_tokens=16, **kw):
    return SeedChatModel(backend=FakeBackend(tokenizer, replies, **kw), tokenizer=tokenizer,
                         sampling=SamplingParams(max_tokens=max_tokens, temperature=0.7))


def play(graph, env=None, task=Task(task_id="t")):
    config = {"configurable": {"env": env or ScriptedEnv()}}
    with capture(task_id=task.task_id, trajectory_id="traj-1") as cap:
        state = asyncio.run(graph.ainvoke({"task": task}, config=config))
    return state, cap.calls


def test_write_skill_records_a_greedy_analyzer_call(tokenizer):
    reply, _ = scripted(tokenizer)
    llm = make_llm(tokenizer, reply)
    state, calls = play(build_env_agent(llm, max_turns=5))
    with capture() as cap:
        skill = asyncio.run(write_skill(llm, calls, "Leave the room.", True, max_tokens=200))
    assert skill.valid and skill.reject_reason is None and skill.skill == SKILL
    assert skill.summary == "Opened the door and went north." and skill.raw == GOOD
    assert skill.trajectory_id == "traj-1" and skill.task_id == "t" and skill.success
    [call] = cap.calls
    assert call.purpose == "analyzer" and call.call_id == skill.call_id
    assert call.sampling.temperature == 0.0 and call.sampling.max_tokens == 200
    prompt = tokenizer.decode(call.prompt_ids)
    assert "Leave the room." in prompt and "episode_success: success" in prompt and "Response: go north" in prompt


def test_with_hindsight_writes_a_skill_into_the_final_state(tokenizer):
    reply, seen = scripted(tokenizer)
    llm = make_llm(tokenizer, reply)
    graph = with_hindsight(build_env_agent(llm, max_turns=5), llm)
    state, calls = play(graph)
    assert state["success"] and state["reward"] == 1.0 and state["steps"] == 2  # the agent's state is shared
    skill = state["skill"]
    assert isinstance(skill, Skill) and skill.valid and skill.skill == SKILL and skill.success
    assert skill.trajectory_id == "traj-1" and skill.task_id == "t"
    assert [c.purpose for c in calls] == ["policy", "policy", "analyzer"] and seen["analyzer"] == 1
    analyzer = calls[-1]
    assert analyzer.call_id == skill.call_id and analyzer.scope["trajectory_id"] == "traj-1"
    prompt = tokenizer.decode(analyzer.prompt_ids)
    # default task text: the first user message of the first policy call
    assert "Task description: Current observation:\nYou are in a room. Your task is to leave it." in prompt


def test_the_hindsight_node_asks_with_the_answer_format_it_is_given(tokenizer):
    reply, _ = scripted(tokenizer)
    llm = make_llm(tokenizer, reply)
    state, calls = play(with_hindsight(build_env_agent(llm, max_turns=5), llm, answer_format="described"))
    prompt = tokenizer.decode(calls[-1].prompt_ids)
    assert state["skill"].valid and "<the rule to follow next time>" in prompt and '"string"' not in prompt


def test_failed_episode_gets_avoidance_rules_and_custom_task_text(tokenizer):
    reply, _ = scripted(tokenizer, policy=lambda text: "look")
    llm = make_llm(tokenizer, reply)
    graph = with_hindsight(build_env_agent(llm, max_turns=3), llm, task_text=lambda s: f"Task {s['task'].task_id}: leave")
    state, calls = play(graph)
    assert not state["success"] and not state["skill"].success and state["skill"].valid
    prompt = tokenizer.decode(calls[-1].prompt_ids)
    assert "episode_success: failure" in prompt and "avoidance rules" in prompt and "Task description: Task t: leave" in prompt
    assert prompt.count("Response: look") == 3


def test_failures_skip_asks_nothing_about_a_failed_episode(tokenizer):
    reply, _ = scripted(tokenizer, policy=lambda text: "look")
    llm = make_llm(tokenizer, reply)
    state, calls = play(with_hindsight(build_env_agent(llm, max_turns=3), llm, failures="skip"))
    assert not state["success"] and not state["skill"].valid
    assert state["skill"].reject_reason == "not written: skills.failures skip"
    assert [c.purpose for c in calls] == ["policy"] * 3  # no analyzer call
    reply, _ = scripted(tokenizer)
    llm = make_llm(tokenizer, reply)
    state, calls = play(with_hindsight(build_env_agent(llm, max_turns=5), llm, failures="skip"))
    assert state["success"] and state["skill"].valid and calls[-1].purpose == "analyzer"  # a success still gets one


def test_garbage_analyzer_reply_is_recorded_invalid_and_the_episode_still_succeeds(tokenizer):
    reply, _ = scripted(tokenizer, analyzer_reply="Sure! The agent did great <|im_end|>")
    llm = make_llm(tokenizer, reply)
    state, calls = play(with_hindsight(build_env_agent(llm, max_turns=5), llm))
    assert state["success"] and state["reward"] == 1.0
    skill = state["skill"]
    assert not skill.valid and skill.reject_reason.startswith("not a JSON object") and skill.raw.startswith("Sure!")
    assert skill.call_id == calls[-1].call_id and calls[-1].purpose == "analyzer"


def test_analyzer_backend_error_gives_an_invalid_skill(tokenizer):
    reply, _ = scripted(tokenizer)
    llm = make_llm(tokenizer, reply, fail_on={2})  # calls 0, 1: policy; call 2: the analyzer
    state, calls = play(with_hindsight(build_env_agent(llm, max_turns=5), llm))
    assert state["success"]
    skill = state["skill"]
    assert not skill.valid and skill.reject_reason.startswith("analyzer error: RuntimeError") and skill.call_id is None
    assert [c.purpose for c in calls] == ["policy", "policy"]


def test_without_a_capture_scope_the_skill_is_invalid_not_an_error(tokenizer):
    reply, seen = scripted(tokenizer)
    llm = make_llm(tokenizer, reply)
    graph = with_hindsight(build_env_agent(llm, max_turns=5), llm)
    state = asyncio.run(graph.ainvoke({"task": Task(task_id="t")}, config={"configurable": {"env": ScriptedEnv()}}))
    assert state["success"] and not state["skill"].valid and "no policy calls" in state["skill"].reject_reason
    assert seen["analyzer"] == 0


def test_under_the_runner_each_trajectory_has_one_analyzer_call(tokenizer):
    reply, seen = scripted(tokenizer)
    llm = make_llm(tokenizer, reply)
    graph = with_hindsight(build_env_agent(llm, max_turns=5), llm)
    runner = EpisodeRunner(graph, RunnerConfig(progress=False, group_size=2, concurrency=4), make_env=lambda t: ScriptedEnv())
    trajs = asyncio.run(runner.run([Task(task_id="a"), Task(task_id="b")]))
    assert len(trajs) == 4 and seen["analyzer"] == 4
    for t in trajs:
        assert t.success and t.reward == 1.0 and t.steps == 2
        analyzer = [c for c in t.calls if c.purpose == "analyzer"]
        assert len(analyzer) == 1 and len(t.policy_calls) == 2
        assert analyzer[0].scope["trajectory_id"] == t.trajectory_id and analyzer[0].sampling.temperature == 0.0
        # the analyzer saw exactly this episode's steps
        prompt = analyzer[0].messages[-1]["content"]
        assert prompt.count("\nStep ") + prompt.startswith("Step ") == 2 and "Step 1\n" in prompt


def tool_reply(tokenizer):
    """Call `add`, then answer; write a valid skill when asked to analyze."""
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 3, "b": 4}}\n</tool_call>'

    def reply(prompt_ids):
        text = tokenizer.decode(prompt_ids)
        if "episode_skill" in text:
            return GOOD
        return "It is 7." if "<tool_response>" in text else call

    return reply


def test_tool_agent_keys_survive_the_wrap(tokenizer):
    llm = make_llm(tokenizer, tool_reply(tokenizer), max_tokens=64)
    graph = with_hindsight(build_tool_agent(llm, TOOLS, max_turns=4), llm)
    task = Task(task_id="c", data={"question": "What is 3 + 4?"})
    with capture() as cap:
        state = asyncio.run(graph.ainvoke({"task": task}))
    # no success key: the outcome falls back to reward >= 1 (no reward here -> failure)
    assert state["answer"] == "It is 7." and len(state["messages"]) == 4 and not state["skill"].success
    assert state["skill"].valid and [c.purpose for c in cap.calls] == ["policy", "policy", "analyzer"]
    assert "What is 3 + 4?" in cap.calls[-1].messages[-1]["content"]


def test_an_analyzer_object_reads_the_tools_the_episode_offered(tokenizer):
    """The hindsight node's ``EpisodeRecord`` names the tools the policy was offered (what a
    ``skills.opening call`` skill may name); a text env's episode offers none."""
    from seed_agents.stage1.analyzers import Analyzer, AnalyzerReply

    class Reading(Analyzer):
        name = "reading"
        seen: list = []

        async def analyze(self, messages, episode=None):
            self.seen.append(episode.tools)
            return AnalyzerReply(text=GOOD)

    llm = make_llm(tokenizer, tool_reply(tokenizer), max_tokens=64)
    with capture():
        asyncio.run(with_hindsight(build_tool_agent(llm, TOOLS, max_turns=4), Reading()).ainvoke(
            {"task": Task(task_id="c", data={"question": "What is 3 + 4?"})}))
    reply, _ = scripted(tokenizer)
    play(with_hindsight(build_env_agent(make_llm(tokenizer, reply), max_turns=5), Reading()))
    assert Reading.seen == [sorted(t.name for t in TOOLS), []]


def test_prebuilt_react_agent_under_the_runner_with_a_success_fn(tokenizer):
    from seed_agents.graphs.calculator import build_react_calculator, final_answer

    llm = make_llm(tokenizer, tool_reply(tokenizer), max_tokens=64)
    graph = with_hindsight(build_react_calculator(llm), llm, success_fn=lambda s: final_answer(s).endswith("7."))
    with capture(trajectory_id="r") as cap:
        state = asyncio.run(graph.ainvoke({"messages": [("user", "What is 3 + 4?")]}))
    assert final_answer(state) == "It is 7." and state["skill"].valid and state["skill"].success
    assert "episode_success: success" in cap.calls[-1].messages[-1]["content"]
    runner = EpisodeRunner(graph, RunnerConfig(progress=False), reward_fn=lambda t, s: float(final_answer(s) == "It is 7."),
                           make_input=lambda t: {"messages": [("user", t.data["question"])]})
    [traj] = asyncio.run(runner.run([Task(task_id="c", data={"question": "What is 3 + 4?"})]))
    assert traj.success and [c.purpose for c in traj.calls] == ["policy", "policy", "analyzer"]


def test_an_analyzer_object_writes_the_skill_without_an_llm_call(tokenizer):
    """``skills.source: rule_based``: the suite's offline analyzer reads the episode's
    structured turns (from the final state's metadata); the policy is asked nothing, so
    there is no analyzer call and no call_id."""
    from seed_agents.tools.textworld_analyzer import TextWorldAnalyzer

    reply, seen = scripted(tokenizer)
    llm = make_llm(tokenizer, reply)
    graph = with_hindsight(build_env_agent(llm, max_turns=5), TextWorldAnalyzer())
    state, calls = play(graph)
    skill = state["skill"]
    assert state["success"] and skill.valid and skill.success and skill.call_id is None
    assert [c.purpose for c in calls] == ["policy", "policy"] and seen["analyzer"] == 0
    # a workflow of the commands that worked, read off the trajectory
    assert "open door" in skill.skill.lower() and "go north" in skill.skill.lower()
    assert skill.trajectory_id == "traj-1" and skill.task_id == "t"


def test_an_analyzer_that_fails_or_raises_gives_an_invalid_skill(tokenizer):
    from seed_agents.stage1.analyzers import Analyzer, AnalyzerReply

    class Failing(Analyzer):
        name = "failing"

        def __init__(self, raise_it: bool) -> None:
            self.raise_it = raise_it

        async def analyze(self, messages, episode=None):
            if self.raise_it:
                raise TimeoutError("analyzer hung")
            return AnalyzerReply(error="HTTP 503 after 3 attempts", attempts=3)

    reply, _ = scripted(tokenizer)
    llm = make_llm(tokenizer, reply)
    _, calls = play(build_env_agent(llm, max_turns=5))
    failed = asyncio.run(write_skill(Failing(False), calls, "Leave the room.", True))
    raised = asyncio.run(write_skill(Failing(True), calls, "Leave the room.", True))
    assert not failed.valid and failed.reject_reason == "analyzer error: HTTP 503 after 3 attempts"
    assert not raised.valid and raised.reject_reason == "analyzer error: TimeoutError: analyzer hung"
