"""Constrained decoding on real SmolLM2 weights (local backend): the policy's own skills
parse at the CPU demo's budget (``skills.max_tokens`` 128), and its forced tool calls
parse and name a bound tool, on episodes of the atlas tool agent. Slow tier: SmolLM2 on
2 cores takes a minute or two."""

from __future__ import annotations

import asyncio

import pytest
from langchain_core.messages import HumanMessage

from examples.knowledge_base import TOOLS, answer_reward, build_agent, make_tasks
from seed_agents.capture import capture
from seed_agents.chat_model import SeedChatModel
from seed_agents.graphs.hindsight import write_skill
from seed_agents.runner import EpisodeRunner, RunnerConfig
from seed_agents.skills import first_user_message
from seed_agents.types import SamplingParams

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def smollm2_llm(smollm2_dir):
    from seed_agents.backends.local import LocalBackend

    backend = LocalBackend(smollm2_dir, max_batch_size=8)
    yield SeedChatModel(backend=backend, tokenizer=backend.tokenizer, model_name="smollm2-135m",
                        sampling=SamplingParams(max_tokens=64, temperature=0.7))
    backend.close()


def test_smollm2_forced_tool_calls_parse_and_name_a_bound_tool(smollm2_llm):
    bound = smollm2_llm.bind_tools(TOOLS, tool_choice="any", max_tokens=96)
    replies = [bound.invoke([HumanMessage(task.data["question"])], seed=i)
               for i, task in enumerate(make_tasks("train", 4))]
    assert all(r.tool_calls and not r.invalid_tool_calls for r in replies), [r.invalid_tool_calls for r in replies]
    assert {c["name"] for r in replies for c in r.tool_calls} <= {t.name for t in TOOLS}


def test_smollm2_writes_skills_that_parse_at_the_demo_budget(smollm2_llm):
    runner = EpisodeRunner(build_agent(smollm2_llm), RunnerConfig(group_size=1, concurrency=4, progress=False),
                           reward_fn=answer_reward, seed=0)
    with capture():
        episodes = asyncio.run(runner.run(make_tasks("train", 4)))
    assert not [e for e in episodes if e.fault is not None]

    async def skills():
        return await asyncio.gather(*(write_skill(smollm2_llm, e.calls, first_user_message(e.calls), e.reward >= 1,
                                                  max_tokens=128)
                                      for e in episodes))

    with capture() as scope:
        written = asyncio.run(skills())
    assert all(s.valid for s in written), [s.reject_reason for s in written]
    assert all(c.sampling.structural_tag is not None for c in scope.calls if c.purpose == "analyzer")
