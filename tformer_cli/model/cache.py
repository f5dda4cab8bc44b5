"""What a decoder keeps between incremental decoding steps: the small interface the model calls, and the
plain reference caches that implement it.

Decoding one token at a time, each attention layer keeps the keys and values of the steps so far
(`KVCache.update`; cross-attention keeps the encoder's, computed once: `keep_memory`, `memory`), and each
stack records its new steps (`DecodeCache.record`: their positions, a tensor, and their self-attention mask)
and says how many key steps attention spans (`n_keys`). Those are all the model reads. A cache that lays its
keys out otherwise (beam search's, which groups a sentence's hypotheses) overrides the re-layout hooks
`relayout_queries`, `relayout_outputs` and `relayout_score_bias`, identities here. Faster caches
(preallocated and reused buffers, beam search's shared one, fixed shapes) live in tformer_cli/decoding/
(cache.py, static_cache.py); they implement this interface and are tested against these classes.

Shape legend: B batch rows, H_kv key/value heads, T steps, S source length, d_head head width.
"""

from __future__ import annotations

import torch
from torch import Tensor


def can_drop_mask(key_mask: Tensor) -> bool:
    """Whether `key_mask` (True for real tokens) may be left out, having no padding; never under torch.compile.

    Without a mask the fused attention kernels take their fastest paths (no mask, or the causal mask
    built in). Reading the mask's values is a graph break for torch.compile (`train.compile`), so
    compiled code always passes the mask: the same results, in one graph.
    """
    return not torch.compiler.is_compiling() and bool(key_mask.all())


def self_attention_mask(key_mask: Tensor, t_q: int, start: int, causal: bool) -> tuple[Tensor | None, bool]:
    """The self-attention mask from padding and causality (model/attention.py's convention).

    Args:
        key_mask: (B, T_k) True for real tokens, the cached steps included.
        t_q: the number of new steps (queries); they sit at positions start .. start + t_q - 1.
        start: the number of steps before the new ones.
        causal: each query sees only keys at or before its own position.

    Returns:
        (mask (B, 1, T_q, T_k) or (T_q, T_k) or None, is_causal): `is_causal` True asks the fused
        kernel to build the plain causal mask itself.
    """
    mask = None if can_drop_mask(key_mask) else key_mask[:, None, None, :]  # (B, 1, 1, T_k)
    if not causal:
        return mask, False
    if mask is None and start == 0:
        return None, True  # plain causal: let the fused kernel build it
    if mask is None and t_q == 1:
        return None, False  # one new step sees every cached key: nothing to mask
    t_k = key_mask.size(1)
    q_pos = torch.arange(start, start + t_q, device=key_mask.device)[:, None]
    future = torch.arange(t_k, device=key_mask.device)[None, :] <= q_pos  # (T_q, T_k)
    return (future if mask is None else mask & future), False


class KVCache:
    """Keys and values of one attention layer, kept across decoding steps.

    Self-attention: `update` adds the new steps' keys and values and returns all that attention reads.
    Cross-attention: `memory` holds the encoder's keys and values once `keep_memory` stored them.
    `relayout_queries` and `relayout_outputs` are the re-layout hooks of a cache that holds its keys in
    another layout than the queries' rows (identity here; beam search's cache groups a sentence's hypotheses).
    """

    def __init__(self) -> None:
        self.k: Tensor | None = None  # (B, H_kv, T, d_head)
        self.v: Tensor | None = None
        self.memory: tuple[Tensor, Tensor] | None = None  # cross-attention: (B, H_kv, S, d_head) each

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add `k`, `v` of shape (B, H_kv, T_new, d_head); return all keys and values so far."""
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        return self.k, self.v

    def keep_memory(self, k: Tensor, v: Tensor) -> None:
        """Store cross-attention's keys and values (computed once from the encoder output)."""
        self.memory = (k, v)

    def relayout_queries(self, q: Tensor) -> Tensor:
        """Re-layout hook: the queries (B, H, T_q, d_head) laid out as this cache's keys are."""
        return q

    def relayout_outputs(self, out: Tensor) -> Tensor:
        """Re-layout hook: attention output back to the queries' layout (the inverse of `relayout_queries`)."""
        return out

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows `index`, in that order (a search dropping or repeating rows)."""
        if self.k is not None and self.v is not None:
            self.k, self.v = self.k.index_select(0, index), self.v.index_select(0, index)
        if self.memory is not None:
            self.memory = (self.memory[0].index_select(0, index), self.memory[1].index_select(0, index))


class LayerCache:
    """The caches of one block: self-attention (grows step by step) and cross-attention (one source)."""

    def __init__(self, self_kv: KVCache, cross_kv: KVCache) -> None:
        self.self_kv, self.cross_kv = self_kv, cross_kv


class DecodeCache:
    """Everything a stack keeps between incremental decoding steps.

    `key_mask` (B, T_so_far) records which cached steps are real tokens (False for padding, e.g.
    left-padded prompts), so later steps never attend to them.
    """

    def __init__(self, layers: list[LayerCache]) -> None:
        self.layers = layers
        self.key_mask: Tensor | None = None

    @classmethod
    def plain(cls, n_layers: int) -> DecodeCache:
        """The reference cache for a stack of `n_layers` blocks."""
        return cls([LayerCache(KVCache(), KVCache()) for _ in range(n_layers)])

    @property
    def n_keys(self) -> int:
        """The key steps the new steps' self-attention spans, once `record` recorded them: all steps so far here
        (a static cache spans its whole length, written or not). Positions 0 .. n_keys - 1 cover the new steps'."""
        return 0 if self.key_mask is None else self.key_mask.size(1)

    def record(self, key_mask: Tensor, causal: bool) -> tuple[Tensor, Tensor | None, bool]:
        """Record the new steps, whose key mask is `key_mask` (B, T_new).

        Returns:
            (positions (T_new,) long on key_mask's device, self-attention mask over all steps, is_causal):
            the mask and is_causal as `self_attention_mask` gives them.
        """
        start, t_new = self.n_keys, key_mask.size(1)
        self.key_mask = key_mask if self.key_mask is None else torch.cat([self.key_mask, key_mask], dim=1)
        positions = torch.arange(start, start + t_new, device=key_mask.device)
        return positions, *self_attention_mask(self.key_mask, t_new, start, causal)

    def relayout_score_bias(self, bias: Tensor) -> Tensor:
        """Re-layout hook: a score bias over the steps (ALiBi, (., H, T_q, T_k)) in this cache's key layout."""
        return bias

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows `index` in every layer (e.g. greedy search dropping finished sentences)."""
        for layer in self.layers:
            layer.self_kv.reorder(index)
            layer.cross_kv.reorder(index)
        if self.key_mask is not None:
            self.key_mask = self.key_mask.index_select(0, index)
