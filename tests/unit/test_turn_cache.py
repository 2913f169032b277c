"""The local backend's turn cache: an episode's next call reads its last prompt's keys and
values, and changes nothing but the time (tiny random model)."""

import asyncio
import gc
import time

import pytest
import torch

from seed_agents.backends.local import LocalBackend
from seed_agents.backends.prefix import MIN_PREFIX
from seed_agents.backends.turn_cache import TurnCache, weights_fingerprint
from seed_agents.capture import capture
from seed_agents.types import SamplingParams

SYSTEM = "You answer questions about places in a private atlas; look facts up with the lookup tool. " * 2


def _kv(n: int, fill: float = 0.0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.full((1, 2, n, 4), fill), torch.full((1, 2, n, 4), fill)) for _ in range(2)]


class Owner:  # a stand-in for a capture scope: any weak-referenceable object
    pass


def test_lookup_reads_the_common_prefix_and_leaves_a_token_to_compute():
    cache = TurnCache(1 << 20)
    a = Owner()
    prompt = list(range(100))
    cache.store(a, prompt, [(torch.arange(100.0).view(1, 1, 100, 1),) * 2])
    n, kv = cache.lookup(a, prompt + [7, 8])  # the next turn: the whole last prompt
    assert n == 100 and kv[0][0].flatten().tolist() == list(range(100))
    assert cache.lookup(a, prompt)[0] == 99  # the same prompt again: its last token is computed
    n, kv = cache.lookup(a, prompt[:60] + [-1] * 50)  # the reply re-tokenized: the common part
    assert n == 60 and kv[0][0].shape[2] == 60
    assert cache.lookup(a, prompt[:MIN_PREFIX - 1] + [-1] * 50) == (0, None)  # too short to pay
    assert cache.lookup(Owner(), prompt + [1]) == (0, None) and cache.lookup(None, prompt + [1]) == (0, None)


def test_new_weights_empty_it_memory_is_bounded_and_finished_episodes_go():
    per_entry = sum(k.nbytes + v.nbytes for k, v in _kv(50))
    cache = TurnCache(2 * per_entry)
    owners = [Owner() for _ in range(3)]
    cache.check(1)
    for o in owners[:2]:
        cache.store(o, list(range(50)), _kv(50))
    cache.lookup(owners[0], list(range(51)))  # owners[0] is now the most recently used
    cache.store(owners[2], list(range(50)), _kv(50))
    assert len(cache) == 2 and cache.nbytes <= cache.max_bytes
    assert cache.lookup(owners[1], list(range(51)))[0] == 0 and cache.lookup(owners[0], list(range(51)))[0] == 50
    del owners[2]
    gc.collect()
    assert len(cache) == 1  # the finished episode's entry went with it
    cache.check(2)
    assert len(cache) == 0 and cache.lookup(owners[0], list(range(51))) == (0, None)
    cache.store(owners[0], list(range(50)), _kv(50, 1.0) + _kv(50) * 4)  # larger than the whole budget: not kept
    assert len(cache) == 0
    with pytest.raises(ValueError):
        TurnCache(-1)


def test_the_fingerprint_moves_with_an_in_place_write():
    model = torch.nn.Linear(2, 2)
    before = weights_fingerprint(model, 0)
    assert weights_fingerprint(model, 0) == before != weights_fingerprint(model, 1)
    with torch.no_grad():
        model.weight.add_(0.0)  # even a write that changes no value: the version counter moves
    assert weights_fingerprint(model, 0) != before


def _turns(tok, n: int = 3) -> list[str]:
    """An episode's prompts: each is the last one plus a reply and a new observation."""
    text = f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
    prompts = []
    for t in range(n):
        text += f"<|im_start|>user\nobservation {t}: you are in room {t}<|im_end|>\n<|im_start|>assistant\n"
        prompts.append(text)
        text += f"go north {t}<|im_end|>\n"
    return [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]


async def _episode(backend, prompts, params, **labels):
    with capture(**labels):
        return [await backend.agenerate(p, params) for p in prompts]


@pytest.mark.parametrize("kv_cache", ["dynamic", "static"])
async def test_an_episodes_turns_reuse_its_last_prompt_and_sample_what_a_fresh_prompt_samples(tiny_model_dir, kv_cache):
    backend = LocalBackend(tiny_model_dir, max_batch_size=4, batch_wait_s=0.01, kv_cache=kv_cache)
    fresh = LocalBackend(backend.model, tokenizer=backend.tokenizer, turn_cache_bytes=0, share_prefix=False)
    prompts = _turns(backend.tokenizer)
    params = SamplingParams(max_tokens=6, temperature=0.0)
    got = await _episode(backend, prompts, params, task_id="t0")
    assert backend.turn_cache.hits == 2 and backend.turn_cache.reused_tokens == len(prompts[0]) + len(prompts[1])
    for p, c in zip(prompts, got):
        ref = fresh.generate(p, params)
        assert c.token_ids == ref.token_ids
        assert max(abs(x - y) for x, y in zip(c.logprobs, ref.logprobs)) < 1e-4
    assert fresh.turn_cache.hits == 0 and len(fresh.turn_cache) == 0
    # read, not recomputed: a later turn's first forward runs only the tokens its entry lacks
    # (a cache handed over empty would still sample the same ids, from a whole-prompt prefill)
    widths = []
    hook = backend.model.register_forward_pre_hook(lambda m, a, kw: widths.append(kw["input_ids"].shape[1]),
                                                   with_kwargs=True)
    try:
        await _episode(backend, prompts[:2], params, task_id="t1")
    finally:
        hook.remove()
    prefills = [w for w in widths if w > 1]
    assert prefills == [len(prompts[0]), len(prompts[1]) - len(prompts[0])], prefills
    # the episode is over: its keys and values are freed. The executor thread that ran the last batch
    # holds its arguments (the episode's scope among them) until it loops, which on a loaded machine
    # can come after this coroutine resumes: wait for that, not for a leak (a leak never reaches 0)
    deadline = time.monotonic() + 60
    while True:
        gc.collect()
        if len(backend.turn_cache) == 0 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    assert len(backend.turn_cache) == 0


@pytest.mark.parametrize("kv_cache", ["dynamic", "static"])
async def test_a_batch_mixing_cached_shared_and_fresh_rows_samples_what_each_prompt_samples_alone(tiny_model_dir, kv_cache):
    """Two episodes at different turns and a third just starting, in one batch: rows read
    their own episode's entry, the batch's shared prefix, or nothing, and each row's tokens
    and logprobs are those of its prompt sampled alone without any cache."""
    backend = LocalBackend(tiny_model_dir, max_batch_size=8, batch_wait_s=0.05, kv_cache=kv_cache)
    fresh = LocalBackend(backend.model, tokenizer=backend.tokenizer, turn_cache_bytes=0, share_prefix=False)
    tok = backend.tokenizer
    a, b = _turns(tok, 3), _turns(tok, 2)
    b = [p + tok(" (b)", add_special_tokens=False)["input_ids"] for p in b]
    params = SamplingParams(max_tokens=5, temperature=0.0)

    async def episode(name, prompts):
        with capture(task_id=name):
            return [await backend.agenerate(p, params) for p in prompts]

    # a plays its first turn alone: in the batch below, its second turn reads its own entry
    with capture(task_id="a"):
        first_a = await backend.agenerate(a[0], params)
        rest = await asyncio.gather(
            backend.agenerate(a[1], params),
            episode("b", b),  # b's second prompt shares its first's tokens up to " (b)": a partial reuse
            episode("c", [a[0][:-1] + tok("x", add_special_tokens=False)["input_ids"]]),
        )
    assert backend.turn_cache.hits == 2  # a's second turn, b's second turn
    c = a[0][:-1] + tok("x", add_special_tokens=False)["input_ids"]
    rows = [(a[0], first_a), (a[1], rest[0]), (b[0], rest[1][0]), (b[1], rest[1][1]), (c, rest[2][0])]
    for p, got in rows:
        ref = fresh.generate(p, params)
        assert got.token_ids == ref.token_ids
        assert max(abs(x - y) for x, y in zip(got.logprobs, ref.logprobs)) < 1e-4


async def test_weights_written_in_place_are_never_read_through_stale_keys(tiny_model_dir):
    """The trainer updates a shared model in place between turns: the next turn computes
    its whole prompt with the new weights."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    backend = LocalBackend(model, tokenizer=tok, batch_wait_s=0.01)
    fresh = LocalBackend(model, tokenizer=tok, turn_cache_bytes=0, share_prefix=False)
    prompts = _turns(tok, 2)
    params = SamplingParams(max_tokens=6, temperature=0.0)
    with capture(task_id="t"):
        await backend.agenerate(prompts[0], params)
        assert len(backend.turn_cache) == 1
        with torch.no_grad():
            model.model.layers[0].self_attn.k_proj.weight.mul_(-1.0)  # changes every key
        second = await backend.agenerate(prompts[1], params)
    assert backend.turn_cache.hits == 0
    ref = fresh.generate(prompts[1], params)
    assert second.token_ids == ref.token_ids
    assert max(abs(x - y) for x, y in zip(second.logprobs, ref.logprobs)) < 1e-4
    backend.policy_version = 3  # a sync frees the entries at once
    assert len(backend.turn_cache) == 0
