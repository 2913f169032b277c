"""Trainer-side log-probabilities of given completion tokens.

This is the other half of the project's central invariant: the logprobs a server
returned while sampling must equal what the trainer computes on the same ids with a
plain forward pass, or the importance ratios in the RL loss are off from the first
step. These functions are that plain forward pass: raw log-softmax at temperature 1,
no sampling processors. They do not disable gradients; wrap them in
``torch.no_grad()`` when only scoring.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def sequence_logprobs(model: Any, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> torch.Tensor:
    """Log-prob of each completion token given the prompt and the tokens before it.

    Returns a float32 tensor of shape ``[len(completion_ids)]``. ``model`` is any causal
    LM whose forward returns ``.logits`` (e.g. ``AutoModelForCausalLM``).
    """
    if not prompt_ids:
        raise ValueError("prompt_ids must hold at least one token (the first token has no logprob)")
    n_prompt, n_completion = len(prompt_ids), len(completion_ids)
    device = _device_of(model)
    if n_completion == 0:
        return torch.zeros(0, dtype=torch.float32, device=device)
    ids_1_L = torch.tensor([list(prompt_ids) + list(completion_ids)], dtype=torch.long, device=device)
    logits_1_L_V = model(input_ids=ids_1_L).logits
    # Position t predicts token t+1: the completion is predicted by the logits that end
    # one step before it.
    logits_T_V = logits_1_L_V[0, n_prompt - 1 : n_prompt - 1 + n_completion].float()
    targets_T = ids_1_L[0, n_prompt:]
    return torch.log_softmax(logits_T_V, dim=-1).gather(-1, targets_T[:, None]).squeeze(-1)


def batch_sequence_logprobs(
    model: Any,
    prompt_ids: Sequence[Sequence[int]],
    completion_ids: Sequence[Sequence[int]],
    *,
    pad_token_id: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``sequence_logprobs`` for a batch in one forward pass.

    Sequences are right-padded (so positions of real tokens are unchanged) and the
    result is aligned to completions: ``logps_B_T[b, t]`` is the log-prob of
    ``completion_ids[b][t]``, ``mask_B_T`` is 1 where such a token exists. Values under
    mask 0 are 0.0. Batched matmuls may differ from single-sequence ones in the last
    float bits; the tolerance in the conformance suite covers that.
    """
    if len(prompt_ids) != len(completion_ids):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(completion_ids)} completions")
    device = _device_of(model)
    batch = len(prompt_ids)
    max_t = max((len(c) for c in completion_ids), default=0)
    mask_B_T = torch.zeros(batch, max_t, dtype=torch.long, device=device)
    if batch == 0 or max_t == 0:
        return torch.zeros(batch, max_t, dtype=torch.float32, device=device), mask_B_T
    if any(len(p) == 0 for p in prompt_ids):
        raise ValueError("every prompt must hold at least one token")

    seqs = [list(p) + list(c) for p, c in zip(prompt_ids, completion_ids, strict=True)]
    max_l = max(len(s) for s in seqs)
    ids_B_L = torch.full((batch, max_l), pad_token_id, dtype=torch.long, device=device)
    attn_B_L = torch.zeros(batch, max_l, dtype=torch.long, device=device)
    for b, seq in enumerate(seqs):
        ids_B_L[b, : len(seq)] = torch.tensor(seq, dtype=torch.long, device=device)
        attn_B_L[b, : len(seq)] = 1
    logits_B_L_V = model(input_ids=ids_B_L, attention_mask=attn_B_L).logits

    rows: list[torch.Tensor] = []
    for b, (p, c) in enumerate(zip(prompt_ids, completion_ids, strict=True)):
        n_p, n_c = len(p), len(c)
        logits_T_V = logits_B_L_V[b, n_p - 1 : n_p - 1 + n_c].float()
        targets_T = ids_B_L[b, n_p : n_p + n_c]
        logps_T = torch.log_softmax(logits_T_V, dim=-1).gather(-1, targets_T[:, None]).squeeze(-1)
        # Pad by concatenation rather than in-place writes: keeps autograd simple.
        rows.append(torch.cat([logps_T, logps_T.new_zeros(max_t - n_c)]))
        mask_B_T[b, :n_c] = 1
    logps_B_T = torch.stack(rows)
    return logps_B_T, mask_B_T


def completion_logprobs(
    model: Any,
    prompt_ids: Sequence[Sequence[int]],
    completion_ids: Sequence[Sequence[int]],
    *,
    prefix_len: int = 0,
    pad_token_id: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch_sequence_logprobs`` for scoring, where most of the work is the prompts.

    Two savings, both exact up to float rounding: the vocabulary projection runs only where a
    completion token is predicted (``logits_to_keep``; SmolLM2's 49k-word head is about a
    fifth of its per-token matmuls, though on atlas scoring it is the smaller of the two
    savings: docs/benchmarks.md, ``bench/skill_scoring_speed.py``), and
    the first ``prefix_len`` tokens, which every prompt must share (the system prompt and tool
    schemas, the task), run once and every row reads their keys and values
    (``backends.prefix``). Layout: each row's own prompt tokens left-padded, its completion
    right-padded, positions counted over real tokens only. Same return contract as
    ``batch_sequence_logprobs``.
    """
    from seed_agents.backends.prefix import cache_kwarg, prefix_kv

    if len(prompt_ids) != len(completion_ids):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(completion_ids)} completions")
    device = _device_of(model)
    n = len(prompt_ids)
    width_c = max((len(c) for c in completion_ids), default=0)
    if n == 0 or width_c == 0:
        empty_B_T = torch.zeros(n, width_c, dtype=torch.long, device=device)
        return empty_B_T.float(), empty_B_T
    own = [list(p[prefix_len:]) for p in prompt_ids]
    if prefix_len < 0 or any(not o for o in own):
        raise ValueError(f"prefix_len {prefix_len} must leave every prompt at least one token of its own")
    if prefix_len and any(list(p[:prefix_len]) != list(prompt_ids[0][:prefix_len]) for p in prompt_ids):
        raise ValueError(f"the prompts do not share their first {prefix_len} tokens")
    width_p = max(len(o) for o in own)
    ids_B_L = torch.full((n, width_p + width_c), pad_token_id, dtype=torch.long, device=device)
    mask_B_L = torch.zeros(n, width_p + width_c, dtype=torch.long, device=device)
    for b, (o, c) in enumerate(zip(own, completion_ids, strict=True)):
        ids_B_L[b, width_p - len(o) : width_p] = torch.tensor(o, dtype=torch.long, device=device)
        ids_B_L[b, width_p : width_p + len(c)] = torch.tensor(list(c), dtype=torch.long, device=device)
        mask_B_L[b, width_p - len(o) : width_p + len(c)] = 1
    positions_B_L = prefix_len + (mask_B_L.cumsum(1) - 1).clamp(min=0)
    kwargs: dict[str, Any] = {}
    attention_B_L = mask_B_L
    if prefix_len:
        from transformers.cache_utils import DynamicCache

        cache = DynamicCache()
        for i, (k, v) in enumerate(prefix_kv(model, torch.tensor([list(prompt_ids[0][:prefix_len])], device=device))):
            DynamicCache.update(cache, k, v, i)
        for layer in cache.layers:  # one prefix, read by every row (the forward below extends a copy)
            layer.keys = layer.keys.expand(n, -1, -1, -1)
            layer.values = layer.values.expand(n, -1, -1, -1)
        kwargs[cache_kwarg(model)] = cache
        attention_B_L = torch.cat([mask_B_L.new_ones(n, prefix_len), mask_B_L], dim=1)
    logits = model(input_ids=ids_B_L, attention_mask=attention_B_L, position_ids=positions_B_L, use_cache=False,
                   logits_to_keep=width_c + 1, **kwargs).logits
    # the last width_c + 1 positions: the prompt's last token predicts the first completion token
    logits_B_T_V = logits[:, :-1].float()
    mask_B_T = mask_B_L[:, width_p:]
    logps_B_T = torch.log_softmax(logits_B_T_V, dim=-1).gather(-1, ids_B_L[:, width_p:, None]).squeeze(-1)
    return logps_B_T * mask_B_T, mask_B_T


def _device_of(model: Any) -> torch.device:
    device = getattr(model, "device", None)
    if isinstance(device, torch.device):
        return device
    try:
        return next(model.parameters()).device
    except (AttributeError, StopIteration):
        return torch.device("cpu")
