"""One builder for the three architectures, the initialisation, and parameter counts by component.

`build_model` takes plain typed arguments (the recipe's `model:` section, plus the vocabulary and
class counts that come from the data); it never reads a file.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Literal

import torch
from torch import Tensor, nn

from tformer_cli.model.attention import MultiHeadAttention
from tformer_cli.model.classifier import Classifier, Pooling
from tformer_cli.model.layers import FeedForward, FFNKind, NormKind, TokenEmbedding
from tformer_cli.model.lm import LanguageModel
from tformer_cli.model.lstm import LSTMLanguageModel
from tformer_cli.model.scores import AttentionScore, ScoreKind
from tformer_cli.model.seq2seq import Seq2Seq
from tformer_cli.model.stack import PosKind, Stack

ModelKind = Literal["classifier", "lm", "seq2seq", "lstm"]


def build_model(
    kind: ModelKind,
    *,
    vocab_size: int,
    n_classes: int = 0,
    d_model: int = 512,
    n_heads: int = 8,
    n_kv_heads: int | None = None,
    n_layers: int = 6,
    n_decoder_layers: int | None = None,
    d_ff: int = 2048,
    dropout: float = 0.1,
    attn_dropout: float = 0.0,
    activation_dropout: float = 0.0,
    norm: NormKind = "layernorm",
    norm_placement: Literal["pre", "post"] = "post",
    ffn: FFNKind = "relu",
    pos: PosKind = "sinusoidal",
    attention_score: ScoreKind = "scaled_dot",
    max_len: int = 1024,
    bias: bool = True,
    pooling: Pooling = "mean",
    tie_embeddings: bool = True,
    share_all_embeddings: bool = False,
    pad_id: int = 0,
) -> nn.Module:
    """Build and initialise a `classifier`, `lm`, `seq2seq` or `lstm` (recurrent LM baseline) model.

    Args:
        kind: the architecture (a closed set).
        vocab_size: token vocabulary (joint for source and target in seq2seq).
        n_classes: output classes (classifier only).
        n_layers: encoder layers (or decoder layers for `lm`); n_decoder_layers defaults to it.
        tie_embeddings: share the decoder's input embedding with its output projection.
        share_all_embeddings: seq2seq: one embedding for encoder, decoder and output (the paper).
        attention_score: every attention layer's score function (model/scores.py).
        Others: see the recipe reference in the README.

    Returns:
        The initialised module (see `init_weights`).
    """

    def stack(embedding: TokenEmbedding, n: int, causal: bool, cross: bool) -> Stack:
        return Stack(
            embedding,
            n_layers=n,
            d_model=d_model,
            n_heads=n_heads,
            d_ff=d_ff,
            dropout=dropout,
            attn_dropout=attn_dropout,
            activation_dropout=activation_dropout,
            norm=norm,
            norm_first=norm_placement == "pre",
            ffn=ffn,
            n_kv_heads=n_kv_heads,
            bias=bias,
            pos=pos,
            attention_score=attention_score,
            max_len=max_len,
            causal=causal,
            cross=cross,
            pad_id=pad_id,
        )

    match kind:
        case "classifier":
            model: nn.Module = Classifier(
                stack(TokenEmbedding(vocab_size, d_model, pad_id), n_layers, False, False), d_model, n_classes, pooling
            )
        case "lm":
            model = LanguageModel(
                stack(TokenEmbedding(vocab_size, d_model, pad_id), n_layers, True, False),
                d_model,
                vocab_size,
                tie_embeddings,
            )
        case "seq2seq":
            src_embedding = TokenEmbedding(vocab_size, d_model, pad_id)
            tgt_embedding = src_embedding if share_all_embeddings else TokenEmbedding(vocab_size, d_model, pad_id)
            model = Seq2Seq(
                stack(src_embedding, n_layers, False, False),
                stack(tgt_embedding, n_decoder_layers or n_layers, True, True),
                d_model,
                vocab_size,
                tie_embeddings or share_all_embeddings,
            )
        case "lstm":  # the recurrent baseline; embeddings keep PyTorch's LSTM-style init below
            model = LSTMLanguageModel(vocab_size, d_model, n_layers, dropout, tie_embeddings, pad_id)
        case _:
            raise ValueError(f"unknown model kind {kind!r}")
    init_weights(model, d_model)
    return model


def init_weights(model: nn.Module, d_model: int) -> None:
    """Initialise as the textbook does, which the PatternSequence runs showed matters.

    - Linear weights: Xavier-uniform (Glorot), computed per projection for the fused QKV / KV /
      SwiGLU matrices, so fusing does not change the initial scale; biases zero.
    - Embeddings: N(0, d_model^-1/2), padding row zero. Multiplied by sqrt(d_model) in the forward
      pass they have unit variance, the same scale as the sinusoidal table, so positions are not
      drowned (PyTorch's default N(0, 1) makes them ~sqrt(d_model) times larger) and a tied output
      projection starts with logits of unit scale.
    - Norms: weight one, bias zero (PyTorch's default).
    - Attention scores (`AttentionScore.reset_parameters`): general's W = I / sqrt(d_head), so it
      starts as the scaled dot product; additive's W_q, W_k and v Xavier-uniform per head.
    """
    for module in model.modules():
        if isinstance(module, nn.Linear):
            _xavier_rows(module.weight, [module.weight.size(0)])
            if module.bias is not None:
                nn.init.zeros_(module.bias)
    for module in model.modules():  # second pass: after the plain Linear pass above
        if isinstance(module, MultiHeadAttention):  # fused projections: one Xavier per part
            kv = module.n_kv_heads * module.d_head
            if module.cross:
                _xavier_rows(module.kv_proj.weight, [kv, kv])
            else:
                _xavier_rows(module.qkv_proj.weight, [module.n_heads * module.d_head, kv, kv])
        elif isinstance(module, AttentionScore):
            module.reset_parameters()
        elif isinstance(module, FeedForward) and module.kind == "swiglu":
            _xavier_rows(module.w1.weight, [module.w1.weight.size(0) // 2] * 2)
        elif isinstance(module, nn.Embedding):  # after the Linear pass: a tied output projection keeps this
            nn.init.normal_(module.weight, mean=0.0, std=d_model**-0.5)
            if module.padding_idx is not None:
                module.weight.data[module.padding_idx].zero_()


def _xavier_rows(weight: Tensor, sizes: list[int]) -> None:
    """Xavier-uniform on each block of rows, as if each were its own (out_rows x in) matrix."""
    with torch.no_grad():
        for rows in weight.split(sizes, dim=0):
            bound = math.sqrt(6.0 / (rows.size(0) + rows.size(1)))
            rows.uniform_(-bound, bound)


def count_parameters(model: nn.Module) -> OrderedDict[str, int]:
    """Parameters by component (shared tensors counted once), plus a `total`."""
    groups: OrderedDict[str, int] = OrderedDict()
    for name, param in model.named_parameters():  # named_parameters skips shared duplicates
        groups[_component(name)] = groups.get(_component(name), 0) + param.numel()
    groups["total"] = sum(groups.values())
    return groups


def _component(name: str) -> str:
    part = name.split(".")[0]
    side = {"encoder": "encoder ", "decoder": "decoder "}.get(part, "")
    for key, label in (
        ("embedding.", "embeddings"),
        ("positions.", "positions"),
        ("cross_attn.", "cross-attention"),
        ("self_attn.", "self-attention"),
        ("ffn.", "feed-forward"),
        ("norm", "norms"),
        ("lstm.", "lstm layers"),
    ):
        if key in name:
            return "embeddings" if label == "embeddings" else side + label
    return "output head"
