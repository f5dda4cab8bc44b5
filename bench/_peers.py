"""bench/time_to_bleu.py's peer: Hugging Face's MarianMTModel at a tformer recipe's shape, trained from scratch in a
plain PyTorch loop on the recipe's prepared data, stopped at wall-clock marks, decoding with its own beam search.

Where its settings come from (`MARIAN`): Hugging Face's translation examples only fine-tune pretrained checkpoints
(examples/pytorch/translation/README.md: run_translation.py with TrainingArguments' defaults, lr 5e-5, no warm-up,
no label smoothing, 4 sentences per device), which says nothing about training from scratch. MarianMTModel is the
port of the Marian toolkit's transformer, and the toolkit's own example of one trained from scratch
(marian-nmt/marian-examples, transformer/run-me.sh) sets: Adam with betas (0.9, 0.98) and eps 1e-9, lr 3e-4 reached
by a linear warm-up and then decayed with the inverse square root (--lr-warmup 16000 --lr-decay-inv-sqrt 16000),
label smoothing 0.1, gradient norm clipped at 5, dropout 0.1, all embeddings tied, embeddings scaled by sqrt(d_model),
post-norm layers (--transformer-postprocess dan), batches filled by target words (--mini-batch-fit), the cost the
mean cross-entropy per target word, exponential smoothing of the weights (decoding uses the smoothed ones) and beam
search with length normalisation 0.6. All of these are kept, except:
- the warm-up: 16,000 updates suit WMT runs of a few hundred thousand; an hour on a CPU makes a few thousand, so the
  peer warms up as long as the tformer recipe does (`--peer-warmup 16000` runs the example's literally);
- the batches: tformer's token-budget batcher over the same prepared arrays, at the recipe's train.max_tokens and
  update_freq (Marian's batches are also filled by tokens): both systems see the same sentences per update;
- the size, dropout and activation: the tformer recipe's (a model of the same size), not Marian's transformer-base.
"""

from __future__ import annotations

import copy
import itertools
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer_cli.data.batching import pad_rows, pair_rows, pair_sizes, token_budget_batches
from tformer_cli.data.prepared import PreparedData
from tformer_cli.decoding.translate import length_sorted_batches
from tformer_cli.schema import Config, DecodeConfig
from tformer_cli.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer

if TYPE_CHECKING:
    from transformers import MarianMTModel

M = TypeVar("M", bound=nn.Module)


@dataclass(frozen=True)
class PeerSettings:
    """The optimiser, schedule and search of the peer (see the module's docstring for their source)."""

    lr: float = 3e-4
    warmup: int = 16_000  # linear warm-up, then lr * sqrt(warmup / step)
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-9
    clip_norm: float = 5.0
    label_smoothing: float = 0.1
    smoothing: float = 1e-4  # --exponential-smoothing: the floor of the smoothed weights' decay per update
    length_penalty: float = 0.6  # --normalize: a hypothesis's score over its length ** 0.6

    def describe(self) -> str:
        return (
            f"Adam ({self.betas[0]}, {self.betas[1]}, {self.eps:g}), lr {self.lr:g}, linear warm-up {self.warmup:,} "
            f"updates then inverse square root, label smoothing {self.label_smoothing}, clip norm {self.clip_norm:g}, "
            f"exponential smoothing {self.smoothing:g} (marian-examples transformer/run-me.sh); "
            f"HF generate length_penalty {self.length_penalty}"
        )


MARIAN = PeerSettings()


@dataclass(frozen=True)
class PeerMark:
    """The peer when the training clock passed a mark: a copy with the smoothed weights, in eval mode."""

    minutes: float
    seconds: float  # training time when it was taken (>= minutes * 60)
    updates: int
    model: MarianMTModel


def marian_model(config: Config, vocab: int) -> MarianMTModel:
    """MarianMTModel at the recipe's shape (model.*), with tformer's special ids; initialised from the global RNG.

    Raises:
        ValueError: a model.ffn that Marian does not have (swiglu).
    """
    from transformers import MarianConfig, MarianMTModel

    m = config.model
    if m.ffn not in ("relu", "gelu"):
        raise ValueError(f"model.ffn={m.ffn}: MarianMTModel has no such feed-forward layer; use relu or gelu")
    n_dec = m.n_decoder_layers or m.n_layers
    marian = MarianConfig(
        vocab_size=vocab,
        decoder_vocab_size=vocab,
        d_model=m.d_model,
        encoder_layers=m.n_layers,
        decoder_layers=n_dec,
        encoder_attention_heads=m.n_heads,
        decoder_attention_heads=m.n_heads,
        encoder_ffn_dim=m.d_ff,
        decoder_ffn_dim=m.d_ff,
        activation_function=m.ffn,
        dropout=m.dropout,
        attention_dropout=m.attn_dropout,
        activation_dropout=m.activation_dropout,
        max_position_embeddings=m.max_len,
        scale_embedding=True,  # Marian's transformer scales embeddings by sqrt(d_model), as the OPUS-MT ports set
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
        pad_token_id=PAD_ID,
        eos_token_id=EOS_ID,
        forced_eos_token_id=EOS_ID,
        decoder_start_token_id=BOS_ID,
    )
    return MarianMTModel(marian)


def parameter_count(model: nn.Module) -> int:
    """Trained parameters, each tied tensor once (sinusoidal position tables are not trained)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def lr_factor(step: int, warmup: int) -> float:
    """Marian's --lr-warmup W --lr-decay-inv-sqrt W at update `step` (from 1): step / W, then sqrt(W / step)."""
    warmup = max(warmup, 1)
    return min(step / warmup, (warmup / step) ** 0.5)


def autocast(precision: str) -> torch.autocast:
    """The autocast a user of the peer writes for tformer's train.precision (bf16 and bf16-weights: bf16)."""
    if precision not in ("fp32", "bf16", "bf16-weights"):
        raise ValueError(f"train.precision={precision}: the peer runs fp32 or bf16 autocast on the CPU")
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision != "fp32")


Batch = tuple[Tensor, Tensor, Tensor]  # source (B, S), decoder input (B, T), target (B, T)


def batches(config: Config) -> Iterator[list[Batch]]:
    """The recipe's training batches from its prepared data, epoch after epoch, update_freq micro-batches each."""
    data = PreparedData(config.data, config.tokenizer)
    src, tgt = data.array("train", "src"), data.array("train", "tgt")
    tc = config.train
    sizes = pair_sizes(src, tgt, tc.pad_to_multiple)
    for epoch in itertools.count():
        order = token_budget_batches(sizes, tc.max_tokens, config.run.seed, epoch)
        for start in range(0, len(order) - tc.update_freq + 1, tc.update_freq):
            yield [pair_rows(src, tgt, index, tc.pad_to_multiple) for index in order[start : start + tc.update_freq]]


class Smoothed:
    """Marian's exponential smoothing: avg <- (1 - d) avg + d w after each update, d = max(floor, 9 / (t + 10))
    (src/optimizers/exponential_smoothing.cpp: early in training the average follows the weights closely)."""

    def __init__(self, model: nn.Module, floor: float) -> None:
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.avg = [p.detach().clone() for p in self.params]
        self.floor = floor

    @torch.no_grad()
    def update(self, step: int) -> None:
        decay = max(self.floor, 1 - (step + 1) / (step + 10))
        for avg, p in zip(self.avg, self.params, strict=True):
            avg.lerp_(p, decay)

    def copy_of(self, model: M) -> M:
        """`model` with the smoothed weights, in eval mode (`model` itself goes on training)."""
        out = copy.deepcopy(model).eval()
        with torch.no_grad():
            for avg, p in zip(self.avg, [p for p in out.parameters() if p.requires_grad], strict=True):
                p.copy_(avg)
        return out


def update(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    micro_batches: list[Batch],
    settings: PeerSettings,
    precision: str,
) -> int:
    """One update: each micro-batch's label-smoothed cross-entropy, the mean per target token (Marian's
    ce-mean-words), on fp32 logits under `precision`'s autocast; backward, the norm clipped, an Adam step.

    Returns:
        The target tokens it trained on.
    """
    for src, tgt_in, tgt in micro_batches:
        with autocast(precision):
            logits = model(input_ids=src, attention_mask=src != PAD_ID, decoder_input_ids=tgt_in).logits  # (B, T, V)
        loss = F.cross_entropy(
            logits.float().flatten(0, 1), tgt.flatten(), ignore_index=PAD_ID, label_smoothing=settings.label_smoothing
        )
        (loss / len(micro_batches)).backward()
    params = [p for group in optimizer.param_groups for p in group["params"]]
    torch.nn.utils.clip_grad_norm_(params, settings.clip_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return sum(int((tgt != PAD_ID).sum()) for _, _, tgt in micro_batches)


def train(
    model: MarianMTModel, config: Config, settings: PeerSettings, precision: str, marks_min: list[float],
    on_mark: Callable[[PeerMark], None],
) -> float:  # fmt: skip
    """Train `model` until the training clock passes the last of `marks_min`; at each mark, with the clock stopped,
    call `on_mark`. The clock counts updates only (batch assembly included), from the first.

    Returns:
        The median target tokens/s over windows of train.log_every updates.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(params, lr=settings.lr, betas=settings.betas, eps=settings.eps)
    smoothed = Smoothed(model, settings.smoothing)
    pending, trained, step, rates = sorted(marks_min), 0.0, 0, []
    window_tokens, window_s = 0, 0.0
    model.train()
    stream = batches(config)
    while pending:
        start = time.perf_counter()
        micro_batches = next(stream)  # batch assembly is training time too
        step += 1
        for group in optimizer.param_groups:
            group["lr"] = settings.lr * lr_factor(step, settings.warmup)
        tokens = update(model, optimizer, micro_batches, settings, precision)
        smoothed.update(step)
        took = time.perf_counter() - start
        trained, window_tokens, window_s = trained + took, window_tokens + tokens, window_s + took
        if step % config.train.log_every == 0:
            rates.append(window_tokens / window_s)
            window_tokens, window_s = 0, 0.0
        while pending and trained >= pending[0] * 60:
            on_mark(PeerMark(pending.pop(0), trained, step, smoothed.copy_of(model)))
    return statistics.median(rates) if rates else window_tokens / max(window_s, 1e-9)


@torch.inference_mode()
def translate(
    model: MarianMTModel, tokenizer: Tokenizer, lines: list[str], dc: DecodeConfig, beam: int, settings: PeerSettings,
    precision: str,
) -> list[str]:  # fmt: skip
    """Detokenized translations of `lines` by HF `generate` (beam search), in batches of dc.max_tokens source tokens
    sorted by length, each limited to dc.max_len_a x its longest source + dc.max_len_b new tokens (tformer's limit);
    the weights cast to bf16 where `precision` (tformer's decode.precision) is bf16."""
    if precision == "bf16":
        model = model.bfloat16()
    encoded = [ids + [EOS_ID] for ids in tokenizer.encode(lines)]  # as tformer translate encodes a source
    out = [""] * len(lines)
    for batch in length_sorted_batches([len(ids) for ids in encoded], dc.max_tokens):
        src = pad_rows([np.asarray(encoded[i]) for i in batch])  # (B, S)
        generated = model.generate(
            input_ids=src,
            attention_mask=src != PAD_ID,
            num_beams=beam,
            length_penalty=settings.length_penalty,
            max_new_tokens=int(dc.max_len_a * src.size(1) + dc.max_len_b),
            do_sample=False,
            decoder_start_token_id=BOS_ID,
            eos_token_id=EOS_ID,
            pad_token_id=PAD_ID,
        )  # (B, T): BOS first, EOS then padding after each hypothesis
        for i, row in zip(batch, generated.tolist(), strict=True):
            out[i] = tokenizer.decode(row)
    return out
