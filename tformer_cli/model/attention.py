"""Scaled dot-product attention (two paths, one mask convention) and multi-head attention.

The fast path is the scaled dot product only; the reference path takes any score function of
model/scores.py (`model.attention_score`), and multi-head attention sends the others there.

Mask convention, shared by both paths and every caller:
    mask: bool tensor broadcastable to (B, H, T_q, T_k); True means "query may attend to this key".
    score_bias: float tensor broadcastable to (B, H, T_q, T_k), added to the scores (ALiBi); or None.
A query row whose keys are all masked attends to nothing: its output is exactly zero (never NaN).

`MultiHeadAttention` keeps no state between calls. The written-out path is chosen for a block of code by
`reference_attention()`, which restores the choice on exit; the weights it computes pass through the module's
`weights_tap` (an identity), where a forward hook can read them (tformer_cli/attention_maps.py).

Shape legend: B batch, H query heads, H_kv key/value heads, T_q / T_k query / key length,
D model width, d_head = D / H.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer_cli.model.cache import KVCache
from tformer_cli.model.positions import Rotary
from tformer_cli.model.scores import AttentionScore, scaled_dot_scores
from tformer_cli.model.spec import ScoreKind

_reference = False  # every MultiHeadAttention takes the written-out path: set only by `reference_attention`


@contextmanager
def reference_attention() -> Iterator[None]:
    """Inside the block, every `MultiHeadAttention` computes `attention_reference` (and passes its weights through
    `weights_tap`) instead of the fused kernels; the previous choice comes back on exit, exception or not."""
    global _reference
    before, _reference = _reference, True
    try:
        yield
    finally:
        _reference = before


def attention_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    score_bias: Tensor | None = None,
    dropout_p: float = 0.0,
    score: Callable[[Tensor, Tensor], Tensor] = scaled_dot_scores,
) -> tuple[Tensor, Tensor]:
    """softmax(Q K^T / sqrt(d_k) + score_bias, masked) V, written out as in the chapters.

    Another `score` replaces Q K^T / sqrt(d_k); score bias, masks and dropout stay as they are.

    Args:
        q: (B, H, T_q, d_head) queries.
        k: (B, H, T_k, d_head) keys.
        v: (B, H, T_k, d_head) values.
        mask: bool, True = may attend; broadcastable to (B, H, T_q, T_k).
        score_bias: float bias on the scores (ALiBi), broadcastable to (B, H, T_q, T_k).
        dropout_p: dropout on the attention weights (0 at evaluation).
        score: the (B, H, T_q, T_k) logits of q and k (model/scores.py); the scaled dot product.

    Returns:
        (output (B, H, T_q, d_head), weights (B, H, T_q, T_k)); masked weights are exactly 0.
    """
    scores = score(q, k)  # (B, H, T_q, T_k)
    if score_bias is not None:
        scores = scores + score_bias.to(scores.dtype)  # an fp32 bias must not promote bf16 scores (as attention_fast)
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
    score_bias: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
) -> Tensor:
    """The same computation through `F.scaled_dot_product_attention` (fused kernels).

    Args are those of `attention_reference`; `is_causal` may replace an explicit causal mask when
    T_q == T_k and there is no other mask (it selects the fastest kernels).
    """
    if score_bias is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal)
    if is_causal:
        causal = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool, device=q.device).tril()
        mask = causal if mask is None else mask & causal
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=score_bias.to(q.dtype), dropout_p=dropout_p)
    # A float mask cannot say "nothing": use the most negative finite value, then zero empty rows.
    floor = torch.finfo(q.dtype).min
    additive = score_bias.to(q.dtype).masked_fill(~mask, floor)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=additive, dropout_p=dropout_p)
    return out * mask.any(dim=-1, keepdim=True).to(out.dtype)


# CPU speed paths: taken by `MultiHeadAttention` where they pay, beside the reference and fused paths above.


def cpu_bf16_training(q: Tensor) -> bool:
    """Whether `attention_fp32_for_bf16` pays for these queries: bf16 on a CPU, gradients on (training)."""
    return q.dtype == torch.bfloat16 and q.device.type == "cpu" and torch.is_grad_enabled()


def attention_fp32_for_bf16(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    score_bias: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
) -> Tensor:
    """`attention_fast` of bf16 inputs computed in fp32, returned in bf16 (args as `attention_fast`'s).

    For training, PyTorch's bf16 CPU kernel is slower than its fp32 one (docs/benchmarks.md, "Measurements
    behind the code's comments"); attention is a small share of the FLOPs, so it runs in fp32 (autocast off,
    or it would cast back). Forward only (decoding) the bf16 kernel is the faster one: `cpu_bf16_training`.
    """
    with torch.autocast("cpu", enabled=False):
        out = attention_fast(q.float(), k.float(), v.float(), mask, score_bias, dropout_p, is_causal)
    return out.to(torch.bfloat16)


class MultiHeadAttention(nn.Module):
    """Multi-head attention with grouped-query heads, used for self- and cross-attention.

    Self-attention projects Q, K and V with one fused linear; cross-attention projects Q from the
    decoder and K, V (fused) from the encoder memory. `n_kv_heads < n_heads` shares each key/value
    head among n_heads / n_kv_heads query heads (GQA; 1 is multi-query attention).
    `score` is the score function (model/scores.py); any but the scaled dot product takes the
    reference path, with its parameters in `self.score`. `bias`: the projections have bias vectors.
    """

    def __init__(
        self,
        d_model: int,
        *,
        n_heads: int,
        n_kv_heads: int | None = None,
        cross: bool = False,
        bias: bool = True,
        dropout: float = 0.0,
        rotary: Rotary | None = None,
        score: ScoreKind = "scaled_dot",
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
        self.score = AttentionScore(score, n_heads, self.d_head)
        self.weights_tap = nn.Identity()  # the reference path's weights pass through here, for forward hooks

    def _split(self, x: Tensor, n: int) -> Tensor:
        return x.view(x.size(0), x.size(1), n, self.d_head).transpose(1, 2)  # (B, n, T, d_head)

    def _project(self, x: Tensor, memory: Tensor | None, cache: KVCache | None) -> tuple[Tensor, Tensor, Tensor]:
        kv_width = self.n_kv_heads * self.d_head
        if not self.cross:
            q, k, v = self.qkv_proj(x).split([self.n_heads * self.d_head, kv_width, kv_width], dim=-1)
            return self._split(q, self.n_heads), self._split(k, self.n_kv_heads), self._split(v, self.n_kv_heads)
        q = self._split(self.q_proj(x), self.n_heads)
        if cache is not None and cache.memory is not None:
            return q, *cache.memory
        if memory is None:
            raise ValueError("cross-attention needs the encoder memory")
        k, v = self.kv_proj(memory).split([kv_width, kv_width], dim=-1)
        k, v = self._split(k, self.n_kv_heads), self._split(v, self.n_kv_heads)
        if cache is not None:
            cache.keep_memory(k, v)
        return q, k, v

    def forward(
        self,
        x: Tensor,
        *,
        memory: Tensor | None = None,
        mask: Tensor | None = None,
        score_bias: Tensor | None = None,
        is_causal: bool = False,
        cache: KVCache | None = None,
        positions: Tensor | None = None,
    ) -> Tensor:
        """Attend from `x` (B, T_q, D) to itself or to `memory` (B, T_k, D).

        Args:
            x: queries' input (B, T_q, D).
            memory: encoder output for cross-attention (ignored once the cache holds it).
            mask: bool mask (True = attend), see the module docstring.
            score_bias: additive score bias (ALiBi), broadcastable to (B, H, T_q, T_k).
            is_causal: causal self-attention without an explicit mask (fast kernels).
            cache: per-layer KV cache for incremental decoding.
            positions: (T_q,) x's positions, for the rotary embedding (model/positions.py); None: 0 .. T_q - 1.

        Returns:
            (B, T_q, D).
        """
        q, k, v = self._project(x, memory, cache)
        if self.rotary is not None and not self.cross:
            q, k = self.rotary(q, positions), self.rotary(k, positions)
        if cache is not None:
            if not self.cross:
                k, v = cache.update(k, v)
            q = cache.relayout_queries(q)  # laid out as the cache holds its keys (model/cache.py)
        if self.n_kv_heads != self.n_heads:  # GQA: each K/V head serves a group of query heads
            k = k.repeat_interleave(self.n_heads // self.n_kv_heads, dim=1)
            v = v.repeat_interleave(self.n_heads // self.n_kv_heads, dim=1)
        p = self.dropout if self.training else 0.0
        if _reference or self.score.kind != "scaled_dot":
            if is_causal:
                causal = torch.ones(q.size(2), k.size(2), dtype=torch.bool, device=q.device).tril(k.size(2) - q.size(2))
                mask = causal if mask is None else mask & causal
            out, weights = attention_reference(q, k, v, mask, score_bias, p, self.score)
            self.weights_tap(weights)
        elif cpu_bf16_training(q):
            out = attention_fp32_for_bf16(q, k, v, mask, score_bias, p, is_causal)
        else:
            out = attention_fast(q, k, v, mask, score_bias, p, is_causal)
        if cache is not None:
            out = cache.relayout_outputs(out)
        out = out.transpose(1, 2).reshape(x.size(0), x.size(1), -1)  # (B, T_q, D)
        return self.out_proj(out)
