"""Real TextWorld games: generated with tw-make into a temp cache, played through jericho."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import seed_agents.tools.textworld as tw
from seed_agents.envs import TextEnv
from seed_agents.testing import random_play
from seed_agents.tools.textworld import INVALID_ACTION_TEXT, TextWorldSuite, TwMakeError

pytestmark = [
    pytest.mark.integration,
    # jericho warns about TextWorld games; TextWorld silences it at import, pytest resets filters.
    pytest.mark.filterwarnings("ignore:Game .* is not fully supported"),
]


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    return TextWorldSuite(cache_dir=tmp_path_factory.mktemp("tw-cache"), seed=7)


@pytest.fixture(scope="module")
def tasks(suite):
    """Two games with multi-step walkthroughs: treasure_hunter level 3 and the custom type."""
    chosen = suite.tasks("train", 4)[2:4]
    start = time.perf_counter()
    suite.prepare(chosen)
    print(f"tw-make: {(time.perf_counter() - start) / len(chosen):.1f} s per game")
    return chosen


def test_walkthrough_wins_with_rewards_equal_to_score_differences(suite, tasks):
    for task in tasks:
        env = suite.make_env(task)
        assert isinstance(env, TextEnv)
        obs = env.reset()
        assert obs.text and obs.admissible_actions and not obs.done
        assert obs.info["score"] == 0 and obs.info["max_score"] >= 1
        scores, rewards = [obs.info["score"]], []
        start = time.perf_counter()
        for action in env.walkthrough:
            assert action in obs.admissible_actions
            obs = env.step(action)
            assert not obs.invalid
            scores.append(obs.info["score"])
            rewards.append(obs.reward)
        print(f"{task.task_id}: {(time.perf_counter() - start) / len(rewards) * 1000:.1f} ms per step")
        assert obs.won and obs.done and not obs.lost
        assert rewards == [b - a for a, b in zip(scores, scores[1:])]
        assert sum(rewards) == obs.info["score"] > 0
        assert obs.info["moves"] == len(env.walkthrough)
        with pytest.raises(RuntimeError, match="over"):
            env.step(env.walkthrough[-1])
        env.close()


def test_first_observation_is_clean_and_starts_with_objective(suite, tasks):
    env = suite.make_env(tasks[0])
    obs = env.reset()
    env.close()
    assert obs.text.splitlines()[0].strip().endswith(("!", "."))
    assert "$$" not in obs.text and "___" not in obs.text
    assert "-= " in obs.text  # the room title stays
    assert not obs.text.rstrip().endswith(("0/1", ">"))


def test_admissible_order_is_shuffled_reproducibly(suite, tasks):
    def orders(seed):
        env = suite.make_env(tasks[1], seed=seed)
        first = env.reset().admissible_actions
        second = env.step(env.walkthrough[0]).admissible_actions
        env.close()
        return first, second

    assert orders(1) == orders(1)
    many = [orders(s)[0] for s in range(8)]
    assert len({tuple(o) for o in many}) > 1
    assert all(sorted(o) == sorted(many[0]) for o in many)


def test_invalid_action_does_not_reach_the_game(suite, tasks):
    env = suite.make_env(tasks[0])
    obs = env.reset()
    for bad in ["dance wildly", "", "take the moon"]:
        out = env.step(bad)
        assert out.invalid and out.reward == 0 and not out.done
        assert out.text == INVALID_ACTION_TEXT
        assert out.admissible_actions == obs.admissible_actions
        assert out.info == obs.info
    # State unchanged: the walkthrough still wins from here, and matching ignores case/space.
    for action in env.walkthrough:
        obs = env.step(f"  {action.upper()} ")
        assert not obs.invalid
    assert obs.won
    env.close()


def _play(suite, task, seed, n_steps=25, barrier=None):
    return random_play(lambda: suite.make_env(task, seed=seed), seed, n_steps, barrier)


def test_concurrent_episodes_match_sequential(suite, tasks):
    from textworld.logic import GameLogic

    jobs = [(tasks[i % 2], 100 + i) for i in range(4)]
    sequential = [_play(suite, task, seed) for task, seed in jobs]
    # Loading parses the game logic with one module-global parser, cached afterwards;
    # clear the cache so the threads really load concurrently (this fails without the lock).
    GameLogic.parse.__func__.cache_clear()
    barrier = threading.Barrier(len(jobs))
    with ThreadPoolExecutor(len(jobs)) as pool:
        concurrent = list(pool.map(lambda job: _play(suite, *job, barrier=barrier), jobs))
    assert concurrent == sequential
    assert all(len(t) > 2 for t in sequential)


def test_cached_game_is_reused(suite, tasks, monkeypatch):
    game = suite.make_env(tasks[0]).game_path
    mtime = game.stat().st_mtime_ns

    def boom(*args, **kwargs):
        raise AssertionError("tw-make must not run for a cached game")

    monkeypatch.setattr(tw, "_run_tw_make", boom)
    fresh = TextWorldSuite(cache_dir=suite.cache_dir)
    assert fresh.make_env(tasks[0]).game_path == game
    assert game.stat().st_mtime_ns == mtime


def test_concurrent_generation_runs_tw_make_once(tmp_path, monkeypatch):
    calls = []
    real = tw._run_tw_make

    def counting(*args, **kwargs):
        calls.append(args)
        real(*args, **kwargs)

    monkeypatch.setattr(tw, "_run_tw_make", counting)
    suite = TextWorldSuite(cache_dir=tmp_path)
    task = suite.tasks("eval_unseen", 1)[0]
    with ThreadPoolExecutor(3) as pool:
        paths = list(pool.map(lambda _: tw.ensure_game(task, tmp_path), range(3)))
    assert len(calls) == 1 and len(set(paths)) == 1 and paths[0].is_file()
    assert not list((tmp_path / "textworld" / "tmp").iterdir())


def test_failing_tw_make_raises_with_its_output(tmp_path):
    suite = TextWorldSuite(cache_dir=tmp_path)
    task = suite.tasks("train", 1)[0].model_copy(
        update={"task_id": "tw-broken", "data": {"make_args": ["tw-no-such-game"], "seed": 1}}
    )
    with pytest.raises(TwMakeError, match="invalid choice"):
        suite.make_env(task)
    assert not (tmp_path / "textworld" / "games" / "tw-broken").exists()
    assert not list((tmp_path / "textworld" / "tmp").iterdir())
