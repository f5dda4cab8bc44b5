"""The encoder-decoders the training benchmarks compare, at one shape: tformer, torch.nn.Transformer, Hugging Face
Marian; their random batches and the training FLOPs of an update (bench/train_throughput.py, bench/gpu_train.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from tformer_cli.model import build_model


@dataclass(frozen=True)
class Shape:
    """An encoder-decoder of the paper's layout (post-LN, ReLU FFN, tied shared vocabulary) and its batch."""

    d_model: int
    layers: int  # encoder layers
    heads: int
    d_ff: int
    vocab: int
    batch: int  # sentences per batch
    src: int  # source tokens per sentence
    tgt: int  # target tokens per sentence (decoder input and prediction)
    dec_layers: int | None = None  # None: as many as the encoder's
    dropout: float = 0.1

    @property
    def n_dec(self) -> int:
        return self.layers if self.dec_layers is None else self.dec_layers

    @property
    def tgt_tokens(self) -> int:
        """Target tokens per batch (all real: random batches have no padding)."""
        return self.batch * self.tgt


def random_batch(shape: Shape, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(source (B, S), decoder input (B, T), target (B, T)) of ids >= 4 (no padding, no special tokens), seeded."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, shape.vocab, (shape.batch, shape.src), generator=g)
    tgt = torch.randint(4, shape.vocab, (shape.batch, shape.tgt + 1), generator=g)
    return src, tgt[:, :-1], tgt[:, 1:]


def train_flops(shape: Shape) -> float:
    """Training FLOPs per update: 2 FLOPs per multiply-add, forward + backward = 3 x forward, so 6 x MACs.

    The count of tformer_cli/flops.py (weight matrices and the output projection; norms, biases and embeddings
    left out) plus attention's two products over the exact source and target lengths.
    """
    d, ff = shape.d_model, shape.d_ff
    enc_layer = 4 * d * d + 2 * d * ff
    dec_layer = 8 * d * d + 2 * d * ff
    linear = shape.batch * (
        shape.src * shape.layers * enc_layer + shape.tgt * shape.n_dec * dec_layer + shape.tgt * d * shape.vocab
    )
    attention = (
        shape.batch * 2 * d * (shape.layers * shape.src**2 + shape.n_dec * (shape.tgt**2 + shape.tgt * shape.src))
    )
    return 6.0 * (linear + attention)


def tformer(shape: Shape) -> nn.Module:
    """tformer's seq2seq model at `shape` (the wmt14_base recipe's layout), initialised from the global RNG."""
    return build_model(
        "seq2seq",
        vocab_size=shape.vocab,
        d_model=shape.d_model,
        n_heads=shape.heads,
        n_layers=shape.layers,
        n_decoder_layers=shape.dec_layers,
        d_ff=shape.d_ff,
        dropout=shape.dropout,
        share_all_embeddings=True,
    )


class TorchNN(nn.Module):
    """torch.nn.Transformer with a shared tied embedding and sinusoidal positions, batch_first."""

    def __init__(self, shape: Shape) -> None:
        super().__init__()
        d = shape.d_model
        self.d_model = d
        self.embed = nn.Embedding(shape.vocab, d, padding_idx=0)
        self.core = nn.Transformer(
            d, shape.heads, shape.layers, shape.n_dec, shape.d_ff, dropout=shape.dropout, batch_first=True
        )
        pe = torch.zeros(512, d)
        pos = torch.arange(512)[:, None]
        div = torch.exp(torch.arange(0, d, 2) * (-torch.log(torch.tensor(10000.0)) / d))
        pe[:, 0::2], pe[:, 1::2] = torch.sin(pos * div), torch.cos(pos * div)
        self.register_buffer("pe", pe)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        """(B, S), (B, T) -> logits (B, T, V)."""
        s = self.embed(src) * self.d_model**0.5 + self.pe[: src.size(1)]
        t = self.embed(tgt) * self.d_model**0.5 + self.pe[: tgt.size(1)]
        mask = nn.Transformer.generate_square_subsequent_mask(tgt.size(1), device=tgt.device)
        return self.core(s, t, tgt_mask=mask, tgt_is_causal=True) @ self.embed.weight.T


def marian(shape: Shape) -> nn.Module | None:
    """Hugging Face's MarianMTModel at `shape` (shared tied embeddings, ReLU); None without transformers."""
    try:
        from transformers import MarianConfig, MarianMTModel
    except ImportError:
        return None
    cfg = MarianConfig(
        vocab_size=shape.vocab,
        d_model=shape.d_model,
        encoder_layers=shape.layers,
        decoder_layers=shape.n_dec,
        encoder_attention_heads=shape.heads,
        decoder_attention_heads=shape.heads,
        encoder_ffn_dim=shape.d_ff,
        decoder_ffn_dim=shape.d_ff,
        max_position_embeddings=512,
        pad_token_id=0,
        eos_token_id=3,  # tformer's ids (tokenizer.py): `generate` (bench/gpu_decode.py) stops on it
        decoder_start_token_id=2,
        share_encoder_decoder_embeddings=True,
        activation_function="relu",
        dropout=shape.dropout,
    )
    return MarianMTModel(cfg)
