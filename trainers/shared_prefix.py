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
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint
from transformers.cache_utils import DynamicCache
from trl.trainer.utils import entropy_from_logits, selective_log_softmax

from seed_agents.backends.prefix import cache_kwarg, prefix_kv
from seed_agents.trainers.head import head_logps, plain_head

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


class _KeepingRowsKV(_ReadOnlyPrefix):
    """A read-only prefix that also keeps, detached, the keys and values of the first
    ``own_width`` columns of the rows' tokens (their own prompt) at each layer's first
    call: a checkpointed layer's replay in backward is not kept again."""

    def __init__(self, own_width: int) -> None:
        super().__init__()
        self.own_width = own_width
        self.kept: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if layer_idx not in self.kept:
            w = self.own_width
            self.kept[layer_idx] = (key_states[:, :, :w].detach(), value_states[:, :, :w].detach())
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)


@dataclass
class PromptKV:
    """The keys and values a shared-prefix forward computed for its rows' prompts, detached,
    at their true positions: the prefix's (batch 1, ``prefix_len`` columns) and each row's own
    prompt tokens after it (left-padded to ``own_width`` columns; ``own_lens`` real per row).
    What ``logps_on_prompt_kv`` scores other tokens on top of."""

    prefix: list[tuple[torch.Tensor, torch.Tensor]]
    own: list[tuple[torch.Tensor, torch.Tensor]]
    prefix_len: int
    own_lens: torch.Tensor


def _layers(model: Any) -> list[Any]:
    if GradientCheckpointingLayer is None:
        return []
    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def checkpointed_layers(model: Any) -> list[Any]:
    """The model's layers that recompute their forward in backward now."""
    return [m for m in _layers(model) if m.gradient_checkpointing]


def supported(model: Any) -> bool:
    """Whether a grad-enabled forward can use the shared prefix here: no checkpointed layer,
    or layers that can keep a read-only cache under checkpointing."""
    return all(hasattr(m, "_can_checkpoint_with_cache") for m in checkpointed_layers(model))


@contextlib.contextmanager
def _checkpointing(model: Any, *, prefix: bool) -> Iterator[None]:
    """The prefix forward's layers run unchecked (it fills a cache, which a replayed layer would
    fill twice; ``_prefix_kv`` checkpoints the prefix forward as a whole instead); the rows'
    forward keeps checkpointing and is told its cache is read-only."""
    layers = checkpointed_layers(model)
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


def recomputes(model: Any) -> bool:
    """Whether a forward now should keep only what its checkpointed layers keep: under gradients,
    with the model's layers checkpointed (``gradient_checkpointing`` on, and not switched off for
    an update whose activations fit: ``trainers.activations``)."""
    return torch.is_grad_enabled() and bool(checkpointed_layers(model))


def _prefix_kv(model: Any, prefix: torch.Tensor, autocast: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The prefix's keys and values (``prefix_kv``), its layers run unchecked (a replayed layer would
    fill the cache twice). Where the model's layers recompute (``recomputes``), the prefix forward
    is one checkpoint as a whole: it keeps its input ids and keys and values, and runs again in
    backward. Kept instead, every layer's activations of a few hundred prefix tokens would stay
    alive per loss chunk until backward, more than the chunk's checkpointed rows keep. The replay
    computes the same numbers with the same operations, so the gradients are the same bits."""
    def run(ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        with _checkpointing(model, prefix=True), autocast():
            return tuple(t for layer in prefix_kv(model, ids) for t in layer)

    flat = checkpoint(run, prefix, use_reentrant=False) if recomputes(model) else run(prefix)
    return list(zip(flat[0::2], flat[1::2], strict=True))


def shared_prefix_logps(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
                        prefix_len: int, *, compute_entropy: bool = False,
                        autocast: Any = contextlib.nullcontext,
                        keep_kv: list[PromptKV] | None = None,
                        keep: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs (and entropies) of the last ``logits_to_keep`` columns, as TRL's
    scorer computes them, for rows laid out as TRL lays them out (a left-padded prompt, then
    a right-padded completion) whose real tokens all begin with the same ``prefix_len``
    tokens. ``prefix_len`` must leave every prompt at least one token of its own (the first
    completion token is predicted from the prompt's last position). With ``keep_kv``, the
    prompts' keys and values are appended to it (``PromptKV``), for scoring on top of them.
    With ``keep`` ((rows, ``logits_to_keep``) bool), the head runs at those completion positions
    only and the others are 0 (``trainers.head``; a model without a plain head scores them all)."""
    n, width = input_ids.shape
    prompt_width = width - logits_to_keep
    prompt_lens = attention_mask[:, :prompt_width].sum(1)
    if prefix_len < 1 or int(prompt_lens.min()) <= prefix_len:
        raise ValueError(f"prefix_len {prefix_len} must be in [1, shortest prompt {int(prompt_lens.min())})")
    first = prompt_width - int(prompt_lens[0])
    prefix = input_ids[:1, first:first + prefix_len]
    cache_kw = cache_kwarg(model)
    kv = _prefix_kv(model, prefix, autocast)

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
    cache = _ReadOnlyPrefix() if keep_kv is None else _KeepingRowsKV(rest_width)
    for i, (k, v) in enumerate(kv):
        DynamicCache.update(cache, k, v, i)  # fill once, batch 1
    for layer in cache.layers:
        layer.keys = layer.keys.expand(n, -1, -1, -1)
        layer.values = layer.values.expand(n, -1, -1, -1)
    mask = torch.cat([rest_mask.new_ones(n, prefix_len), rest_mask], dim=1)
    parts = plain_head(model) if keep is not None else None
    if parts is not None:
        decoder, head = parts
        with _checkpointing(model, prefix=False), autocast():
            hidden = decoder(input_ids=rest_ids, attention_mask=mask, position_ids=positions, use_cache=False,
                             **{cache_kwarg(decoder): cache}).last_hidden_state
            logps, entropies = head_logps(hidden[:, -(logits_to_keep + 1):-1], input_ids[:, prompt_width:], keep,
                                          head, compute_entropy=compute_entropy, recompute=recomputes(model))
    else:
        with _checkpointing(model, prefix=False), autocast():
            logits = model(input_ids=rest_ids, attention_mask=mask, position_ids=positions, use_cache=False,
                           **{cache_kw: cache}, logits_to_keep=logits_to_keep + 1).logits
        # TRL's memory-lean reductions: a full log-softmax would hold two more (rows, tokens, vocab)
        # fp32 tensors for backward (about 3 GB for 16 rows of 512 tokens over SmolLM2's 49k vocab)
        logits = logits[:, :-1].float()
        logps = selective_log_softmax(logits, input_ids[:, prompt_width:])
        entropies = entropy_from_logits(logits) if compute_entropy else None
    if keep_kv is not None:
        keep_kv.append(PromptKV(prefix=[(k.detach(), v.detach()) for k, v in kv],
                                own=[cache.kept[i] for i in range(len(kv))], prefix_len=prefix_len,
                                own_lens=(prompt_lens - prefix_len).to(torch.long)))
    return logps, entropies


def logps_on_prompt_kv(model: Any, kv: PromptKV, rows: list[int], shared: list[int], tails: list[list[int]],
                       completion_lens: list[int], *, autocast: Any = contextlib.nullcontext,
                       keep: torch.Tensor | None = None) -> torch.Tensor:
    """Log-probs of completions under other prompts that begin like the rows' own, computed
    on top of the rows' prompt keys and values instead of from the first token.

    Row ``rows[j]`` of ``kv`` shares its first ``shared[j]`` prompt tokens with the other
    prompt; ``tails[j]`` is that prompt's rest followed by the completion's
    ``completion_lens[j]`` tokens. The shared tokens are read from ``kv`` (the prefix's and the
    row's own columns at positions below ``shared[j]``; the rest masked out), the tail runs at
    its true positions from ``shared[j]`` on. SEED's teacher prompt is the row's prompt with
    a skill put in (``skills.injector``): after the whole prompt, every prompt token is shared
    and the teacher computes the skill and the completion only. Returns (len(rows), longest
    completion), zero-padded; no gradient. Exact up to float rounding
    (``tests/unit/test_shared_prefix.py`` against the whole prompt scored alone). With ``keep``
    ((len(rows), longest completion) bool, entry (i, j) for completion token j of ``rows[i]``), the
    head runs at those tokens only and the others are 0 (``trainers.head``; a model without a
    plain head scores them all)."""
    dev = kv.prefix[0][0].device
    m, p = len(rows), kv.prefix_len
    idx = torch.tensor(rows, device=dev)
    s = torch.tensor(shared, device=dev)
    if any(n < 1 for n in shared) or any(len(t) <= c for t, c in zip(tails, completion_lens)):
        raise ValueError("every row must share a token and keep one prompt token of its own in its tail")
    own_width = kv.own[0][0].shape[-2]
    own_lens = kv.own_lens.to(dev)[idx]
    prefix_ok = torch.arange(p, device=dev)[None, :] < s[:, None]
    col = torch.arange(own_width, device=dev)[None, :]
    own_pos = p + col - (own_width - own_lens)[:, None]  # a left-padded column's true position
    own_ok = (col >= (own_width - own_lens)[:, None]) & (own_pos < s[:, None])
    # tails left-padded, so that every completion ends at the last column and the logits of
    # the last (longest completion + 1) columns cover them all: a skill's own positions need
    # no logits (the vocabulary projection is a fifth of SmolLM2's per-token work)
    width = max(len(t) for t in tails)
    tail_ids = torch.zeros(m, width, dtype=torch.long, device=dev)
    tail_mask = torch.zeros(m, width, dtype=torch.long, device=dev)
    for j, t in enumerate(tails):
        tail_ids[j, width - len(t):] = torch.tensor(t, device=dev)
        tail_mask[j, width - len(t):] = 1
    positions = s[:, None] + (tail_mask.cumsum(1) - 1).clamp(min=0)
    cache = _ReadOnlyPrefix()
    for i, ((pk, pv), (ok, ov)) in enumerate(zip(kv.prefix, kv.own)):
        DynamicCache.update(cache, torch.cat([pk.expand(m, -1, -1, -1), ok[idx]], dim=-2),
                            torch.cat([pv.expand(m, -1, -1, -1), ov[idx]], dim=-2), i)
    mask = torch.cat([prefix_ok, own_ok, tail_mask.bool()], dim=1).to(torch.long)
    longest = max(completion_lens)
    lens = torch.tensor(completion_lens, device=dev)
    # completion token j of row i: column width - c_i + j, predicted at the column before it;
    # ``at`` counts from the first of the last (longest + 1) columns
    at = (longest - lens[:, None] + torch.arange(longest, device=dev)[None, :]).clamp(max=longest - 1)
    valid = torch.arange(longest, device=dev)[None, :] < lens[:, None]
    targets = tail_ids[:, width - longest:].gather(1, at)
    parts = plain_head(model) if keep is not None else None
    if parts is not None:
        decoder, head = parts
        with torch.no_grad(), _checkpointing(model, prefix=False), autocast():
            hidden = decoder(input_ids=tail_ids, attention_mask=mask, position_ids=positions, use_cache=False,
                             **{cache_kwarg(decoder): cache}).last_hidden_state[:, width - longest - 1:]
            picked = hidden.gather(1, at[:, :, None].expand(-1, -1, hidden.size(-1)))
            logps, _ = head_logps(picked, targets, keep.bool() & valid, head)
        return logps
    with torch.no_grad(), _checkpointing(model, prefix=False), autocast():
        logits = model(input_ids=tail_ids, attention_mask=mask, position_ids=positions, use_cache=False,
                       logits_to_keep=longest + 1, **{cache_kwarg(model): cache}).logits
    picked = logits.gather(1, at[:, :, None].expand(-1, -1, logits.size(-1))).float()
    return torch.where(valid, selective_log_softmax(picked, targets), torch.zeros((), device=dev))
