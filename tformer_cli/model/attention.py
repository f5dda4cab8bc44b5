"""Scaled dot-product attention (two paths, one mask convention), multi-head attention, KV cache.

Mask convention, shared by both paths and every caller:
    mask: bool tensor broadcastable to (B, H, T_q, T_k); True means "query may attend to this key".
    bias: float tensor broadcastable to (B, H, T_q, T_k), added to the scores (ALiBi); or None.
A query row whose keys are all masked attends to nothing: its output is exactly zero (never NaN).

Shape legend: B batch, H query heads, H_kv key/value heads, T_q / T_k query / key length,
D model width, d_head = D / H.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer_cli.model.positions import Rotary


def attention_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    bias: Tensor | None = None,
    dropout_p: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """softmax(Q K^T / sqrt(d_k) + bias, masked) V, written out as in the chapters.

    Args:
        q: (B, H, T_q, d_head) queries.
        k: (B, H, T_k, d_head) keys.
        v: (B, H, T_k, d_head) values.
        mask: bool, True = may attend; broadcastable to (B, H, T_q, T_k).
        bias: float scores bias broadcastable to (B, H, T_q, T_k).
        dropout_p: dropout on the attention weights (0 at evaluation).

    Returns:
        (output (B, H, T_q, d_head), weights (B, H, T_q, T_k)); masked weights are exactly 0.
    """
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, T_q, T_k)
    if bias is not None:
        scores = scores + bias
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    if mask is not None:
        # A fully masked row is NaN after softmax(-inf, ..., -inf); it attends to nothing.
        weights = weights.masked_fill(~mask, 0.0)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    return weights @ v, weights


def attention_fast(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    bias: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
) -> Tensor:
    """The same computation through `F.scaled_dot_product_attention` (fused kernels).

    Args are those of `attention_reference`; `is_causal` may replace an explicit causal mask when
    T_q == T_k and there is no other mask (it selects the fastest kernels).
    """
    if q.dtype == torch.bfloat16 and q.device.type == "cpu" and torch.is_grad_enabled():
        # For training, PyTorch's bf16 CPU kernel is slower than its fp32 one (forward+backward at
        # 144x8x28x64: 72 ms vs 21 ms, bench notes in docs/benchmarks.md); attention is a small share
        # of the FLOPs, so compute it in fp32 (autocast off, or it would cast back) and return bf16.
        # Forward only (decoding with bf16 weights) the bf16 kernel is the faster one.
        with torch.autocast("cpu", enabled=False):
            out = attention_fast(q.float(), k.float(), v.float(), mask, bias, dropout_p, is_causal)
        return out.to(torch.bfloat16)
    if bias is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal)
    if is_causal:
        causal = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool, device=q.device).tril()
        mask = causal if mask is None else mask & causal
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype), dropout_p=dropout_p)
    # A float mask cannot say "nothing": use the most negative finite value, then zero empty rows.
    floor = torch.finfo(q.dtype).min
    additive = bias.to(q.dtype).masked_fill(~mask, floor)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=additive, dropout_p=dropout_p)
    return out * mask.any(dim=-1, keepdim=True).to(out.dtype)


class BufferPool:
    """Key/value buffers handed back by finished caches, for the next batch to reuse.

    The first write to a freshly allocated buffer costs a page fault per 4 KB page; beam 4 x 32
    sentences write 96 MB of cache per batch (docs/benchmarks.md, "Decoding speed": 7,907 faults and
    1.56 s per batch with fresh buffers, 1,006 and 1.51 s reused). Reusing the previous batch's buffers
    skips most of them. A buffer returns here only when the cache that held it calls
    `DecodeCache.release()` (greedy and beam search do, once done), so two live caches never share
    one. Holds at most `capacity` buffers, the largest (one cache's worth: then decoding holds at most
    twice the memory of its largest cache).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._free: list[Tensor] = []  # flat and contiguous, largest first

    def take(self, shape: tuple[int, ...], like: Tensor) -> Tensor:
        """An uninitialised tensor of `shape`, dtype and device of `like`: the smallest free buffer
        that is large enough, or a new one."""
        numel = math.prod(shape)
        fitting = [
            i
            for i, buf in enumerate(self._free)
            if buf.dtype == like.dtype and buf.device == like.device and buf.numel() >= numel
        ]
        if not fitting:  # the free buffers of this kind are all too small: let them go
            self._free = [b for b in self._free if b.dtype != like.dtype or b.device != like.device]
            return like.new_empty(shape)
        return self._free.pop(fitting[-1])[:numel].view(shape)  # largest first: the last fit is the smallest

    def give(self, tensor: Tensor) -> None:
        """Hand back a tensor that `take` returned (or a view of it); nobody may use it afterwards."""
        base = tensor if tensor._base is None else tensor._base
        if base.is_contiguous():
            self._free.append(base.view(-1))
            self._free.sort(key=Tensor.numel, reverse=True)
            del self._free[self.capacity :]


class KVCache:
    """Keys and values of one attention layer kept across decoding steps.

    Self-attention: `append` writes one (or more) new steps into a preallocated buffer.
    Cross-attention: `set_static` stores the encoder's keys and values once per source.
    `reorder` selects batch rows (beam search). Self-attention buffers come from `pool` when given
    (and go back to it on `release`).
    """

    def __init__(self, max_len: int, pool: BufferPool | None = None) -> None:
        self.max_len = max_len
        self.k: Tensor | None = None  # (B, H_kv, max_len, d_head) for self-attention
        self.v: Tensor | None = None
        self.length = 0
        self.static = False
        self.pool = pool
        self._owned: list[Tensor] = []  # the buffers taken from the pool

    def _allocate(self, shape: tuple[int, ...], like: Tensor) -> None:
        if self.pool is None:
            self.k, self.v = like.new_empty(shape), like.new_empty(shape)
        else:
            self.k, self.v = self.pool.take(shape, like), self.pool.take(shape, like)
            self._owned = [self.k, self.v]

    def release(self) -> None:
        """Done with this cache: its buffers go back to the pool (if any) and it holds nothing."""
        if self.pool is not None:
            for buf in self._owned:
                self.pool.give(buf)
        self._owned, self.k, self.v, self.length = [], None, None, 0

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add `k`, `v` of shape (B, H_kv, T_new, d_head); return all keys and values so far."""
        t_new = k.size(2)
        if self.k is None:
            self._allocate((k.size(0), k.size(1), self.max_len, k.size(3)), k)
        if self.length + t_new > self.max_len:
            raise ValueError(f"KV cache holds {self.max_len} steps; asked for {self.length + t_new}")
        assert self.v is not None
        self.k[:, :, self.length : self.length + t_new] = k
        self.v[:, :, self.length : self.length + t_new] = v
        self.length += t_new
        return self.k[:, :, : self.length], self.v[:, :, : self.length]

    def set_static(self, k: Tensor, v: Tensor) -> None:
        """Store cross-attention keys and values (computed once from the encoder output)."""
        self.k, self.v, self.length, self.static = k, v, k.size(2), True

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows `index` (in that order), e.g. the surviving beams.

        Only the filled steps are copied (the buffer is preallocated to max_len), in place when the
        batch keeps its size.
        """
        if self.k is None or self.v is None:
            return
        if self.static:
            self.k, self.v = self.k.index_select(0, index), self.v.index_select(0, index)
            return
        filled_k = self.k[:, :, : self.length].index_select(0, index)
        filled_v = self.v[:, :, : self.length].index_select(0, index)
        self.k, self.v = self.k[: index.numel()], self.v[: index.numel()]
        self.k[:, :, : self.length] = filled_k
        self.v[:, :, : self.length] = filled_v


class BeamKVCache(KVCache):
    """Keys and values of one attention layer for beam search, written in place and never moved.

    A plain cache for beam search copies every layer's keys and values at every step to follow the
    surviving hypotheses (`KVCache.reorder`); at beam 4 x 32 sentences that copying moves more memory
    than the weights do. Here the K hypotheses of a sentence share one buffer: step s of slot j holds
    the keys of whichever hypothesis sat in beam slot j at step s, and nothing moves afterwards. The
    K queries of a sentence attend together (`fold`) to all K slots' keys of all steps, each masked to
    its own ancestors (`BeamDecodeCache.step_mask`): the same attention, read where it was written.
    Cross-attention keeps the encoder's keys and values once per sentence, not once per hypothesis.

    Shapes: self-attention buffers (B, H_kv, max_len, K, d_head); cross-attention (B, H_kv, S, d_head)
    (`set_static`, one copy per sentence); `append` and `fold` take the decoder's (B*K, ., 1, d_head)
    and `unfold` returns it. The buffers' rows are sentences: `reorder(sentences)` is how finished
    sentences leave the batch.
    """

    def __init__(self, max_len: int, beam: int, pool: BufferPool | None = None) -> None:
        super().__init__(max_len, pool)
        self.beam = beam

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write one step of (B*K, H_kv, 1, d_head); return all keys, values as (B, H_kv, t*K, d_head)."""
        if k.size(2) != 1:
            raise ValueError(f"beam search decodes one step at a time, got {k.size(2)}")
        n, h, d = k.size(0) // self.beam, k.size(1), k.size(3)
        if self.k is None:
            self._allocate((n, h, self.max_len, self.beam, d), k)
        if self.length >= self.max_len:
            raise ValueError(f"KV cache holds {self.max_len} steps; asked for {self.length + 1}")
        assert self.v is not None
        self.k[:, :, self.length] = k.view(n, self.beam, h, d).transpose(1, 2)  # (B, H_kv, K, d_head)
        self.v[:, :, self.length] = v.view(n, self.beam, h, d).transpose(1, 2)
        self.length += 1
        return self.k[:, :, : self.length].flatten(2, 3), self.v[:, :, : self.length].flatten(2, 3)

    def fold(self, q: Tensor) -> Tensor:
        """(B*K, H, 1, d_head) -> (B, H, K, d_head): a sentence's hypotheses become its queries."""
        return q.reshape(-1, self.beam, q.size(1), q.size(3)).transpose(1, 2)

    def unfold(self, out: Tensor) -> Tensor:
        """(B, H, K, d_head) -> (B*K, H, 1, d_head)."""
        return out.transpose(1, 2).reshape(-1, out.size(1), 1, out.size(3))


class MultiHeadAttention(nn.Module):
    """Multi-head attention with grouped-query heads, used for self- and cross-attention.

    Self-attention projects Q, K and V with one fused linear; cross-attention projects Q from the
    decoder and K, V (fused) from the encoder memory. `n_kv_heads < n_heads` shares each key/value
    head among n_heads / n_kv_heads query heads (GQA; 1 is multi-query attention).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        cross: bool = False,
        bias: bool = True,
        dropout: float = 0.0,
        rotary: Rotary | None = None,
    ) -> None:
        super().__init__()
        n_kv_heads = n_kv_heads or n_heads
        if d_model % n_heads or n_heads % n_kv_heads:
            raise ValueError(f"d_model {d_model}, n_heads {n_heads}, n_kv_heads {n_kv_heads} do not divide")
        self.n_heads, self.n_kv_heads, self.d_head = n_heads, n_kv_heads, d_model // n_heads
        self.cross, self.dropout, self.rotary = cross, dropout, rotary
        kv_width = 2 * n_kv_heads * self.d_head
        if cross:
            self.q_proj = nn.Linear(d_model, d_model, bias=bias)
            self.kv_proj = nn.Linear(d_model, kv_width, bias=bias)
        else:
            self.qkv_proj = nn.Linear(d_model, d_model + kv_width, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.use_reference = False  # True: the written-out path (tests, attention plots)
        self.last_weights: Tensor | None = None  # set when `keep_weights` is on
        self.keep_weights = False

    def _split(self, x: Tensor, n: int) -> Tensor:
        return x.view(x.size(0), x.size(1), n, self.d_head).transpose(1, 2)  # (B, n, T, d_head)

    def _project(self, x: Tensor, memory: Tensor | None, cache: KVCache | None) -> tuple[Tensor, Tensor, Tensor]:
        kv_width = self.n_kv_heads * self.d_head
        if not self.cross:
            q, k, v = self.qkv_proj(x).split([self.n_heads * self.d_head, kv_width, kv_width], dim=-1)
            return self._split(q, self.n_heads), self._split(k, self.n_kv_heads), self._split(v, self.n_kv_heads)
        q = self._split(self.q_proj(x), self.n_heads)
        if cache is not None and cache.static:
            assert cache.k is not None and cache.v is not None
            return q, cache.k, cache.v
        if memory is None:
            raise ValueError("cross-attention needs the encoder memory")
        k, v = self.kv_proj(memory).split([kv_width, kv_width], dim=-1)
        k, v = self._split(k, self.n_kv_heads), self._split(v, self.n_kv_heads)
        if cache is not None:
            cache.set_static(k, v)
        return q, k, v

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        mask: Tensor | None = None,
        bias: Tensor | None = None,
        is_causal: bool = False,
        cache: KVCache | None = None,
        offset: int = 0,
    ) -> Tensor:
        """Attend from `x` (B, T_q, D) to itself or to `memory` (B, T_k, D).

        Args:
            x: queries' input (B, T_q, D).
            memory: encoder output for cross-attention (ignored once the cache holds it).
            mask: bool mask (True = attend), see the module docstring.
            bias: additive score bias (ALiBi), broadcastable to (B, H, T_q, T_k).
            is_causal: causal self-attention without an explicit mask (fast kernels).
            cache: per-layer KV cache for incremental decoding.
            offset: position of x's first step (rotary positions while decoding with a cache).

        Returns:
            (B, T_q, D).
        """
        q, k, v = self._project(x, memory, cache)
        if self.rotary is not None and not self.cross:
            q, k = self.rotary(q, offset), self.rotary(k, offset)
        if cache is not None and not self.cross:
            k, v = cache.append(k, v)
        beam = isinstance(cache, BeamKVCache)
        if beam:  # a sentence's K hypotheses query its shared keys together (the mask keeps them apart)
            q = cache.fold(q)
        if self.n_kv_heads != self.n_heads:  # GQA: each K/V head serves a group of query heads
            k = k.repeat_interleave(self.n_heads // self.n_kv_heads, dim=1)
            v = v.repeat_interleave(self.n_heads // self.n_kv_heads, dim=1)
        p = self.dropout if self.training else 0.0
        if self.use_reference or self.keep_weights:
            if is_causal:
                causal = torch.ones(q.size(2), k.size(2), dtype=torch.bool, device=q.device).tril(k.size(2) - q.size(2))
                mask = causal if mask is None else mask & causal
            out, weights = attention_reference(q, k, v, mask, bias, p)
            self.last_weights = weights.detach() if self.keep_weights else None
        else:
            out = attention_fast(q, k, v, mask, bias, p, is_causal)
        if beam:
            out = cache.unfold(out)
        out = out.transpose(1, 2).reshape(x.size(0), x.size(1), -1)  # (B, T_q, D)
        return self.out_proj(out)
