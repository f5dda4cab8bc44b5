"""Building blocks: normalisation, feed-forward, scaled token embedding, and one Transformer block.

A block is self-attention (optionally causal), optional cross-attention, and a feed-forward
network, each wrapped in a residual connection with a norm placed `post` (the paper:
x = Norm(x + Sublayer(x))) or `pre` (x = x + Sublayer(Norm(x))).

Shape legend: B batch, T length, D d_model, F d_ff, V vocabulary.
"""

from __future__ import annotations

import math

import torch.nn.functional as F
from torch import Tensor, nn

from tformer_cli.model.attention import MultiHeadAttention
from tformer_cli.model.cache import LayerCache
from tformer_cli.model.positions import Rotary
from tformer_cli.model.spec import FFNKind, ModelConfig, NormKind


def make_norm(kind: NormKind, d_model: int, eps: float = 1e-5) -> nn.LayerNorm | nn.RMSNorm:
    """LayerNorm (the paper's) or RMSNorm (no centring, no bias)."""
    match kind:
        case "layernorm":
            return nn.LayerNorm(d_model, eps=eps)
        case "rmsnorm":
            return nn.RMSNorm(d_model, eps=eps)
    raise ValueError(f"unknown norm {kind!r}")


class FeedForward(nn.Module):
    """Position-wise FFN: W2 act(W1 x) for relu/gelu; W2 (SiLU(W1 x) * W3 x) for SwiGLU.

    `dropout` here is on the hidden activation (fairseq's activation_dropout; tensor2tensor's
    relu_dropout). The paper has none: its dropout is on each sub-layer's output (see Block).
    """

    def __init__(self, d_model: int, d_ff: int, kind: FFNKind, dropout: float, bias: bool = True) -> None:
        super().__init__()
        self.kind = kind
        width = 2 * d_ff if kind == "swiglu" else d_ff  # SwiGLU: gate and value in one matmul
        self.w1 = nn.Linear(d_model, width, bias=bias)
        self.w2 = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        h = self.w1(x)  # (B, T, F) or (B, T, 2F)
        match self.kind:
            case "relu":
                h = F.relu(h, inplace=True)  # h is w1's fresh output, used nowhere else
            case "gelu":
                h = F.gelu(h)
            case "swiglu":
                gate, value = h.chunk(2, dim=-1)
                h = F.silu(gate) * value
        return self.w2(self.dropout(h))


class TokenEmbedding(nn.Module):
    """Token embedding multiplied by sqrt(d_model) (the paper, section 3.4)."""

    def __init__(self, vocab_size: int, d_model: int, pad_id: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, d_model, padding_idx=pad_id)
        self.scale = math.sqrt(d_model)

    @property
    def weight(self) -> Tensor:
        return self.embedding.weight

    def forward(self, tokens: Tensor) -> Tensor:
        return self.embedding(tokens) * self.scale  # (B, T) -> (B, T, D)


def _attention(config: ModelConfig, *, cross: bool, rotary: Rotary | None) -> MultiHeadAttention:
    """A block's self- or cross-attention: the same heads, dropout and score function for both."""
    return MultiHeadAttention(
        config.d_model,
        n_heads=config.n_heads,
        n_kv_heads=config.n_kv_heads,
        cross=cross,
        bias=config.bias,
        dropout=config.attn_dropout,
        rotary=rotary,
        score=config.attention_score,
    )


class Block(nn.Module):
    """One encoder layer (cross=False) or decoder layer (cross=True); causality comes from the mask.

    Args:
        config: the architecture (d_model, heads, d_ff, dropouts, norm and its placement, ffn, bias, score).
        cross: a decoder layer of seq2seq: cross-attention to the encoder's memory after self-attention.
        rotary: RoPE's rotation, shared by a stack's blocks (None unless config.pos is rope).
    """

    def __init__(self, config: ModelConfig, *, cross: bool = False, rotary: Rotary | None = None) -> None:
        super().__init__()
        d = config.d_model
        self.norm_first = config.norm_first
        self.self_attn = _attention(config, cross=False, rotary=rotary)
        self.self_attn_norm = make_norm(config.norm, d)
        self.cross_attn = _attention(config, cross=True, rotary=None) if cross else None
        self.cross_attn_norm = make_norm(config.norm, d) if cross else None
        self.ffn = FeedForward(d, config.d_ff, config.ffn, config.activation_dropout, config.bias)
        self.ffn_norm = make_norm(config.norm, d)
        self.dropout = nn.Dropout(config.dropout)

    def _residual(self, x: Tensor, norm: nn.Module, sublayer) -> Tensor:
        if self.norm_first:
            return x + self.dropout(sublayer(norm(x)))
        return norm(x + self.dropout(sublayer(x)))

    def forward(
        self,
        x: Tensor,
        *,
        mask: Tensor | None = None,
        score_bias: Tensor | None = None,
        is_causal: bool = False,
        memory: Tensor | None = None,
        memory_mask: Tensor | None = None,
        cache: LayerCache | None = None,
        positions: Tensor | None = None,
    ) -> Tensor:
        """x: (B, T, D) at `positions` (T,) (None: 0 .. T - 1); memory: (B, S, D) encoder output; returns (B, T, D).

        mask, score_bias and is_causal are self-attention's (model/attention.py), memory_mask cross-attention's.
        """
        self_kv = cache.self_kv if cache is not None else None
        x = self._residual(
            x,
            self.self_attn_norm,
            lambda h: self.self_attn(
                h, mask=mask, score_bias=score_bias, is_causal=is_causal, cache=self_kv, positions=positions
            ),
        )
        if self.cross_attn is not None:
            assert self.cross_attn_norm is not None  # made with cross_attn
            cross_kv = cache.cross_kv if cache is not None else None
            x = self._residual(
                x,
                self.cross_attn_norm,
                lambda h: self.cross_attn(h, memory=memory, mask=memory_mask, cache=cross_kv),
            )
        return self._residual(x, self.ffn_norm, self.ffn)
