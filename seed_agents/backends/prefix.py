"""Prompts that begin with the same tokens: find that prefix and compute it once.

An agent's concurrent calls share most of their prompt (the system prompt, the tool
schemas, the task), and so do the rows of one update. Both the local backend (sampling a
batch) and the trainer (scoring a chunk of rows) run the shared prefix as one sequence
and let every row read its keys and values. Exact up to float rounding: each row's own
tokens keep their true positions after the prefix.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from transformers.cache_utils import DynamicCache

MIN_PREFIX = 32  # below this, one more forward costs more than the tokens it saves


def common_prefix_len(seqs: list[list[int]]) -> int:
    """Length of the longest prefix every sequence shares."""
    if not seqs:
        return 0
    first, n = seqs[0], min(len(s) for s in seqs)
    for i in range(n):
        token = first[i]
        if any(s[i] != token for s in seqs):
            return i
    return n


def worth_sharing(seqs: list[list[int]]) -> int:
    """The prefix length to compute once for these sequences, or 0: at least ``MIN_PREFIX``
    tokens, two sequences, and one token of its own left to every sequence (the first new
    token is predicted from a sequence's own last position)."""
    if len(seqs) < 2:
        return 0
    shared = min(common_prefix_len(seqs), min(len(s) for s in seqs) - 1)
    return shared if shared >= MIN_PREFIX else 0


def prefix_groups(seqs: list[list[int]]) -> list[tuple[list[int], int]]:
    """(indices, shared prefix length) of groups of sequences that compute a prefix once each,
    chosen to skip the most tokens; sequences in no group are left out.

    A batch's sequences often share more within groups than across all of them: SEED's
    hindsight prompts for one task's episodes share the analyzer's instructions, the task and
    the first observation (~560 of ~750 tokens on the demo's TextWorld batch), while the
    instructions differ between a success and a failure, so the batch as a whole shares ~200.
    In token order a group is a run of neighbours and shares the least common prefix of its
    neighbouring pairs; the best split into runs (tokens skipped: (size - 1) x shared) is a
    small dynamic program over at most a batch of sequences. A group needs two sequences and
    ``worth_sharing``'s conditions (``MIN_PREFIX`` tokens, one token of its own left to each)."""
    order = sorted(range(len(seqs)), key=lambda i: seqs[i])
    n = len(order)
    # neighbours' common prefixes, once: a run's is their minimum (the batch's prompts are long)
    pair = [common_prefix_len([seqs[order[k]], seqs[order[k + 1]]]) for k in range(n - 1)]
    # best[j]: (tokens skipped, groups) over the first j sequences in token order
    best: list[tuple[int, list[tuple[list[int], int]]]] = [(0, [])]
    for j in range(1, n + 1):
        choice = (best[j - 1][0], best[j - 1][1])  # sequence j-1 in no group
        common, shortest = len(seqs[order[j - 1]]), len(seqs[order[j - 1]])
        for i in range(j - 2, -1, -1):  # sequences i..j-1 as one group
            common, shortest = min(common, pair[i]), min(shortest, len(seqs[order[i]]))
            shared = min(common, shortest - 1)  # worth_sharing's conditions, run by run
            if shared >= MIN_PREFIX and best[i][0] + (j - i - 1) * shared > choice[0]:
                choice = (best[i][0] + (j - i - 1) * shared, [*best[i][1], (sorted(order[i:j]), shared)])
        best.append(choice)
    return best[n][1]


def prefix_batches(seqs: list[list[int]], max_rows: int) -> list[list[int]]:
    """Batches (lists of indices) of at most ``max_rows`` sequences, for sequences already in
    token order: a batch ends where the next sequence shares fewer than ``MIN_PREFIX``
    tokens with the one before it, so a sequence that shares nothing never costs a batch
    its shared prefix (the rows that do share still run it once)."""
    batches: list[list[int]] = []
    for i, seq in enumerate(seqs):
        if batches and len(batches[-1]) < max_rows and common_prefix_len([seqs[i - 1], seq]) >= MIN_PREFIX:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def cache_kwarg(model: Any) -> str:
    """transformers 5 renamed the forward's ``past_key_values`` to ``cache``."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(type(base).forward).parameters else "past_key_values"


def prefix_kv(model: Any, prefix_ids: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's keys and values of ``prefix_ids`` (shape [1, K]), from one forward."""
    # the layers fill a cache they are handed whatever use_cache says; asking for use_cache
    # under gradient checkpointing only makes transformers warn that it turns it off
    cache = DynamicCache()
    model(input_ids=prefix_ids, use_cache=False, logits_to_keep=1, **{cache_kwarg(model): cache})
    if not cache.layers or cache.get_seq_length() != prefix_ids.shape[1]:
        raise RuntimeError("this transformers version did not fill the prefix cache; set share_prefix off")
    return [(layer.keys, layer.values) for layer in cache.layers]
