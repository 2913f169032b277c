"""The turn cache on real weights and a real multi-turn agent: SmolLM2-135M playing
TextWorld games with its chat history, seeded at T 0.7, samples the same ids with the
cache as without it, and the logprobs agree within 1e-4 (slow tier: a few minutes on
2 cores)."""

from __future__ import annotations

import asyncio

import pytest

from seed_agents.chat_model import SeedChatModel
from seed_agents.runner import EpisodeRunner, RunnerConfig
from seed_agents.types import SamplingParams

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_smollm2_textworld_episodes_are_the_same_with_and_without_the_turn_cache(smollm2_dir):
    from seed_agents.backends.local import LocalBackend
    from seed_agents.envs import load_env_suite

    suite = load_env_suite("textworld", seed=0)
    tasks = suite.tasks("train", 2)
    suite.prepare(tasks)
    cached = LocalBackend(smollm2_dir, max_batch_size=4)
    whole = LocalBackend(cached.model, tokenizer=cached.tokenizer, max_batch_size=4, turn_cache_bytes=0)

    def play(backend):
        llm = SeedChatModel(backend=backend, tokenizer=backend.tokenizer,
                            sampling=SamplingParams(max_tokens=16, temperature=0.7))
        graph = suite.build_graph(llm, max_turns=3, history="chat")
        runner = EpisodeRunner(graph, RunnerConfig(group_size=2, concurrency=4, progress=False),
                               make_env=suite.make_env, make_input=lambda task: {"task": task}, seed=11)
        return [c for t in asyncio.run(runner.run(tasks)) for c in t.policy_calls]

    with_cache, without = play(cached), play(whole)
    assert cached.turn_cache.hits > 0 and cached.turn_cache.reused_tokens > 0 and whole.turn_cache.hits == 0
    assert len(with_cache) == len(without) > len(tasks) * 2
    for a, b in zip(with_cache, without):
        assert a.prompt_ids == b.prompt_ids and a.completion_ids == b.completion_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4
