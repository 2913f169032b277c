"""Real ALFWorld games: the fixture problems (tests/fixtures/alfworld) built into game files
and played by alfworld's wrappers on TextWorld's PDDL engine, through the LangGraph agent."""

import asyncio
import json
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

import seed_agents.tools.alfworld as alf
from seed_agents.capture import read_jsonl
from seed_agents.chat_model import SeedChatModel
from seed_agents.graphs.alfworld import SYSTEM_PROMPT
from seed_agents.metrics import summarize
from seed_agents.runner import EpisodeRunner, RunnerConfig
from seed_agents.testing import FakeBackend, random_play
from seed_agents.tools.alfworld import INVALID_ACTION_TEXT, SPLITS, AlfWorldSuite
from seed_agents.types import SamplingParams, StopReason, Trajectory
from tests.fixtures.alfworld.make_fixtures import build_data_dir

pytestmark = pytest.mark.integration

TYPES = ["pick", "look", "clean", "heat", "cool", "pick2"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return build_data_dir(tmp_path_factory.mktemp("alfworld-data"))


@pytest.fixture(scope="module")
def suite(data_dir):
    return AlfWorldSuite(data_dir=data_dir)


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


def every_task(suite):
    return [t for split in SPLITS for t in suite.tasks(split, len(suite.games(split)))]


def scripted(tokenizer, replies):
    """A chat model that answers from a list, in order (run episodes one at a time)."""
    return SeedChatModel(backend=FakeBackend(tokenizer, replies), tokenizer=tokenizer,
                         sampling=SamplingParams(max_tokens=32, temperature=0.0))


def play(suite, llm, tasks, **graph_options):
    graph = suite.build_graph(llm, **graph_options)
    runner = EpisodeRunner(graph, RunnerConfig(group_size=1, concurrency=1, progress=False), make_env=suite.make_env)
    return asyncio.run(runner.run(tasks))


def test_walkthrough_wins_every_fixture_game(suite):
    tasks = every_task(suite)
    assert len(tasks) == 11 and {t.data["game_type"] for t in tasks} == set(TYPES)
    for task in tasks:
        env = suite.make_env(task)
        obs = env.reset()
        objective = obs.info["objective"]
        assert objective.startswith("Your task is to: ") and obs.text.endswith(objective)
        assert obs.text.startswith("You are in the middle of a room.") and "Welcome" not in obs.text
        assert obs.admissible_actions and "help" not in obs.admissible_actions and not obs.done
        rewards = []
        for action in env.walkthrough:
            assert action in obs.admissible_actions, (task.task_id, action)
            obs = env.step(action)
            rewards.append(obs.reward)
        assert obs.won and obs.done and not obs.invalid, task.task_id
        assert rewards == [0.0] * (len(rewards) - 1) + [10.0]
        assert obs.info["moves"] == len(env.walkthrough) and obs.info["game_type"] == task.data["game_type"]
        assert obs.info["task_id"] == task.task_id and obs.info["objective"] == objective
        with pytest.raises(RuntimeError, match="over"):
            env.step(env.walkthrough[-1])
        env.close()


def test_invalid_action_costs_a_tenth_and_changes_nothing(suite):
    task = next(t for t in suite.tasks("valid_seen", 6) if t.data["game_type"] == "pick2")
    env = suite.make_env(task)
    walkthrough = env.walkthrough
    obs = env.reset()
    for action in walkthrough[:2]:  # at the desk, holding cd 1
        obs = env.step(action)
    for bad in ["take cd 2 from bed 1", "help", "fly away"]:
        out = env.step(bad)
        assert out.invalid and out.reward == -0.1 and not out.done and out.text == INVALID_ACTION_TEXT
        assert out.admissible_actions == obs.admissible_actions and out.info == obs.info
    total = -0.3
    for action in walkthrough[2:]:
        obs = env.step(action)
        total += obs.reward
    assert obs.won and total == pytest.approx(9.7) and obs.info["moves"] == len(walkthrough)
    env.close()


def test_scripted_policy_wins_every_type_through_the_graph(suite, tokenizer):
    tasks = suite.tasks("valid_seen", 6)
    walks = [suite.make_env(t).walkthrough for t in tasks]
    replies = ["dance", *walks[0]] + [a for w in walks[1:] for a in w]  # one invalid action first
    trajs = play(suite, scripted(tokenizer, replies), tasks)
    assert [t.task_id for t in trajs] == [t.task_id for t in tasks]
    assert [t.error for t in trajs] == [None] * 6
    assert all(t.success and t.stop_reason == StopReason.DONE for t in trajs)
    assert [t.reward for t in trajs] == [pytest.approx(9.9)] + [10.0] * 5
    assert [t.invalid_actions for t in trajs] == [1, 0, 0, 0, 0, 0]
    assert [t.steps for t in trajs] == [len(walks[0]) + 1] + [len(w) for w in walks[1:]]
    assert [t.metadata["game_type"] for t in trajs] == TYPES
    first = trajs[0].calls[0].messages
    assert first[0]["content"] == SYSTEM_PROMPT and "Your task is to: put a cellphone in bed." in first[-1]["content"]
    summary = summarize(trajs, wall_s=1.0)
    assert summary["success_rate"] == 1.0 and summary["success_by_type"] == {t: 1.0 for t in sorted(TYPES)}
    assert summary["mean_reward"] == pytest.approx((9.9 + 50) / 6)


def test_manifest_and_runs_are_reproducible(data_dir, tokenizer):
    def run_once():
        suite = AlfWorldSuite(data_dir=data_dir)
        tasks = suite.tasks("valid_unseen", 2)
        replies = [a for t in tasks for a in suite.make_env(t).walkthrough]
        trajs = play(suite, scripted(tokenizer, replies), tasks)
        return [t.model_dump() for t in every_task(suite)], [(t.task_id, t.reward, t.steps, t.success) for t in trajs]

    first, second = run_once(), run_once()
    assert first == second
    assert [r[3] for r in first[1]] == [True, True]


def test_smollm2_plays_without_errors(suite, smollm2_dir):
    from seed_agents.backends.local import LocalBackend

    backend = LocalBackend(smollm2_dir, max_batch_size=2)
    sampling = SamplingParams(max_tokens=10, temperature=0.7)
    llm = SeedChatModel(backend=backend, tokenizer=backend.tokenizer, sampling=sampling)
    graph = suite.build_graph(llm, max_turns=2)
    runner = EpisodeRunner(graph, RunnerConfig(group_size=2, concurrency=2, progress=False), make_env=suite.make_env)
    trajs = asyncio.run(runner.run(suite.tasks("valid_seen", 1)))
    backend.close()
    assert [t.error for t in trajs] == [None] * 2
    for t in trajs:
        assert 1 <= t.steps <= 2 and len(t.calls) == t.steps
        assert t.reward == pytest.approx(10.0 * t.success - 0.1 * t.invalid_actions)
        assert all(c.completion_ids and len(c.logprobs) == len(c.completion_ids) for c in t.calls)
        assert "Your task is to:" in t.calls[0].messages[-1]["content"]


def _random_play(suite, task, seed, n_steps=8, barrier=None):
    return random_play(lambda: suite.make_env(task), seed, n_steps, barrier)


def test_concurrent_episodes_match_sequential(suite):
    tasks = suite.tasks("valid_seen", 3)
    jobs = [(tasks[i], 100 + i) for i in range(3)]
    argv = list(sys.argv)
    sequential = [_random_play(suite, task, seed) for task, seed in jobs]
    barrier = threading.Barrier(len(jobs))
    with ThreadPoolExecutor(len(jobs)) as pool:
        concurrent = list(pool.map(lambda job: _random_play(suite, *job, barrier=barrier), jobs))
    assert concurrent == sequential
    assert sys.argv == argv  # fast-downward's overwrite is undone


def test_engines_are_reused_across_episodes(suite):
    task = suite.tasks("train", 1)[0]
    _random_play(suite, task, seed=0, n_steps=1)
    before = list(alf._IDLE_ENGINES)
    for seed in range(3):
        _random_play(suite, task, seed, n_steps=1)
    assert len(alf._IDLE_ENGINES) == len(before) >= 1
    assert {id(e) for e in alf._IDLE_ENGINES} == {id(e) for e in before}


def test_cli_eval_reports_success_by_type(tmp_path, data_dir, tiny_model_dir, suite):
    from seed_agents.app.cli import main

    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"env: alfworld\nsplit: valid_seen\nepisodes: 6\nenv_options:\n  data_dir: {data_dir}\n")
    out = tmp_path / "run"
    code = main(["eval", "--config", str(cfg), "--out", str(out), "--model", tiny_model_dir,
                 "--max-turns", "2", "--max-tokens", "8"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    trajs = read_jsonl(out / "trajectories.jsonl", Trajectory)
    assert summary["episodes"] == 6 and summary["errors"] == 0
    assert summary["success_by_type"] == {t: 0.0 for t in sorted(TYPES)}  # no game is won in 2 steps
    assert sorted(t.task_id for t in trajs) == sorted(t.task_id for t in suite.tasks("valid_seen", 6))
    for t in trajs:
        assert t.steps <= 2 and t.reward == pytest.approx(10.0 * t.success - 0.1 * t.invalid_actions)
