"""The model's settings, written once: the closed sets of options and the config every module is built from.

`ModelConfig` is the recipe's `model:` section (`tformer_cli/schema.py` puts it in the config tree under
that one name) and what `build.py`, `Stack` and `Block` take, as litgpt passes one `Config` down its modules. What
comes from the data (the vocabulary, the classes, the padding id) is not part of it. This module imports
no torch: the recipe's schema is read before torch is (`tformer check` refuses an impossible recipe
without it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ModelKind = Literal["classifier", "lm", "seq2seq", "lstm"]
NormKind = Literal["layernorm", "rmsnorm"]
NormPlacement = Literal["pre", "post"]
FFNKind = Literal["relu", "gelu", "swiglu"]
PosKind = Literal["sinusoidal", "learned", "rope", "alibi", "none"]
ScoreKind = Literal["scaled_dot", "dot", "general", "additive"]
Pooling = Literal["mean", "first"]


@dataclass(frozen=True)
class ModelConfig:
    """model: the architecture (built by tformer_cli/model/build.py).

    - kind: the architecture, a closed set: an encoder and a pooled head (`classifier`), a causal
      decoder (`lm`), the paper's encoder-decoder (`seq2seq`), or the recurrent LM baseline (`lstm`:
      d_model, n_layers, dropout and tie_embeddings only).
    - n_layers: encoder layers (decoder layers for `lm`); `n_decoder_layers` defaults to it.
    - norm_placement: `post` is the paper's x = Norm(x + Sublayer(x)); `pre` is x + Sublayer(Norm(x)),
      with a final norm after each stack.
    - pos: added to the embeddings (sinusoidal, learned: a table of max_len rows), rotating queries and
      keys (rope), a bias on the scores (alibi), or nothing.
    - tie_embeddings: the decoder's input embedding is its output projection too.
    - share_all_embeddings: seq2seq: one embedding for encoder, decoder and output (the paper).
    - pooling: classifier: mean over the real tokens, or the first position.

    The README's recipe reference says more about each key; `Config.problems` checks their ranges.
    """

    kind: ModelKind = "seq2seq"  # lstm: recurrent LM baseline
    d_model: int = 512
    n_heads: int = 8
    n_kv_heads: int | None = None  # None: as many as n_heads; fewer: grouped-query attention
    n_layers: int = 6
    n_decoder_layers: int | None = None  # seq2seq: None means n_layers
    d_ff: int = 2048
    dropout: float = 0.1
    attn_dropout: float = 0.0  # on the attention weights
    activation_dropout: float = 0.0  # inside the FFN, after the activation (not in the paper)
    norm: NormKind = "layernorm"
    norm_placement: NormPlacement = "post"
    ffn: FFNKind = "relu"
    pos: PosKind = "sinusoidal"
    # every attention layer's score of query q and key k (tformer_cli/model/scores.py): q.k/sqrt(d_k),
    # q.k, q W k^T (Luong) or v.tanh(q W_q + k W_k) (Bahdanau); only scaled_dot has the fused kernels
    attention_score: ScoreKind = "scaled_dot"
    max_len: int = 1024
    bias: bool = True
    pooling: Pooling = "mean"
    tie_embeddings: bool = True
    share_all_embeddings: bool = False

    @property
    def norm_first(self) -> bool:
        """Pre-LN: each sub-layer normalises its input, and each stack ends with a norm."""
        return self.norm_placement == "pre"

    @property
    def decoder_layers(self) -> int:
        """The seq2seq decoder's layers: n_decoder_layers, or n_layers when that is None."""
        return self.n_decoder_layers or self.n_layers
