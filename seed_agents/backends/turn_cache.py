"""Keys and values an episode's next turn reuses: the prompt its last call computed.

An agent's prompt at turn n is its prompt at turn n-1 plus what happened since (the reply,
a tool result, the next observation), so without reuse every turn recomputes the whole
history: the local backend's prefill grows quadratically over an episode. ``TurnCache``
keeps, per episode (the capture scope the call ran in), the keys and values of the last
prompt the backend computed for it; the episode's next call reads them for the tokens its
prompt shares with that one and computes only the rest (vLLM's prefix cache does the same
across requests, by hashing blocks).

Why per episode, not one cache for every request: the numbers must not depend on which
other episodes ran before. A row's keys and values differ in the last bits with the batch
they were computed in, so a cache shared across episodes would make an episode's logits
depend on its neighbours' history, and a resumed run (which restarts its episodes) would
sample other ids than the uninterrupted one. An episode's own entries depend only on what
that episode did, in the same waves, in every run.

The common prefix is taken, not only an exact prefix: attention is causal, so the keys and
values of a prompt's first k tokens are those of any prompt that begins with the same k
tokens (the reply, which a chat template re-renders in the next prompt, may tokenize
differently from the sampled ids; everything before it still matches).

Entries are stale as soon as the weights change (the trainer updates a shared model in
place): the cache is keyed by a fingerprint of the parameters' identities and version
counters (torch bumps a tensor's ``_version`` at every in-place write: an optimizer step, a
``load_state_dict``, a weight sync), the backend's ``policy_version`` and the compute dtype,
and empties itself when it changes. Memory is bounded (``max_bytes``; least recently used
episodes go first): SmolLM2-135M keeps 46 KB of fp32 keys and values per token.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch

from seed_agents.backends.prefix import MIN_PREFIX, common_prefix_len

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values, each [1, heads, tokens, head_dim]


def weights_fingerprint(model: torch.nn.Module, *extra: Any) -> int:
    """Changes whenever a parameter is written in place or replaced (``extra``: anything
    else the keys and values depend on)."""
    return hash((tuple((id(p), p._version) for p in model.parameters()), *extra))


@dataclass
class _Entry:
    tokens: list[int]
    kv: KV
    nbytes: int
    used: int  # when it was last read or written (a counter): the least recent goes first


class TurnCache:
    """Per-owner keys and values of the last prompt, LRU-bounded by bytes.

    Owners are held weakly: an episode's entry (and its memory) goes with its capture scope,
    when the episode's rollout is over, not at the next request."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.max_bytes = max_bytes
        self._entries: weakref.WeakKeyDictionary[Any, _Entry] = weakref.WeakKeyDictionary()
        self._fingerprint: int | None = None
        self._clock = 0
        self.hits = self.reused_tokens = 0

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in list(self._entries.values()))

    def __len__(self) -> int:
        return len(self._entries)

    def check(self, fingerprint: int) -> None:
        """Drop every entry if the weights (or what else the fingerprint covers) changed."""
        if fingerprint != self._fingerprint:
            self._entries.clear()
            self._fingerprint = fingerprint

    def lookup(self, owner: Any, prompt: list[int]) -> tuple[int, KV | None]:
        """(tokens of ``prompt`` whose keys and values are cached, those keys and values
        sliced to them); (0, None) when fewer than ``MIN_PREFIX`` match. At least one token
        of the prompt is left to compute (the next token is predicted from its position)."""
        if owner is None or self.max_bytes == 0:
            return 0, None
        entry = self._entries.get(owner)
        if entry is None:
            return 0, None
        n = min(common_prefix_len([entry.tokens, prompt]), len(prompt) - 1)
        if n < MIN_PREFIX:
            return 0, None
        self._clock += 1
        entry.used = self._clock
        self.hits += 1
        self.reused_tokens += n
        return n, [(k[:, :, :n], v[:, :, :n]) for k, v in entry.kv]

    def store(self, owner: Any, prompt: list[int], kv: KV) -> None:
        """Keep ``kv`` (its own memory: pass copies) as ``owner``'s entry, replacing the last;
        the least recently used entries go while the total is over ``max_bytes``."""
        if owner is None or self.max_bytes == 0:
            return
        self._entries.pop(owner, None)
        nbytes = sum(k.nbytes + v.nbytes for k, v in kv)
        if nbytes > self.max_bytes:
            return
        self._clock += 1
        self._entries[owner] = _Entry(list(prompt), kv, nbytes, self._clock)
        entries = sorted(self._entries.items(), key=lambda item: item[1].used)
        total = sum(e.nbytes for _, e in entries)
        for key, e in entries:
            if total <= self.max_bytes:
                break
            del self._entries[key]
            total -= e.nbytes
