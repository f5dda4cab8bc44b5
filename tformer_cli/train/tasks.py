"""What the loop trains on: data, batches in a (seed, epoch)-determined order, loss and evaluation.

One task per data kind, made by `make_task` from its data read once (data/splits.py); the loop in `loop.py`
only calls the methods below. Validation is each task's `valid` set (validation.py), made as `tformer eval`
makes it from the same splits; the model is run.build_model_from_config's.

A batch's loss is two halves: `inputs` (the data side: indices -> padded tensors on the device) and
`loss_on` (the model and its loss on those tensors, nothing else), so that train.compile compiles the
forward pass and the loss as one graph (train/step.py `Objective`) and the data side stays outside it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tformer_cli.data import sessions
from tformer_cli.data.batching import (
    TokenArray,
    block_offset,
    lm_blocks,
    lm_rows,
    padded_length,
    pair_rows,
    pair_sizes,
    shuffled_batches,
    token_budget_batches,
)
from tformer_cli.data.bpe_dropout import BpeDropout
from tformer_cli.data.pattern import PatternData
from tformer_cli.data.sessions import Sessions
from tformer_cli.data.sources import locate
from tformer_cli.data.splits import PreparedSplits, read_splits
from tformer_cli.errors import ConfigError, DataError
from tformer_cli.metrics import Stats
from tformer_cli.run import build_model_from_config
from tformer_cli.schema import Config, TrainConfig, position_limit
from tformer_cli.train.loss import output_loss
from tformer_cli.validation import (
    LMValidation,
    PairValidation,
    PatternValidation,
    SessionValidation,
    Validation,
    validation_from,
)


class Task(Protocol):
    """What the training loop (loop.py) and step (step.py) ask of the data: one class per data kind
    (`kinds.DATA_KINDS` names it), made by `make_task`."""

    unit: str  # what `count` counts: "examples" or "tokens"

    @property
    def tokenizer_fingerprint(self) -> str | None:
        """The prepared data's tokenizer; None for generated data."""
        ...

    @property
    def valid(self) -> Validation:
        """The validation set, as `tformer eval` scores it too."""
        ...

    def build_model(self) -> nn.Module:
        """The freshly initialised model of the recipe, for this data's vocabulary."""
        ...

    def batches(self, epoch: int) -> Sequence[Any]:
        """The epoch's batches (index sets), in an order drawn from (run.seed, epoch) only."""
        ...

    def count(self, batch: Any) -> int:
        """What the loss of a batch is averaged over (examples or target tokens)."""
        ...

    def inputs(self, batch: Any, device: torch.device) -> tuple[Tensor, ...]:
        """The model's inputs and the targets of a batch, on `device` (the data side of the loss)."""
        ...

    @property
    def loss_on(self) -> Callable[..., tuple[Tensor, Stats]]:
        """The mean loss of a batch and its sums (the model side: what train.compile compiles), called with the model
        and the tensors `inputs` gave (each task's method names its own)."""
        ...

    def evaluate(self, model: nn.Module, device: torch.device) -> dict[str, float]:
        """The validation metrics."""
        ...


def to_device(batch: Tensor, device: torch.device) -> Tensor:
    """A training batch tensor on `device`. To a GPU it goes from pinned (page-locked) memory without the host
    waiting: the copy queues behind the work already queued, and the host goes on assembling and queuing
    (a copy from ordinary memory would make it wait for the GPU at every micro-batch). PyTorch's pinned-memory
    cache reuses the staging buffer only once its copy is done."""
    if device.type != "cuda":
        return batch.to(device)
    return batch.pin_memory().to(device, non_blocking=True)


def next_token_loss(model: nn.Module, inputs: tuple[Tensor, ...], train: TrainConfig) -> tuple[Tensor, Stats]:
    """The training loss of a token-predicting model: `inputs` are the model's inputs, then the targets.

    The model gives its logits, or with train.loss_chunk its last hidden states, which train/loss.py projects
    and scores that many tokens at a time.
    """
    *model_inputs, targets = inputs
    out = model(*model_inputs, head=not train.loss_chunk)  # (B, T, V) logits, or (B, T, D) hidden states
    return output_loss(out, targets, model, train)


class ClassifierTask:
    """PatternSequence classification: examples are (tokens, label), the metric is accuracy."""

    unit = "examples"
    tokenizer_fingerprint = None

    def __init__(self, config: Config, data: PatternData, valid: PatternValidation) -> None:
        self.config, self.data, self.valid = config, data, valid

    def build_model(self) -> nn.Module:
        return build_model_from_config(self.config)

    def batches(self, epoch: int) -> list[Tensor]:
        """Index batches of the training set: a permutation drawn from (run.seed, epoch) only."""
        gen = torch.Generator().manual_seed(self.config.run.seed * 100_003 + epoch)
        order = torch.randperm(self.data.train_tokens.size(0), generator=gen)
        return list(order.split(self.config.train.batch_size))

    def count(self, batch: Tensor) -> int:
        """Examples in a batch (what the loss is averaged over)."""
        return len(batch)

    def inputs(self, batch: Tensor, device: torch.device) -> tuple[Tensor, Tensor]:
        """(tokens (B, T), labels (B,)) of a batch, on `device`."""
        return to_device(self.data.train_tokens[batch], device), to_device(self.data.train_labels[batch], device)

    def loss_on(self, model: nn.Module, tokens: Tensor, labels: Tensor) -> tuple[Tensor, Stats]:
        """Mean cross-entropy over the batch, and its sums for logging."""
        logits = model(tokens)
        loss = F.cross_entropy(logits.float(), labels, label_smoothing=self.config.train.label_smoothing)
        correct = (logits.argmax(-1) == labels).sum()
        return loss, Stats(loss.detach() * labels.size(0), correct, labels.size(0))

    def evaluate(self, model: nn.Module, device: torch.device) -> dict[str, float]:
        """Validation loss and accuracy."""
        return self.valid.evaluate(model, device)


class SessionTask:
    """Next-item prediction over generated sessions: a language model whose tokens are item ids.

    Each session is one row: inputs are its items but the last, targets the items after them (padding
    past a session's end is no target). Validation scores ranks by rule (validation.SessionValidation).
    """

    unit = "tokens"
    tokenizer_fingerprint = None

    def __init__(self, config: Config, data: dict[str, Sessions], valid: SessionValidation) -> None:
        self.config, self.train, self.valid = config, data["train"], valid

    def build_model(self) -> nn.Module:
        return build_model_from_config(self.config)

    def batches(self, epoch: int) -> list[np.ndarray]:
        """Session batches of the training split, in an order drawn from (run.seed, epoch) only."""
        return shuffled_batches(len(self.train), self.config.train.batch_size, self.config.run.seed, epoch)

    def count(self, batch: np.ndarray) -> int:
        """Targets in a batch (what the loss is averaged over)."""
        return int((self.train.rules[torch.from_numpy(batch)] != sessions.NO_TARGET).sum())

    def inputs(self, batch: np.ndarray, device: torch.device) -> tuple[Tensor, Tensor]:
        """(items (B, L - 1), the items after them (B, L - 1)) of a batch of sessions, on `device`."""
        rows = self.train.rows(torch.from_numpy(batch))
        return to_device(rows.inputs, device), to_device(rows.targets, device)

    def loss_on(self, model: nn.Module, *inputs: Tensor) -> tuple[Tensor, Stats]:
        """Mean cross-entropy over the batch's targets, and its sums for logging."""
        return next_token_loss(model, inputs, self.config.train)

    def evaluate(self, model: nn.Module, device: torch.device) -> dict[str, float]:
        """The validation metrics, by rule and beside the Bayes-optimal ones (validation.py)."""
        return self.valid.evaluate(model, device)


class _PreparedTask:
    """Shared by the tasks that read `prepare`'s output: vocabulary, tokenizer fingerprint, model, loss."""

    unit = "tokens"
    valid: LMValidation | PairValidation

    def __init__(self, config: Config, data: PreparedSplits) -> None:
        self.config = config
        self.prepared = data.prepared
        self.manifest = self.prepared.manifest
        self.vocab_size = self.prepared.vocab_size
        self.tokenizer_fingerprint = self.prepared.tokenizer_fingerprint

    def build_model(self) -> nn.Module:
        return build_model_from_config(self.config, self.vocab_size)

    def evaluate(self, model: nn.Module, device: torch.device) -> dict[str, float]:
        """The validation metrics (validation.py)."""
        return self.valid.evaluate(model, device)

    def loss_on(self, model: nn.Module, *inputs: Tensor) -> tuple[Tensor, Stats]:
        """Mean (label-smoothed) cross-entropy over the batch's target tokens (next_token_loss)."""
        return next_token_loss(model, inputs, self.config.train)


class LMTask(_PreparedTask):
    """Language modelling on the token stream cut into blocks of block_size + 1."""

    valid: LMValidation

    def __init__(self, config: Config, data: PreparedSplits, valid: LMValidation) -> None:
        super().__init__(config, data)
        (train,) = data.train
        self.train_stream = train.tokens
        self.block = config.data.block_size  # within the learned positions: schema.py checks that
        self.starts = lm_blocks(self.train_stream.size, self.block)
        self.valid = valid

    def count(self, batch: np.ndarray) -> int:
        return len(batch) * self.block

    def batches(self, epoch: int) -> list[np.ndarray]:
        """The epoch's blocks in batches, in an order drawn from (seed, epoch); with train.shift_blocks the stream
        is cut at an offset drawn likewise (up to block_size tokens at its start left out of that epoch)."""
        seed, starts = self.config.run.seed, self.starts
        if self.config.train.shift_blocks:
            offset = block_offset(self.train_stream.size, self.block, seed, epoch)
            starts = lm_blocks(self.train_stream.size, self.block, offset)
        blocks = shuffled_batches(starts.size, self.config.train.batch_size, seed, epoch)
        return [starts[b] for b in blocks]

    def inputs(self, batch: np.ndarray, device: torch.device) -> tuple[Tensor, Tensor]:
        """(tokens (B, block), the tokens after them (B, block)) of a batch of block starts, on `device`."""
        inputs, targets = lm_rows(self.train_stream, batch, self.block)
        return to_device(inputs, device), to_device(targets, device)


class Seq2SeqTask(_PreparedTask):
    """Translation: token-budget batches of (source, target) pairs.

    With train.bpe_dropout each epoch's pairs are segmented anew (data/bpe_dropout.py): `batches(epoch)` draws
    them, and `count`, `inputs` and `collate` read the pairs of the epoch `batches` was last asked for.
    """

    valid: PairValidation

    def __init__(self, config: Config, data: PreparedSplits, valid: PairValidation) -> None:
        super().__init__(config, data)
        self.train_src, self.train_tgt = data.train
        self.train_sizes = pair_sizes(self.train_src, self.train_tgt, config.train.pad_to_multiple)
        self._refuse_too_long("train", self.train_src, self.train_tgt)
        self.valid = valid
        self._refuse_too_long("valid", valid.src, valid.tgt)
        self.resegment: BpeDropout | None = None
        if any(config.train.bpe_dropout):
            self.resegment = BpeDropout(
                self.prepared.tokenizer_path,
                self.train_src,
                self.train_tgt,
                config.train.bpe_dropout,
                config.run.seed,
                self._which_fit,
            )

    def _which_fit(self, src_lengths: np.ndarray, tgt_lengths: np.ndarray) -> np.ndarray:
        """Which pairs of these lengths (EOS included) a batch and the model's learned positions take."""
        multiple, positions = self.config.train.pad_to_multiple, position_limit(self.config.model)
        fits = padded_length(np.maximum(src_lengths, tgt_lengths + 1), multiple) <= self.config.train.max_tokens
        if positions is not None:
            fits &= padded_length(np.maximum(src_lengths, tgt_lengths), multiple) <= positions
        return fits

    def _refuse_too_long(self, split: str, src: TokenArray, tgt: TokenArray) -> None:
        """Refuse, before any update, a pair that the model's learned positions or a batch cannot take.

        Lengths are counted as batches pad them (train.pad_to_multiple).

        Raises:
            DataError: naming the split, where its longest such pair was read, the length, the limit and the fix.
        """
        c, multiple = self.config, self.config.train.pad_to_multiple
        limits = [("train.max_tokens", c.train.max_tokens, "one batch", (0, 1))]  # target + 1, as in pair_sizes
        positions = position_limit(c.model)
        if positions is not None:
            limits.insert(0, ("model.max_len", positions, "learned positions", (0, 0)))
        for setting, limit, what, extra in limits:
            for side, lengths in enumerate((src.lengths + extra[0], tgt.lengths + extra[1])):
                padded = padded_length(lengths, multiple)
                too_long = int((padded > limit).sum())
                if not too_long:
                    continue
                number = self.manifest["splits"][split]["longest"][self.manifest["sides"][side]]["example"]
                size, pad_fix = f"{int(lengths.max())} tokens", ""
                if multiple > 1:
                    size += f" ({int(padded.max())} padded to a multiple of train.pad_to_multiple={multiple})"
                    pad_fix = "lower train.pad_to_multiple, "
                fix = "lower data.max_len" if split == "train" else "shorten or remove that line"
                others = f" ({too_long} {split} pairs are too long)" if too_long > 1 else ""
                raise DataError(
                    f"data.{split}: {locate(c.data, split, number, side)} has {size}, more than {setting}={limit} "
                    f"({what}) takes{others}: raise {setting}, {pad_fix}or {fix} and run `tformer prepare` again"
                )

    def count(self, batch: np.ndarray) -> int:
        """Target tokens (including EOS) in a batch."""
        return int(self.train_tgt.lengths[batch].sum())

    def batches(self, epoch: int) -> list[np.ndarray]:
        if self.resegment is not None:
            self.train_src, self.train_tgt = self.resegment.epoch(epoch)
            self.train_sizes = pair_sizes(self.train_src, self.train_tgt, self.config.train.pad_to_multiple)
        return token_budget_batches(self.train_sizes, self.config.train.max_tokens, self.config.run.seed, epoch)

    def collate(self, batch: np.ndarray) -> tuple[Tensor, Tensor, Tensor]:
        """Training pair indices -> padded (source (B, S), decoder input (B, T), target (B, T))."""
        return pair_rows(self.train_src, self.train_tgt, batch, self.config.train.pad_to_multiple)

    def inputs(self, batch: np.ndarray, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
        """(source (B, S), decoder input (B, T), target (B, T)) of a batch of pair indices, on `device`."""
        return tuple(to_device(t, device) for t in self.collate(batch))  # type: ignore[return-value]


def make_task(config: Config) -> Task:
    """The training task of `data.kind`, on its data read once: the splits come from data/ in one go
    (`read_splits`), the validation set is made from them as `tformer eval` makes it (`validation_from`), then
    the task checks what it trains on. One explicit choice of class (the kinds table's `task` column names the
    same class; tests/unit/train/test_make_task.py keeps the two equal).

    Raises:
        DataError: see `read_splits`; a pair longer than the model's learned positions or a batch take.
        ConfigError: an unknown data.kind.
    """
    data = read_splits(config.data, config.tokenizer)
    valid = validation_from(config, data)
    match config.data.kind:
        # read_splits and validation_from chose by data.kind too: the data and validation set of this kind
        case "pattern":
            return ClassifierTask(config, cast(PatternData, data), cast(PatternValidation, valid))
        case "sessions":
            return SessionTask(config, cast("dict[str, Sessions]", data), cast(SessionValidation, valid))
        case "text":
            return LMTask(config, cast(PreparedSplits, data), cast(LMValidation, valid))
        case "parallel":
            return Seq2SeqTask(config, cast(PreparedSplits, data), cast(PairValidation, valid))
    raise ConfigError(f"unknown data.kind {config.data.kind!r}")
