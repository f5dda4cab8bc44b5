"""One builder for the three architectures, the initialisation, and parameter counts by component.

`build_model` takes the recipe's `model:` section as it is (a `ModelConfig`, model/spec.py), or a kind and
the config's fields as keywords, plus the vocabulary, class count and padding id that come from the data;
`Stack` and `Block` take the same config. Nothing here reads a file.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any

import torch
from torch import Tensor, nn

from tformer_cli.model.attention import MultiHeadAttention
from tformer_cli.model.classifier import Classifier
from tformer_cli.model.layers import FeedForward, TokenEmbedding
from tformer_cli.model.lm import LanguageModel
from tformer_cli.model.lstm import LSTMLanguageModel
from tformer_cli.model.scores import AttentionScore
from tformer_cli.model.seq2seq import Seq2Seq
from tformer_cli.model.spec import ModelConfig, ModelKind
from tformer_cli.model.stack import Stack


def build_model(
    config: ModelConfig | ModelKind, *, vocab_size: int, n_classes: int = 0, pad_id: int = 0, **settings: Any
) -> nn.Module:
    """Build and initialise a `classifier`, `lm`, `seq2seq` or `lstm` (recurrent LM baseline) model.

    Args:
        config: the architecture (the recipe's `model:` section); or only its kind, with the config's other
            fields as keywords (`build_model("lm", vocab_size=50, d_model=32)`: tests and readers).
        vocab_size: token vocabulary (joint for source and target in seq2seq).
        n_classes: output classes (classifier only).
        pad_id: the padding token: its embedding row is zero and it is masked as a key.
        settings: with a kind, any other field of `ModelConfig`; the others keep its defaults.

    Returns:
        The initialised module (see `init_weights`).

    Raises:
        TypeError: a keyword that is not a field of `ModelConfig`, or keywords beside a whole config.
        ValueError: a kind outside the closed set.
    """
    if isinstance(config, str):
        config = ModelConfig(kind=config, **settings)
    elif settings:
        raise TypeError(f"build_model takes a ModelConfig or a kind with keywords, not both: {sorted(settings)}")
    d = config.d_model
    match config.kind:
        case "classifier":
            embedding = TokenEmbedding(vocab_size, d, pad_id)
            encoder = Stack(
                config, embedding=embedding, n_layers=config.n_layers, causal=False, cross=False, pad_id=pad_id
            )
            model: nn.Module = Classifier(encoder, d, n_classes, config.pooling)
        case "lm":
            embedding = TokenEmbedding(vocab_size, d, pad_id)
            decoder = Stack(
                config, embedding=embedding, n_layers=config.n_layers, causal=True, cross=False, pad_id=pad_id
            )
            model = LanguageModel(decoder, d, vocab_size, config.tie_embeddings)
        case "seq2seq":
            src_embedding = TokenEmbedding(vocab_size, d, pad_id)
            tgt_embedding = src_embedding if config.share_all_embeddings else TokenEmbedding(vocab_size, d, pad_id)
            encoder = Stack(
                config, embedding=src_embedding, n_layers=config.n_layers, causal=False, cross=False, pad_id=pad_id
            )
            decoder = Stack(
                config, embedding=tgt_embedding, n_layers=config.decoder_layers, causal=True, cross=True, pad_id=pad_id
            )
            model = Seq2Seq(encoder, decoder, d, vocab_size, config.tie_embeddings or config.share_all_embeddings)
        case "lstm":  # the recurrent baseline; embeddings keep PyTorch's LSTM-style init below
            model = LSTMLanguageModel(vocab_size, d, config.n_layers, config.dropout, config.tie_embeddings, pad_id)
        case _:
            raise ValueError(f"unknown model kind {config.kind!r}")
    init_weights(model, d)
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
