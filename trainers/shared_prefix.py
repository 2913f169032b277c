"""Score rows that begin with the same tokens by computing those tokens once.

An agent's rows share most of their prompt: every call of a tool agent starts with the same
system prompt and tool schemas (about 400 of the atlas rows' 450 prompt tokens), and a
group's episodes share the task too. TRL's scorer runs the full prompt of every row, so the
update spent most of its matmuls on the same prefix, dozens of times. Here the longest
common prefix of a chunk of rows runs once (batch 1), its keys and values are broadcast to
the chunk, and each row's own tokens run on top of them with their true positions. Exact up
to float rounding, gradients included: the rows' backward flows into the one prefix forward
(``tests/unit/test_shared_prefix.py`` checks log-probs, entropies and gradients against
TRL's padded layout, with and without gradient checkpointing).

Why this reaches into transformers: the rows read the prefix through a KV cache that must not
grow (``_ReadOnlyPrefix``), because gradient checkpointing replays each layer's forward in
backward and a growing cache would be extended twice; transformers lets a layer keep its cache
under checkpointing only when the cache is read-only (``_can_checkpoint_with_cache``), which is
what this cache is. Where a transformers version lacks that switch, checkpointed training
forwards keep TRL's path (``supported``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from transformers.cache_utils import DynamicCache
from trl.trainer.utils import entropy_from_logits, selective_log_softmax

from seed_agents.backends.prefix import cache_kwarg, prefix_kv

try:  # transformers >= 4.56 has the layer class; the cache switch came later
    from transformers.modeling_layers import GradientCheckpointingLayer
except ImportError:  # pragma: no cover - older transformers: no checkpointed layers to manage
    GradientCheckpointingLayer = None  # type: ignore[assignment,misc]


class _ReadOnlyPrefix(DynamicCache):
    """The prefix's keys and values, read by every layer and never extended: a replayed
    (checkpointed) layer sees exactly what its first run saw."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        layer = self.layers[layer_idx]
        return torch.cat([layer.keys, key_states], dim=-2), torch.cat([layer.values, value_states], dim=-2)


def _layers(model: Any) -> list[Any]:
    if GradientCheckpointingLayer is None:
        return []
    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def supported(model: Any) -> bool:
    """Whether a grad-enabled forward can use the shared prefix here: no checkpointed layer,
    or layers that can keep a read-only cache under checkpointing."""
    layers = _layers(model)
    checkpointed = [m for m in layers if m.gradient_checkpointing]
    return not checkpointed or all(hasattr(m, "_can_checkpoint_with_cache") for m in checkpointed)


@contextlib.contextmanager
def _checkpointing(model: Any, *, prefix: bool) -> Iterator[None]:
    """The prefix forward runs without checkpointing (it fills a cache, which a replay would
    fill twice; it is one row, so its activations are small); the rows' forward keeps
    checkpointing and is told its cache is read-only."""
    layers = [m for m in _layers(model) if m.gradient_checkpointing]
    saved = [(m.gradient_checkpointing, m.__dict__.get("_can_checkpoint_with_cache")) for m in layers]
    for m in layers:
        if prefix:
            m.gradient_checkpointing = False
        else:
            m._can_checkpoint_with_cache = True
    try:
        yield
    finally:
        for m, (gc, can) in zip(layers, saved):
            m.gradient_checkpointing = gc
            if can is None:
                m.__dict__.pop("_can_checkpoint_with_cache", None)
            else:
                m._can_checkpoint_with_cache = can


def shared_prefix_logps(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
                        prefix_len: int, *, compute_entropy: bool = False,
                        autocast: Any = contextlib.nullcontext) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs (and entropies) of the last ``logits_to_keep`` columns, as TRL's
    scorer computes them, for rows laid out as TRL lays them out (a left-padded prompt, then
    a right-padded completion) whose real tokens all begin with the same ``prefix_len``
    tokens. ``prefix_len`` must leave every prompt at least one token of its own (the first
    completion token is predicted from the prompt's last position)."""
    n, width = input_ids.shape
    prompt_width = width - logits_to_keep
    prompt_lens = attention_mask[:, :prompt_width].sum(1)
    if prefix_len < 1 or int(prompt_lens.min()) <= prefix_len:
        raise ValueError(f"prefix_len {prefix_len} must be in [1, shortest prompt {int(prompt_lens.min())})")
    first = prompt_width - int(prompt_lens[0])
    prefix = input_ids[:1, first:first + prefix_len]
    cache_kw = cache_kwarg(model)
    with _checkpointing(model, prefix=True), autocast():
        kv = prefix_kv(model, prefix)

    # each row's own tokens: drop its prefix columns, keep TRL's layout for the rest
    rest_width = int((prompt_lens - prefix_len).max())
    rows = torch.arange(n, device=input_ids.device)[:, None]
    cols = prompt_width - rest_width + torch.arange(rest_width, device=input_ids.device)[None, :]
    own_prompt_ok = cols >= (prompt_width - prompt_lens + prefix_len)[:, None]
    rest_ids = torch.cat([torch.where(own_prompt_ok, input_ids[rows, cols], input_ids[rows, cols].new_zeros(())),
                          input_ids[:, prompt_width:]], dim=1)
    rest_mask = torch.cat([own_prompt_ok.to(attention_mask.dtype), attention_mask[:, prompt_width:]], dim=1)
    # true positions: the prefix holds 0..prefix_len-1, a row's own tokens continue from there
    positions = (prefix_len + rest_mask.cumsum(1) - 1).clamp(min=prefix_len)
    cache = _ReadOnlyPrefix()
    for i, (k, v) in enumerate(kv):
        DynamicCache.update(cache, k, v, i)  # fill once, batch 1
    for layer in cache.layers:
        layer.keys = layer.keys.expand(n, -1, -1, -1)
        layer.values = layer.values.expand(n, -1, -1, -1)
    mask = torch.cat([rest_mask.new_ones(n, prefix_len), rest_mask], dim=1)
    with _checkpointing(model, prefix=False), autocast():
        logits = model(input_ids=rest_ids, attention_mask=mask, position_ids=positions, use_cache=False,
                       **{cache_kw: cache}, logits_to_keep=logits_to_keep + 1).logits
    # TRL's memory-lean reductions: a full log-softmax would hold two more (rows, tokens, vocab)
    # fp32 tensors for backward (about 3 GB for 16 rows of 512 tokens over SmolLM2's 49k vocab)
    logits = logits[:, :-1].float()
    logps = selective_log_softmax(logits, input_ids[:, prompt_width:])
    entropies = entropy_from_logits(logits) if compute_entropy else None
    return logps, entropies
