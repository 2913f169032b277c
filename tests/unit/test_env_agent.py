"""The env agent graph and the runner, with a scripted env and a fake backend."""

import asyncio

import pytest

from seed_agents.capture import capture
from seed_agents.chat_model import SeedChatModel
from seed_agents.graphs.env_agent import build_env_agent, parse_action
from seed_agents.rows import trajectory_to_rows
from seed_agents.runner import EpisodeRunner, RunnerConfig
from seed_agents.testing import FakeBackend, ScriptedEnv
from seed_agents.types import SamplingParams, StopReason, Task

ADMISSIBLE = ["go north", "open door", "take key"]


@pytest.mark.parametrize("reply,expected", [
    ("open door", "open door"), ("Open Door.", "open door"), ("> go north", "go north"),
    ('"take key"', "take key"), ("2", "open door"), ("3. take key", "take key"),
    ("Action: go north\nbecause...", "go north"), ("I think I should dance", "I think I should dance"),
    ("9", "9"), ("", ""),
])
def test_parse_action(reply, expected):
    assert parse_action(reply, ADMISSIBLE) == expected


def solver(prompt_text_fn):
    """Reply with the solution step the prompt asks for (the env lists it)."""
    def reply(prompt_ids):
        text = prompt_text_fn(prompt_ids)
        current = text.rsplit("Valid commands:", 1)[1]
        return "open door" if "open door" in current else "go north"
    return reply


def make_llm(tokenizer, replies, **kw):
    return SeedChatModel(backend=FakeBackend(tokenizer, replies, **kw), tokenizer=tokenizer,
                         sampling=SamplingParams(max_tokens=16, temperature=0.7))


def run(graph, env, task=Task(task_id="t")):
    return asyncio.run(graph.ainvoke({"task": task}, config={"configurable": {"env": env}}))


def test_agent_wins_and_each_turn_is_captured(tokenizer):
    llm = make_llm(tokenizer, solver(tokenizer.decode))
    graph = build_env_agent(llm, max_turns=5)
    env = ScriptedEnv()
    with capture() as cap:
        state = run(graph, env)
    assert state["success"] and state["done"] and state["reward"] == 1.0
    assert state["steps"] == 2 and state["invalid_actions"] == 0
    assert state["stop_reason"] == StopReason.DONE
    assert len(cap.calls) == 2
    c = cap.calls[0]
    assert c.completion_ids[-1] == tokenizer.eos_token_id and len(c.logprobs) == len(c.completion_ids)
    assert tokenizer.decode(c.prompt_ids).endswith("<|im_start|>assistant\n")
    assert "1. go north" in c.messages[-1]["content"] or "1. look" in c.messages[-1]["content"]


def test_invalid_actions_are_fed_back_counted_and_not_fatal(tokenizer):
    llm = make_llm(tokenizer, ["dance wildly", "open door", "go north"])
    graph = build_env_agent(llm, max_turns=5)
    with capture() as cap:
        state = run(graph, ScriptedEnv())
    assert state["success"] and state["invalid_actions"] == 1 and state["steps"] == 3
    second_prompt = tokenizer.decode(cap.calls[1].prompt_ids)
    assert "not a valid action" in second_prompt and "dance wildly" in second_prompt


def test_max_turns_stops_the_episode(tokenizer):
    graph = build_env_agent(make_llm(tokenizer, ["look"]), max_turns=3)
    state = run(graph, ScriptedEnv())
    assert not state["success"] and state["steps"] == 3 and state["stop_reason"] == StopReason.MAX_TURNS


def test_history_window_limits_the_prompt(tokenizer):
    graph = build_env_agent(make_llm(tokenizer, ["look"]), max_turns=4, history_window=1)
    with capture() as cap:
        run(graph, ScriptedEnv())
    last = tokenizer.decode(cap.calls[-1].prompt_ids)
    assert last.count("Observation:") == 1  # only the last pair of history


def test_chat_layout_merges_into_one_row_with_the_real_template(tokenizer):
    graph = build_env_agent(make_llm(tokenizer, ["look", "open door", "go north"]), max_turns=5, history="chat")
    with capture() as cap:
        state = run(graph, ScriptedEnv())
    assert state["success"]
    from seed_agents.types import Trajectory

    traj = Trajectory(task_id="t", group_id="g", calls=cap.calls)
    rows = trajectory_to_rows(traj)
    assert len(cap.calls) == 3 and len(rows) == 1
    assert rows[0].num_sampled_tokens == sum(len(c.completion_ids) for c in cap.calls)
    window_graph = build_env_agent(make_llm(tokenizer, ["look", "open door", "go north"]), max_turns=5)
    with capture() as cap2:
        run(window_graph, ScriptedEnv())
    assert len(trajectory_to_rows(Trajectory(task_id="t", group_id="g", calls=cap2.calls))) == 3


def test_bad_agent_options_are_rejected(tokenizer):
    with pytest.raises(ValueError, match="max_turns"):
        build_env_agent(make_llm(tokenizer, ["x"]), max_turns=0)


# -- runner ---------------------------------------------------------------------------

def runner_for(tokenizer, replies, make_env, **cfg):
    graph = build_env_agent(make_llm(tokenizer, replies), max_turns=4)
    return EpisodeRunner(graph, RunnerConfig(progress=False, **cfg), make_env=make_env)


def test_runner_groups_and_isolates_episodes(tokenizer):
    tasks = [Task(task_id="a"), Task(task_id="b")]
    runner = runner_for(tokenizer, solver(tokenizer.decode), lambda t: ScriptedEnv(), group_size=3, concurrency=4)
    trajs = asyncio.run(runner.run(tasks))
    assert [(t.task_id, t.sample_index) for t in trajs] == [("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1), ("b", 2)]
    assert len({t.group_id for t in trajs}) == 2 and all(t.success for t in trajs)
    for t in trajs:  # each episode captured exactly its own two calls
        assert len(t.calls) == 2 and all(c.scope["trajectory_id"] == t.trajectory_id for c in t.calls)


def test_env_exception_becomes_a_recorded_failed_trajectory(tokenizer):
    runner = runner_for(tokenizer, ["open door"], lambda t: ScriptedEnv(raise_on_step=1))
    [traj] = asyncio.run(runner.run([Task(task_id="a")]))
    assert traj.stop_reason == StopReason.ERROR and not traj.success
    assert "scripted env failure" in traj.error and len(traj.calls) == 1  # the call made before the failure is kept


def test_hung_env_times_out_without_blocking_the_others(tokenizer):
    envs = {"slow": lambda: ScriptedEnv(hang_s=1.5), "ok": ScriptedEnv}
    runner = runner_for(tokenizer, solver(tokenizer.decode), lambda t: envs[t.task_id](), episode_timeout_s=0.3, concurrency=2)
    trajs = asyncio.run(runner.run([Task(task_id="slow"), Task(task_id="ok")]))
    assert trajs[0].stop_reason == StopReason.TIMEOUT and "exceeded" in trajs[0].error
    assert trajs[1].success


def test_backend_failure_is_recorded(tokenizer):
    graph = build_env_agent(make_llm(tokenizer, ["open door"], fail_on={0}), max_turns=4)
    runner = EpisodeRunner(graph, RunnerConfig(progress=False), make_env=lambda t: ScriptedEnv())
    [traj] = asyncio.run(runner.run([Task(task_id="a")]))
    assert traj.stop_reason == StopReason.ERROR and "scripted failure" in traj.error


def test_env_is_closed_after_each_episode(tokenizer):
    made = []

    def make(task):
        made.append(ScriptedEnv())
        return made[-1]

    asyncio.run(runner_for(tokenizer, ["look"], make, group_size=2).run([Task(task_id="a")]))
    assert len(made) == 2 and all(e.closed for e in made)


def test_runner_can_run_twice_in_one_event_loop(tokenizer):
    """The runner installs its env thread pool once per loop, so repeated runs reuse it."""
    runner = runner_for(tokenizer, solver(tokenizer.decode), lambda t: ScriptedEnv())

    async def twice():
        a = await runner.run([Task(task_id="a")])
        pool_loop = runner._executor_loop
        b = await runner.run([Task(task_id="b")])
        return a, b, pool_loop is runner._executor_loop is asyncio.get_running_loop()

    a, b, same = asyncio.run(twice())
    assert a[0].success and b[0].success and same


def test_window_layout_keeps_the_objective_in_view_after_it_leaves_the_window(tokenizer):
    class ObjectiveEnv(ScriptedEnv):
        def _obs(self, text, reward=0.0, invalid=False):
            obs = super()._obs(text, reward, invalid)
            obs.info["objective"] = "Your task is to: leave the room."
            return obs

    graph = build_env_agent(make_llm(tokenizer, ["look"]), max_turns=4, history_window=1)
    with capture() as cap:
        run(graph, ObjectiveEnv())
    prompts = [c.messages[-1]["content"] for c in cap.calls]
    assert all(p.startswith("Your task is to: leave the room.") and p.count("Your task is to:") == 1 for p in prompts)


def test_a_hung_env_does_not_hold_up_the_end_of_the_run(tokenizer):
    """``asyncio.run`` (each training iteration, each eval) shuts the loop's executor down
    and, with a plain thread pool, waits for the thread still stuck in ``env.step``; the
    run would end only when the env does (never, for a dead game process)."""
    import time

    envs = {"hung": lambda: ScriptedEnv(hang_s=6.0), "ok": ScriptedEnv}
    runner = runner_for(tokenizer, solver(tokenizer.decode), lambda t: envs[t.task_id](), episode_timeout_s=0.3, concurrency=2)
    t0 = time.perf_counter()
    trajs = asyncio.run(runner.run([Task(task_id="hung"), Task(task_id="ok")]))
    assert time.perf_counter() - t0 < 3.0
    assert trajs[0].stop_reason == StopReason.TIMEOUT and trajs[1].success
