"""A dynamic KV cache that grows in place instead of concatenating at every token.

transformers' ``DynamicLayer`` appends a decode step's keys and values with ``torch.cat``, which
copies the layer's whole cache at every step, a large part of a batched decode step on a CPU
(docs/benchmarks.md, "Decode taken apart"). The static
cache (``kv_cache="static"``, an engine option) avoids the copy but attends over its whole preallocated
buffer, masked, and was no faster. Here each layer keeps a buffer with room to spare and hands
attention a view of its filled columns: a step writes one column, attention reads exactly the
columns the dynamic cache would hold, so the numbers are the dynamic cache's bit for bit.

``value_dtype`` stores the values in another format as they arrive: with attention in fp32 over
bf16 products (``seed_agents.precision.attention_in_fp32``) the values come out of their bf16
projection and attention would upcast the whole cache at every step; stored
upcast once, attention reads them as they are. The same numbers: a bf16 value is exact in fp32."""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer


class GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` whose ``keys`` and ``values`` are views of buffers with spare columns.

    Whatever replaces ``keys``/``values`` from outside (``crop``, ``batch_select_indices``,
    ``reset``) is noticed at the next update, which starts new buffers from it."""

    def __init__(self, value_dtype: torch.dtype | None = None, reserve: int = 0) -> None:
        super().__init__()
        self.value_dtype = value_dtype
        self.reserve = reserve
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        self._len = 0
        self._views: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if self.value_dtype is not None:
            value_states = value_states.to(self.value_dtype)
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self._k is None or self.keys is not self._views[0]:  # first call, or replaced from outside
            self._restart()
        n = key_states.shape[-2]
        if self._k is None or self._len + n > self._k.shape[-2]:
            self._grow(key_states, value_states, self._len + n)
        assert self._k is not None and self._v is not None
        self._k[:, :, self._len:self._len + n] = key_states
        self._v[:, :, self._len:self._len + n] = value_states
        self._len += n
        self.keys, self.values = self._k[:, :, :self._len], self._v[:, :, :self._len]
        self._views = (self.keys, self.values)
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the rows ``indices`` names, row ``indices[j]`` as row j. Where every moved row
        comes from past the kept count (``seed_agents.backends.decode`` orders a shrinking batch
        so), the rows move within the buffers: no new buffers, and a kept row in place is not
        copied at all. Any other order: transformers' (copies, then new buffers at the next
        update)."""
        order = indices.tolist()
        n = len(order)
        in_place = (self._k is not None and self.keys is self._views[0] and len(set(order)) == n
                    and all(src == j or src >= n for j, src in enumerate(order)))
        if not in_place:
            super().batch_select_indices(indices)
            return
        assert self._k is not None and self._v is not None
        for j, src in enumerate(order):
            if src != j:
                self._k[j, :, :self._len] = self._k[src, :, :self._len]
                self._v[j, :, :self._len] = self._v[src, :, :self._len]
        self._k, self._v = self._k[:n], self._v[:n]
        self.keys, self.values = self._k[:, :, :self._len], self._v[:, :, :self._len]
        self._views = (self.keys, self.values)

    def _restart(self) -> None:
        """Adopt whatever ``keys``/``values`` hold now (empty after lazy initialization)."""
        self._k = self._v = None
        self._len = 0
        if self.keys is not None and self.keys.numel():
            held_k, held_v = self.keys, self.values.to(self.value_dtype) if self.value_dtype else self.values
            self._grow(held_k, held_v, held_k.shape[-2], held=(held_k, held_v))

    def _grow(self, key_like: torch.Tensor, value_like: torch.Tensor, needed: int,
              held: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """New buffers for at least ``needed`` columns (the reserve or double, whichever is more),
        holding the filled columns so far (or ``held``)."""
        cap = max(needed + self.reserve, 2 * (self._k.shape[-2] if self._k is not None else 0), needed)
        b, h, _, d = key_like.shape
        k = key_like.new_empty((b, h, cap, d))
        v = value_like.new_empty((b, value_like.shape[1], cap, value_like.shape[-1]))
        if held is not None:
            k[:, :, :needed], v[:, :, :needed] = held
            self._len = needed
        elif self._k is not None and self._len:
            k[:, :, :self._len], v[:, :, :self._len] = self._k[:, :, :self._len], self._v[:, :, :self._len]
        self._k, self._v = k, v
        if held is not None:
            self.keys, self.values = k[:, :, :needed], v[:, :, :needed]
            self._views = (self.keys, self.values)


class GrowingCache(DynamicCache):
    """A ``DynamicCache`` of ``GrowingLayer``s (one per model layer, made as the model first
    writes it), optionally filled with ``layers`` (per layer: keys, values) first."""

    def __init__(self, layers: list[tuple[torch.Tensor, torch.Tensor]] | None = None, *,
                 value_dtype: torch.dtype | None = None, reserve: int = 0) -> None:
        Cache.__init__(self, layer_class_to_replicate=lambda: GrowingLayer(value_dtype, reserve))
        for i, (k, v) in enumerate(layers or []):
            self.update(k, v, i)
