"""Encoder-only sequence classifier: encoder stack, pooling over real tokens, linear head."""

from __future__ import annotations

from torch import Tensor, nn

from tformer_cli.model.spec import Pooling
from tformer_cli.model.stack import Stack


class Classifier(nn.Module):
    """logits = W pool(Encoder(tokens)) + b."""

    def __init__(self, encoder: Stack, d_model: int, n_classes: int, pooling: Pooling) -> None:
        super().__init__()
        self.encoder, self.pooling = encoder, pooling
        self.head = nn.Linear(d_model, n_classes)

    def pool(self, tokens: Tensor) -> Tensor:
        """(B, T) token ids -> (B, D): mean over non-padding positions, or the first position."""
        h = self.encoder(tokens)  # (B, T, D)
        if self.pooling == "first":
            return h[:, 0]
        real = (tokens != self.encoder.pad_id).unsqueeze(-1).to(h.dtype)  # (B, T, 1)
        return (h * real).sum(dim=1) / real.sum(dim=1).clamp_min(1.0)

    def forward(self, tokens: Tensor) -> Tensor:
        return self.head(self.pool(tokens))  # (B, n_classes)
