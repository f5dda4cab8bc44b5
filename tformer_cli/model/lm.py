"""Decoder-only language model: causal stack and an output projection (tied to the embedding)."""

from __future__ import annotations

from torch import Tensor, nn

from tformer_cli.model.stack import DecodeCache, Stack


class LanguageModel(nn.Module):
    """logits(t) = W h_t, with h_t depending on tokens <= t only."""

    def __init__(self, decoder: Stack, d_model: int, vocab_size: int, tie_embeddings: bool) -> None:
        super().__init__()
        self.decoder = decoder
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        if tie_embeddings:
            self.lm_head.weight = decoder.embedding.weight

    def new_cache(self) -> DecodeCache:
        """The decoder's reference cache for incremental decoding."""
        return self.decoder.new_cache()

    def forward(self, tokens: Tensor, cache: DecodeCache | None = None, head: bool = True) -> Tensor:
        """(B, T) -> logits (B, T, V); with a cache, `tokens` are the next steps only. head=False: the last
        hidden states (B, T, D), for a loss that applies `lm_head` itself (train/loss.py)."""
        hidden = self.decoder(tokens, cache=cache)
        return self.lm_head(hidden) if head else hidden

    @property
    def output(self) -> nn.Linear:
        """The output projection (hidden states -> logits)."""
        return self.lm_head
