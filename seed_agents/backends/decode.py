"""The local backend's decode loop: a row that has sampled its stop token leaves the forward.

transformers' ``generate`` runs every row of a batch until the longest one ends; a finished
row keeps going through the model on padding. On the embedded demo the hindsight batch's
skills end after 36-44 tokens but one runs to 73, and an agent's action ends after a few of
its 16 tokens: most of a batch's late steps computed rows nobody reads. ``generate`` cannot
shrink a batch as it runs (its loop, caches and criteria assume a fixed one), so this loop is
written here, doing what ``generate``'s sampling loop does with one difference: the model runs
on the unfinished rows only (the cache keeps their rows, ``Cache.batch_select_indices``).

Everything a row's tokens depend on is what ``generate`` gives it: the logits processors see
the whole batch at every step, as there (a finished row's logits are zeros and its token is
padding, which nothing reads), so each row's sampler draws from its own generator exactly as
often as under ``generate`` and the grammar masks see the same ids; logits are cast to fp32 before the
processors, the raw ones kept for the log-probs. The numbers are ``generate``'s up to float
rounding (a forward over fewer rows may round a product differently); ids and log-probs are
compared in ``tests/unit/test_decode.py``. ``drop_finished=False`` (an engine option) keeps ``generate``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from transformers.cache_utils import DynamicCache


def can_drop_rows(cache: Any) -> bool:
    """Whether rows can leave ``cache`` mid-generation (a dynamic cache; a static one keeps
    its fixed batch, and its rows run to the end as in ``generate``)."""
    return cache is None or isinstance(cache, DynamicCache)


def fewest_moves(keep: torch.Tensor) -> torch.Tensor:
    """The kept rows' indices in the order that moves the fewest: a kept row among the first
    ``n`` (the kept count) stays in its slot, the kept rows past ``n`` fill the gaps in order.
    (A cache may then move rows within its buffers: ``GrowingLayer.batch_select_indices``.)"""
    kept = keep.nonzero().squeeze(-1)
    n = len(kept)
    order = torch.arange(n)
    order[~keep[:n]] = kept[kept >= n]
    return order


def sample_until_done(model: Any, input_ids: torch.Tensor, attention: torch.Tensor, *, cache: Any, cache_kwarg: str,
                      position_ids: torch.Tensor | None, processors: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                      stop_ids: Sequence[int], max_new: int, pad_id: int, should_stop: Callable[[], bool] = lambda: False,
                      streamer: Any = None,
                      after_prefill: Callable[[Any], None] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode up to ``max_new`` tokens a row; (new ids [B, steps], their raw log-probs [B, steps]:
    ``chosen_logprobs`` of each step's fp32 logits, taken as the step ends so no step's
    (rows, vocab) logits outlive it).

    ``input_ids``/``attention`` span every column, those ``cache`` already holds first (as
    ``generate`` takes them). A row's ids after its stop token are ``pad_id``; ``should_stop()`` ends the whole batch after
    the step it turns true. ``after_prefill(cache)`` sees the cache holding every row's prompt
    (before any row leaves it: the turn cache copies prompts out of it). Rows leave the forward
    only where ``can_drop_rows(cache)``."""
    batch = input_ids.shape[0]
    if cache is None:
        cache = DynamicCache()
    if position_ids is None:  # generate's: the count of real tokens before, 0 on padding
        position_ids = (attention.cumsum(1) - 1).masked_fill(attention == 0, 0)
    droppable = can_drop_rows(cache)
    stops = torch.tensor(sorted(set(stop_ids)), dtype=torch.long)
    ids, mask = input_ids, attention
    # the cache may already hold the first columns (a shared prefix, an episode's last turn): the
    # prefill computes the rest, the mask still spans them all (generate slices the same way)
    past = cache.get_seq_length()
    step_ids, step_pos = input_ids[:, past:], position_ids[:, past:]
    last_pos = position_ids[:, -1]  # of each row in the forward, the position of its last token
    active = torch.arange(batch)
    unfinished = torch.ones(batch, dtype=torch.bool)
    logp_steps: list[torch.Tensor] = []
    if streamer is not None:
        streamer.put(input_ids.cpu())
    for step in range(max_new):
        out = model(input_ids=step_ids, attention_mask=mask[active], position_ids=step_pos, use_cache=True,
                    logits_to_keep=1, **{cache_kwarg: cache})
        if step == 0 and after_prefill is not None:
            after_prefill(cache)
        logits = out.logits[:, -1].to(copy=True, dtype=torch.float32)
        if len(active) < batch:  # finished rows: zeros, never read
            logits = logits.new_zeros((batch, logits.shape[-1])).index_copy_(0, active, logits)
        chosen = processors(ids, logits).argmax(-1)
        chosen = torch.where(unfinished, chosen, torch.full_like(chosen, pad_id))
        logp_steps.append(chosen_logprobs([logits], chosen[:, None])[:, 0])
        ids = torch.cat([ids, chosen[:, None]], dim=1)
        mask = torch.cat([mask, mask.new_ones((batch, 1))], dim=1)
        if streamer is not None:
            streamer.put(chosen.cpu())
        unfinished &= ~torch.isin(chosen, stops)
        if should_stop() or not unfinished.any():
            break
        if droppable and not bool(unfinished[active].all()):
            kept = fewest_moves(unfinished[active])
            cache.batch_select_indices(kept)
            active, last_pos = active[kept], last_pos[kept]
        step_ids = chosen[active][:, None]
        last_pos = last_pos + 1
        step_pos = last_pos[:, None]
    if streamer is not None:
        streamer.end()
    return ids[:, input_ids.shape[1]:], torch.stack(logp_steps, dim=1)


def chosen_logprobs(steps: Sequence[torch.Tensor], ids: torch.Tensor) -> torch.Tensor:
    """The raw log-probs [B, T] of ``ids`` [B, T] under each step's logits [B, V]: each step's
    log-softmax in fp32, one step at a time: stacked first, a batch's (rows, steps, vocab) logits
    and their log-softmax would be two more copies of every step's logits at once (32 rows of 64
    tokens over a 49k vocab: 0.4 GB each). The same bits: the log-softmax runs row by row over the
    vocabulary either way."""
    return torch.stack([step.float().log_softmax(-1).gather(-1, ids[:, t:t + 1]).squeeze(-1)
                        for t, step in enumerate(steps)], dim=1)
