"""WebShop through the LangGraph agent: the synthetic catalog played by a scripted
shopper (wins, wrong purchases, per-category success, reproducible manifests), by real
SmolLM2 weights, and by ``seed-agents eval --env webshop`` (on the tiny random model)."""

import asyncio
import json
import re

import pytest

from seed_agents.app.cli import main
from seed_agents.capture import read_jsonl
from seed_agents.chat_model import SeedChatModel
from seed_agents.metrics import summarize
from seed_agents.runner import EpisodeRunner, RunnerConfig
from seed_agents.testing import FakeBackend
from seed_agents.tools.webshop import Goal, WebShopSuite, get_reward
from seed_agents.types import SamplingParams, StopReason, Trajectory

pytestmark = pytest.mark.integration

WINNING = ("synthetic-beauty", "synthetic-electronics", "synthetic-fashion")


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(scope="module")
def suite():
    return WebShopSuite(seed=0)


@pytest.fixture(scope="module")
def tasks(suite):
    return suite.tasks("test", 10)  # two of each of the five categories


def options_on(product, goal):
    """The goal's option values the product offers: what the shopper clicks."""
    return {name: v for name, values in product.options.items() for v in values if v in goal.options}


def wrong_asin(suite, goal):
    """A product from the goal's own search results that earns less than 1."""
    for p in suite.catalog.search(goal.instruction)[:10]:
        if p.asin != goal.asin and get_reward(p, goal, p.price, options_on(p, goal))[0] < 1:
            return p.asin
    raise AssertionError(f"no wrong product for {goal.instruction!r}")


def shopper(tokenizer, tasks, pick):
    """A scripted policy reading the prompt like a model would: search for the
    instruction, open the ASIN ``pick(task)`` names, click the goal's options, buy."""
    by_instruction = {t.data["instruction"]: t for t in tasks}

    def reply(prompt_ids):
        current = tokenizer.decode(prompt_ids).rsplit("Current observation:", 1)[1]
        page, _, commands = current.partition("\n\nValid commands:")
        task = by_instruction[re.search(r"^Instruction: (.*)$", page, re.M).group(1)]
        asin = pick(task)
        if "search[<query>]" in commands:
            return f"search[{task.data['instruction']}]"
        if "(Total results:" in page:
            return f"click[{asin}]" if f"[{asin}]" in page else "click[Next >]"
        selected = re.search(r"^Selected: .*$", page, re.M)
        selected = selected.group(0) if selected else ""
        todo = [v for v in task.data["options"] if f"[{v}]" in page and f": {v}" not in selected]
        return f"click[{todo[0]}]" if todo else "click[Buy Now]"

    return reply


def play(tokenizer, suite, tasks, pick, group_size=2, max_turns=15):
    llm = SeedChatModel(backend=FakeBackend(tokenizer, shopper(tokenizer, tasks, pick)), tokenizer=tokenizer,
                        sampling=SamplingParams(max_tokens=64, temperature=0.0))
    runner = EpisodeRunner(suite.build_graph(llm, max_turns=max_turns),
                           RunnerConfig(group_size=group_size, concurrency=8, progress=False), make_env=suite.make_env)
    return asyncio.run(runner.run(tasks))


def test_scripted_shopper_wins_every_task(tokenizer, suite, tasks):
    trajs = play(tokenizer, suite, tasks, lambda t: t.data["asin"])
    assert [t.task_id for t in trajs] == [t.task_id for t in tasks for _ in range(2)]
    for traj, task in zip(trajs, [t for t in tasks for _ in range(2)]):
        assert traj.error is None and traj.stop_reason == StopReason.DONE
        assert traj.reward == 1.0 and traj.success
        assert traj.steps == 3 + len(task.data["options"]) and traj.invalid_actions == 0  # search, open, options, buy
        assert traj.metadata["game_type"] == task.data["game_type"]
        assert traj.metadata["purchased_asin"] == task.data["asin"]
        assert len(traj.policy_calls) == traj.steps
    summary = summarize(trajs, wall_s=1.0)
    assert summary["success_rate"] == 1.0 and summary["mean_reward"] * 100 == 100.0  # the WebShop score
    assert set(summary["success_by_type"]) == {t.data["game_type"] for t in tasks}


def test_wrong_product_earns_its_partial_reward(tokenizer, suite, tasks):
    wrong = {t.task_id: wrong_asin(suite, Goal.from_data(t.data)) for t in tasks}
    trajs = play(tokenizer, suite, tasks, lambda t: wrong[t.task_id], group_size=1)
    for traj, task in zip(trajs, tasks):
        goal, bought = Goal.from_data(task.data), suite.catalog.by_asin[wrong[task.task_id]]
        expected = get_reward(bought, goal, bought.price, options_on(bought, goal))[0]
        assert traj.error is None and traj.metadata["purchased_asin"] == bought.asin
        assert traj.reward == pytest.approx(expected) and traj.reward < 1 and not traj.success
    score = summarize(trajs, wall_s=1.0)["mean_reward"] * 100
    assert 0 < score < 100 and score == pytest.approx(100 * sum(t.reward for t in trajs) / len(trajs))


def test_success_is_reported_per_category(tokenizer, suite, tasks):
    def pick(task):
        return task.data["asin"] if task.data["game_type"] in WINNING else wrong_asin(suite, Goal.from_data(task.data))

    summary = summarize(play(tokenizer, suite, tasks, pick), wall_s=1.0)
    assert summary["success_by_type"] == {
        "synthetic-beauty": 1.0, "synthetic-electronics": 1.0, "synthetic-fashion": 1.0,
        "synthetic-food": 0.0, "synthetic-furniture": 0.0,
    }
    assert summary["success_rate"] == pytest.approx(0.6)


def test_two_runs_play_the_same_manifest_the_same_way(tokenizer, tasks):
    def run_once():
        suite = WebShopSuite(seed=0)
        run_tasks = suite.tasks("test", 10)
        return run_tasks, play(tokenizer, suite, run_tasks, lambda t: t.data["asin"], group_size=1)

    (tasks_a, trajs_a), (tasks_b, trajs_b) = run_once(), run_once()
    assert [t.model_dump() for t in tasks_a] == [t.model_dump() for t in tasks_b] == [t.model_dump() for t in tasks]
    assert [(t.task_id, t.reward, t.steps) for t in trajs_a] == [(t.task_id, t.reward, t.steps) for t in trajs_b]
    assert [[c.completion_ids for c in t.policy_calls] for t in trajs_a] == \
           [[c.completion_ids for c in t.policy_calls] for t in trajs_b]


def test_running_out_of_steps_scores_zero(tokenizer, suite, tasks):
    llm = SeedChatModel(backend=FakeBackend(tokenizer, ["search[shampoo]", "click[Back to Search]"]),
                        tokenizer=tokenizer, sampling=SamplingParams(max_tokens=16))
    runner = EpisodeRunner(suite.build_graph(llm, max_turns=4), RunnerConfig(progress=False), make_env=suite.make_env)
    (traj,) = asyncio.run(runner.run(tasks[:1]))
    assert traj.stop_reason == StopReason.MAX_TURNS and traj.steps == 4
    assert traj.reward == 0.0 and not traj.success and traj.invalid_actions == 0


@pytest.fixture
def one_torch_thread():
    """On a shared CPU, torch's spinning worker threads make generation ~10x slower than
    one thread; one thread keeps this test near ten seconds under load."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_smollm2_plays_without_errors(smollm2_dir, suite, tasks, one_torch_thread):
    from seed_agents.backends.local import LocalBackend

    backend = LocalBackend(smollm2_dir, max_batch_size=4)
    llm = SeedChatModel(backend=backend, tokenizer=backend.tokenizer,
                        sampling=SamplingParams(max_tokens=16, temperature=0.7))
    # Two episodes in one batch, two turns each: the search page, then whatever it led to.
    runner = EpisodeRunner(suite.build_graph(llm, max_turns=2), RunnerConfig(group_size=2, progress=False),
                           make_env=suite.make_env)
    trajs = asyncio.run(runner.run(tasks[:1]))
    backend.close()
    for traj in trajs:
        assert traj.error is None and 1 <= traj.steps <= 2 and len(traj.policy_calls) == traj.steps
        assert 0.0 <= traj.reward <= 1.0 and traj.metadata["game_type"] == tasks[0].data["game_type"]
        prompt = traj.policy_calls[0].messages
        assert "search[" in prompt[0]["content"] and tasks[0].data["instruction"] in prompt[-1]["content"]
    print("SmolLM2 actions:", [c.text for t in trajs for c in t.policy_calls])


def test_seed_agents_eval_env_webshop(tmp_path, tiny_model_dir, capsys):
    cfg = tmp_path / "eval.yaml"
    cfg.write_text(
        "episodes: 2\n"  # no split: the suite's eval_split (test) is the default
        f"backend:\n  kind: local\n  model: {tiny_model_dir}\n"
        "sampling:\n  max_tokens: 8\n  temperature: 0.7\n"
        "runner:\n  group_size: 1\n  progress: false\n"
        "agent:\n  max_turns: 2\n"
        "env_options:\n  catalog: synthetic\n"
    )
    out = tmp_path / "run"
    assert main(["eval", "--env", "webshop", "--config", str(cfg), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    trajs = read_jsonl(out / "trajectories.jsonl", Trajectory)
    assert summary["episodes"] == len(trajs) == 2 and summary["errors"] == 0
    assert [t.task_id for t in trajs] == ["webshop-synthetic-00000", "webshop-synthetic-00001"]
    assert set(summary["success_by_type"]) == {"synthetic-beauty", "synthetic-electronics"}
    assert summary["llm_calls"] == sum(t.steps for t in trajs) <= 4
    assert summary["score"] == pytest.approx(100 * summary["mean_reward"])
    assert json.loads((out / "config.json").read_text())["split"] == "test"
    printed = capsys.readouterr().out
    assert "success_rate" in printed and "score" in printed
