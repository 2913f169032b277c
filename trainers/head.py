"""The LM head at the positions a loss reads, not at every completion position.

An agent's rows merge its calls (``seed_agents.rows``): a row's completion runs from its first
sampled token to its last, and between calls it holds what the environment answered, tokens the
policy never sampled and nobody trains (``loss_mask`` 0). On the embedded demo's TextWorld rows
(three turns) about one completion position in seven is a sampled token (600 of 4,431 in its first batch). The scorer TRL ships
projects every completion position through the 49k-row head, then log-softmaxes and takes the
entropy of each in fp32; on a CPU TRL's fused head does so for every position (its compact path is
for Triton devices). Every term of the SEED objective (PPO, entropy, KL, OPD) is a masked mean over
``loss_mask``, so here the backbone's hidden states are gathered at the kept positions first and
only those meet the head. Log-probs and entropies at the kept positions are the full path's up to
float rounding, gradients included (``tests/unit/test_head.py``); elsewhere they are 0, which
every masked term multiplies by 0.

Models whose logits are scaled or soft-capped (``logit_scale``, ``final_logit_softcapping`` and
kin) keep the full path: only the plain head is reproduced here (``plain_head``)."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint
from trl.trainer.utils import entropy_from_logits, selective_log_softmax

from seed_agents.models import SCALED_LOGITS


def plain_head(model: Any) -> tuple[torch.nn.Module, torch.nn.Module] | None:
    """(decoder, LM head) of a causal LM whose logits are ``head(decoder(...))``, or None.

    A PEFT model's LoRA layers sit inside its base model's modules, so the base model's decoder
    runs them (and ``disable_adapter`` still turns them off)."""
    lm = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
    if hasattr(lm, "get_base_model"):
        lm = lm.get_base_model()
    if not (hasattr(lm, "get_decoder") and hasattr(lm, "get_output_embeddings")):
        return None
    text = lm.config.get_text_config()
    if any(getattr(text, key, None) is not None for key in SCALED_LOGITS):
        return None
    head = lm.get_output_embeddings()
    return (lm.get_decoder(), head) if head is not None else None


def head_logps(hidden: torch.Tensor, targets: torch.Tensor, keep: torch.Tensor, head: torch.nn.Module, *,
               compute_entropy: bool = False, recompute: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs (and entropies) of ``targets`` at the ``keep`` positions, 0 elsewhere.

    ``hidden``: (B, T, H), position t the state that predicts ``targets[:, t]``; ``keep``: (B, T)
    bool. The head runs on the kept rows only (in the caller's autocast, as the model's forward
    would run it), the softmax in fp32 as TRL's scorer does.

    ``recompute`` (under gradients, where the model's layers are checkpointed): the head keeps its
    kept hidden states only and runs again in backward. Kept instead, its fp32 logits, their
    log-softmax and the entropy's probabilities (three (kept, vocab) tensors: 0.6 MB a position over
    SmolLM2's 49k vocab) would stay alive per loss chunk until backward. The replay computes the same
    numbers with the same operations (autocast included), so the gradients are the same bits."""
    keep = keep.bool()
    kept, kept_targets = hidden[keep], targets[keep]

    def run(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        logits = head(h).float()
        if not logits.size(0):  # nothing trained here: a zero still attached to the graph
            return logits.sum(-1), (logits.sum(-1) if compute_entropy else None)
        # one (1, K, V) block: TRL's log-softmax loops over the first dimension
        logps = selective_log_softmax(logits[None], kept_targets[None])[0]
        return logps, (entropy_from_logits(logits) if compute_entropy else None)

    logps, entropies = checkpoint(run, kept, use_reentrant=False) if recompute and kept.size(0) else run(kept)
    out = logps.new_zeros(keep.shape).masked_scatter(keep, logps)
    if not compute_entropy:
        return out, None
    return out, logps.new_zeros(keep.shape).masked_scatter(keep, entropies)


def completion_logps(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
                     keep: torch.Tensor, *, compute_entropy: bool = False, autocast: Any = contextlib.nullcontext,
                     recompute: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """TRL's scorer for rows laid out as TRL lays them out (left-padded prompt, right-padded
    completion of ``logits_to_keep`` columns), with the head at the ``keep`` positions of the
    completion only. ``model`` must have a ``plain_head``; ``recompute``: ``head_logps``'."""
    parts = plain_head(model)
    if parts is None:
        raise ValueError("completion_logps needs a model whose logits are its head over its decoder (plain_head)")
    decoder, head = parts
    with autocast():
        hidden = decoder(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        return head_logps(hidden[:, -(logits_to_keep + 1):-1], input_ids[:, -logits_to_keep:], keep, head,
                          compute_entropy=compute_entropy, recompute=recompute)
