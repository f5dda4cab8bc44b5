"""An LSTM language model: the recurrent baseline the seed chapters compare the Transformer with.

Same interface as `LanguageModel` (tokens -> next-token logits), so the same task, loop and
evaluation train and score it. The recurrent state plays the KV cache's part while generating.
"""

from __future__ import annotations

import math

from torch import Tensor, nn


class LSTMState:
    """The (h, c) state carried between generation steps (the LSTM's "cache")."""

    def __init__(self) -> None:
        self.hc: tuple[Tensor, Tensor] | None = None


class LSTMLanguageModel(nn.Module):
    """Embedding -> dropout -> n-layer LSTM -> dropout -> output projection (tied to the embedding)."""

    def __init__(
        self, vocab_size: int, d_model: int, n_layers: int, dropout: float, tie_embeddings: bool, pad_id: int
    ) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, d_model, padding_idx=pad_id)
        self.dropout = nn.Dropout(dropout)
        self.lstm = nn.LSTM(d_model, d_model, n_layers, batch_first=True, dropout=dropout if n_layers > 1 else 0.0)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        if tie_embeddings:
            self.lm_head.weight = self.embedding.weight
        bound = 1.0 / math.sqrt(d_model)
        for name, param in self.lstm.named_parameters():
            nn.init.uniform_(param, -bound, bound) if "weight" in name else nn.init.zeros_(param)

    def new_cache(self) -> LSTMState:
        """A fresh recurrent state for generation."""
        return LSTMState()

    def forward(self, tokens: Tensor, cache: LSTMState | None = None, head: bool = True) -> Tensor:
        """(B, T) -> logits (B, T, V); with a state, `tokens` continue the previous call. head=False: the
        last hidden states (B, T, D), for a loss that applies `lm_head` itself (train/loss.py)."""
        x = self.dropout(self.embedding(tokens))  # (B, T, D)
        out, hc = self.lstm(x, cache.hc if cache is not None else None)
        if cache is not None:
            cache.hc = hc
        hidden = self.dropout(out)
        return self.lm_head(hidden) if head else hidden

    @property
    def output(self) -> nn.Linear:
        """The output projection (hidden states -> logits)."""
        return self.lm_head
