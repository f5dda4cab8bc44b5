"""The paper's encoder-decoder: encode the source once, decode the target with cross-attention."""

from __future__ import annotations

from torch import Tensor, nn

from tformer_cli.model.cache import can_drop_mask
from tformer_cli.model.stack import DecodeCache, Stack


class Seq2Seq(nn.Module):
    """logits = W Decoder(target_in, Encoder(source))."""

    def __init__(self, encoder: Stack, decoder: Stack, d_model: int, vocab_size: int, tie_embeddings: bool) -> None:
        super().__init__()
        self.encoder, self.decoder = encoder, decoder
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        if tie_embeddings:
            self.lm_head.weight = decoder.embedding.weight

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor | None]:
        """(B, S) -> memory (B, S, D) and its key mask (B, 1, 1, S), None when there is no padding (eager)."""
        real = src != self.encoder.pad_id
        mask = None if can_drop_mask(real) else real[:, None, None, :]
        return self.encoder(src), mask

    def decode(
        self, tgt: Tensor, memory: Tensor | None, memory_mask: Tensor | None, cache: DecodeCache | None = None
    ) -> Tensor:
        """(B, T) target prefix -> logits (B, T, V); `memory` None: the cache holds its keys and values."""
        return self.lm_head(self.decoder(tgt, memory=memory, memory_mask=memory_mask, cache=cache))

    def new_cache(self) -> DecodeCache:
        """The decoder's reference cache for incremental decoding."""
        return self.decoder.new_cache()

    def forward(self, src: Tensor, tgt: Tensor, head: bool = True) -> Tensor:
        """(B, S), (B, T) -> logits (B, T, V); head=False: the decoder's last hidden states (B, T, D), for a
        loss that applies `lm_head` itself (train/loss.py)."""
        memory, memory_mask = self.encode(src)
        if not head:
            return self.decoder(tgt, memory=memory, memory_mask=memory_mask)
        return self.decode(tgt, memory, memory_mask)

    @property
    def output(self) -> nn.Linear:
        """The output projection (hidden states -> logits)."""
        return self.lm_head
