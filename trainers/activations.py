"""Keep an update's activations when they fit in memory; recompute them when they do not.

Gradient checkpointing (``trainer.gradient_checkpointing``) keeps each layer's input only and
runs the layer's forward again in backward: memory for compute. A learning-benchmark batch
does not fit in memory without it, where the demo's small update does (docs/training.md,
"Activations kept where they fit"). With ``keep_activations_gb``
above 0 the trainer chooses for each update, keeping what fits.

It estimates the bytes the loss forward would keep for backward as ``fixed + per_token x
tokens``, where tokens are the batch's real prompt and completion tokens. A shared prefix
computes fewer, so the estimate errs high. The two figures are measured on the model itself,
in the update's number format: two small forwards under ``saved_tensors_hooks``, summing the
distinct storages autograd keeps (``measure``). Under autocast the fixed part is the
weights' bf16 copies. The activations are kept when the estimate fits the budget
(``keep_activations_gb`` GB, or with ``auto`` a third of the memory available as the update
starts, leaving room for logits, gradients and the optimizer). Above it the layers recompute.
The numbers do not depend on the choice: checkpointing replays the same forward
(``tests/unit/test_activations.py``: the same loss and gradients, bit for bit).

Off by default (0: every update recomputes). Keeping saves time in a warm update, less with
the heap trimmed after each one as ``trainer.release_memory`` does; a process's first update,
which maps the kept memory fresh, is not faster; no whole run has yet separated the saving from
its noise; and the peak RSS grows (docs/benchmarks.md, "Framework costs":
``bench/activation_trim.py``, ``bench/update_memory.py --demo``). On a GPU, whose caching
allocator keeps its memory, it should pay more; not measured.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from seed_agents.trainers.head import plain_head
from seed_agents.trainers.shared_prefix import checkpointed_layers

BUDGET_SHARE = 1 / 3  # of the available memory, when no budget is given
_PROBE_TOKENS = (32, 96)  # two sizes: fixed bytes and bytes per token from their difference


@dataclass(frozen=True)
class ActivationCost:
    """Bytes a forward keeps for backward: ``fixed + per_token x tokens``."""

    fixed: float
    per_token: float

    def estimate(self, tokens: int) -> float:
        return self.fixed + self.per_token * tokens


def _saved_bytes(module: Any, ids: torch.Tensor, autocast: Any) -> int:
    """Bytes of the distinct storages autograd saves in one forward of ``module`` on ``ids``,
    parameters left out (they are held anyway)."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = max(seen.get(storage.data_ptr(), 0), storage.nbytes())
        return t

    with torch.enable_grad(), autocast(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = module(input_ids=ids, use_cache=False)
    del out
    return sum(seen.values())


def measure(model: Any, autocast: Any = contextlib.nullcontext) -> ActivationCost:
    """The model's activation bytes, fixed and per token, without checkpointing, measured on
    two small forwards of one row in ``autocast`` (the update's). The decoder alone where the
    model has a plain head (the update runs its head at the trained positions only); the
    whole model otherwise (its logits counted at every position: an estimate that errs high).
    The global RNG is left as it was, so a seeded run draws what it drew before."""
    parts = plain_head(model)
    module = parts[0] if parts is not None else model
    device = next(model.parameters()).device
    sizes = []
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.random.fork_rng(devices=[device] if device.type == "cuda" else []))
        stack.enter_context(recompute(model, False))
        for n in _PROBE_TOKENS:
            ids = torch.zeros((1, n), dtype=torch.long, device=device)
            sizes.append(_saved_bytes(module, ids, autocast))
    (n0, n1), (b0, b1) = _PROBE_TOKENS, sizes
    per_token = max((b1 - b0) / (n1 - n0), 0.0)
    return ActivationCost(fixed=max(b0 - per_token * n0, 0.0), per_token=per_token)


def available_bytes(device: torch.device | None = None) -> float:
    """Memory the activations can take now: the GPU's free memory on a CUDA device, else what
    the OS can give this process (psutil: RAM free or reclaimable)."""
    if device is not None and device.type == "cuda":
        return float(torch.cuda.mem_get_info(device)[0])
    import psutil

    return float(psutil.virtual_memory().available)


def budget_bytes(keep_gb: float | None, device: torch.device | None = None) -> float:
    """The activation budget of one update: ``keep_gb`` GB, or a share of what is available
    on ``device``."""
    return keep_gb * 1e9 if keep_gb is not None else BUDGET_SHARE * available_bytes(device)


@contextlib.contextmanager
def recompute(model: Any, on: bool) -> Iterator[None]:
    """Within the block, the layers that checkpoint (``gradient_checkpointing_enable``) do so
    only if ``on``. A layer decides in its forward; the backward of a forward run inside the
    block follows that decision after the block ends."""
    layers = checkpointed_layers(model)
    for m in layers:
        m.gradient_checkpointing = on
    try:
        yield
    finally:
        for m in layers:
            m.gradient_checkpointing = True
