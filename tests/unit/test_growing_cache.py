"""The in-place growing KV cache holds what transformers' concatenating one holds, and the
local backend samples the same tokens and log-probs with it, bit for bit."""

import pytest
import torch
from transformers.cache_utils import DynamicCache

from seed_agents.backends.growing_cache import GrowingCache
from seed_agents.backends.local import LocalBackend
from seed_agents.types import SamplingParams


@pytest.mark.parametrize("kept", [[0, 2], [2, 0]])  # rows moved within the buffers; any other order
def test_it_holds_what_the_concatenating_cache_holds_through_growth_and_reselection(kept):
    torch.manual_seed(0)
    start = [(torch.randn(3, 2, 5, 4), torch.randn(3, 2, 5, 4).bfloat16()) for _ in range(2)]
    want, got = DynamicCache(ddp_cache_data=start), GrowingCache(start, value_dtype=torch.float32, reserve=2)
    rows = 3
    for step in range(9):  # past the reserve: the buffers grow (doubling) more than once
        for layer in range(2):
            k, v = torch.randn(rows, 2, 1 + (step == 0), 4), torch.randn(rows, 2, 1 + (step == 0), 4).bfloat16()
            wk, wv = want.update(k, v, layer)
            gk, gv = got.update(k, v, layer)
            assert torch.equal(gk, wk) and gv.dtype == torch.float32 and torch.equal(gv, wv.float())
        if step == 4:  # the decode loop drops finished rows this way: the layer must follow
            buffer = got.layers[0]._k
            for cache in (want, got):
                cache.batch_select_indices(torch.tensor(kept))
            moved_in_place = got.layers[0].keys.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()
            assert moved_in_place == (kept == [0, 2])
            rows = 2
    assert got.get_seq_length() == want.get_seq_length() == 15
    assert got.layers[0]._k.shape[-2] > 15, "the buffer has room to spare"


class _Episode:
    """Stands in for a capture scope: the turn cache's owner key."""


def _prompts(tok):
    system = "You answer questions about places in a private atlas; look facts up with the lookup tool. " * 2
    return [tok(f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n",
                add_special_tokens=False)["input_ids"] for q in ("a", "what is the area of Varnok?", "x y z")]


def test_the_backend_samples_the_same_with_it_as_with_concatenation(tiny_model_dir):
    """bf16 with attention in fp32 (values stored upcast), a shared prefix, then a second turn
    read from the turn cache, seeded at T 0.7: every id and log-prob equal, not only close."""
    runs = []
    for kv_cache in ("dynamic", "concat"):
        backend = LocalBackend(tiny_model_dir, max_batch_size=8, kv_cache=kv_cache, compute_dtype=torch.bfloat16,
                               fp32_attention=True)
        prompts = _prompts(backend.tokenizer)
        owners = [_Episode() for _ in prompts]  # the turn cache keys episodes weakly
        params = SamplingParams(max_tokens=12, temperature=0.7)
        first = backend._generate_batch(prompts, params, seeds=[1, 2, 3], owners=owners)
        follow = [p + c.token_ids + backend.tokenizer("\nnext", add_special_tokens=False)["input_ids"]
                  for p, c in zip(prompts, first)]
        second = backend._generate_batch(follow, params, seeds=[4, 5, 6], owners=owners)
        assert len(backend.turn_cache._entries) == len(prompts), "the second turn read the turn cache"
        runs.append([(c.token_ids, c.logprobs) for c in first + second])
        backend.close()
    assert runs[0] == runs[1]
