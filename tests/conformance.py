"""The conformance suite every ``Backend`` must pass.

Subclass ``BackendConformance`` in a test module and provide three fixtures:

- ``backend``: the backend under test;
- ``reference_model``: an fp32 ``AutoModelForCausalLM`` loaded from the same weights
  the backend serves (the trainer's view of the policy);
- ``prompt_ids``: a short chat-templated prompt.

The central test is ``test_sampled_logprobs_match_trainer``: what the backend reports
while sampling must equal what a trainer computes with a plain forward pass on the same
ids, or every importance ratio in the RL loss is wrong from the first step. Streaming
must not change that: a stream's pieces add up to exactly what ``generate`` returns.

``ChatModelConformance`` runs the same idea one level up, on a ``SeedChatModel`` over
the backend (fixture ``chat_model``): streamed, stopped and forced-tool calls are
recorded token-exactly. Keep seeded requests serial (vLLM 0.32 on CPU crashes on seeded
requests whose prompt chunked prefill splits under concurrency).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import torch

from seed_agents.backends.base import Backend, StreamingBackend, join_pieces
from seed_agents.capture import capture
from seed_agents.scoring import sequence_logprobs
from seed_agents.types import Completion, SamplingParams

# Max abs difference allowed between backend and trainer logprobs (nats). Measured on
# this CPU, vLLM 0.32 fp32 vs transformers 5 fp32 (different matmul/attention kernels and
# summation orders): 4e-6 on the tiny model, 4e-5 on SmolLM2-135M (max over ~200 sampled
# tokens at T=1, 0.7 and 0). 1e-3 leaves a 25x margin over the real model, yet any
# semantic mismatch is orders of magnitude larger: temperature-scaled ("processed")
# logprobs at T=0.7 are off by ~nats, an off-by-one position or a bf16 model by >1e-2.
LOGPROB_ATOL = 1e-3

MAX_TOKENS = 12


def _eos_ids(model: Any) -> set[int]:
    eos = model.generation_config.eos_token_id
    if eos is None:
        return set()
    return {int(e) for e in (eos if isinstance(eos, list | tuple) else [eos])}


def _trainer_logprobs(model: Any, prompt_ids: list[int], completion: Completion) -> torch.Tensor:
    with torch.no_grad():
        return sequence_logprobs(model, prompt_ids, completion.token_ids)


def _max_abs_diff(a: list[float] | torch.Tensor, b: list[float] | torch.Tensor) -> float:
    ta = torch.as_tensor(a, dtype=torch.float64)
    tb = torch.as_tensor(b, dtype=torch.float64)
    assert ta.shape == tb.shape, (ta.shape, tb.shape)
    return float((ta - tb).abs().max()) if ta.numel() else 0.0


class BackendConformance:
    """Backend-agnostic tests; subclasses supply ``backend``, ``reference_model``, ``prompt_ids``."""

    def test_is_a_backend(self, backend: Backend) -> None:
        assert isinstance(backend, Backend)

    def test_output_shapes(self, backend: Backend, reference_model: Any, prompt_ids: list[int]) -> None:
        params = SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, seed=11)
        c = backend.generate(prompt_ids, params)
        assert 1 <= len(c.token_ids) <= MAX_TOKENS
        assert len(c.logprobs) == len(c.token_ids)
        vocab = reference_model.config.vocab_size
        assert all(0 <= t < vocab for t in c.token_ids)
        assert all(lp <= 0.0 and lp > float("-inf") for lp in c.logprobs)
        assert c.finish_reason in ("stop", "length")
        assert c.latency_s > 0.0

    def test_finish_reason_length_when_max_tokens_hit(
        self, backend: Backend, reference_model: Any, prompt_ids: list[int]
    ) -> None:
        c = backend.generate(prompt_ids, SamplingParams(max_tokens=4, temperature=1.0, seed=3))
        stopped_early = len(c.token_ids) < 4 or c.token_ids[-1] in _eos_ids(reference_model)
        assert c.finish_reason == ("stop" if stopped_early else "length")

    def test_stop_token_ids_end_the_completion(self, backend: Backend, prompt_ids: list[int]) -> None:
        first = backend.generate(prompt_ids, SamplingParams(max_tokens=6, temperature=0.0))
        if len(first.token_ids) < 3:
            pytest.skip("greedy completion too short to pick a stop token from")
        stop_at = first.token_ids[2]
        c = backend.generate(prompt_ids, SamplingParams(max_tokens=6, temperature=0.0, stop_token_ids=(stop_at,)))
        end = first.token_ids.index(stop_at) + 1  # the stop token itself is part of the completion
        assert c.token_ids == first.token_ids[:end]
        assert c.finish_reason == "stop"

    def test_greedy_is_deterministic(self, backend: Backend, prompt_ids: list[int]) -> None:
        params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
        a, b = backend.generate(prompt_ids, params), backend.generate(prompt_ids, params)
        assert a.token_ids == b.token_ids
        assert _max_abs_diff(a.logprobs, b.logprobs) <= LOGPROB_ATOL

    def test_greedy_picks_the_reference_argmax(
        self, backend: Backend, reference_model: Any, prompt_ids: list[int]
    ) -> None:
        c = backend.generate(prompt_ids, SamplingParams(max_tokens=1, temperature=0.0))
        with torch.no_grad():
            logits_V = reference_model(input_ids=torch.tensor([prompt_ids])).logits[0, -1]
        assert c.token_ids[0] == int(logits_V.argmax())

    def test_seeded_sampling_is_reproducible(self, backend: Backend, prompt_ids: list[int]) -> None:
        params = SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, seed=1234)
        a, b = backend.generate(prompt_ids, params), backend.generate(prompt_ids, params)
        assert a.token_ids == b.token_ids

    async def test_ascore_matches_sampled_logprobs(self, backend: Backend, prompt_ids: list[int]) -> None:
        c = await backend.agenerate(prompt_ids, SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, seed=5))
        scored = await backend.ascore(prompt_ids, c.token_ids)
        assert len(scored) == len(c.token_ids)
        assert _max_abs_diff(scored, c.logprobs) <= LOGPROB_ATOL

    @pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
    def test_sampled_logprobs_match_trainer(
        self, backend: Backend, reference_model: Any, prompt_ids: list[int], temperature: float
    ) -> None:
        """THE invariant: server logprobs == trainer logprobs on the same ids.

        At T=0.7 this also proves the logprobs are raw (T=1): temperature-scaled ones
        would differ by whole nats.
        """
        for seed in (0, 1):
            c = backend.generate(prompt_ids, SamplingParams(max_tokens=MAX_TOKENS, temperature=temperature, seed=seed))
            trainer = _trainer_logprobs(reference_model, prompt_ids, c)
            diff = _max_abs_diff(c.logprobs, trainer)
            assert diff <= LOGPROB_ATOL, f"T={temperature} seed={seed}: max |backend - trainer| = {diff:.2e}"

    async def test_concurrent_agenerate(self, backend: Backend, prompt_ids: list[int]) -> None:
        comps = await asyncio.gather(
            *(
                backend.agenerate(prompt_ids, SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, seed=i))
                for i in range(8)
            )
        )
        assert len(comps) == 8
        for c in comps:
            assert 1 <= len(c.token_ids) <= MAX_TOKENS and len(c.logprobs) == len(c.token_ids)
        # Different seeds really sample: not all eight completions are the same.
        assert len({tuple(c.token_ids) for c in comps}) > 1

    async def test_policy_version_is_stamped(self, backend: Backend, prompt_ids: list[int]) -> None:
        saved = backend.policy_version
        try:
            backend.policy_version = saved + 7
            c = backend.generate(prompt_ids, SamplingParams(max_tokens=2, temperature=0.0))
            ac = await backend.agenerate(prompt_ids, SamplingParams(max_tokens=2, temperature=0.0))
            assert c.policy_version == ac.policy_version == saved + 7
        finally:
            backend.policy_version = saved

    # -- streaming ---------------------------------------------------------------------

    def test_is_a_streaming_backend(self, backend: Backend) -> None:
        assert isinstance(backend, StreamingBackend)

    @pytest.mark.parametrize("temperature", [0.0, 1.0])
    def test_stream_adds_up_to_generate(self, backend: Any, prompt_ids: list[int], temperature: float) -> None:
        """Greedy, and seeded at T=1: the same ids, logprobs and finish reason."""
        params = SamplingParams(max_tokens=MAX_TOKENS, temperature=temperature, seed=21)
        whole = backend.generate(prompt_ids, params)
        pieces = list(backend.stream(prompt_ids, params))
        assert all(p.finish_reason is None for p in pieces[:-1]) and pieces[-1].finish_reason is not None
        assert all(p.policy_version == backend.policy_version for p in pieces)
        streamed = join_pieces(pieces)
        assert streamed.token_ids == whole.token_ids and streamed.finish_reason == whole.finish_reason
        assert _max_abs_diff(streamed.logprobs, whole.logprobs) <= LOGPROB_ATOL

    async def test_astream_adds_up_to_agenerate(self, backend: Any, prompt_ids: list[int]) -> None:
        params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
        whole = await backend.agenerate(prompt_ids, params)
        streamed = join_pieces([p async for p in backend.astream(prompt_ids, params)])
        assert streamed.token_ids == whole.token_ids and streamed.finish_reason == whole.finish_reason
        assert _max_abs_diff(streamed.logprobs, whole.logprobs) <= LOGPROB_ATOL

    def test_stream_yields_token_by_token(self, backend: Any, prompt_ids: list[int]) -> None:
        """Tokens arrive in pieces as they are sampled (at least three pieces carry tokens)."""
        pieces = list(backend.stream(prompt_ids, SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, seed=4,
                                                                stop_token_ids=())))
        assert sum(1 for p in pieces if p.token_ids) >= min(3, sum(len(p.token_ids) for p in pieces))

    def test_stream_honours_stop_token_ids(self, backend: Any, prompt_ids: list[int]) -> None:
        first = backend.generate(prompt_ids, SamplingParams(max_tokens=6, temperature=0.0))
        if len(first.token_ids) < 3:
            pytest.skip("greedy completion too short to pick a stop token from")
        stop_at = first.token_ids[2]
        c = join_pieces(backend.stream(prompt_ids, SamplingParams(max_tokens=6, temperature=0.0, stop_token_ids=(stop_at,))))
        assert c.token_ids == first.token_ids[: first.token_ids.index(stop_at) + 1] and c.finish_reason == "stop"

    @pytest.mark.parametrize("use_async", [False, True])
    async def test_closing_a_stream_stops_it(self, backend: Any, prompt_ids: list[int], use_async: bool) -> None:
        """A consumer that stops reading frees the backend at once; the next request works."""
        long = SamplingParams(max_tokens=2000, temperature=1.0, seed=8, stop_token_ids=())
        t0 = time.perf_counter()
        if use_async:
            stream = backend.astream(prompt_ids, long)
            got = [await stream.__anext__(), await stream.__anext__()]
            await stream.aclose()
        else:
            stream = backend.stream(prompt_ids, long)
            got = [next(stream), next(stream)]
            stream.close()
        assert all(p.finish_reason is None for p in got)
        assert time.perf_counter() - t0 < 30.0  # nowhere near 2000 tokens
        after = backend.generate(prompt_ids, SamplingParams(max_tokens=2, temperature=0.0))
        assert len(after.token_ids) >= 1


class ChatModelConformance:
    """``SeedChatModel`` over a backend (fixture ``chat_model``, greedy or seeded)."""

    def _greedy_call(self, chat_model: Any, **kwargs: Any) -> Any:
        with capture() as cap:
            msg = chat_model.invoke("Tell me a story.", temperature=0.0, max_tokens=24, **kwargs)
        return msg, cap.calls[0]

    def test_stream_records_the_same_ids_as_invoke(self, chat_model: Any) -> None:
        msg, call = self._greedy_call(chat_model)
        with capture() as cap:
            chunks = list(chat_model.stream("Tell me a story.", temperature=0.0, max_tokens=24))
        streamed = cap.calls[0]
        assert len(cap.calls) == 1, "a stream records its call once"
        assert streamed.completion_ids == call.completion_ids and streamed.prompt_ids == call.prompt_ids
        assert _max_abs_diff(streamed.logprobs, call.logprobs) <= LOGPROB_ATOL
        assert streamed.text == chat_model.tokenizer.decode(streamed.completion_ids, skip_special_tokens=True)
        full = chunks[0]
        for c in chunks[1:]:
            full = full + c
        assert full.content == msg.content
        assert sum(1 for c in chunks if c.content) > 1, "tokens arrive one by one"
        last = chunks[-1]
        assert last.chunk_position == "last" and last.usage_metadata["output_tokens"] == len(streamed.completion_ids)
        assert last.response_metadata["call_id"] == streamed.call_id
        assert last.response_metadata["finish_reason"] == streamed.finish_reason

    async def test_astream_records_the_same_ids_as_ainvoke(self, chat_model: Any) -> None:
        with capture() as cap:
            msg = await chat_model.ainvoke("Tell me a story.", temperature=0.0, max_tokens=24)
            chunks = [c async for c in chat_model.astream("Tell me a story.", temperature=0.0, max_tokens=24)]
        a, b = cap.calls
        assert a.completion_ids == b.completion_ids and "".join(str(c.content) for c in chunks) == msg.content

    @pytest.mark.parametrize("streamed", [False, True])
    def test_stop_string_ends_at_the_token_that_completes_it(self, chat_model: Any, streamed: bool) -> None:
        """The recorded ids end with the token in which the stop string first appears;
        the content ends before the stop string (as OpenAI's does)."""
        _, free = self._greedy_call(chat_model)
        tok = chat_model.tokenizer
        ids = free.completion_ids
        # a stop string that starts inside token 3 and ends inside token 4 when possible
        texts = [tok.decode(ids[:k], skip_special_tokens=True) for k in range(len(ids) + 1)]
        k = next((k for k in range(4, len(ids)) if len(texts[k]) - len(texts[k - 1]) >= 2
                  and len(texts[k - 1]) - len(texts[k - 2]) >= 2), None)
        if k is None:
            pytest.skip("greedy completion has no two adjacent multi-character tokens")
        stop = texts[k][len(texts[k - 1]) - 1: len(texts[k - 1]) + 1]  # spans tokens k-1 and k
        at = texts[k].find(stop)
        with capture() as cap:
            if streamed:
                chunks = list(chat_model.stream("Tell me a story.", temperature=0.0, max_tokens=24, stop=[stop]))
                content = "".join(str(c.content) for c in chunks)
                meta = chunks[-1].response_metadata
            else:
                msg = chat_model.invoke("Tell me a story.", temperature=0.0, max_tokens=24, stop=[stop])
                content, meta = msg.content, msg.response_metadata
        call = cap.calls[0]
        first = next(j for j in range(1, len(ids) + 1) if stop in texts[j])
        assert call.completion_ids == ids[:first] and call.logprobs == pytest.approx(free.logprobs[:first], abs=LOGPROB_ATOL)
        assert call.finish_reason == "stop" and meta["finish_reason"] == "stop" and meta["stop_sequence"] == stop
        assert call.text == texts[first] and content == texts[first][: texts[first].find(stop)]
        assert texts[first].find(stop) <= at

    def test_forced_tool_call_prefill_is_prompt_not_completion(self, chat_model: Any) -> None:
        """tool_choice forces a Hermes call by prefill; the prefill ends the prompt ids."""
        tool = {"type": "function", "function": {"name": "lookup", "description": "Look a word up.",
                                                 "parameters": {"type": "object", "properties": {"word": {"type": "string"}}}}}
        other = {"type": "function", "function": {"name": "other", "description": "Unused.", "parameters": {"type": "object", "properties": {}}}}
        with capture() as cap:
            chat_model.bind_tools([tool, other], tool_choice="lookup").invoke("Define 'cat'.", temperature=0.0, max_tokens=8)
        call = cap.calls[0]
        tok = chat_model.tokenizer
        prompt = tok.decode(call.prompt_ids)
        assert prompt.endswith('<tool_call>\n{"name": "lookup", "arguments":')
        assert call.messages[-1] == {"role": "assistant", "content": '<tool_call>\n{"name": "lookup", "arguments":'}
        assert call.text == tok.decode(call.completion_ids, skip_special_tokens=True)
        # the prefilled tokens were not sampled: the completion's logprobs score only sampled ids
        assert len(call.logprobs) == len(call.completion_ids) <= 8


# -- langchain-tests ---------------------------------------------------------------------

NO_VALID_TOOL_ARGS = ("model capability: a random tiny model cannot write a tool call's JSON arguments "
                      "(tool_choice forces the call by prefill; the arguments are sampled noise)")
NO_STRUCTURED_OUTPUT = ("model capability: structured output is a forced tool call, whose arguments a "
                        "random tiny model cannot write as the schema's JSON")
NO_AGENT = "model capability: a random tiny model cannot choose a tool and use its result"

#: Standard tests a random model cannot pass, by name (the tiny model, local or on vLLM).
TINY_MODEL_XFAILS = {
    "test_tool_calling": NO_VALID_TOOL_ARGS,
    "test_tool_calling_async": NO_VALID_TOOL_ARGS,
    "test_bind_runnables_as_tools": NO_VALID_TOOL_ARGS,
    "test_tool_choice": NO_VALID_TOOL_ARGS,
    "test_tool_calling_with_no_arguments": NO_VALID_TOOL_ARGS,
    "test_unicode_tool_call_integration": NO_VALID_TOOL_ARGS,
    "test_structured_output": NO_STRUCTURED_OUTPUT,
    "test_structured_output_async": NO_STRUCTURED_OUTPUT,
    "test_structured_output_pydantic_2_v1": NO_STRUCTURED_OUTPUT,
    "test_structured_output_optional_param": NO_STRUCTURED_OUTPUT,
    "test_agent_loop": NO_AGENT,
}


def xfail_by_name(reasons: dict[str, str], *, run: bool = False) -> Any:
    """Class decorator for a ``langchain-tests`` subclass: mark the named standard tests
    ``xfail(reason=..., run=False)`` (the suite's documented way to opt out; its
    ``test_no_overrides_DO_NOT_OVERRIDE`` accepts an override only with such a mark).
    Each override wraps the standard test unchanged, parametrization included."""
    import functools

    def decorate(cls: type) -> type:
        for name, reason in reasons.items():
            standard = getattr(cls, name)  # AttributeError: the suite has no such test

            @functools.wraps(standard)
            def override(self: Any, *args: Any, _standard: Any = standard, **kwargs: Any) -> Any:
                return _standard(self, *args, **kwargs)

            # run=True (a real model): the test runs and may pass (XPASS), so the mark is not strict
            setattr(cls, name, pytest.mark.xfail(reason=reason, run=run, strict=not run)(override))
        return cls

    return decorate
