"""A stack of blocks: embedding -> positions -> N blocks -> final norm (pre-LN only).

The encoder, the decoder-only LM and the encoder-decoder's decoder are all a `Stack`; they differ in
`causal` (mask future keys) and `cross` (attend to an encoder memory).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

from tformer_cli.model.attention import BufferPool
from tformer_cli.model.layers import Block, FFNKind, LayerCache, NormKind, TokenEmbedding, make_norm
from tformer_cli.model.positions import ALiBi, LearnedPositions, Rotary, SinusoidalPositions

PosKind = Literal["sinusoidal", "learned", "rope", "alibi", "none"]


class DecodeCache:
    """Everything a stack keeps between incremental decoding steps.

    `key_mask` (B, T_so_far) records which cached steps are real tokens (False for padding, e.g.
    left-padded prompts), so later steps never attend to them.
    """

    def __init__(self, n_layers: int, max_len: int, pool: BufferPool | None = None) -> None:
        self.layers = [LayerCache(max_len, pool=pool) for _ in range(n_layers)]
        self.key_mask: Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.key_mask is None else self.key_mask.size(1)

    def extend(self, key_mask: Tensor) -> Tensor:
        """Append the new steps' key mask (B, T_new); return the whole mask (B, T_so_far)."""
        self.key_mask = key_mask if self.key_mask is None else torch.cat([self.key_mask, key_mask], dim=1)
        return self.key_mask

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows `index` in every layer (e.g. greedy search dropping finished sentences)."""
        for layer in self.layers:
            layer.self_kv.reorder(index)
            layer.cross_kv.reorder(index)
        if self.key_mask is not None:
            self.key_mask = self.key_mask.index_select(0, index)

    def release(self) -> None:
        """Decoding is over: the key/value buffers go back to the model's pool for the next batch.

        The cache must not be used afterwards (its buffers may already hold another batch's keys).
        """
        for layer in self.layers:
            layer.self_kv.release()
            layer.cross_kv.release()


class BeamDecodeCache(DecodeCache):
    """Beam search's cache: K hypotheses per sentence, keys and values never moved (`BeamKVCache`).

    `ancestry` (B*K, t) holds, for each live hypothesis, the beam slot its ancestor occupied at each
    step, i.e. where that step's keys were written. `reorder` then only reorders this small table;
    the keys stay put (and move only when finished sentences leave the batch).
    """

    def __init__(self, n_layers: int, max_len: int, beam: int, pool: BufferPool | None = None) -> None:
        super().__init__(0, max_len)
        self.layers = [LayerCache(max_len, beam, pool) for _ in range(n_layers)]
        self.beam = beam
        self.ancestry: Tensor | None = None  # (B*K, t) long

    @property
    def length(self) -> int:
        return 0 if self.ancestry is None else self.ancestry.size(1)

    def step_mask(self, key_mask: Tensor) -> Tensor:
        """Record one new step (each hypothesis writes into its own slot); return the self-attention mask.

        key_mask: (B*K, 1), the new step's tokens (beam search never feeds padding).
        Returns (B, 1, K, t*K) bool: hypothesis k of sentence b may attend to flattened key s*K + j iff
        its ancestor at step s sat in slot j.
        """
        if key_mask.size(1) != 1 or not bool(key_mask.all()):
            raise ValueError("beam search feeds one real token per hypothesis and step")
        slots = torch.arange(key_mask.size(0), device=key_mask.device) % self.beam
        column = slots[:, None]
        self.ancestry = column if self.ancestry is None else torch.cat([self.ancestry, column], dim=1)
        allowed = torch.nn.functional.one_hot(self.ancestry, self.beam).bool()  # (B*K, t, K)
        return allowed.view(-1, self.beam, self.length * self.beam).unsqueeze(1)

    def expand_bias(self, bias: Tensor) -> Tensor:
        """A (., H, T_q, t) score bias over steps -> over the flattened (t*K) keys."""
        return bias.repeat_interleave(self.beam, dim=-1)

    def reorder(self, index: Tensor) -> None:
        """Hypotheses `index` (rows of the previous step, grouped by sentence) continue.

        Only the ancestry table moves; when the batch shrinks (sentences finished), every layer keeps
        the remaining sentences' keys and values (cross-attention's included: one copy per sentence).
        """
        assert self.ancestry is not None
        if index.numel() < self.ancestry.size(0):
            sentences = index.view(-1, self.beam)[:, 0] // self.beam
            for layer in self.layers:
                layer.self_kv.reorder(sentences)
                layer.cross_kv.reorder(sentences)
        self.ancestry = self.ancestry.index_select(0, index)


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
            )
            for _ in range(n_layers)
        )
        self.final_norm = make_norm(norm, d_model) if norm_first else nn.Identity()
        self.kv_pool = BufferPool(capacity=2 * n_layers)  # one released cache's keys and values

    def new_cache(self, max_len: int, beam: int | None = None) -> DecodeCache:
        """A cache for incremental decoding; `beam=K` for beam search's (rows = B sentences x K).

        Its self-attention buffers come from `kv_pool`; call `release()` on it when decoding is done.
        """
        if beam is not None:
            return BeamDecodeCache(len(self.blocks), max_len, beam, self.kv_pool)
        return DecodeCache(len(self.blocks), max_len, self.kv_pool)

    def _self_mask(self, key_mask: Tensor, t_q: int, offset: int) -> tuple[Tensor | None, bool]:
        """Self-attention mask (B, 1, T_q, T_k) from padding and causality; or (None, is_causal)."""
        has_pad = not bool(key_mask.all())
        mask = key_mask[:, None, None, :] if has_pad else None  # (B, 1, 1, T_k)
        if not self.causal:
            return mask, False
        if mask is None and offset == 0:
            return None, True  # plain causal: let the fused kernel build it
        if mask is None and t_q == 1:
            return None, False  # one new step sees every cached key: nothing to mask
        t_k = key_mask.size(1)
        q_pos = torch.arange(offset, offset + t_q, device=key_mask.device)[:, None]
        causal = torch.arange(t_k, device=key_mask.device)[None, :] <= q_pos  # (T_q, T_k)
        return (causal if mask is None else mask & causal), False

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
        if isinstance(cache, BeamDecodeCache):
            mask, is_causal = cache.step_mask(key_mask), False  # each hypothesis sees its own history
        else:
            if cache is not None:
                key_mask = cache.extend(key_mask)  # (B, T_k) with the cached steps
            mask, is_causal = self._self_mask(key_mask, tokens.size(1), offset)
        t_k = offset + tokens.size(1)
        bias = self.alibi(tokens.size(1), t_k, offset) if self.alibi is not None else None
        if bias is not None and isinstance(cache, BeamDecodeCache):
            bias = cache.expand_bias(bias)
        for i, block in enumerate(self.blocks):
            layer_cache = cache.layers[i] if cache is not None else None
            x = block(x, mask, bias, is_causal, memory, memory_mask, layer_cache, offset)
        return self.final_norm(x)
