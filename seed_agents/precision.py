"""Which number format the model computes in, chosen from what this CPU can do.

bf16 halves the bytes every decode step reads and, on a CPU with bf16 matrix units (AMX,
AVX-512 BF16), runs matmuls several times faster than fp32. Without them torch emulates
bf16 and it is far *slower* (``bench/roofline.py`` measured 0.3 vs 58 GFLOP/s on an AVX2-only
AMD EPYC), so ``auto`` picks bf16 only where the CPU has the instructions (or a CUDA device
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


@contextlib.contextmanager
def compute_in(dtype: torch.dtype | None, device: str = "cpu") -> Iterator[None]:
    """Run the block's matmuls in ``dtype`` (autocast) over whatever the weights are; a no-op
    for None or float32."""
    if dtype is None or dtype == torch.float32:
        yield
        return
    with torch.autocast(device_type=device.split(":")[0], dtype=dtype):
        yield
