"""Which number format the model computes in, chosen from what this CPU can do.

bf16 halves the bytes every decode step reads and, on a CPU with bf16 matrix units (AMX,
AVX-512 BF16), runs matmuls several times faster than fp32. Without them torch emulates
bf16 and it is far *slower* (docs/benchmarks.md, "This machine's limits": ``bench/roofline.py``
on an AVX2-only CPU), so ``auto`` picks bf16 only where the CPU has the instructions (or a CUDA device
supports it) and keeps fp32 everywhere else, and the choice is printed with its reason.

bf16 runs as autocast over fp32 master weights (``torch.autocast``): the trainer keeps
updating fp32 weights, the local backend that shares them samples under the same autocast,
and the logprobs a rollout records are those of the bf16 computation. The trainer's
recomputation of the same tokens differs by the rounding of the two passes (batch shape,
padding); ``bench/logprob_gap.py`` measures the gap per mode and the PPO ratio it puts at
the first step (docs/results/logprob_gap.json).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Literal

import torch

from seed_agents.cpu import cpu_flags

Precision = Literal["auto", "float32", "bfloat16"]
Attention = Literal["auto", "same", "float32"]
_BF16_FLAGS = ("amx_bf16", "avx512_bf16")


def resolve_precision(wanted: Precision, *, device: str = "cpu") -> tuple[torch.dtype, str]:
    """(the dtype to compute in, why) for ``wanted``; ``auto`` is bf16 only where it is fast."""
    if wanted == "float32":
        return torch.float32, "float32 (asked for)"
    if wanted == "bfloat16":
        return torch.bfloat16, "bfloat16 (asked for)"
    if device.startswith("cuda"):
        if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
            return torch.bfloat16, "bfloat16 (auto: this GPU supports it)"
        return torch.float32, "float32 (auto: this GPU has no bf16)"
    have = sorted(cpu_flags() & set(_BF16_FLAGS))
    if have:
        return torch.bfloat16, f"bfloat16 (auto: this CPU has {', '.join(have)})"
    capability = torch.backends.cpu.get_cpu_capability()
    return torch.float32, (f"float32 (auto: this CPU ({capability}) has no bf16 matrix instructions, "
                           f"where bf16 is emulated and slower than fp32)")


def resolve_served(wanted: Precision, kind: str) -> tuple[torch.dtype, str]:
    """``resolve_precision`` for a run whose rollouts come from a ``kind`` backend ("local" or
    "vllm"): the one rule the local backend, the trainer and the stage-1 key share.

    ``auto`` is float32 where bf16 would split the sampler from the trainer: a vLLM server
    samples in its own format (``seed-agents serve``: float32), and a local backend's autocast
    is the CPU's, which leaves a model on a CUDA device in float32 while the trainer there would
    update in bf16. Explicit formats are taken as given."""
    if wanted == "auto" and kind == "vllm":
        return torch.float32, "float32 (auto: a vLLM server samples, and `seed-agents serve` samples in float32)"
    if wanted == "auto" and torch.cuda.is_available():
        return torch.float32, ("float32 (auto: a CUDA device is present, where the local backend's CPU autocast "
                               "would not reach the model)")
    return resolve_precision(wanted)


def resolve_attention(wanted: Attention, dtype: torch.dtype, *, device: str = "cpu") -> tuple[bool, str]:
    """(run attention in fp32 over bf16 products?, why) for ``wanted`` under ``dtype``.

    ``auto`` is fp32 attention on a CPU without AMX and bf16 attention elsewhere. Why: on an
    AVX-512 BF16 CPU without AMX torch's bf16 attention kernel is several times slower than its
    fp32 one (docs/benchmarks.md, "Decode taken apart"; why, inside the kernel, was not
    profiled). AMX is a bf16 matrix unit, so on an AMX CPU, or a GPU, bf16 attention is kept;
    which is faster there has not been measured."""
    if dtype == torch.float32:
        return False, "attention in float32 with the rest"
    if wanted == "float32":
        return True, "attention in float32 (asked for)"
    if wanted == "same":
        return False, "attention in bfloat16 (asked for)"
    if device.startswith("cuda") or "amx_bf16" in cpu_flags():
        return False, "attention in bfloat16 (auto: " + ("a GPU)" if device.startswith("cuda") else "this CPU has amx_bf16)")
    return True, "attention in float32 (auto: no AMX on this CPU, where bf16 attention is slower than fp32's)"


@contextlib.contextmanager
def compute_in(dtype: torch.dtype | None, device: str = "cpu") -> Iterator[None]:
    """Run the block's matmuls in ``dtype`` (autocast) over whatever the weights are; a no-op
    for None or float32."""
    if dtype is None or dtype == torch.float32:
        yield
        return
    with torch.autocast(device_type=device.split(":")[0], dtype=dtype):
        yield


FP32_ATTENTION = "seed_sdpa_fp32"
"""The attention implementation name ``attention_in_fp32`` registers with transformers."""


def _sdpa_in_fp32(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: torch.Tensor | None, **kwargs: object) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention with queries, keys and values in fp32, its output cast back."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    # under autocast the rotary embedding has already promoted queries and keys to fp32 (values
    # stay bf16), and autocast would cast all three back to bf16 for SDPA: it is turned off here
    if query.dtype == key.dtype == value.dtype == torch.float32 and not torch.is_autocast_enabled(query.device.type):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    if attention_mask is not None and attention_mask.is_floating_point():
        attention_mask = attention_mask.float()
    with torch.autocast(query.device.type, enabled=False):
        out, weights = sdpa_attention_forward(module, query.float(), key.float(), value.float(), attention_mask,
                                              **kwargs)
    return out.to(value.dtype), weights


def attention_in_fp32(model: torch.nn.Module) -> None:
    """Run ``model``'s attention in fp32 while its matmuls stay under bf16 autocast.

    Why: on a CPU with AVX-512 BF16 but no AMX, torch's bf16 SDPA kernel is several times
    slower than its fp32 one (docs/benchmarks.md, "Decode taken apart"), which cancels bf16's
    faster products at decode. The
    attention's inputs are upcast (their bf16 rounding stays), so the numbers are bf16
    autocast's with a more exact softmax: not the plain bf16 path's bits. Through
    transformers' public attention registry; the mask is SDPA's."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(FP32_ATTENTION, _sdpa_in_fp32)
    AttentionMaskInterface.register(FP32_ATTENTION, sdpa_mask)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    base.set_attn_implementation(FP32_ATTENTION)
