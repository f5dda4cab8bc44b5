"""Attention score functions: how well each query matches each key, per head.

`model.attention_score` picks one (the chapters' bake-off of score functions):

    scaled_dot   q . k / sqrt(d_k)          the paper's; the only one the fused kernels compute
    dot          q . k                      Luong's "dot": its logits grow like sqrt(d_k), so at
                                            large d_k the softmax saturates (the paper, section 3.2.1)
    general      q W k^T                    Luong's multiplicative score: a learned W per head
    additive     v . tanh(q W_q + k W_k)    Bahdanau's: a one-hidden-layer network per (query, key)

In a Transformer q = x W^Q is itself learned, so general's W folds into the query projection
(q W = x (W^Q W)): it adds parameters but no expressiveness, unlike in Luong's recurrent models,
which had no query projection to fold it into. (The tests use this folding to check it.)

Vectors are rows, as in the code (the papers write W q with column vectors: the same maps,
transposed). Each score depends on one query and one key only, so the caches that lay keys out
differently (model/cache.py, decoding/cache.py) give the same scores as the full recompute.

Shape legend: B batch, H heads, T_q / T_k query / key length, d_k = d_head, the head width.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from tformer_cli.model.spec import ScoreKind


def scaled_dot_scores(q: Tensor, k: Tensor) -> Tensor:
    """q . k / sqrt(d_k): q (B, H, T_q, d_k), k (B, H, T_k, d_k) -> (B, H, T_q, T_k)."""
    return q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))


def dot_scores(q: Tensor, k: Tensor) -> Tensor:
    """q . k, unscaled: shapes as `scaled_dot_scores`."""
    return q @ k.transpose(-2, -1)


def general_scores(q: Tensor, k: Tensor, w: Tensor) -> Tensor:
    """q W k^T with one (d_k, d_k) matrix per head: w (H, d_k, d_k); shapes as `scaled_dot_scores`."""
    return (q @ w) @ k.transpose(-2, -1)  # q W once per query: (B, H, T_q, d_k)


def additive_scores(q: Tensor, k: Tensor, w_q: Tensor, w_k: Tensor, v: Tensor) -> Tensor:
    """v . tanh(q W_q + k W_k) for every (query, key) pair; shapes as `scaled_dot_scores`.

    Args:
        q, k: (B, H, T_q, d_k) queries and (B, H, T_k, d_k) keys.
        w_q, w_k: (H, d_k, d_k), one per head.
        v: (H, d_k), one per head.

    Memory: the hidden layer (B, H, T_q, T_k, d_k) is d_k times the size of the scores, and the
    backward pass keeps it: at batch 32, 4 heads of width 64 and T = 64 it is 128 MiB per attention
    layer in fp32 (docs/benchmarks.md, "Attention score functions", has the measured peak). Fine
    for CPU-sized experiments; at the paper's sizes this is what "much faster and more
    space-efficient in practice" (section 3.2.1) chose the dot product against.
    """
    q_part = (q @ w_q).unsqueeze(-2)  # (B, H, T_q, 1, d_k): once per query
    k_part = (k @ w_k).unsqueeze(-3)  # (B, H, 1, T_k, d_k): once per key
    hidden = torch.tanh(q_part + k_part)  # (B, H, T_q, T_k, d_k)
    return torch.einsum("bhqkd,hd->bhqk", hidden, v)  # (B, H, T_q, T_k)


class AttentionScore(nn.Module):
    """One of the four score functions with its parameters (scaled_dot and dot have none).

    Called as `score(q, k)` on (B, H, T_q, d_k) queries and (B, H, T_k, d_k) keys, it returns the
    (B, H, T_q, T_k) logits that the softmax turns into attention weights.
    """

    def __init__(self, kind: ScoreKind, n_heads: int, d_head: int) -> None:
        super().__init__()
        self.kind = kind
        match kind:
            case "scaled_dot" | "dot":
                pass
            case "general":
                self.w = nn.Parameter(torch.empty(n_heads, d_head, d_head))
            case "additive":
                self.w_q = nn.Parameter(torch.empty(n_heads, d_head, d_head))
                self.w_k = nn.Parameter(torch.empty(n_heads, d_head, d_head))
                self.v = nn.Parameter(torch.empty(n_heads, d_head))
            case _:
                raise ValueError(f"unknown attention score {kind!r}")
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """general: W = I / sqrt(d_k) in every head, so the model starts as the scaled dot product.
        (Xavier's W would give q W k^T a standard deviation of about sqrt(d_k), the unscaled dot
        product's: the saturated softmax this score is compared against.)
        additive: W_q, W_k Xavier-uniform per head, v Xavier-uniform as a (1 x d_k) map. With unit
        variance q and k the tanh's input then has variance about 2 and the logits a standard
        deviation near 1, the scale of the scaled dot product at initialisation.
        """
        with torch.no_grad():
            match self.kind:
                case "general":
                    d_head = self.w.size(-1)
                    self.w.copy_(torch.eye(d_head).expand_as(self.w) / math.sqrt(d_head))
                case "additive":
                    d_head = self.v.size(-1)
                    for w in (self.w_q, self.w_k):
                        bound = math.sqrt(6.0 / (d_head + d_head))
                        w.uniform_(-bound, bound)
                    bound = math.sqrt(6.0 / (d_head + 1))
                    self.v.uniform_(-bound, bound)

    def forward(self, q: Tensor, k: Tensor) -> Tensor:
        match self.kind:
            case "scaled_dot":
                return scaled_dot_scores(q, k)
            case "dot":
                return dot_scores(q, k)
            case "general":
                return general_scores(q, k, self.w)
            case "additive":
                return additive_scores(q, k, self.w_q, self.w_k, self.v)
        raise ValueError(f"unknown attention score {self.kind!r}")

    def extra_repr(self) -> str:
        return self.kind
