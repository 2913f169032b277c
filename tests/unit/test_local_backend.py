"""LocalBackend passes the same conformance suite as the vLLM server (tiny random model)."""

from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from seed_agents.backends.local import LocalBackend
from seed_agents.types import SamplingParams
from tests.conformance import BackendConformance


@pytest.fixture(scope="module", params=["dynamic", "static", "concat"])
def local_backend(tiny_model_dir: str, request: pytest.FixtureRequest) -> LocalBackend:
    """Every cache passes the suite: each is a speed option, not another sampler."""
    return LocalBackend(tiny_model_dir, max_batch_size=8, kv_cache=request.param)


class TestLocalConformance(BackendConformance):
    @pytest.fixture
    def backend(self, local_backend: LocalBackend) -> LocalBackend:
        local_backend.policy_version = 0
        return local_backend

    @pytest.fixture
    def reference_model(self, tiny_model_dir: str) -> Any:
        return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()

    @pytest.fixture
    def prompt_ids(self, tiny_model_dir: str) -> list[int]:
        tok = AutoTokenizer.from_pretrained(tiny_model_dir)
        text = tok.apply_chat_template([{"role": "user", "content": "Name a colour."}], add_generation_prompt=True, tokenize=False)
        return tok(text, add_special_tokens=False)["input_ids"]


async def test_concurrent_requests_are_batched_and_match_single_requests(local_backend, tiny_model_dir):
    """Left-padded batches give the same greedy tokens as one request at a time."""
    import asyncio

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompts = [tok(f"<|im_start|>user\nsay {w}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
               for w in ("a", "hello there", "one two three four", "x")]
    params = SamplingParams(max_tokens=8, temperature=0.0)
    calls = []
    original = local_backend._generate_batch

    def spy(batch, p, *rest):
        calls.append(len(batch))
        return original(batch, p, *rest)

    local_backend._generate_batch = spy
    try:
        batched = await asyncio.gather(*(local_backend.agenerate(p, params) for p in prompts))
    finally:
        local_backend._generate_batch = original
    assert max(calls) > 1, f"requests were not batched: {calls}"
    for p, b in zip(prompts, batched):
        single = local_backend.generate(p, params)
        assert single.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(single.logprobs, b.logprobs)) < 1e-4


def _greedy_check(model, prompt_ids, completion):
    """(every token is the model's argmax, max |logprob - the model's log-softmax|) for a
    greedy completion, scored by the model itself in one forward."""
    with torch.no_grad():
        logits_T_V = model(torch.tensor([prompt_ids + completion.token_ids])).logits[0, len(prompt_ids) - 1:-1].float()
    logp_T_V = torch.log_softmax(logits_T_V, -1)
    tokens_T = torch.tensor(completion.token_ids)
    ref_T = logp_T_V.gather(-1, tokens_T[:, None]).squeeze(-1)
    return torch.equal(logp_T_V.argmax(-1), tokens_T), (ref_T - torch.tensor(completion.logprobs)).abs().max().item()


def test_shared_model_sees_in_place_weight_updates(tiny_model_dir):
    """A backend built on a model object generates with that object's current weights
    (the trainer updates them in place): after the update its greedy tokens and logprobs
    are the updated model's, not the old ones."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    backend = LocalBackend(model, tokenizer=tok)
    ids = tok("hello", add_special_tokens=False)["input_ids"]
    params = SamplingParams(max_tokens=4, temperature=0.0)
    before = backend.generate(ids, params)
    assert _greedy_check(model, ids, before) == (True, pytest.approx(0.0, abs=1e-4))
    with torch.no_grad():
        model.lm_head.weight.mul_(-1.0)
    after = backend.generate(ids, params)
    assert len(after.token_ids) == 4
    assert _greedy_check(model, ids, after) == (True, pytest.approx(0.0, abs=1e-4))
    # and the update mattered: the old completion is not the updated model's greedy one
    assert _greedy_check(model, ids, before)[0] is False


def test_model_object_without_tokenizer_is_a_clear_error(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with pytest.raises(ValueError, match="tokenizer"):
        LocalBackend(model)


@pytest.mark.parametrize("kv_cache", ["dynamic", "static", "concat"])
async def test_a_shared_prompt_prefix_is_computed_once_and_changes_nothing(tiny_model_dir, monkeypatch, kv_cache):
    """Prompts with one long system prompt: the batch runs the prefix once (a forward of one
    row), and every row's greedy tokens and logprobs equal that prompt sampled alone."""
    import seed_agents.backends.local as local_module

    backend = LocalBackend(tiny_model_dir, max_batch_size=8, batch_wait_s=0.05, kv_cache=kv_cache)
    tok = backend.tokenizer
    system = "You answer questions about places in a private atlas; look facts up with the lookup tool. " * 3
    prompts = [tok(f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n",
                   add_special_tokens=False)["input_ids"] for q in ("a", "what is the area of Varnok?", "x y z", "hello")]
    prefixes = []
    original = local_module.prefix_kv
    monkeypatch.setattr(local_module, "prefix_kv", lambda model, ids: prefixes.append(ids.shape) or original(model, ids))
    await _together_equals_alone(backend, prompts)
    assert prefixes and all(shape[0] == 1 and shape[1] >= 32 for shape in prefixes), prefixes


@pytest.mark.parametrize("kv_cache", ["dynamic", "static", "concat"])
async def test_each_group_of_a_batch_computes_its_own_prefix_once(tiny_model_dir, monkeypatch, kv_cache):
    """Two tasks' prompts in one batch (as one iteration's hindsight prompts are): each task's
    long shared prefix runs once, and every row's greedy tokens and logprobs equal its prompt
    sampled alone."""
    import seed_agents.backends.local as local_module

    backend = LocalBackend(tiny_model_dir, max_batch_size=8, batch_wait_s=0.05, kv_cache=kv_cache)
    tok = backend.tokenizer
    head = "<|im_start|>system\nYou analyze finished episodes.<|im_end|>\n<|im_start|>user\n"
    tasks = ["Task: " + "take the broccoli from the bedroom floor. " * 4, "Task: " + "open the red door in the hall. " * 4]
    prompts = [tok(f"{head}{task}\nStep {step}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
               for task in tasks for step in ("one", "two three")]
    prefixes = []
    original = local_module.prefix_kv
    monkeypatch.setattr(local_module, "prefix_kv", lambda model, ids: prefixes.append(ids.shape[1]) or original(model, ids))
    await _together_equals_alone(backend, prompts)
    task_prefix = [len(p) for p in (tok(head + t, add_special_tokens=False)["input_ids"] for t in tasks)]
    assert len(prefixes) == 2 and all(n >= min(task_prefix) - 2 for n in prefixes), (prefixes, task_prefix)


async def _together_equals_alone(backend: LocalBackend, prompts: list[list[int]]) -> None:
    """Sample ``prompts`` greedily as one batch, then each alone with no prefix shared: the same
    tokens, log-probs within 1e-4. Closes the backend."""
    import asyncio

    params = SamplingParams(max_tokens=8, temperature=0.0)
    batched = await asyncio.gather(*(backend.agenerate(p, params) for p in prompts))
    backend.share_prefix = False
    for p, b in zip(prompts, batched):
        single = backend.generate(p, params)
        assert single.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(single.logprobs, b.logprobs)) < 1e-4
    backend.close()
