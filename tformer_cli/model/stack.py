"""A stack of blocks: embedding -> positions -> N blocks -> final norm (pre-LN only).

The encoder, the decoder-only LM and the encoder-decoder's decoder are all a `Stack`; they differ in
`causal` (mask future keys) and `cross` (attend to an encoder memory).
"""

from __future__ import annotations

from typing import Literal

from torch import Tensor, nn

from tformer_cli.model.cache import DecodeCache, self_attention_mask
from tformer_cli.model.layers import Block, FFNKind, NormKind, TokenEmbedding, make_norm
from tformer_cli.model.positions import ALiBi, LearnedPositions, Rotary, SinusoidalPositions
from tformer_cli.model.scores import ScoreKind

PosKind = Literal["sinusoidal", "learned", "rope", "alibi", "none"]


def make_positions(pos: PosKind, d_model: int, max_len: int) -> nn.Module | None:
    """The module that adds positions to embeddings (sinusoidal, learned), or None."""
    match pos:
        case "sinusoidal":
            return SinusoidalPositions(d_model, max_len)
        case "learned":
            return LearnedPositions(d_model, max_len)
        case "rope" | "alibi" | "none":
            return None
    raise ValueError(f"unknown position scheme {pos!r}")


class Stack(nn.Module):
    """Embedding, positions, `n_layers` blocks and (for pre-LN) a final norm."""

    def __init__(
        self,
        embedding: TokenEmbedding,
        *,
        n_layers: int,
        d_model: int,
        n_heads: int,
        d_ff: int,
        dropout: float,
        attn_dropout: float,
        activation_dropout: float,
        norm: NormKind,
        norm_first: bool,
        ffn: FFNKind,
        n_kv_heads: int | None,
        bias: bool,
        pos: PosKind,
        attention_score: ScoreKind,
        max_len: int,
        causal: bool,
        cross: bool,
        pad_id: int,
    ) -> None:
        super().__init__()
        self.embedding, self.causal, self.pad_id = embedding, causal, pad_id
        self.positions = make_positions(pos, d_model, max_len)
        rotary = Rotary(d_model // n_heads) if pos == "rope" else None
        self.alibi = ALiBi(n_heads) if pos == "alibi" else None
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            Block(
                d_model,
                n_heads,
                d_ff,
                dropout=dropout,
                attn_dropout=attn_dropout,
                activation_dropout=activation_dropout,
                norm=norm,
                norm_first=norm_first,
                ffn=ffn,
                n_kv_heads=n_kv_heads,
                bias=bias,
                cross=cross,
                rotary=rotary,
                attention_score=attention_score,
            )
            for _ in range(n_layers)
        )
        self.final_norm = make_norm(norm, d_model) if norm_first else nn.Identity()

    def new_cache(self) -> DecodeCache:
        """The reference cache for incremental decoding (tformer_cli/decoding/cache.py has the fast ones)."""
        return DecodeCache.plain(len(self.blocks))

    def forward(
        self,
        tokens: Tensor,
        memory: Tensor | None = None,
        memory_mask: Tensor | None = None,
        cache: DecodeCache | None = None,
    ) -> Tensor:
        """tokens: (B, T) ids; memory: (B, S, D); memory_mask: (B, 1, 1, S) bool. Returns (B, T, D)."""
        offset = cache.length if cache is not None else 0
        x = self.embedding(tokens)  # (B, T, D), already scaled by sqrt(D)
        if self.positions is not None:
            x = self.positions(x, offset)
        x = self.dropout(x)
        key_mask = tokens != self.pad_id  # (B, T)
        if cache is None:
            mask, is_causal = self_attention_mask(key_mask, tokens.size(1), 0, self.causal)
        else:  # the cache knows the earlier steps, and how it lays out their keys
            mask, is_causal = cache.self_attention_mask(key_mask, self.causal)
        bias = None
        if self.alibi is not None:
            n_keys = offset + tokens.size(1) if cache is None else cache.n_keys  # the keys attention spans
            bias = self.alibi(tokens.size(1), n_keys, offset)
            bias = cache.score_bias(bias) if cache is not None else bias
        for i, block in enumerate(self.blocks):
            layer_cache = cache.layers[i] if cache is not None else None
            x = block(x, mask, bias, is_causal, memory, memory_mask, layer_cache, offset)
        return self.final_norm(x)
