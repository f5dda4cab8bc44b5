"""bench/lm_race.py's peer: Hugging Face's GPT-2 architecture (GPT2LMHeadModel) trained from scratch in a plain
PyTorch loop at a tformer language-model recipe's size, on the recipe's prepared data, stopped at wall-clock marks.

What it shares with `tformer train RECIPE` (so that only the architecture and the loop differ):
- the size: n_embd = model.d_model, n_layer = model.n_layers, n_head = model.n_heads, n_inner = model.d_ff,
  n_positions = model.max_len, the dropouts (embedding, residual, attention), tied embeddings;
- the vocabulary and tokenizer: the prepared data folder's (data.dir/spm.model), its size from the manifest;
- the batches: tformer's own LM task (train/tasks.py `LMTask`): the same blocks of data.block_size tokens in the
  same (run.seed, epoch) order, train.batch_size blocks per micro-batch, train.update_freq micro-batches per update;
- the optimiser and schedule: tformer's `build_optimizer` (AdamW, betas, eps, weight decay) and `lr_at` (warm-up
  then cosine over the same number of updates), train.clip_norm, train.label_smoothing, train.precision's autocast.
What it keeps of GPT-2's own: learned absolute positions, its GELU (tanh), its initialisation (std 0.02, residual
projections scaled by 1 / sqrt(2 n_layer)), LayerNorm with biases; model.pos, model.ffn, model.norm and
model.activation_dropout (no GPT-2 counterpart) are tformer's alone.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from _peers import autocast
from torch import Tensor, nn

from tformer_cli.schema import Config
from tformer_cli.tokenizer import EOS_ID, PAD_ID

if TYPE_CHECKING:
    from transformers import GPT2LMHeadModel


def gpt2_config(config: Config, vocab: int):
    """The GPT2Config of the recipe's size (see the module's docstring)."""
    from transformers import GPT2Config

    m = config.model
    return GPT2Config(
        vocab_size=vocab,
        n_positions=m.max_len,
        n_embd=m.d_model,
        n_layer=m.n_layers,
        n_head=m.n_heads,
        n_inner=m.d_ff,
        embd_pdrop=m.dropout,
        resid_pdrop=m.dropout,
        attn_pdrop=m.attn_dropout,
        tie_word_embeddings=m.tie_embeddings,
        bos_token_id=EOS_ID,  # GPT-2's own convention: one end-of-text token begins and ends a text
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
    )


def gpt2_model(config: Config, vocab: int) -> GPT2LMHeadModel:
    """GPT2LMHeadModel at the recipe's size, initialised from the global RNG."""
    from transformers import GPT2LMHeadModel

    return GPT2LMHeadModel(gpt2_config(config, vocab))


class Scorer(nn.Module):
    """A GPT2LMHeadModel behind the two calls tformer's perplexity (metrics.py `stream_nll`) makes of a language
    model: `model(x, head=False)`, the last hidden states (B, T, D), and `model.output(h)`, their logits (N, V)."""

    def __init__(self, gpt2: GPT2LMHeadModel) -> None:
        super().__init__()
        self.gpt2 = gpt2

    def forward(self, x: Tensor, head: bool = True) -> Tensor:
        hidden = self.gpt2.transformer(input_ids=x).last_hidden_state  # (B, T, D), after the final LayerNorm
        return self.output(hidden) if head else hidden

    def output(self, hidden: Tensor) -> Tensor:
        return self.gpt2.lm_head(hidden)  # (..., V)


def save(model: GPT2LMHeadModel, path: Path) -> None:
    """The weights and the GPT2Config (as a dict), written whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    torch.save({"config": model.config.to_dict(), "model": model.state_dict()}, partial)
    partial.replace(path)


def load(path: Path) -> GPT2LMHeadModel:
    """A checkpoint `save` wrote, read with weights_only=True, in eval mode."""
    from transformers import GPT2Config, GPT2LMHeadModel

    state = torch.load(path, map_location="cpu", weights_only=True)
    model = GPT2LMHeadModel(GPT2Config.from_dict(state["config"]))
    model.load_state_dict(state["model"])
    return model.eval()


@dataclass(frozen=True)
class Mark:
    """The peer when its training clock passed a mark."""

    minutes: float
    seconds: float  # training time when it was taken (>= minutes * 60, unless the schedule ended first)
    updates: int


def updates(config: Config, task) -> Iterator[list]:
    """The micro-batches of each update, as tformer's loop takes them: train.update_freq consecutive batches of
    `task.batches(epoch)`, epoch after epoch (an epoch's last short group is an update of its own)."""
    epoch, per_update = 0, config.train.update_freq
    while True:
        batches = task.batches(epoch)
        for start in range(0, len(batches), per_update):
            yield batches[start : start + per_update]
        epoch += 1


def total_updates(config: Config, task) -> int:
    """The schedule's length as tformer's loop computes it: train.max_updates, or fewer if train.epochs end first."""
    tc = config.train
    epoch_steps = tc.epochs * math.ceil(len(task.batches(0)) / tc.update_freq)
    return epoch_steps if tc.max_updates is None else min(tc.max_updates, epoch_steps)


def update(model: nn.Module, optimizer, task, micro_batches: list, config: Config, precision: str, lr: float) -> int:
    """One update: the mean next-token cross-entropy of each micro-batch (fp32 logits under `precision`'s autocast),
    backward, the gradient norm clipped, an AdamW step at `lr`.

    Returns:
        The tokens it trained on.
    """
    tc = config.train
    for group in optimizer.param_groups:
        group["lr"] = lr
    for batch in micro_batches:
        inputs, targets = task.inputs(batch, torch.device("cpu"))  # (B, block) each
        with autocast(precision):
            logits = model(input_ids=inputs).logits  # (B, block, V)
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), label_smoothing=tc.label_smoothing)
        (loss / len(micro_batches)).backward()
    if tc.clip_norm > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), tc.clip_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return sum(task.count(batch) for batch in micro_batches)


def train(
    model: nn.Module, config: Config, precision: str, marks_min: list[float], on_mark: Callable[[Mark], None]
) -> float:
    """Train `model` until its training clock passes the last of `marks_min` (or the schedule ends: the marks left
    are then taken at once); at each, with the clock stopped, call `on_mark`. The clock counts updates only, batch
    assembly included, from the first.

    Returns:
        The median tokens/s over windows of train.log_every updates.
    """
    from tformer_cli.train.optim import build_optimizer, lr_at
    from tformer_cli.train.tasks import make_task

    if config.train.optimizer == "muon":  # build_optimizer finds Muon's matrices in tformer's blocks only
        raise SystemExit(
            "the GPT-2 peer has none of tformer's blocks for train.optimizer=muon: race it with "
            "gpt2:train.optimizer=adamw (or adam)"
        )
    task = make_task(config)
    optimizer = build_optimizer(model, config.train)
    total = total_updates(config, task)
    pending, trained, step, rates = sorted(marks_min), 0.0, 0, []
    window_tokens, window_s = 0, 0.0
    model.train()
    stream = updates(config, task)
    while pending:
        if step >= total:  # the schedule ended before the clock reached the marks left
            for minutes in pending:
                on_mark(Mark(minutes, trained, step))
            break
        start = time.perf_counter()
        step += 1
        lr = lr_at(step, config.train, config.model.d_model, total)
        tokens = update(model, optimizer, task, next(stream), config, precision, lr)
        took = time.perf_counter() - start
        trained, window_tokens, window_s = trained + took, window_tokens + tokens, window_s + took
        if step % config.train.log_every == 0:
            rates.append(window_tokens / window_s)
            window_tokens, window_s = 0, 0.0
        while pending and trained >= pending[0] * 60:
            model.eval()
            on_mark(Mark(pending.pop(0), trained, step))
            model.train()
    return statistics.median(rates) if rates else window_tokens / max(window_s, 1e-9)
