"""What a training run costs before it starts: tokens per update and training FLOPs (`tformer check`).

The count is the standard one (Kaplan et al., 2020, "Scaling Laws for Neural Language Models",
Table 1; PaLM's model-FLOPs formula, Chowdhery et al., 2022, Appendix B). A token's forward pass
costs 2 FLOPs (a multiply and an add) for every weight it is multiplied by; the backward pass costs
twice the forward (the gradients of the activations and of the weights), so training costs

    6 x N_token FLOPs per token, plus 12 x n_layers x d_model x n_ctx for self-attention

N_token is the weights a token passes through: its stack's layers (attention, feed-forward, norms)
and, for a predicted token, the output projection d_model x V (tied or not: it is a matrix product).
The embedding lookup is no arithmetic and is left out. Attention's two products (scores Q K^T and
the weighted sum of V) cost 4 x d_model x n_ctx per layer and token forward, 12 x backward
included, over the whole n_ctx as dense kernels compute it (the causal mask's half too).

- seq2seq: a source token passes through the encoder (N_enc), a target token through the decoder
  and the output projection (N_dec + d_model x V):

      FLOPs per update = 6 x (N_enc x S + (N_dec + d_model x V) x T)

  with S = T = train.max_tokens x train.update_freq x processes, the token budget of each side.
  The budget counts padding, and so do the matrix products: at WMT lengths the padded tensors fill
  94-99% of it (measured on the WMT14 sample), so this is the arithmetic done, not the real tokens
  (87% EN, 93% DE of the budget). Attention is left out: its context (the sentence length) is not
  known before the data is read, and at WMT lengths (~30 tokens) it adds under 1%
  (12 x 6 x 512 x 30 per token against 6 x 18.9M for the base encoder).
- lm: T = batch_size x data.block_size x update_freq x processes tokens, each with the whole block as
  context: FLOPs per update = (6 x (N_dec + d_model x V) + 12 x n_layers x d_model x block_size) x T.
  Sessions data (data.kind: sessions): a row is a session's session_len - 1 inputs (with the padding
  of shorter sessions, which the products compute too) and V is n_items + 1.
- lstm: the same without attention (every LSTM weight multiplies once per token).
- classifier: not counted (None).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tformer_cli.kinds import MODEL_KINDS
from tformer_cli.schema import Config, row_length, vocabulary

_NO_ARITHMETIC = ("embeddings", "positions")  # lookups; the output projection is added as d_model x V


@dataclass(frozen=True)
class TrainingCost:
    """What one update processes and costs, and the whole run (when train.max_updates fixes its length)."""

    src_tokens: int  # per update: source positions (seq2seq; 0 for a language model)
    tgt_tokens: int  # per update: predicted positions (the target side, or the language model's tokens)
    flops_per_update: float
    updates: int | None  # train.max_updates; None: the data decides (epochs x batches per epoch)

    @property
    def total_flops(self) -> float | None:
        return None if self.updates is None else self.flops_per_update * self.updates


def seq2seq_flops(enc_weights: int, dec_weights: int, d_model: int, vocab: int, src: int, tgt: int) -> float:
    """Training FLOPs of `src` source and `tgt` target tokens: 6 x (N_enc x S + (N_dec + d_model x V) x T)."""
    return 6.0 * (enc_weights * src + (dec_weights + d_model * vocab) * tgt)


def lm_flops(weights: int, d_model: int, vocab: int, n_layers: int, n_ctx: int, tokens: int) -> float:
    """Training FLOPs of `tokens` tokens with `n_ctx` of context each (0: no attention, an LSTM).

    (6 x (N + d_model x V) + 12 x n_layers x d_model x n_ctx) x tokens.
    """
    return (6.0 * (weights + d_model * vocab) + 12.0 * n_layers * d_model * n_ctx) * tokens


def training_cost(config: Config, parameters: Mapping[str, int], processes: int = 1) -> TrainingCost | None:
    """Tokens and FLOPs per update of a recipe (see the module docstring for the formula).

    Args:
        config: the recipe (model shape, token budget or batch, update_freq, max_updates).
        parameters: the model's parameters by component, as `model.count_parameters` gives them
            ("encoder ..." for the encoder's, "embeddings", "positions", "output head", "total").
        processes: torchrun's processes: each takes its own micro-batches.

    Returns:
        The cost, or None for a classifier (not counted).
    """
    t, m = config.train, config.model
    (vocab, _), (row, _) = vocabulary(config), row_length(config)
    weights = {
        name: count
        for name, count in parameters.items()
        if name not in ("total", "output head") and not name.endswith(_NO_ARITHMETIC)
    }
    encoder = sum(count for name, count in weights.items() if name.startswith("encoder "))
    others = sum(weights.values()) - encoder
    kind = MODEL_KINDS[m.kind]
    if not kind.predicts_tokens:
        return None
    if kind.has_source:  # source and target tokens
        tokens = t.max_tokens * t.update_freq * processes
        flops = seq2seq_flops(encoder, others, m.d_model, vocab, tokens, tokens)
        return TrainingCost(tokens, tokens, flops, t.max_updates)
    tokens = t.batch_size * row * t.update_freq * processes
    n_ctx = row if kind.attention else 0
    flops = lm_flops(others, m.d_model, vocab, m.n_layers, n_ctx, tokens)
    return TrainingCost(0, tokens, flops, t.max_updates)


def cost_lines(config: Config, parameters: Mapping[str, int], processes: int = 1) -> list[str]:
    """What `tformer check` prints: tokens per update and what makes them, FLOPs per update and per run.

    Args:
        config, parameters, processes: as for `training_cost`.

    Returns:
        Two lines; none for a classifier.
    """
    cost = training_cost(config, parameters, processes)
    if cost is None:
        return []
    t = config.train
    row, row_name = row_length(config)
    made = f"train.batch_size {t.batch_size:,} x {row_name} {row:,}"
    tokens, padding = f"{cost.tgt_tokens:,}", ""
    if cost.src_tokens:
        made, padding = f"train.max_tokens {t.max_tokens:,}", "; padding included"
        tokens = f"{cost.src_tokens:,} source + {cost.tgt_tokens:,} target"
    processes_ = f"{processes} process{'es' if processes > 1 else ''}"
    run = (
        "whole run: set by the data (train.max_updates is not set)"
        if cost.total_flops is None
        else f"{cost.total_flops:.3g} for {cost.updates:,} updates"
    )
    return [
        f"tokens per update: {tokens} ({made} x update_freq {t.update_freq} x {processes_}{padding})",
        f"training FLOPs: {cost.flops_per_update:.3g} per update, {run} (formula: tformer_cli/flops.py)",
    ]
