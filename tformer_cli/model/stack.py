"""A stack of blocks: embedding -> positions -> N blocks -> final norm (pre-LN only).

The encoder, the decoder-only LM and the encoder-decoder's decoder are all a `Stack`; they differ in
`causal` (mask future keys) and `cross` (attend to an encoder memory).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from tformer_cli.model.cache import DecodeCache, self_attention_mask
from tformer_cli.model.layers import Block, TokenEmbedding, make_norm
from tformer_cli.model.positions import ALiBi, LearnedPositions, Rotary, SinusoidalPositions
from tformer_cli.model.spec import ModelConfig, PosKind


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
    """Embedding, positions, `n_layers` blocks and (for pre-LN) a final norm.

    Args:
        config: the architecture; each block is built from it (`Block`).
        embedding: the token embedding (a seq2seq model's sides may share one).
        n_layers: blocks in this stack (config.n_layers, or config.decoder_layers for a seq2seq decoder).
        causal: mask future keys (a decoder).
        cross: attend to an encoder memory (a seq2seq decoder).
        pad_id: the padding token, masked as a key.
    """

    def __init__(
        self, config: ModelConfig, *, embedding: TokenEmbedding, n_layers: int, causal: bool, cross: bool, pad_id: int
    ) -> None:
        super().__init__()
        self.embedding, self.causal, self.pad_id = embedding, causal, pad_id
        self.max_len = config.max_len  # the positions the model is built for (more extrapolate, where pos allows)
        self.positions = make_positions(config.pos, config.d_model, config.max_len)
        self.rotary = Rotary(config.d_model // config.n_heads) if config.pos == "rope" else None  # shared by the blocks
        self.alibi = ALiBi(config.n_heads) if config.pos == "alibi" else None
        self.dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config, cross=cross, rotary=self.rotary) for _ in range(n_layers))
        self.final_norm = make_norm(config.norm, config.d_model) if config.norm_first else nn.Identity()

    def new_cache(self) -> DecodeCache:
        """The reference cache for incremental decoding (tformer_cli/decoding/cache.py has the fast ones)."""
        return DecodeCache.plain(len(self.blocks))

    def forward(
        self,
        tokens: Tensor,
        *,
        memory: Tensor | None = None,
        memory_mask: Tensor | None = None,
        cache: DecodeCache | None = None,
    ) -> Tensor:
        """tokens: (B, T) ids; memory: (B, S, D); memory_mask: (B, 1, 1, S) bool. Returns (B, T, D).

        With a cache, `tokens` are the next steps: the cache gives their positions and records them.
        """
        key_mask = tokens != self.pad_id  # (B, T)
        if cache is None:
            positions = torch.arange(tokens.size(1), device=tokens.device)  # (T,)
            mask, is_causal = self_attention_mask(key_mask, tokens.size(1), 0, self.causal)
            n_keys = tokens.size(1)
        else:  # the cache knows the earlier steps, and how it lays out their keys
            positions, mask, is_causal = cache.record(key_mask, self.causal)
            n_keys = cache.n_keys  # the key steps attention spans; every position is below it
        self.prepare_positions(n_keys, tokens.device)
        x = self.embedding(tokens)  # (B, T, D), already scaled by sqrt(D)
        if self.positions is not None:
            x = self.positions(x, positions)
        x = self.dropout(x)
        score_bias = None
        if self.alibi is not None:
            score_bias = self.alibi(positions, n_keys)  # (1, H, T, n_keys)
            score_bias = cache.relayout_score_bias(score_bias) if cache is not None else score_bias
        for i, block in enumerate(self.blocks):
            x = block(
                x,
                mask=mask,
                score_bias=score_bias,
                is_causal=is_causal,
                memory=memory,
                memory_mask=memory_mask,
                cache=cache.layers[i] if cache is not None else None,
                positions=positions,
            )
        return self.final_norm(x)

    def prepare_positions(self, n: int, device: torch.device) -> None:
        """The position tables cover 0 .. n - 1 (host ints only: nothing here reads a tensor's value).

        `forward` calls it for its own length; training's compile check calls it for `max_len` first, so that no
        table is built inside the compiled graph (a table built there changes the graph's guards, and the first
        update would compile everything again)."""
        if isinstance(self.positions, (SinusoidalPositions, LearnedPositions)):
            self.positions.prepare(n)
        if self.rotary is not None:
            self.rotary.prepare(n, device)
