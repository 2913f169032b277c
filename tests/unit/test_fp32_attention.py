"""``attention_in_fp32``: bf16 products, attention in fp32 (a decode speed lever on CPUs
whose bf16 attention kernel is slow; docs/benchmarks.md, decode taken apart)."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from seed_agents.precision import FP32_ATTENTION, attention_in_fp32, compute_in


def _sdpa_dtypes(model, ids, dtype, monkeypatch):
    seen = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, *args, **kwargs):
        out = sdpa(q, k, v, *args, **kwargs)
        seen.append({q.dtype, k.dtype, v.dtype, out.dtype} if not torch.is_autocast_enabled("cpu") else {"autocast"})
        return out

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    with torch.no_grad(), compute_in(dtype):
        logits = model(input_ids=ids).logits.float()
    monkeypatch.undo()
    return seen, logits


def test_bf16_attention_runs_in_fp32_and_fp32_is_untouched(tiny_model_dir, monkeypatch):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    ids = torch.randint(5, 200, (2, 24), generator=torch.Generator().manual_seed(0))
    before_bf16 = _sdpa_dtypes(model, ids, torch.bfloat16, monkeypatch)
    before_fp32 = _sdpa_dtypes(model, ids, torch.float32, monkeypatch)
    assert before_bf16[0] and all(s == {"autocast"} for s in before_bf16[0])  # autocast casts SDPA's inputs to bf16

    attention_in_fp32(model)
    assert model.config._attn_implementation == FP32_ATTENTION
    after_bf16 = _sdpa_dtypes(model, ids, torch.bfloat16, monkeypatch)
    after_fp32 = _sdpa_dtypes(model, ids, torch.float32, monkeypatch)
    assert after_bf16[0] and all(s == {torch.float32} for s in after_bf16[0])  # autocast off, all four fp32
    assert not torch.equal(after_bf16[1], before_bf16[1])
    assert torch.equal(after_fp32[1], before_fp32[1])  # fp32 compute: the same bits as plain SDPA
    # a more exact softmax over the same bf16 products: closer to fp32, not further
    err = {name: (logits - before_fp32[1]).abs().mean().item() for name, logits in
           (("bf16 attention", before_bf16[1]), ("fp32 attention", after_bf16[1]))}
    assert err["fp32 attention"] <= err["bf16 attention"] * 1.05, err


def test_the_backend_switches_attention_only_in_bf16(tiny_model_dir):
    from seed_agents.backends.local import LocalBackend

    for dtype, switched in ((torch.float32, False), (torch.bfloat16, True)):
        backend = LocalBackend(tiny_model_dir, compute_dtype=dtype, fp32_attention=True)
        assert (backend.model.config._attn_implementation == FP32_ATTENTION) is switched
    with pytest.raises(ValueError, match="kv_cache"):
        LocalBackend(tiny_model_dir, kv_cache="paged")


@pytest.mark.parametrize(("flags", "wanted", "dtype", "fp32"), [
    ({"avx512_bf16"}, "auto", torch.bfloat16, True),                 # no AMX: bf16 attention was 5x slower
    ({"avx512_bf16", "amx_bf16"}, "auto", torch.bfloat16, False),    # AMX: kept in bf16 (not measured)
    ({"avx512_bf16"}, "same", torch.bfloat16, False),
    ({"avx512_bf16", "amx_bf16"}, "float32", torch.bfloat16, True),
    ({"avx512_bf16"}, "float32", torch.float32, False),              # fp32 throughout: nothing to switch
])
def test_auto_attention_is_fp32_under_bf16_only_where_the_cpu_has_no_amx(monkeypatch, flags, wanted, dtype, fp32):
    import seed_agents.precision as precision

    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset(flags))
    got, why = precision.resolve_attention(wanted, dtype)
    assert got is fp32 and why.startswith(f"attention in {'float32' if fp32 or dtype == torch.float32 else 'bfloat16'}")
    if wanted == "auto":
        assert "auto" in why
