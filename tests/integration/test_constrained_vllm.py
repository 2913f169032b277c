"""Constrained decoding on the real vLLM CPU server: the request's
``structured_outputs.structural_tag`` is honoured, replies of a random tiny model parse,
and the logprobs the server reports are the masked distribution's, equal to the local
backend's on the same weights and ids."""

from __future__ import annotations

import asyncio

import pytest
from langchain_core.messages import HumanMessage

from seed_agents.backends.grammar import skill_tag
from seed_agents.backends.local import LocalBackend
from seed_agents.capture import capture
from seed_agents.chat_model import SeedChatModel
from seed_agents.graphs.calculator import TOOLS
from seed_agents.graphs.hindsight import write_skill
from seed_agents.skills import parse_skill
from seed_agents.types import LLMCall, SamplingParams

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _episode(i: int) -> list[LLMCall]:
    return [LLMCall(messages=[{"role": "user", "content": f"Find key {i}."}], prompt_ids=[1], completion_ids=[2],
                    logprobs=[-0.1], text="take key", scope={"trajectory_id": f"t{i}", "task_id": f"k{i}"})]


def test_constrained_analyzer_parses_every_reply_on_the_vllm_server(vllm_backend, tokenizer):
    llm = SeedChatModel(backend=vllm_backend, tokenizer=tokenizer)

    async def run(constrained: bool):
        return await asyncio.gather(*(write_skill(llm, _episode(i), f"Find key {i}.", i % 2 == 0, max_tokens=300,
                                                  max_words=20, constrained=constrained) for i in range(4)))

    with capture() as scope:
        skills = asyncio.run(run(True))
    assert all(s.valid for s in skills), [(s.reject_reason, s.raw) for s in skills]
    assert all(c.sampling.structural_tag is not None for c in scope.calls)
    assert not any(s.valid for s in asyncio.run(run(False)))  # the random model alone never manages


def test_server_logprobs_under_the_grammar_match_the_local_backend(vllm_backend, tiny_model_dir, tokenizer):
    prompt = tokenizer("Write the skill:", add_special_tokens=False)["input_ids"]
    params = SamplingParams(max_tokens=200, temperature=0.0, structural_tag=skill_tag(max_words=12, summary_max_chars=40, max_tokens=200),
                            stop_token_ids=(tokenizer.eos_token_id,))
    served = vllm_backend.generate(prompt, params)
    assert parse_skill(tokenizer.decode(served.token_ids, skip_special_tokens=True))[2] is None
    local = LocalBackend(tiny_model_dir).generate(prompt, params)
    assert local.token_ids == served.token_ids
    assert served.logprobs == pytest.approx(local.logprobs, abs=1e-3)
    raw = vllm_backend.score(prompt, served.token_ids)
    assert max(s - r for s, r in zip(served.logprobs, raw, strict=True)) > 1.0  # masked, not raw


def test_forced_tool_calls_parse_on_the_vllm_server(vllm_backend, tokenizer):
    llm = SeedChatModel(backend=vllm_backend, tokenizer=tokenizer, temperature=1.0, max_tokens=100)
    bound = llm.bind_tools(TOOLS, tool_choice="any")
    replies = [bound.invoke([HumanMessage("What is 2 + 3?")], seed=s) for s in range(4)]
    assert all(r.tool_calls and not r.invalid_tool_calls for r in replies), [r.invalid_tool_calls for r in replies]
    assert {c["name"] for r in replies for c in r.tool_calls} <= {"add", "multiply"}
